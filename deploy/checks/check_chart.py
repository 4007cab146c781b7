#!/usr/bin/python3
"""Checks the Helm chart deploy/helm/kvpool by rendering it (Helm is not in Debian 12, so with
deploy/tools/helmrender, a renderer of Go templates with Helm's functions built from Debian's Go
packages) for several sets of values, and then:

  check_chart.py [--helmrender BIN]            structure: every object and the fields kvpool
      needs (images, commands and flags, ports, probe paths, volumes, resources, huge pages,
      host network, ServiceMonitor, PrometheusRule), cross-checked with the binaries' flags (the
      built binaries parse the rendered flags), the Dockerfile's user and the compose/Prometheus
      job names; renders that must fail do; values.yaml documents every value.
  check_chart.py --kubectl [--helmrender BIN]  kubectl parses every rendered object client-side
      (`kubectl label --local`), and decodes Deployments, DaemonSets and Services into its typed
      API structs (`kubectl set env|selector --local`), which reports wrong types; a field that
      does not survive that round trip is unknown to Kubernetes (a misspelling). No cluster is
      contacted. Exits 77 (skipped) when kubectl is not installed.
"""

import argparse
import copy
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

import yaml

import deploylib as lib
from deploylib import ROOT

CHART = ROOT / "deploy/helm/kvpool"
HP_VALUES = ROOT / "deploy/checks/values-hugepages-hostnetwork.yaml"
NAMESPACE = "kvpool-test"
RELEASE = "pool"
ENV_SAMPLES = {"POD_IP": "10.1.2.3", "NODE_NAME": "node-a"}
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

# (name, helmrender arguments) of the renders that must succeed.
CASES = [
    ("default values", []),
    ("hugepages and hostNetwork", ["-f", str(HP_VALUES)]),
    ("embedded segment only", ["--set", "segment.enabled=false",
                               "--set", "master.embeddedSegment.sizeMiB=1024"]),
    ("three masters with the chart's etcd", ["--set", "highAvailability.enabled=true"]),
    ("three masters with an external etcd", ["--set", "highAvailability.enabled=true",
                                             "--set", "highAvailability.etcd.endpoints=e1:2379,e2:2379"]),
    ("cert-manager installed", ["--api-versions", "cert-manager.io/v1"]),
    ("certificates and tokens from Secrets", ["--set", "tls.source=secret",
                                              "--set", "tls.existingSecret=my-tls",
                                              "--set", "auth.existingSecret=my-auth"]),
    ("no TLS, no tokens, insecure", ["--set", "tls.enabled=false", "--set", "auth.enabled=false",
                                     "--set", "insecure=true"]),
]
# (helmrender arguments, text the error must contain) of the renders that must fail.
FAILING = [
    (["--set", "highAvailability.enabled=true", "--set", "master.embeddedSegment.sizeMiB=64"],
     "needs master.embeddedSegment.sizeMiB 0"),
    (["--set", "highAvailability.enabled=true", "--set", "highAvailability.replicas=1"],
     "at least 2"),
    (["--set", "segment.enabled=false"], "the pool has no memory"),
    (["--set", "segment.hugepages.enabled=true", "--set", "segment.pool.sizeMiB=1025"],
     "multiple of 2"),
    (["--set", "segment.resources.requests.memory=1Gi"], "do not set memory"),
    (["--set", "image.repository="], "image.repository is required"),
    (["--set", "tls.enabled=false"], "set insecure=true to mean it"),
    (["--set", "auth.enabled=false"], "set insecure=true to mean it"),
    (["--set", "tls.source=secret"], "tls.existingSecret is required"),
    (["--set", "tls.source=vault"], "is not auto, certManager, helm or secret"),
]


# --- rendering ---------------------------------------------------------------------------------

def helmrender_path(arg):
    path = arg or os.environ.get("KVPOOL_HELMRENDER")
    if path and os.path.exists(path):
        return path
    built = ROOT / "build/deploy/helmrender"
    if not built.exists():
        subprocess.run([str(ROOT / "deploy/checks/build_helmrender.sh"), str(built)], check=True)
    return str(built)


def render(helmrender, extra, notes=False):
    """(returncode, manifests, stderr, notes text)."""
    with tempfile.TemporaryDirectory() as tmp:
        notes_file = os.path.join(tmp, "NOTES.txt")
        argv = [helmrender, "--strict", "--release-name", RELEASE, "--namespace", NAMESPACE,
                "--notes", notes_file] + extra + [str(CHART)]
        r = subprocess.run(argv, capture_output=True, text=True)
        text = open(notes_file).read() if os.path.exists(notes_file) else ""
        return r.returncode, r.stdout, r.stderr, text


def effective_values(extra):
    """values.yaml with the case's -f files and --set values merged, as the renderer does."""
    values = lib.load_yaml(CHART / "values.yaml")

    def merge(dst, src):
        for k, v in src.items():
            if v is None:
                dst.pop(k, None)
            elif isinstance(v, dict) and isinstance(dst.get(k), dict):
                merge(dst[k], v)
            else:
                dst[k] = v

    i = 0
    while i < len(extra):
        if extra[i] == "-f":
            merge(values, lib.load_yaml(extra[i + 1]) or {})
        elif extra[i] == "--set":
            key, _, raw = extra[i + 1].partition("=")
            value = {"true": True, "false": False}.get(raw, int(raw) if raw.isdigit() else raw)
            node = values
            parts = key.split(".")
            for p in parts[:-1]:
                node = node.setdefault(p, {})
            node[parts[-1]] = value
        i += 2
    return values


# --- helpers over rendered objects -------------------------------------------------------------

def by_kind(objects, kind):
    return [o for o in objects if o.get("kind") == kind]


def one(c, objects, kind, component=None):
    found = [o for o in by_kind(objects, kind)
             if component is None or
             o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component]
    c.check(len(found) == 1, f"want one {kind}{' ' + component if component else ''}, "
            f"got {len(found)}")
    return found[0] if found else None


def dig(obj, *path, default=None):
    for p in path:
        if isinstance(obj, dict) and p in obj:
            obj = obj[p]
        elif isinstance(obj, list) and isinstance(p, int) and p < len(obj):
            obj = obj[p]
        else:
            return default
    return obj


def mebibytes(quantity):
    m = re.fullmatch(r"(\d+)Mi", str(quantity))
    return int(m.group(1)) if m else None


def dockerfile_uid():
    text = (ROOT / "deploy/docker/Dockerfile").read_text(encoding="utf-8")
    users = re.findall(r"^USER\s+(\d+)", text, re.M)
    return int(users[-1]) if users else None


def prometheus_jobs():
    config = lib.load_yaml(ROOT / "deploy/prometheus/prometheus.yml")
    return {s["job_name"] for s in config.get("scrape_configs", [])}


# --- structural checks -------------------------------------------------------------------------

