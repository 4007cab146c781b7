// Command helmrender renders a Helm chart the way `helm template` does, for machines that have
// Debian's Go packages but no Helm (Helm is not packaged in Debian 12). CI uses it to check that
// deploy/helm/kvpool renders into Kubernetes objects.
//
// It implements what the kvpool chart needs of Helm's engine, with Helm's semantics:
//   - the chart: Chart.yaml (apiVersion v2, no dependencies), values.yaml, templates/ (files whose
//     name starts with "_" define templates and render nothing; NOTES.txt renders separately);
//   - values: parsed like Helm (YAML through JSON, so every number is a float64), -f files merged
//     over the defaults in order (a null deletes a default), --set key.path=value on top;
//   - template data: .Values .Release .Chart .Capabilities .Template .Files;
//   - functions: Sprig's text functions without env/expandenv (Helm drops them), and Helm's own:
//     include, tpl, required, toYaml, fromYaml, fromYamlArray, toJson, fromJson, fromJsonArray,
//     lookup (always empty, as in `helm template`);
//   - output: every rendered document must be a YAML mapping with apiVersion, kind and
//     metadata.name; documents are printed in Helm's install order, each after
//     "---" and "# Source: CHART/templates/FILE".
//
// With --strict a value the templates read but values.yaml lacks is an error (missingkey=error),
// as with `helm lint --strict`; without it, it renders empty, as in Helm.
//
// Builds offline from the Go standard library and Debian's golang-github-masterminds-sprig-dev
// and golang-gopkg-yaml.v2-dev in GOPATH mode (see deploy/checks/build_helmrender.sh).
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	yaml "gopkg.in/yaml.v2"
)

// Metadata is Chart.yaml; templates see it as .Chart (.Chart.Name, .Chart.AppVersion, ...).
type Metadata struct {
	APIVersion   string            `yaml:"apiVersion"`
	Name         string            `yaml:"name"`
	Version      string            `yaml:"version"`
	AppVersion   string            `yaml:"appVersion"`
	Description  string            `yaml:"description"`
	Type         string            `yaml:"type"`
	KubeVersion  string            `yaml:"kubeVersion"`
	Home         string            `yaml:"home"`
	Icon         string            `yaml:"icon"`
	Keywords     []string          `yaml:"keywords"`
	Sources      []string          `yaml:"sources"`
	Deprecated   bool              `yaml:"deprecated"`
	Annotations  map[string]string `yaml:"annotations"`
	Maintainers  []Maintainer      `yaml:"maintainers"`
	Dependencies []interface{}     `yaml:"dependencies"`
}

// Maintainer is one entry of Chart.yaml's maintainers.
type Maintainer struct {
	Name  string `yaml:"name"`
	Email string `yaml:"email"`
	URL   string `yaml:"url"`
}

// VersionSet is .Capabilities.APIVersions.
type VersionSet []string

// Has reports whether the set holds an API version ("apps/v1") or a resource ("apps/v1/Deployment").
func (v VersionSet) Has(apiVersion string) bool {
	for _, x := range v {
		if x == apiVersion {
			return true
		}
	}
	return false
}

// KubeVersion is .Capabilities.KubeVersion.
type KubeVersion struct {
	Version string
	Major   string
	Minor   string
}

// String returns the version, as Helm's does.
func (k KubeVersion) String() string { return k.Version }

// GitVersion is the deprecated spelling of Version, kept by Helm.
func (k KubeVersion) GitVersion() string { return k.Version }

// Capabilities is .Capabilities.
type Capabilities struct {
	APIVersions VersionSet
	KubeVersion KubeVersion
	HelmVersion map[string]string
}

// Files is .Files: the chart's files outside templates/.
type Files map[string][]byte

// Get returns a file's contents, or "" if there is none.
func (f Files) Get(name string) string { return string(f[name]) }

// GetBytes returns a file's contents as bytes.
func (f Files) GetBytes(name string) []byte { return f[name] }

