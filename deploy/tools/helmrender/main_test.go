package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeChart makes a chart directory from file name -> contents.
func writeChart(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func render(t *testing.T, dir string, strict bool, extra ...map[string]interface{}) (string, error) {
	t.Helper()
	c, err := loadChart(dir)
	if err != nil {
		return "", err
	}
	values := c.values
	for _, e := range extra {
		values = coalesce(values, e)
	}
	r, err := newRenderer(c, strict)
	if err != nil {
		return "", err
	}
	out, _, err := r.renderAll(map[string]interface{}{
		"Values": values, "Chart": c.meta, "Files": c.files,
		"Release":      map[string]interface{}{"Name": "rel", "Namespace": "ns"},
		"Capabilities": &Capabilities{APIVersions: VersionSet{"v1"}},
	})
	return out, err
}

const chartYAML = "apiVersion: v2\nname: demo\nversion: 0.1.0\nappVersion: \"1.0\"\n"

func TestRendersLikeHelm(t *testing.T) {
	dir := writeChart(t, map[string]string{
		"Chart.yaml": chartYAML,
		"values.yaml": "port: 50051\nbig: 1000000\nlabels:\n  b: two\n  a: one\n" +
			"list: [x, \"on\"]\nname: \"\"\n",
		"templates/_helpers.tpl": `{{- define "demo.name" -}}{{ .Chart.Name }}-{{ .Release.Name }}{{- end }}`,
		"templates/cm.yaml": `apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ include "demo.name" . }}
  labels: {{- toYaml .Values.labels | nindent 4 }}
data:
  port: {{ .Values.port | quote }}
  big: {{ .Values.big | quote }}
  list: {{ toJson .Values.list | quote }}
  name: {{ .Values.name | default "fallback" | quote }}
  tpl: {{ tpl "{{ .Release.Namespace }}" . | quote }}
  has: {{ .Capabilities.APIVersions.Has "v1" | quote }}
`,
		"templates/svc.yaml":  "apiVersion: v1\nkind: Service\nmetadata:\n  name: s\n",
		"templates/NOTES.txt": "notes for {{ .Release.Name }}\n",
	})
	out, err := render(t, dir, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"# Source: demo/templates/cm.yaml\n",
		"name: demo-rel\n",
		"  labels:\n    a: one\n    b: two\n", // toYaml sorts keys
		`port: "50051"`,
		`big: "1e+06"`, // numbers in values are float64, as in Helm
		`list: "[\"x\",\"on\"]"`,
		`name: "fallback"`,
		`tpl: "ns"`,
		`has: "true"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Helm installs ConfigMaps before Services, whatever the file order.
	if strings.Index(out, "kind: ConfigMap") > strings.Index(out, "kind: Service") {
		t.Errorf("ConfigMap should precede Service:\n%s", out)
	}
	if strings.Contains(out, "notes for") {
		t.Errorf("NOTES.txt leaked into the manifests")
	}
}

func TestStrictMissingValue(t *testing.T) {
	dir := writeChart(t, map[string]string{
		"Chart.yaml":  chartYAML,
		"values.yaml": "a: {}\n",
		"templates/x.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n" +
			"data:\n  v: \"{{ .Values.a.missing }}\"\n",
	})
	if _, err := render(t, dir, true); err == nil {
		t.Fatal("strict render of a missing value succeeded")
	}
	out, err := render(t, dir, false)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `v: ""`) {
		t.Errorf("non-strict render should print an empty value:\n%s", out)
	}
}

func TestRequiredAndFail(t *testing.T) {
	dir := writeChart(t, map[string]string{
		"Chart.yaml":  chartYAML,
		"values.yaml": "image: \"\"\n",
		"templates/x.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n" +
			"data:\n  image: {{ required \"image is required\" .Values.image }}\n",
	})
	_, err := render(t, dir, true)
	if err == nil || !strings.Contains(err.Error(), "image is required") {
		t.Fatalf("want the required message, got %v", err)
	}
}

func TestOverridesMergeAndNullDeletes(t *testing.T) {
	dir := writeChart(t, map[string]string{
		"Chart.yaml":  chartYAML,
		"values.yaml": "res:\n  cpu: 1\n  memory: 1Gi\n",
		"templates/x.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n" +
			"data: {{- toYaml .Values.res | nindent 2 }}\n",
	})
	out, err := render(t, dir, true, map[string]interface{}{
		"res": map[string]interface{}{"cpu": nil, "memory": "2Gi"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "cpu") || !strings.Contains(out, "memory: 2Gi") {
		t.Errorf("want cpu deleted and memory overridden:\n%s", out)
	}
}

func TestRejectsDocumentsThatAreNotObjects(t *testing.T) {
	for name, body := range map[string]string{
		"no kind":    "apiVersion: v1\nmetadata:\n  name: x\n",
		"no name":    "apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n",
		"bad yaml":   "apiVersion: v1\nkind: [\n",
		"not a map":  "- a\n- b\n",
		"no version": "kind: ConfigMap\nmetadata:\n  name: x\n",
	} {
		dir := writeChart(t, map[string]string{
			"Chart.yaml": chartYAML, "values.yaml": "", "templates/x.yaml": body,
		})
		if _, err := render(t, dir, false); err == nil {
			t.Errorf("%s: rendered without error", name)
		}
	}
}

func TestEmptyDocumentsAreSkipped(t *testing.T) {
	dir := writeChart(t, map[string]string{
		"Chart.yaml":  chartYAML,
		"values.yaml": "enabled: false\n",
		"templates/x.yaml": "{{- if .Values.enabled }}\napiVersion: v1\nkind: ConfigMap\n" +
			"metadata:\n  name: x\n{{- end }}\n---\n# only a comment\n",
	})
	out, err := render(t, dir, true)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out) != "" {
		t.Errorf("want no output, got:\n%s", out)
	}
}

func TestSetValue(t *testing.T) {
	v := map[string]interface{}{"a": map[string]interface{}{"b": "x"}}
	for _, s := range []string{"a.b=7", "a.c=true", "d.e=str"} {
		if err := setValue(v, s); err != nil {
			t.Fatal(err)
		}
	}
	a := v["a"].(map[string]interface{})
	if a["b"] != int64(7) || a["c"] != true || v["d"].(map[string]interface{})["e"] != "str" {
		t.Errorf("unexpected values %v", v)
	}
	if err := setValue(v, "novalue"); err == nil {
		t.Error("want an error for a --set without =")
	}
}