# Fields of the kinds kubectl cannot decode into typed structs here (its typed round trip covers
# Deployments, DaemonSets and Services): the ones this chart may use, by path.
KNOWN_FIELDS = {
    "ConfigMap": {"": {"apiVersion", "kind", "metadata", "data", "binaryData", "immutable"}},
    "ServiceAccount": {"": {"apiVersion", "kind", "metadata", "automountServiceAccountToken",
                            "imagePullSecrets", "secrets"}},
    "ServiceMonitor": {
        "": {"apiVersion", "kind", "metadata", "spec"},
        "spec": {"jobLabel", "targetLabels", "podTargetLabels", "endpoints", "selector",
                 "namespaceSelector", "sampleLimit", "attachMetadata"},
        "spec.endpoints": {"port", "targetPort", "path", "scheme", "params", "interval",
                           "scrapeTimeout", "honorLabels", "honorTimestamps", "relabelings",
                           "metricRelabelings", "tlsConfig", "bearerTokenSecret", "followRedirects",
                           "enableHttp2", "filterRunning"},
    },
    "PrometheusRule": {"": {"apiVersion", "kind", "metadata", "spec"}, "spec": {"groups"}},
    "Secret": {"": {"apiVersion", "kind", "metadata", "type", "data", "stringData", "immutable"}},
    "Issuer": {"": {"apiVersion", "kind", "metadata", "spec"}, "spec": {"selfSigned", "ca"}},
    "Certificate": {
        "": {"apiVersion", "kind", "metadata", "spec"},
        "spec": {"isCA", "commonName", "secretName", "duration", "renewBefore", "privateKey",
                 "usages", "dnsNames", "ipAddresses", "issuerRef", "subject"},
        "spec.privateKey": {"algorithm", "size", "encoding", "rotationPolicy"},
        "spec.issuerRef": {"name", "kind", "group"},
    },
}
METADATA_FIELDS = {"name", "labels", "annotations"}


def check_known_fields(c, case, o):
    kind, name = o.get("kind"), o["metadata"]["name"]
    c.check(set(o["metadata"]) <= METADATA_FIELDS,
            f"{case}: {kind}/{name} metadata has unknown fields {set(o['metadata']) - METADATA_FIELDS}")
    for path, allowed in KNOWN_FIELDS.get(kind, {}).items():
        node = o
        for part in filter(None, path.split(".")):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        for item in node if isinstance(node, list) else [node]:
            extra = set(item) - allowed if isinstance(item, dict) else set()
            c.check(not extra, f"{case}: {kind}/{name} {path or 'top level'}: unknown fields {extra}")
    if kind == "ConfigMap":
        c.check(all(isinstance(v, str) for v in o.get("data", {}).values()),
                f"{case}: ConfigMap/{name} data values must be strings")


def check_metadata(c, case, objects):
    seen = set()
    for o in objects:
        check_known_fields(c, case, o)
        kind, meta = o.get("kind"), o.get("metadata", {})
        name = meta.get("name", "")
        key = (kind, name)
        c.check(key not in seen, f"{case}: duplicate {kind}/{name}")
        seen.add(key)
        c.check(len(name) <= 63 and bool(DNS_SUBDOMAIN.match(name)),
                f"{case}: {kind} name {name!r} is not a DNS name of at most 63 characters")
        if kind == "Service":
            c.check(bool(DNS_LABEL.match(name)), f"{case}: Service name {name!r} is not a DNS label")
        c.check("namespace" not in meta, f"{case}: {kind}/{name} hard-codes a namespace")
        labels = meta.get("labels", {})
        for required in ("app.kubernetes.io/name", "app.kubernetes.io/instance",
                         "app.kubernetes.io/managed-by", "helm.sh/chart"):
            c.check(required in labels, f"{case}: {kind}/{name} lacks label {required}")
        for k, v in labels.items():
            c.check(isinstance(v, str) and len(v) <= 63 and bool(LABEL_VALUE.match(v)),
                    f"{case}: {kind}/{name} label {k}={v!r} is not a valid label value")