// The API versions `helm template` assumes when no cluster is asked; more with --api-versions.
var defaultAPIVersions = []string{
	"v1", "apps/v1", "batch/v1", "policy/v1", "autoscaling/v1", "autoscaling/v2",
	"networking.k8s.io/v1", "rbac.authorization.k8s.io/v1", "storage.k8s.io/v1",
	"coordination.k8s.io/v1", "discovery.k8s.io/v1", "apiextensions.k8s.io/v1",
	"scheduling.k8s.io/v1", "admissionregistration.k8s.io/v1", "certificates.k8s.io/v1",
}

// installOrder is Helm's kind order for installing (releaseutil.InstallOrder).
var installOrder = []string{
	"PriorityClass", "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange",
	"PodSecurityPolicy", "PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList",
	"ConfigMap", "StorageClass", "PersistentVolume", "PersistentVolumeClaim",
	"CustomResourceDefinition", "ClusterRole", "ClusterRoleList", "ClusterRoleBinding",
	"ClusterRoleBindingList", "Role", "RoleList", "RoleBinding", "RoleBindingList", "Service",
	"DaemonSet", "Pod", "ReplicationController", "ReplicaSet", "Deployment",
	"HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob", "IngressClass", "Ingress",
	"APIService",
}

const maxIncludeDepth = 1000 // Helm's recursion limit for include

// listFlag collects a repeated string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "helmrender: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("helmrender", flag.ContinueOnError)
	var valueFiles, sets, apiVersions listFlag
	fs.Var(&valueFiles, "f", "values file merged over the chart's values.yaml (repeatable)")
	fs.Var(&sets, "set", "key.path=value set over the values (repeatable; bool, int, null or string)")
	fs.Var(&apiVersions, "api-versions", "extra API version for .Capabilities.APIVersions (repeatable)")
	releaseName := fs.String("release-name", "release-name", "release name (.Release.Name)")
	namespace := fs.String("namespace", "default", "release namespace (.Release.Namespace)")
	kubeVersion := fs.String("kube-version", "v1.29.0", "Kubernetes version (.Capabilities.KubeVersion)")
	strict := fs.Bool("strict", false, "fail on values the templates read but the values lack")
	output := fs.String("o", "-", "where the manifests go (- for stdout)")
	notes := fs.String("notes", "", "also render NOTES.txt into this file")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: helmrender [flags] CHART_DIR")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errors.New("want exactly one chart directory")
	}
	chart, err := loadChart(fs.Arg(0))
	if err != nil {
		return err
	}
	values := chart.values
	for _, file := range valueFiles {
		extra, err := readValuesFile(file)
		if err != nil {
			return err
		}
		values = coalesce(values, extra)
	}
	for _, s := range sets {
		if err := setValue(values, s); err != nil {
			return err
		}
	}
	caps := &Capabilities{
		APIVersions: append(VersionSet(append([]string{}, defaultAPIVersions...)), apiVersions...),
		KubeVersion: parseKubeVersion(*kubeVersion),
		HelmVersion: map[string]string{"version": "v3-compatible (helmrender)"},
	}
	release := map[string]interface{}{
		"Name": *releaseName, "Namespace": *namespace, "Revision": 1,
		"IsInstall": true, "IsUpgrade": false, "Service": "Helm",
	}
	r, err := newRenderer(chart, *strict)
	if err != nil {
		return err
	}
	top := map[string]interface{}{
		"Values": values, "Release": release, "Chart": chart.meta, "Capabilities": caps,
		"Files": chart.files,
	}
	manifests, notesText, err := r.renderAll(top)
	if err != nil {
		return err
	}
	if *notes != "" {
		if err := os.WriteFile(*notes, []byte(notesText), 0o644); err != nil {
			return err
		}
	}
	if *output == "-" {
		_, err = os.Stdout.WriteString(manifests)
		return err
	}
	return os.WriteFile(*output, []byte(manifests), 0o644)
}

func parseKubeVersion(v string) KubeVersion {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	k := KubeVersion{Version: v}
	if len(parts) >= 2 {
		k.Major, k.Minor = parts[0], parts[1]
	}
	return k
}

// chart is a loaded chart directory.
type chart struct {
	meta      *Metadata
	values    map[string]interface{}
	templates map[string]string // "NAME/templates/FILE" -> text
	files     Files
}

func loadChart(dir string) (*chart, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return nil, err
	}
	meta := &Metadata{}
	// Strict: a misspelled Chart.yaml field is an error here, where Helm would ignore it.
	if err := yaml.UnmarshalStrict(raw, meta); err != nil {
		return nil, fmt.Errorf("Chart.yaml: %v", err)
	}
	switch {
	case meta.APIVersion != "v2":
		return nil, fmt.Errorf("Chart.yaml: apiVersion %q, want v2", meta.APIVersion)
	case meta.Name == "":
		return nil, errors.New("Chart.yaml: name is required")
	case meta.Version == "":
		return nil, errors.New("Chart.yaml: version is required")
	case len(meta.Dependencies) > 0:
		return nil, errors.New("Chart.yaml: dependencies are not supported by helmrender")
	case meta.Type != "" && meta.Type != "application":
		return nil, fmt.Errorf("Chart.yaml: type %q is not supported", meta.Type)
	}
	if _, err := os.Stat(filepath.Join(dir, "charts")); err == nil {
		entries, _ := os.ReadDir(filepath.Join(dir, "charts"))
		if len(entries) > 0 {
			return nil, errors.New("subcharts (charts/) are not supported by helmrender")
		}
	}
	values, err := readValuesFile(filepath.Join(dir, "values.yaml"))
	if err != nil {
		return nil, err
	}
	c := &chart{meta: meta, values: values, templates: map[string]string{}, files: Files{}}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasPrefix(d.Name(), ".") {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		switch {
		case strings.HasPrefix(rel, "templates/"):
			c.templates[meta.Name+"/"+rel] = string(data)
		case rel != "Chart.yaml" && rel != "values.yaml":
			c.files[rel] = data
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(c.templates) == 0 {
		return nil, fmt.Errorf("%s: no templates", dir)
	}
	return c, nil
}

// readValuesFile parses values as Helm does (sigs.k8s.io/yaml): YAML converted to JSON and
// decoded into map[string]interface{}, so numbers are float64 and keys are strings.
func readValuesFile(file string) (map[string]interface{}, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var parsed interface{}
	if err := yaml.Unmarshal(raw, &parsed); err != nil {
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	if parsed == nil {
		return map[string]interface{}{}, nil
	}
	values, err := viaJSON(parsed)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	m, ok := values.(map[string]interface{})
	if !ok {
		return nil, fmt.Errorf("%s: values must be a mapping", file)
	}
	return m, nil
}

// viaJSON turns YAML-decoded data into what encoding/json would decode from it.
func viaJSON(v interface{}) (interface{}, error) {
	b, err := json.Marshal(stringKeys(v))
	if err != nil {
		return nil, err
	}
	var out interface{}
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// stringKeys converts yaml.v2's map[interface{}]interface{} into map[string]interface{}.
func stringKeys(v interface{}) interface{} {
	switch t := v.(type) {
	case map[interface{}]interface{}:
		m := make(map[string]interface{}, len(t))
		for k, val := range t {
			m[fmt.Sprint(k)] = stringKeys(val)
		}
		return m
	case []interface{}:
		out := make([]interface{}, len(t))
		for i, val := range t {
			out[i] = stringKeys(val)
		}
		return out
	default:
		return v
	}
}

// coalesce merges src over dst (dst is modified and returned): maps merge key by key, any
// other value replaces, and a null in src deletes the key, as with Helm's user values.
func coalesce(dst, src map[string]interface{}) map[string]interface{} {
	for k, v := range src {
		if v == nil {
			delete(dst, k)
			continue
		}
		if sm, ok := v.(map[string]interface{}); ok {
			if dm, ok := dst[k].(map[string]interface{}); ok {
				dst[k] = coalesce(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
	return dst
}

// setValue applies one --set key.path=value (no lists, no escaped dots).
func setValue(values map[string]interface{}, s string) error {
	eq := strings.IndexByte(s, '=')
	if eq <= 0 {
		return fmt.Errorf("--set %q: want key.path=value", s)
	}
	keys := strings.Split(s[:eq], ".")
	raw := s[eq+1:]
	var value interface{} = raw
	switch {
	case raw == "true" || raw == "false":
		value = raw == "true"
	case raw == "null":
		value = nil
	default:
		if i, err := strconv.ParseInt(raw, 10, 64); err == nil {
			value = i
		}
	}
	m := values
	for _, k := range keys[:len(keys)-1] {
		next, ok := m[k].(map[string]interface{})
		if !ok {
			next = map[string]interface{}{}
			m[k] = next
		}
		m = next
	}
	last := keys[len(keys)-1]
	if value == nil {
		delete(m, last)
	} else {
		m[last] = value
	}
	return nil
}

// renderer holds the chart's templates parsed into one set, as Helm's engine does.
type renderer struct {
	chart  *chart
	strict bool
	set    *template.Template
	depth  map[string]int
}

func newRenderer(c *chart, strict bool) (*renderer, error) {
	r := &renderer{chart: c, strict: strict, depth: map[string]int{}}
	r.set = template.New("gotpl")
	if strict {
		r.set.Option("missingkey=error")
	} else {
		r.set.Option("missingkey=zero")
	}
	r.set.Funcs(r.funcMap())
	names := sortedKeys(c.templates)
	for _, name := range names {
		if _, err := r.set.New(name).Parse(c.templates[name]); err != nil {
			return nil, err
		}
	}
	return r, nil
}

func (r *renderer) funcMap() template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env")
	delete(f, "expandenv")
	f["toYaml"] = toYAML
	f["fromYaml"] = fromYAML
	f["fromYamlArray"] = fromYAMLArray
	f["toJson"] = toJSON
	f["fromJson"] = fromJSON
	f["fromJsonArray"] = fromJSONArray
	f["required"] = required
	f["lookup"] = func(apiVersion, kind, namespace, name string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil // no cluster: as `helm template` answers
	}
	f["include"] = r.include
	f["tpl"] = r.tpl
	return f
}

func (r *renderer) include(name string, data interface{}) (string, error) {
	if r.depth[name] >= maxIncludeDepth {
		return "", fmt.Errorf("rendering template has a nested reference name: %s", name)
	}
	r.depth[name]++
	defer func() { r.depth[name]-- }()
	var buf strings.Builder
	if err := r.set.ExecuteTemplate(&buf, name, data); err != nil {
		return "", err
	}
	return buf.String(), nil
}

func (r *renderer) tpl(text string, data interface{}) (string, error) {
	clone, err := r.set.Clone()
	if err != nil {
		return "", err
	}
	t, err := clone.New("tpl").Parse(text)
	if err != nil {
		return "", fmt.Errorf("cannot parse template %q: %v", text, err)
	}
	var buf strings.Builder
	if err := t.Execute(&buf, data); err != nil {
		return "", fmt.Errorf("error calling tpl: %v", err)
	}
	return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
}

func required(warn string, val interface{}) (interface{}, error) {
	if val == nil {
		return val, errors.New(warn)
	}
	if s, ok := val.(string); ok && s == "" {
		return val, errors.New(warn)
	}
	return val, nil
}

// toYAML is Helm's toYaml: sigs.k8s.io/yaml (JSON, then YAML with sorted keys), no final newline.
func toYAML(v interface{}) string {
	data, err := marshalYAML(v)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

func marshalYAML(v interface{}) ([]byte, error) {
	j, err := json.Marshal(stringKeys(v))
	if err != nil {
		return nil, err
	}
	var obj interface{}
	if err := yaml.Unmarshal(j, &obj); err != nil {
		return nil, err
	}
	return yaml.Marshal(obj)
}

func fromYAML(s string) map[string]interface{} {
	m := map[string]interface{}{}
	var parsed interface{}
	if err := yaml.Unmarshal([]byte(s), &parsed); err != nil {
		m["Error"] = err.Error()
		return m
	}
	v, err := viaJSON(parsed)
	if err != nil {
		m["Error"] = err.Error()
		return m
	}
	if vm, ok := v.(map[string]interface{}); ok {
		return vm
	}
	return m
}

func fromYAMLArray(s string) []interface{} {
	var parsed interface{}
	if err := yaml.Unmarshal([]byte(s), &parsed); err != nil {
		return []interface{}{err.Error()}
	}
	v, err := viaJSON(parsed)
	if err != nil {
		return []interface{}{err.Error()}
	}
	a, _ := v.([]interface{})
	return a
}

func toJSON(v interface{}) string {
	data, err := json.Marshal(stringKeys(v))
	if err != nil {
		return ""
	}
	return string(data)
}

func fromJSON(s string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromJSONArray(s string) []interface{} {
	var a []interface{}
	if err := json.Unmarshal([]byte(s), &a); err != nil {
		return []interface{}{err.Error()}
	}
	return a
}

// document is one rendered Kubernetes object.
type document struct {
	source string // CHART/templates/FILE
	kind   string
	name   string
	text   string
	index  int // order of appearance, for a stable sort
}

var separator = regexp.MustCompile(`(?m)^---[ \t]*(#.*)?$`)

// renderAll renders every template that is not a partial; returns the manifests and the notes.
func (r *renderer) renderAll(top map[string]interface{}) (string, string, error) {
	var docs []document
	notes := ""
	basePath := r.chart.meta.Name + "/templates"
	for _, name := range sortedKeys(r.chart.templates) {
		base := path.Base(name)
		if strings.HasPrefix(base, "_") {
			continue
		}
		data := make(map[string]interface{}, len(top)+1)
		for k, v := range top {
			data[k] = v
		}
		data["Template"] = map[string]interface{}{"Name": name, "BasePath": basePath}
		var buf bytes.Buffer
		if err := r.set.ExecuteTemplate(&buf, name, data); err != nil {
			return "", "", err
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		if r.strict && strings.Contains(buf.String(), "<no value>") {
			return "", "", fmt.Errorf("%s: renders <no value>", name)
		}
		if name == basePath+"/NOTES.txt" {
			notes = text
			continue
		}
		if !strings.HasSuffix(name, ".yaml") && !strings.HasSuffix(name, ".yml") &&
			!strings.HasSuffix(name, ".tpl") {
			continue // Helm renders only manifests; other files are for include and tpl
		}
		for i, part := range separator.Split(text, -1) {
			doc, err := parseDocument(name, i, part)
			if err != nil {
				return "", "", err
			}
			if doc == nil {
				continue
			}
			doc.index = len(docs)
			docs = append(docs, *doc)
		}
	}
	rank := map[string]int{}
	for i, k := range installOrder {
		rank[k] = i
	}
	kindRank := func(kind string) int {
		if r, ok := rank[kind]; ok {
			return r
		}
		return len(installOrder)
	}
	sort.SliceStable(docs, func(i, j int) bool {
		ri, rj := kindRank(docs[i].kind), kindRank(docs[j].kind)
		if ri != rj {
			return ri < rj
		}
		return docs[i].index < docs[j].index
	})
	var out strings.Builder
	for _, d := range docs {
		fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", d.source, strings.TrimRight(d.text, "\n \t"))
	}
	return out.String(), notes, nil
}

// parseDocument checks that a rendered piece is a Kubernetes object; nil for an empty piece.
func parseDocument(source string, index int, text string) (*document, error) {
	var parsed interface{}
	if err := yaml.Unmarshal([]byte(text), &parsed); err != nil {
		return nil, fmt.Errorf("YAML parse error on %s (document %d): %v", source, index, err)
	}
	if parsed == nil {
		return nil, nil // only whitespace and comments
	}
	obj, ok := parsed.(map[interface{}]interface{})
	if !ok {
		return nil, fmt.Errorf("%s (document %d): not a YAML mapping", source, index)
	}
	apiVersion, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	meta, _ := obj["metadata"].(map[interface{}]interface{})
	name := ""
	if meta != nil {
		name, _ = meta["name"].(string)
	}
	switch {
	case apiVersion == "":
		return nil, fmt.Errorf("%s (document %d): apiVersion missing", source, index)
	case kind == "":
		return nil, fmt.Errorf("%s (document %d): kind missing", source, index)
	case name == "":
		return nil, fmt.Errorf("%s (document %d): metadata.name missing", source, index)
	}
	return &document{source: source, kind: kind, name: name, text: strings.TrimLeft(text, "\n")}, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