def check_workload(c, case, objects, workload, binary, values, expect):
    """Checks a Deployment or DaemonSet running `binary`; returns its container or None."""
    if workload is None:
        return None
    kind, name = workload["kind"], workload["metadata"]["name"]
    what = f"{case}: {kind}/{name}"
    spec = workload["spec"]
    template = spec["template"]
    pod = template["spec"]
    selector = dig(spec, "selector", "matchLabels", default={})
    labels = dig(template, "metadata", "labels", default={})
    c.check(bool(selector) and all(labels.get(k) == v for k, v in selector.items()),
            f"{what}: selector {selector} does not match the pod labels {labels}")
    c.check(re.fullmatch(r"[0-9a-f]{64}",
                         str(dig(template, "metadata", "annotations", "checksum/config"))) is not None,
            f"{what}: pods lack the checksum/config annotation (config changes would not roll them)")
    containers = pod.get("containers", [])
    c.check(len(containers) == 1, f"{what}: want one container")
    if not containers:
        return None
    ctr = containers[0]
    c.check(ctr.get("image") == expect["image"], f"{what}: image {ctr.get('image')!r}, "
            f"want {expect['image']!r}")
    c.check(ctr.get("command") == [binary], f"{what}: command {ctr.get('command')}, want [{binary}]")
    c.check(pod.get("automountServiceAccountToken") is False,
            f"{what}: pods need no Kubernetes API token; set automountServiceAccountToken false")
    sa = pod.get("serviceAccountName")
    c.check(sa in {o["metadata"]["name"] for o in by_kind(objects, "ServiceAccount")} or
            not values["serviceAccount"]["create"],
            f"{what}: service account {sa} is not rendered")

    # Security: the image's non-root user.
    sc = ctr.get("securityContext", {})
    c.check(sc.get("runAsNonRoot") is True and sc.get("runAsUser") == dockerfile_uid(),
            f"{what}: runAsNonRoot/runAsUser must match the Dockerfile's USER {dockerfile_uid()}")
    c.check(sc.get("allowPrivilegeEscalation") is False and sc.get("readOnlyRootFilesystem") is True,
            f"{what}: want allowPrivilegeEscalation false and readOnlyRootFilesystem true")

    # Ports.
    ports = {p.get("name"): p for p in ctr.get("ports", [])}
    for port_name, number in expect["ports"].items():
        c.check(dig(ports, port_name, "containerPort") == number,
                f"{what}: container port {port_name} should be {number}, "
                f"got {dig(ports, port_name, 'containerPort')}")
    for p in ctr.get("ports", []):
        c.check(p.get("protocol") == "TCP", f"{what}: port {p.get('name')} should be TCP")
        if expect.get("host_network"):
            c.check(p.get("hostPort") == p.get("containerPort"),
                    f"{what}: with hostNetwork, hostPort must equal containerPort ({p.get('name')})")
        else:
            c.check("hostPort" not in p, f"{what}: hostPort {p.get('name')} without hostNetwork")

    # Probes: paths fixed, ports named and present.
    for probe, path in expect["probes"].items():
        get = dig(ctr, probe, "httpGet", default={})
        c.check(get.get("path") == path, f"{what}: {probe} path {get.get('path')!r}, want {path!r}")
        c.check(get.get("port") == "http" and "http" in ports,
                f"{what}: {probe} must use the container's named port http")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        if probe in ctr and probe not in expect["probes"]:
            c.fail(f"{what}: unexpected {probe}")

    # Volumes and mounts.
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = {m["mountPath"]: m for m in ctr.get("volumeMounts", [])}
    for m in ctr.get("volumeMounts", []):
        c.check(m["name"] in volumes, f"{what}: mount {m['mountPath']} names no volume {m['name']}")
    for path, (volume_kind, medium) in expect["volumes"].items():
        mount = mounts.get(path)
        c.check(mount is not None, f"{what}: nothing mounted at {path}")
        volume = volumes.get(mount["name"]) if mount else None
        c.check(volume is not None and volume_kind in volume,
                f"{what}: {path} should be a {volume_kind} volume")
        if volume is not None and medium is not None:
            c.check(dig(volume, "emptyDir", "medium") == medium,
                    f"{what}: {path} should be an emptyDir of medium {medium}")
    for path in mounts:
        c.check(path in expect["volumes"], f"{what}: unexpected mount at {path}")

    # Resources.
    res = ctr.get("resources", {})
    requests, limits = res.get("requests", {}), res.get("limits", {})
    c.check("cpu" in requests, f"{what}: no CPU request")
    c.check(mebibytes(requests.get("memory")) == expect["memory_mib"] and
            mebibytes(limits.get("memory")) == expect["memory_mib"],
            f"{what}: memory request and limit should be {expect['memory_mib']}Mi, got "
            f"{requests.get('memory')} and {limits.get('memory')}")
    hp = expect.get("hugepages_mib", 0)
    if hp:
        c.check(mebibytes(requests.get("hugepages-2Mi")) == hp and
                mebibytes(limits.get("hugepages-2Mi")) == hp,
                f"{what}: hugepages-2Mi request and limit should be {hp}Mi")
    else:
        c.check(not any(k.startswith("hugepages") for k in list(requests) + list(limits)),
                f"{what}: huge pages requested but not enabled")

    # Host network.
    c.check(bool(pod.get("hostNetwork", False)) == bool(expect.get("host_network")),
            f"{what}: hostNetwork should be {bool(expect.get('host_network'))}")
    if expect.get("host_network"):
        c.check(pod.get("dnsPolicy") == "ClusterFirstWithHostNet",
                f"{what}: with hostNetwork, dnsPolicy must be ClusterFirstWithHostNet to resolve "
                f"the master's Service name")

    # Command line: the flag file from the ConfigMap, then the pod's own flags.
    args = ctr.get("args", [])
    env_names = [e["name"] for e in ctr.get("env", [])]
    for a in args:
        for var in re.findall(r"\$\((\w+)\)", a):
            c.check(var in env_names, f"{what}: argument {a} uses $({var}), not in the env")
    flagfile = args[0] if args else ""
    m = re.fullmatch(r"--flagfile=(/[\w/.-]+)/([\w.-]+)", flagfile)
    c.check(m is not None, f"{what}: the first argument should be --flagfile=DIR/FILE")
    flag_text = None
    if m:
        mount = mounts.get(m.group(1))
        volume = volumes.get(mount["name"]) if mount else None
        cm_name = dig(volume, "configMap", "name")
        cms = {o["metadata"]["name"]: o for o in by_kind(objects, "ConfigMap")}
        c.check(cm_name in cms, f"{what}: {m.group(1)} is not a mounted ConfigMap that exists")
        flag_text = dig(cms.get(cm_name, {}), "data", m.group(2))
        c.check(isinstance(flag_text, str), f"{what}: ConfigMap {cm_name} has no key {m.group(2)}")
    return {"container": ctr, "pod": pod, "args": args, "flag_text": flag_text, "what": what}


def flag_lines(text):
    return [l.strip() for l in (text or "").splitlines()
            if l.strip() and not l.strip().startswith("#")]


def check_flags(c, binary, run):
    """The flags a pod starts with exist in the sources and parse in the built binary."""
    if run is None or run["flag_text"] is None:
        return {}
    known = lib.source_flags(binary)
    file_flags = flag_lines(run["flag_text"])
    for f in file_flags:
        name = f.lstrip("-").split("=", 1)[0]
        c.check("-" not in name, f"{run['what']}: flag file line {f}: Abseil flag files need "
                f"underscores in names")
        c.check(name in known, f"{run['what']}: {f} is not a flag of {binary}")
    args = [re.sub(r"\$\((\w+)\)", lambda m: ENV_SAMPLES.get(m.group(1), "x"), a)
            for a in run["args"][1:]]
    for a in args:
        c.check(lib.flag_name(a) in known, f"{run['what']}: argument {a} is not a flag of {binary}")
    try:
        problem = lib.check_flags_with_binary(binary, args, run["flag_text"])
        c.check(problem is None, f"{run['what']}: {binary} rejects its flags: {problem}")
    except LookupError:
        c.note(f"{binary} is not built: flags checked against its sources only")
    return {**{f.lstrip("-").split("=", 1)[0]: f.split("=", 1)[1] for f in file_flags if "=" in f},
            **{lib.flag_name(a): a.split("=", 1)[1] for a in args if "=" in a}}


def check_service(c, case, service, workload, run, expect_ports):
    if service is None or workload is None or run is None:
        return
    what = f"{case}: Service/{service['metadata']['name']}"
    labels = workload["spec"]["template"]["metadata"]["labels"]
    selector = service["spec"].get("selector", {})
    c.check(bool(selector) and all(labels.get(k) == v for k, v in selector.items()),
            f"{what}: selector {selector} selects no pod of {workload['metadata']['name']}")
    ports = {p["name"]: p for p in run["container"].get("ports", [])}
    got = {}
    for p in service["spec"].get("ports", []):
        target = p.get("targetPort")
        c.check(target in ports, f"{what}: targetPort {target} is not a container port")
        if target in ports:
            c.check(ports[target]["containerPort"] == p["port"],
                    f"{what}: port {p['name']} {p['port']} differs from the container's "
                    f"{ports[target]['containerPort']}")
        got[p["name"]] = p["port"]
    c.check(got == expect_ports, f"{what}: ports {got}, want {expect_ports}")


# --- security: TLS and tokens ------------------------------------------------------------------

TLS_DIR, AUTH_DIR = "/etc/kvpool-tls", "/etc/kvpool-auth"


def tls_source(v, extra):
    """Where the master's certificate comes from in this render, None with TLS off."""
    if not v["tls"]["enabled"]:
        return None
    source = v["tls"]["source"]
    if source == "auto":
        source = "certManager" if "cert-manager.io/v1" in extra else "helm"
    return source


def secret_mounts(v):
    mounts = {}
    if v["tls"]["enabled"]:
        mounts[TLS_DIR] = ("secret", None)
    if v["auth"]["enabled"]:
        mounts[AUTH_DIR] = ("secret", None)
    return mounts


def projected(run, directory):
    """{file: (secret, key)} of the Secret volume mounted at `directory` in run's pod."""
    mount = next((m for m in run["container"].get("volumeMounts", [])
                  if m["mountPath"] == directory), None)
    volume = next((x for x in run["pod"].get("volumes", [])
                   if mount and x["name"] == mount["name"]), None)
    secret = dig(volume, "secret", default={})
    return {i["path"]: (secret.get("secretName"), i["key"]) for i in secret.get("items", [])}


def file_from(run, path):
    """(secret, key) a pod's file comes from, or None."""
    directory, _, name = (path or "").rpartition("/")
    return projected(run, directory).get(name)


def env_value(run, name):
    return next((e.get("value") for e in run["container"].get("env", []) if e["name"] == name),
                None)


def openssl(*args, stdin=None):
    return subprocess.run(["openssl", *args], capture_output=True, text=True, input=stdin)


def check_security(c, case, objects, v, source, mrun, mflags, srun, sflags, master_host):
    """TLS and tokens are on unless insecure=true says otherwise, every pod gets its files from
    a Secret that the render (or the user) provides, and a segment gets no more than it needs."""
    import base64
    runs = [(mrun, mflags, "master")] + ([(srun, sflags, "segment")] if srun else [])
    for run, flags, name in runs:
        if run is None:
            continue
        c.check(("insecure" in flags) == bool(v["insecure"]),
                f"{case}: {name} gets --insecure {'without' if 'insecure' in flags else 'with'} "
                f"insecure=true")
        if not source:
            c.check(not any(f.startswith("tls_") and f != "tls_reload_interval" for f in flags),
                    f"{case}: {name} has TLS flags with tls.enabled=false")
        if not v["auth"]["enabled"]:
            c.check(not any(f.startswith(("auth_", "http_token")) for f in flags),
                    f"{case}: {name} has token flags with auth.enabled=false")
    if mrun is None:
        return
    secrets = {o["metadata"]["name"]: o for o in by_kind(objects, "Secret")}
    decoded = {}
    if source:
        tls_secret = (file_from(mrun, mflags.get("tls_cert")) or (None,))[0]
        c.check(file_from(mrun, mflags.get("tls_cert")) == (tls_secret, "tls.crt") and
                file_from(mrun, mflags.get("tls_key")) == (tls_secret, "tls.key") and
                file_from(mrun, env_value(mrun, "KVPOOL_TLS_CA")) == (tls_secret, "ca.crt"),
                f"{case}: the master's --tls-cert/--tls-key and KVPOOL_TLS_CA are not tls.crt, "
                f"tls.key and ca.crt of one Secret ({mflags.get('tls_cert')}, "
                f"{mflags.get('tls_key')})")
        if srun:
            c.check(file_from(srun, sflags.get("tls_ca")) == (tls_secret, "ca.crt"),
                    f"{case}: segment --tls-ca {sflags.get('tls_ca')} is not ca.crt of {tls_secret}")
            c.check(set(projected(srun, TLS_DIR)) == {"ca.crt"},
                    f"{case}: segments get {sorted(projected(srun, TLS_DIR))} of the TLS Secret; "
                    f"they need only ca.crt (never the master's key)")
        if source == "secret":
            c.check(tls_secret == v["tls"]["existingSecret"] and tls_secret not in secrets,
                    f"{case}: the pods should use tls.existingSecret {v['tls']['existingSecret']}, "
                    f"got {tls_secret}")
        elif source == "certManager":
            certs = {dig(o, "spec", "secretName"): o for o in by_kind(objects, "Certificate")}
            issuers = {o["metadata"]["name"]: o for o in by_kind(objects, "Issuer")}
            cert = certs.get(tls_secret)
            c.check(cert is not None, f"{case}: no cert-manager Certificate makes {tls_secret}")
            if cert:
                c.check(master_host in dig(cert, "spec", "dnsNames", default=[]) and
                        "127.0.0.1" in dig(cert, "spec", "ipAddresses", default=[]),
                        f"{case}: the master's Certificate lacks {master_host} or 127.0.0.1: "
                        f"{dig(cert, 'spec', 'dnsNames')}")
                c.check("server auth" in dig(cert, "spec", "usages", default=[]),
                        f"{case}: the master's Certificate needs usage 'server auth'")
                ca_issuer = issuers.get(dig(cert, "spec", "issuerRef", "name"))
                ca_cert = certs.get(dig(ca_issuer, "spec", "ca", "secretName"))
                root = issuers.get(dig(ca_cert, "spec", "issuerRef", "name"))
                c.check(dig(ca_cert, "spec", "isCA") is True and
                        dig(root, "spec", "selfSigned") == {},
                        f"{case}: the master's Certificate is not signed by a CA Issuer whose "
                        f"CA Certificate is self-signed")
        elif source == "helm":
            secret = secrets.get(tls_secret)
            c.check(secret is not None and secret.get("type") == "kubernetes.io/tls" and
                    set(secret.get("data", {})) == {"tls.crt", "tls.key", "ca.crt"},
                    f"{case}: Secret {tls_secret} should be kubernetes.io/tls with tls.crt, "
                    f"tls.key and ca.crt")
            if secret:
                with tempfile.TemporaryDirectory() as tmp:
                    for key, value in secret.get("data", {}).items():
                        decoded[(tls_secret, key)] = base64.b64decode(value)
                        pathlib.Path(tmp, key).write_bytes(decoded[(tls_secret, key)])
                    r = openssl("verify", "-CAfile", f"{tmp}/ca.crt", f"{tmp}/tls.crt")
                    c.check(r.returncode == 0, f"{case}: the generated certificate does not "
                            f"verify against the generated CA: {r.stdout}{r.stderr}")
                    r = openssl("x509", "-in", f"{tmp}/tls.crt", "-noout", "-ext",
                                "subjectAltName")
                    c.check(f"DNS:{master_host}" in r.stdout and "IP Address:127.0.0.1" in r.stdout,
                            f"{case}: the generated certificate's SANs lack {master_host} or "
                            f"127.0.0.1: {r.stdout.strip()}")
    if v["auth"]["enabled"]:
        auth_secret = (file_from(mrun, mflags.get("auth_tokens")) or (None,))[0]
        want = v["auth"]["existingSecret"] or f"{RELEASE}-kvpool-auth"
        c.check(auth_secret == want and
                file_from(mrun, mflags.get("auth_tokens")) == (want, "tokens") and
                file_from(mrun, env_value(mrun, "KVPOOL_AUTH_TOKEN_FILE")) == (want, "admin.token"),
                f"{case}: the master's --auth-tokens and KVPOOL_AUTH_TOKEN_FILE should be tokens "
                f"and admin.token of Secret {want}")
        if srun:
            c.check(file_from(srun, sflags.get("auth_token_file")) == (want, "segment.token") and
                    file_from(srun, sflags.get("http_token_file")) == (want, "reader.token") and
                    set(projected(srun, AUTH_DIR)) == {"segment.token", "reader.token"},
                    f"{case}: segments should get only segment.token (--auth-token-file) and "
                    f"reader.token (--http-token-file) of {want}, got "
                    f"{sorted(projected(srun, AUTH_DIR))}")
        for sm in by_kind(objects, "ServiceMonitor"):
            for ep in dig(sm, "spec", "endpoints", default=[]):
                c.check(ep.get("bearerTokenSecret") == {"name": want, "key": "reader.token"},
                        f"{case}: the ServiceMonitor should scrape with reader.token of {want}")
        secret = secrets.get(want)
        c.check((secret is None) == bool(v["auth"]["existingSecret"]),
                f"{case}: Secret {want} should be rendered exactly when auth.existingSecret is empty")
        if secret:
            data = {k: base64.b64decode(x).decode() for k, x in secret.get("data", {}).items()}
            decoded.update({(want, k): x.encode() for k, x in data.items()})
            rules = {}
            for line in data.get("tokens", "").splitlines():
                fields = line.split("#", 1)[0].split()
                if fields:
                    c.check(fields[0] == "token" and len(fields) in (4, 5),
                            f"{case}: bad line in the generated credentials file: {line}")
                    rules[fields[1]] = fields[2:4]
            for file, identity, role in (("segment.token", "*", "segment"),
                                         ("admin.token", "admin", "admin"),
                                         ("engine.token", "engine", "engine"),
                                         ("reader.token", "prometheus", "reader")):
                token = data.get(file, "")
                c.check(len(token) >= 32 and rules.get(token) == [identity, role],
                        f"{case}: {file} should be a random token of identity {identity}, role "
                        f"{role} in the credentials file")
    if case == "default values" and source == "helm" and srun:
        run_rendered_pool(c, case, mrun, srun, decoded, master_host)


def run_rendered_pool(c, case, mrun, srun, files, master_host):
    """Runs the built kvpool-master and kvpool-segment with the rendered flag files and the
    rendered Secrets' files (paths moved to a temporary directory, ports 0, a small pool), and
    checks that the segment mounts over TLS with its token and that kvpoolctl with the master
    pod's environment sees it, while kvpoolctl without a token or without TLS is refused."""
    binaries = {b: lib.binary_path(b) for b in ("kvpool-master", "kvpool-segment", "kvpoolctl")}
    if not all(binaries.values()):
        c.note("kvpool-master/segment/kvpoolctl not built: the rendered pool was not started")
        return
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        def materialise(run, tag):
            moved = {}
            for directory in (TLS_DIR, AUTH_DIR):
                here = pathlib.Path(tmp, tag + directory.replace("/", "_"))
                here.mkdir()
                for name, ref in projected(run, directory).items():
                    (here / name).write_bytes(files.get(ref, b""))
                moved[directory] = str(here)
            text = run["flag_text"]
            for directory, here in moved.items():
                text = text.replace(directory + "/", here + "/")
            return text, moved

        def flagfile(text, replace, tag):
            lines = []
            for line in text.splitlines():
                name = line.strip().lstrip("-").split("=", 1)[0]
                lines.append(f"--{name}={replace[name]}" if name in replace else line)
            path = pathlib.Path(tmp, tag + ".flags")
            path.write_text("\n".join(lines) + "\n")
            return str(path)

        try:
            mtext, mdirs = materialise(mrun, "master")
            # 0.0.0.0: not loopback, so the master starts only because TLS and tokens are on.
            mflag = flagfile(mtext, {"listen": "0.0.0.0:0", "http_listen": "0.0.0.0:0"},
                             "master")
            master, m, seen = lib.start_process(
                [binaries["kvpool-master"], f"--flagfile={mflag}"],
                r"listening grpc=\S*:(\d+) http=\S*:(\d+) .*tls=on auth=on http_auth=on")
            procs.append(master)
            if not c.check(m is not None, f"{case}: kvpool-master with the rendered flags did not "
                           f"start with tls=on auth=on: {''.join(seen)[-800:]}"):
                return
            port, master_http = m.group(1), m.group(2)
            stext, _ = materialise(srun, "segment")
            sflag = flagfile(stext, {"master": f"127.0.0.1:{port}", "listen": "0.0.0.0:0",
                                     "http_listen": "0.0.0.0:0", "size": "64MiB",
                                     "prefault": "false"}, "segment")
            # The pods dial the Service's name: check the certificate against it.
            segment, m, seen = lib.start_process(
                [binaries["kvpool-segment"], f"--flagfile={sflag}", "--name=node-a",
                 "--advertise-host=127.0.0.1", f"--tls_server_name={master_host}"],
                r"kvpool-segment listening .*http=\S*:(\d+)")
            procs.append(segment)
            if not c.check(m is not None, f"{case}: kvpool-segment with the rendered flags did "
                           f"not mount: {''.join(seen)[-800:]}"):
                return
            # What the ServiceMonitor's scrape sees: /metrics with reader.token, not without.
            reader = files.get(file_from(srun, f"{AUTH_DIR}/reader.token"), b"").decode()
            for who, http_port in (("master", master_http), ("segment", m.group(1))):
                status, _ = lib.http_get(f"127.0.0.1:{http_port}", "/metrics")
                c.check(status == 401, f"{case}: {who} /metrics without a token answered {status}")
                status, body = lib.http_get(f"127.0.0.1:{http_port}", "/metrics", reader)
                c.check(status == 200 and "kvpool_" in body,
                        f"{case}: {who} /metrics with reader.token answered {status}")
                status, _ = lib.http_get(f"127.0.0.1:{http_port}", "/healthz")
                c.check(status == 200, f"{case}: {who} /healthz (the probe) answered {status}")
            pod_env = dict(os.environ,
                           KVPOOL_TLS_CA=env_value(mrun, "KVPOOL_TLS_CA").replace(
                               TLS_DIR, mdirs[TLS_DIR]),
                           KVPOOL_AUTH_TOKEN_FILE=env_value(mrun, "KVPOOL_AUTH_TOKEN_FILE").replace(
                               AUTH_DIR, mdirs[AUTH_DIR]))
            ctl = [binaries["kvpoolctl"], f"--master=127.0.0.1:{port}", "status"]
            r = lib.kvpoolctl_until(ctl, pod_env, "node-a")
            c.check(r.returncode == 0 and "node-a" in r.stdout,
                    f"{case}: kvpoolctl status in the master pod's environment does not list "
                    f"segment node-a: {r.stdout}{r.stderr}")
            stranger = dict(pod_env)
            del stranger["KVPOOL_AUTH_TOKEN_FILE"]
            r = subprocess.run(ctl, capture_output=True, text=True, env=stranger, timeout=30)
            c.check(r.returncode != 0 and "requires authentication" in r.stdout + r.stderr,
                    f"{case}: kvpoolctl without a token should be refused as unauthenticated: "
                    f"{r.returncode} {r.stdout}{r.stderr}")
            plain = dict(stranger)
            del plain["KVPOOL_TLS_CA"]
            r = subprocess.run(ctl, capture_output=True, text=True, env=plain, timeout=30)
            c.check(r.returncode != 0, f"{case}: plaintext kvpoolctl should fail against the "
                    f"TLS master: {r.stdout}")
        finally:
            lib.stop_processes(procs)


def check_case(c, helmrender, case, extra):
    code, manifests, err, notes = render(helmrender, extra, notes=True)
    c.check(code == 0, f"{case}: render failed: {err.strip()}")
    if code != 0:
        return None
    objects = lib.load_yaml_all(manifests)
    v = effective_values(extra)
    check_metadata(c, case, objects)
    kinds = sorted(o["kind"] for o in objects)
    segment_on = v["segment"]["enabled"]
    embedded = int(v["master"]["embeddedSegment"]["sizeMiB"])
    want = ["ConfigMap", "Deployment", "Service"]
    if segment_on:
        want += ["DaemonSet", "Service"]
    if v["serviceAccount"]["create"]:
        want.append("ServiceAccount")
    if v["serviceMonitor"]["enabled"]:
        want.append("ServiceMonitor")
    if v["prometheusRule"]["enabled"]:
        want.append("PrometheusRule")
    ha = v["highAvailability"]
    chart_etcd = ha["enabled"] and not ha["etcd"]["endpoints"]
    if ha["enabled"]:
        want.append("PodDisruptionBudget")
    if chart_etcd:
        want += ["StatefulSet", "Service", "Service", "PodDisruptionBudget"]
    source = tls_source(v, extra)
    if source == "certManager":
        want += ["Issuer", "Issuer", "Certificate", "Certificate"]
    elif source == "helm":
        want.append("Secret")
    if v["auth"]["enabled"] and not v["auth"]["existingSecret"]:
        want.append("Secret")
    c.check(kinds == sorted(want), f"{case}: objects {kinds}, want {sorted(want)}")

    image = f"{v['image']['repository']}:{v['image']['tag'] or lib.load_yaml(CHART / 'Chart.yaml')['appVersion']}"
    m = v["master"]
    master = one(c, objects, "Deployment", "master")
    if ha["enabled"]:
        c.check(dig(master, "spec", "replicas") == ha["replicas"] and
                dig(master, "spec", "strategy", "type") == "RollingUpdate" and
                dig(master, "spec", "strategy", "rollingUpdate", "maxUnavailable") == 1,
                f"{case}: with highAvailability, {ha['replicas']} masters rolled one at a time")
    else:
        c.check(dig(master, "spec", "replicas") == 1 and
                dig(master, "spec", "strategy", "type") == "Recreate",
                f"{case}: the master must be one replica replaced with strategy Recreate")
    master_ports = {"grpc": m["grpcPort"], "http": m["httpPort"]}
    if embedded:
        master_ports["data"] = m["embeddedSegment"]["port"]
    mrun = check_workload(c, case, objects, master, "kvpool-master", v, {
        "image": image, "ports": master_ports,
        "probes": {"livenessProbe": "/healthz",
                   "readinessProbe": "/readyz?standby=ok" if ha["enabled"] else "/readyz"},
        "volumes": {"/etc/kvpool": ("configMap", None), **secret_mounts(v)},
        "memory_mib": int(m["memoryMiB"]) + embedded,
    })
    mflags = check_flags(c, "kvpool-master", mrun)
    etcd_endpoints = ha["etcd"]["endpoints"] or \
        f"{RELEASE}-kvpool-etcd.{NAMESPACE}.svc:{ha['etcd']['clientPort']}"
    if mflags and ha["enabled"]:
        c.check(mflags.get("etcd") == etcd_endpoints,
                f"{case}: masters elect through --etcd={mflags.get('etcd')}, want {etcd_endpoints}")
        c.check(mflags.get("advertise_address") == f"{ENV_SAMPLES['POD_IP']}:{m['grpcPort']}",
                f"{case}: each master must advertise its pod IP and gRPC port")
        c.check(mflags.get("leader_lease") == ha["leaderLease"] and
                mflags.get("etcd_prefix") == (ha["etcdPrefix"] or f"/kvpool/{RELEASE}"),
                f"{case}: --leader-lease/--etcd-prefix differ from the values")
    elif mflags:
        c.check("etcd" not in mflags, f"{case}: a single master must not run with --etcd")
    if ha["enabled"]:
        pdb = next((o for o in by_kind(objects, "PodDisruptionBudget")
                    if o["metadata"]["labels"].get("app.kubernetes.io/component") == "master"), None)
        pod_labels = dig(master, "spec", "template", "metadata", "labels", default={})
        c.check(pdb is not None and dig(pdb, "spec", "maxUnavailable") == ha["maxUnavailable"] and
                all(pod_labels.get(k) == x for k, x in
                    dig(pdb, "spec", "selector", "matchLabels", default={"-": "-"}).items()),
                f"{case}: the masters need a PodDisruptionBudget selecting them")
    if chart_etcd:
        check_etcd(c, case, objects, ha)
    if mflags:
        c.check(lib.host_port(mflags.get("listen", ":0"))[1] == m["grpcPort"] and
                lib.host_port(mflags.get("http_listen", ":0"))[1] == m["httpPort"],
                f"{case}: master --listen/--http-listen ports differ from its container ports")
        c.check(lib.host_port(mflags.get("listen", ":0"))[0] in ("0.0.0.0", "::"),
                f"{case}: the master must listen on all addresses in its pod")
        if embedded:
            c.check(mflags.get("advertise_host") == ENV_SAMPLES["POD_IP"],
                    f"{case}: the embedded segment must advertise the pod IP")
    master_svc = next((s for s in by_kind(objects, "Service")
                       if s["metadata"]["labels"].get("app.kubernetes.io/component") == "master"),
                      None)
    c.check(master_svc is not None, f"{case}: no master Service")
    check_service(c, case, master_svc, master, mrun,
                  {"grpc": m["grpcPort"], "http": m["httpPort"]})

    s = v["segment"]
    services = [master_svc]
    if segment_on:
        hugepages = s["hugepages"]["enabled"]
        pool = int(s["pool"]["sizeMiB"])
        volumes = {"/etc/kvpool": ("configMap", None), "/dev/shm": ("emptyDir", "Memory"),
                   **secret_mounts(v)}
        if hugepages:
            volumes["/dev/hugepages"] = ("emptyDir", "HugePages")
        segment = one(c, objects, "DaemonSet", "segment")
        srun = check_workload(c, case, objects, segment, "kvpool-segment", v, {
            "image": image, "ports": {"data": s["dataPort"], "http": s["httpPort"]},
            "probes": {"startupProbe": "/healthz", "livenessProbe": "/healthz",
                       "readinessProbe": "/readyz"},
            "volumes": volumes,
            "memory_mib": int(s["pool"]["overheadMiB"]) + (0 if hugepages else pool),
            "hugepages_mib": pool if hugepages else 0,
            "host_network": s["hostNetwork"],
        })
        sflags = check_flags(c, "kvpool-segment", srun)
        if sflags and master_svc:
            host, port = lib.host_port(sflags.get("master", ":0"))
            if ha["enabled"]:
                c.check(sflags.get("master") == f"etcd://{etcd_endpoints}",
                        f"{case}: with several masters, segments must find the leader through "
                        f"etcd://{etcd_endpoints}, not {sflags.get('master')}")
            else:
                c.check(host == f"{master_svc['metadata']['name']}.{NAMESPACE}.svc" and
                        port == m["grpcPort"],
                        f"{case}: segments call the master at {sflags.get('master')}, not at its "
                        f"Service {master_svc['metadata']['name']}.{NAMESPACE}.svc:{m['grpcPort']}")
            c.check(sflags.get("size") == f"{pool}MiB", f"{case}: segment --size should be {pool}MiB")
            c.check(lib.host_port(sflags.get("listen", ":0"))[1] == s["dataPort"] and
                    lib.host_port(sflags.get("http_listen", ":0"))[1] == s["httpPort"],
                    f"{case}: segment --listen/--http-listen ports differ from its container ports")
            c.check(sflags.get("advertise_host") == ENV_SAMPLES["POD_IP"] and
                    sflags.get("name") == ENV_SAMPLES["NODE_NAME"],
                    f"{case}: segments must advertise the pod IP and be named after the node")
            c.check(("hugepages" in sflags) == bool(hugepages),
                    f"{case}: --hugepages must be passed exactly when hugepages.enabled is on")
        seg_svc = next((x for x in by_kind(objects, "Service")
                        if x["metadata"]["labels"].get("app.kubernetes.io/component") == "segment"),
                       None)
        c.check(dig(seg_svc, "spec", "clusterIP") == "None",
                f"{case}: the segments' Service should be headless")
        check_service(c, case, seg_svc, segment, srun, {"data": s["dataPort"], "http": s["httpPort"]})
        services.append(seg_svc)
    else:
        c.check(not by_kind(objects, "DaemonSet"), f"{case}: segment.enabled=false renders a DaemonSet")
        srun, sflags = None, {}
    check_security(c, case, objects, v, source, mrun, mflags, srun, sflags,
                   master_svc and f"{master_svc['metadata']['name']}.{NAMESPACE}.svc")

    jobs = prometheus_jobs()
    if v["serviceMonitor"]["enabled"]:
        sm = one(c, objects, "ServiceMonitor")
        if sm:
            c.check(sm["apiVersion"] == "monitoring.coreos.com/v1", f"{case}: ServiceMonitor apiVersion")
            sel = dig(sm, "spec", "selector", "matchLabels", default={})
            job_label = dig(sm, "spec", "jobLabel")
            for svc in filter(None, services):
                labels = svc["metadata"]["labels"]
                c.check(all(labels.get(k) == x for k, x in sel.items()),
                        f"{case}: the ServiceMonitor does not select Service {svc['metadata']['name']}")
                c.check(labels.get(job_label) in jobs,
                        f"{case}: Service {svc['metadata']['name']} gets job "
                        f"{labels.get(job_label)!r}, not one of prometheus.yml's {sorted(jobs)}")
                names = {p["name"] for p in svc["spec"]["ports"]}
                for ep in dig(sm, "spec", "endpoints", default=[]):
                    c.check(ep.get("port") in names and ep.get("path") == "/metrics",
                            f"{case}: ServiceMonitor endpoint {ep} does not match Service "
                            f"{svc['metadata']['name']}")
            for k, x in v["serviceMonitor"]["labels"].items():
                c.check(sm["metadata"]["labels"].get(k) == x, f"{case}: ServiceMonitor lacks label {k}")
            c.check(dig(sm, "spec", "namespaceSelector", "matchNames") == [NAMESPACE],
                    f"{case}: ServiceMonitor should select the release namespace")
    if v["prometheusRule"]["enabled"]:
        rule = one(c, objects, "PrometheusRule")
        if rule:
            c.check(rule["spec"] == lib.load_yaml(ROOT / "deploy/prometheus/alerts.yml"),
                    f"{case}: the PrometheusRule differs from deploy/prometheus/alerts.yml")

    c.check(notes.strip() != "", f"{case}: NOTES.txt renders empty")
    if master_svc:
        address = f"etcd://{etcd_endpoints}" if ha["enabled"] else \
            f"{master_svc['metadata']['name']}.{NAMESPACE}.svc:{m['grpcPort']}"
        c.check(address in notes and "kvpoolctl" in notes,
                f"{case}: NOTES.txt should tell the master's address {address} and how to use kvpoolctl")
    return manifests


def check_etcd(c, case, objects, ha):
    """The chart's etcd: members that name each other through the headless Service, a client
    Service the masters' --etcd names, a volume each, a budget."""
    e = ha["etcd"]
    sts = one(c, objects, "StatefulSet", "etcd")
    if sts is None:
        return
    name = sts["metadata"]["name"]
    spec = sts["spec"]
    services = {o["metadata"]["name"]: o for o in by_kind(objects, "Service")}
    peers = services.get(spec.get("serviceName"))
    c.check(peers is not None and dig(peers, "spec", "clusterIP") == "None" and
            dig(peers, "spec", "publishNotReadyAddresses") is True,
            f"{case}: etcd's serviceName must be a headless Service publishing unready members")
    c.check(spec.get("replicas") == e["replicas"] and spec.get("podManagementPolicy") == "Parallel",
            f"{case}: {e['replicas']} etcd members started in parallel")
    pod_labels = dig(spec, "template", "metadata", "labels", default={})
    for svc in (peers, services.get(name)):
        c.check(svc is not None and all(pod_labels.get(k) == x for k, x in
                                        dig(svc, "spec", "selector", default={"-": "-"}).items()),
                f"{case}: etcd Services must select the members")
    ctr = dig(spec, "template", "spec", "containers", 0, default={})
    args = ctr.get("args", [])
    cluster = next((a.split("=", 1)[1] for a in args if a.startswith("--initial-cluster=")), "")
    want = ",".join(f"{name}-{i}=http://{name}-{i}.{name}-peers.{NAMESPACE}.svc:{e['peerPort']}"
                    for i in range(e["replicas"]))
    c.check(cluster == want, f"{case}: etcd --initial-cluster={cluster}, want {want}")
    c.check(f"--listen-client-urls=http://0.0.0.0:{e['clientPort']}" in args,
            f"{case}: etcd must listen for clients on port {e['clientPort']}")
    c.check(any(t["metadata"]["name"] == "data" for t in spec.get("volumeClaimTemplates", [])) and
            any(mt.get("name") == "data" and mt.get("mountPath") == "/var/lib/etcd"
                for mt in ctr.get("volumeMounts", [])),
            f"{case}: each etcd member needs its data volume at /var/lib/etcd")
    sc = ctr.get("securityContext", {})
    c.check(sc.get("runAsNonRoot") is True and sc.get("readOnlyRootFilesystem") is True,
            f"{case}: etcd runs as non-root on a read-only root filesystem")
    pdb = next((o for o in by_kind(objects, "PodDisruptionBudget")
                if o["metadata"]["labels"].get("app.kubernetes.io/component") == "etcd"), None)
    c.check(pdb is not None and dig(pdb, "spec", "maxUnavailable") == ha["maxUnavailable"],
            f"{case}: etcd needs a PodDisruptionBudget")


def check_failures(c, helmrender):
    for extra, message in FAILING:
        code, _, err, _ = render(helmrender, extra)
        c.check(code != 0 and message in err,
                f"render with {' '.join(extra)} should fail mentioning {message!r}; "
                f"got exit {code}: {err.strip()[:300]}")


def check_values_documented(c):
    """Every value in values.yaml has a comment: above it, above the run of sibling keys it
    belongs to, or above an enclosing key. Mappings with keys of their own need none."""
    lines = (CHART / "values.yaml").read_text(encoding="utf-8").splitlines()
    key_re = re.compile(r"^(\s*)([\w.-]+):(.*)$")
    documented = {}  # line index -> bool, for key lines
    parents = []  # stack of (indent, line index)
    for i, line in enumerate(lines):
        m = key_re.match(line)
        if not m or line.lstrip().startswith("#"):
            continue
        indent = len(m.group(1))
        while parents and parents[-1][0] >= indent:
            parents.pop()
        # Walk up over sibling keys (and their children) to the comment of the run.
        j, covered = i - 1, False
        while j >= 0:
            prev = lines[j]
            stripped = prev.strip()
            if not stripped:
                break
            pm = key_re.match(prev)
            prev_indent = len(prev) - len(prev.lstrip())
            if stripped.startswith("#"):
                covered = prev_indent == indent
                break
            if pm and prev_indent == indent:
                j -= 1
                continue
            if prev_indent > indent:
                j -= 1
                continue
            break
        covered = covered or any(documented.get(p) for _, p in parents)
        documented[i] = covered
        rest = m.group(3).strip()
        nxt = next((l for l in lines[i + 1:] if l.strip() and not l.strip().startswith("#")), "")
        has_children = rest == "" and (len(nxt) - len(nxt.lstrip())) > indent and \
            not nxt.strip().startswith("-")
        if not has_children:
            path = ".".join([key_re.match(lines[p]).group(2) for _, p in parents] + [m.group(2)])
            c.check(covered, f"values.yaml: {path} (line {i + 1}) is not documented by a comment")
        parents.append((indent, i))


def check_chart_metadata(c):
    chart = lib.load_yaml(CHART / "Chart.yaml")
    c.check(chart.get("appVersion") == lib.project_version(),
            f"Chart.yaml appVersion {chart.get('appVersion')} should be the project's version "
            f"{lib.project_version()} (root CMakeLists.txt)")
    c.check(chart.get("apiVersion") == "v2" and chart.get("type") == "application",
            "Chart.yaml: apiVersion v2, type application")
    alerts = ROOT / "deploy/prometheus/alerts.yml"
    c.check((CHART / "files/alerts.yml").read_bytes() == alerts.read_bytes(),
            "deploy/helm/kvpool/files/alerts.yml must be a copy of deploy/prometheus/alerts.yml")


# --- kubectl -----------------------------------------------------------------------------------

def paths(obj, prefix=()):
    """Leaf paths of a JSON-like object (empty containers count as absent)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from paths(v, prefix + (i,))
    else:
        yield prefix


def kubectl(kubectl_bin, args, input_file, env):
    return subprocess.run([kubectl_bin] + args + ["-f", input_file], capture_output=True,
                          text=True, env=env, timeout=120)


def check_kubectl(c, helmrender, kubectl_bin):
    with tempfile.TemporaryDirectory() as tmp:
        # An empty kubeconfig: nothing here may reach a cluster.
        kubeconfig = os.path.join(tmp, "kubeconfig")
        open(kubeconfig, "w").write("apiVersion: v1\nkind: Config\n")
        env = dict(os.environ, KUBECONFIG=kubeconfig)
        for case, extra in CASES:
            code, manifests, err, _ = render(helmrender, extra)
            if not c.check(code == 0, f"{case}: render failed: {err.strip()}"):
                continue
            objects = lib.load_yaml_all(manifests)
            path = os.path.join(tmp, "all.yaml")
            open(path, "w").write(manifests)
            r = kubectl(kubectl_bin, ["label", "--local", "-o", "name", "kvpool.io/checked=true"],
                        path, env)
            c.check(r.returncode == 0, f"{case}: kubectl cannot parse the manifests: {r.stderr.strip()}")
            names = sorted(r.stdout.split())
            want = sorted(f"{o['kind'].lower()}/{o['metadata']['name']}" for o in objects)
            got = sorted(re.sub(r"^(\w+)\.[\w.-]+/", r"\1/", n) for n in names)
            c.check(got == want, f"{case}: kubectl read {got}, want {want}")
            for o in objects:
                kind, name = o["kind"], o["metadata"]["name"]
                if kind in ("Deployment", "DaemonSet"):
                    args = ["set", "env", "--local", "-o", "json", "KVPOOL_RENDER_CHECK=1"]
                elif kind == "Service" and o["spec"].get("selector"):
                    sel = ",".join(f"{k}={v}" for k, v in sorted(o["spec"]["selector"].items()))
                    args = ["set", "selector", "--local", "-o", "json", sel]
                else:
                    continue
                one_path = os.path.join(tmp, "one.yaml")
                open(one_path, "w").write(yaml.safe_dump(o))
                r = kubectl(kubectl_bin, args, one_path, env)
                if not c.check(r.returncode == 0, f"{case}: kubectl rejects {kind}/{name}: "
                               f"{r.stderr.strip()}"):
                    continue
                typed = json.loads(r.stdout)
                typed_paths = set(paths(typed))
                for p in paths(o):
                    c.check(p in typed_paths, f"{case}: {kind}/{name} field "
                            f"{'.'.join(map(str, p))} is unknown to Kubernetes (dropped by "
                            f"kubectl's typed decoding)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--helmrender", help="helmrender binary (default: build it)")
    parser.add_argument("--kubectl", action="store_true", help="the kubectl checks")
    args = parser.parse_args()
    if args.kubectl:
        kubectl_bin = lib.which("kubectl", env="KVPOOL_KUBECTL")
        if not kubectl_bin:
            print("skipped: kubectl is not installed (it is not a Debian 12 package); the chart's "
                  "structure is still checked by deploy_helm_chart")
            return lib.SKIP
        c = lib.Checker("helm-kubectl")
        check_kubectl(c, helmrender_path(args.helmrender), kubectl_bin)
        return c.finish()
    c = lib.Checker("helm-chart")
    helmrender = helmrender_path(args.helmrender)
    check_chart_metadata(c)
    check_values_documented(c)
    for case, extra in CASES:
        check_case(c, helmrender, case, extra)
    check_failures(c, helmrender)
    return c.finish()


if __name__ == "__main__":
    lib.main_guard(main)
