#!/usr/bin/python3
"""Static checks of a compose file and what it mounts (no Docker engine):
deploy/compose/docker-compose.yaml (one master, Prometheus, Grafana) by default, or the file
named on the command line (deploy/compose/docker-compose.ha.yaml: etcd and three masters).

The compose file parses (with its ${VAR:-default} settings at their defaults); services,
networks, volumes, dependencies and health checks refer to things that exist; every kvpool
command runs a binary the image ships with flags the built binary accepts; the addresses the
services use point at services and ports that listen there (segments -> master or the masters'
etcd, masters -> etcd, Prometheus -> every /metrics, Grafana -> Prometheus); bind mounts exist;
the Prometheus configuration and Grafana's provisioning files parse and agree with the compose
file.
"""

import os
import pathlib
import re
import shlex
import sys

import deploylib as lib
from deploylib import ROOT
import yaml

COMPOSE = ROOT / "deploy/compose/docker-compose.yaml"
# The services each file must have (the kvpool ones found by their commands).
REQUIRED = {
    "docker-compose.yaml": {"master", "segment-1", "segment-2", "prometheus", "grafana"},
    "docker-compose.ha.yaml": {"etcd", "master-1", "master-2", "master-3", "segment-1",
                               "segment-2"},
}
PROMETHEUS_PORT = 9090
GRAFANA_PORT = 3000


def interpolate(c, text):
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default} with an empty environment; $$ is $."""
    def repl(m):
        if m.group(0) == "$$":
            return "$"
        default = m.group(3)
        c.check(default is not None, f"${{{m.group(1)}}} has no default: the file must work "
                "without an environment")
        return default or ""
    return re.sub(r"\$\$|\$\{(\w+)(:?-([^}]*))?\}", repl, text)


def shipped_binaries():
    text = (ROOT / "deploy/docker/Dockerfile").read_text(encoding="utf-8")
    m = re.search(r"for\s+binary\s+in\s+([^;]+);", text)
    return m.group(1).split() if m else []


def listen_ports(binary, args):
    """{flag: port} of the addresses a kvpool server listens on, with the binary's defaults."""
    ports = {}
    for flag in ("listen", "http_listen"):
        value = lib.flag_value(args, flag)
        ports[flag] = lib.host_port(value)[1] if value else lib.default_port(binary, flag)
    return ports


def mount_source(volume):
    """(source, target, read-only) of a short-syntax volume entry."""
    parts = volume.split(":")
    return parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")


def command_of(svc):
    cmd = svc.get("command", [])
    return shlex.split(cmd) if isinstance(cmd, str) else list(cmd)


PKI_DIR = "/etc/kvpool-pki"


def check_security(c, services, commands, kvpool_services, masters):
    """TLS and tokens on by default: no --insecure; the master's certificate, key and
    credentials file and each segment's CA and token come from the volume the one-shot pki
    service fills with make-pki.sh. Runs make-pki.sh into a temporary directory and checks what
    it makes (the certificate verifies against the CA with the name segments dial, each
    segment's token is bound to its --name), then starts the built master and a segment with
    the compose flags on those files and checks that kvpoolctl with the master container's
    environment sees the segment, and that a token-less kvpoolctl is refused."""
    import subprocess
    import tempfile
    pki = services.get("pki", {})
    script_mount = next((mount_source(v) for v in pki.get("volumes", [])
                         if mount_source(v)[0].endswith("make-pki.sh")), None)
    c.check(script_mount is not None and pki.get("entrypoint", [None, None])[1:2] ==
            [script_mount[1]], "pki: should run make-pki.sh, mounted from deploy/compose")
    pki_volume = next((mount_source(v)[0] for v in pki.get("volumes", [])
                       if mount_source(v)[1] == PKI_DIR), None)
    c.check(pki_volume is not None, f"pki: should write a volume mounted at {PKI_DIR}")
    for name, args in commands.items():
        c.check(lib.flag_value(args, "insecure") is None and "--insecure" not in args,
                f"{name}: --insecure in the default compose file")
        mounts = {mount_source(v)[1]: mount_source(v) for v in services[name].get("volumes", [])}
        mount = mounts.get(PKI_DIR, (None, None, False))
        c.check(mount[0] == pki_volume and mount[2],
                f"{name}: should mount the pki volume read-only at {PKI_DIR}")
        depends = services[name].get("depends_on") or {}
        c.check(dict(depends).get("pki", {}).get("condition") ==
                "service_completed_successfully" or any(d in masters for d in depends),
                f"{name}: should start after pki (directly or through a master)")
        wanted = (("tls_cert", "master.crt"), ("tls_key", "master.key"),
                  ("auth_tokens", "tokens")) if kvpool_services[name] == "kvpool-master" else \
            (("tls_ca", "ca.crt"), ("auth_token_file", f"{name}.token"),
             ("http_token_file", "reader.token"))
        for flag, file in wanted:
            c.check(lib.flag_value(args, flag) == f"{PKI_DIR}/{file}",
                    f"{name}: --{flag.replace('_', '-')} should be {PKI_DIR}/{file}, got "
                    f"{lib.flag_value(args, flag)}")
    for master in masters:
        env = services.get(master, {}).get("environment", {})
        c.check(env.get("KVPOOL_TLS_CA") == f"{PKI_DIR}/ca.crt" and
                env.get("KVPOOL_AUTH_TOKEN_FILE") == f"{PKI_DIR}/admin.token",
                f"{master}: KVPOOL_TLS_CA and KVPOOL_AUTH_TOKEN_FILE should let kvpoolctl in "
                "the container call the master")
    env = services.get(masters[0], {}).get("environment", {})
    # Prometheus scrapes with the reader token that pki writes, alone, to the scrape volume.
    entry = pki.get("entrypoint", [])
    scrape_volume = next((mount_source(v)[0] for v in pki.get("volumes", [])
                          if len(entry) > 3 and mount_source(v)[1] == entry[3]), None)
    prom_mounts = {mount_source(v)[0]: mount_source(v)
                   for v in services.get("prometheus", {}).get("volumes", [])}
    c.check("prometheus" not in services or scrape_volume is not None and scrape_volume in prom_mounts and
            prom_mounts[scrape_volume][2] and pki_volume not in prom_mounts,
            "prometheus: should mount the scrape volume pki writes (read-only), and not the "
            "pki volume")
    token_file = (prom_mounts.get(scrape_volume, (None, "?"))[1] + "/reader.token")
    config = lib.load_yaml(ROOT / "deploy/prometheus/prometheus.yml")
    for job in config.get("scrape_configs", []) if "prometheus" in services else []:
        if job["job_name"] in ("kvpool-master", "kvpool-segment"):
            c.check(job.get("authorization") == {"type": "Bearer", "credentials_file": token_file},
                    f"prometheus job {job['job_name']}: should send the reader token "
                    f"{token_file}, got {job.get('authorization')}")
    if script_mount is None:
        return
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as scrape:
        script = str((COMPOSE.parent / script_mount[0]).resolve())
        r = subprocess.run(["sh", script, tmp, scrape], capture_output=True, text=True,
                           timeout=120)
        if not c.check(r.returncode == 0, f"make-pki.sh failed: {r.stdout}{r.stderr}"):
            return
        c.check(sorted(os.listdir(scrape)) == ["reader.token"] and
                pathlib.Path(scrape, "reader.token").read_bytes() ==
                pathlib.Path(tmp, "reader.token").read_bytes(),
                f"make-pki.sh: the scrape directory should hold reader.token alone, got "
                f"{sorted(os.listdir(scrape))}")
        again = subprocess.run(["sh", script, tmp, scrape], capture_output=True, text=True,
                               timeout=120)
        c.check(again.returncode == 0 and "kept" in again.stdout,
                f"make-pki.sh run again should keep what it made: {again.stdout}")
        r = subprocess.run(["openssl", "verify", "-CAfile", f"{tmp}/ca.crt", f"{tmp}/master.crt"],
                           capture_output=True, text=True)
        c.check(r.returncode == 0, f"make-pki.sh: master.crt does not verify: {r.stdout}{r.stderr}")
        r = subprocess.run(["openssl", "x509", "-in", f"{tmp}/master.crt", "-noout", "-ext",
                            "subjectAltName"], capture_output=True, text=True)
        c.check(all(f"DNS:{m}," in r.stdout + "," for m in masters) and
                "IP Address:127.0.0.1" in r.stdout,
                f"make-pki.sh: master.crt's SANs should name {masters} and 127.0.0.1: {r.stdout}")
        rules = {}
        for line in pathlib.Path(tmp, "tokens").read_text().splitlines():
            fields = line.split("#", 1)[0].split()
            if fields:
                rules[fields[1]] = fields[2:4]
        for name, args in commands.items():
            if kvpool_services[name] == "kvpool-segment":
                token = pathlib.Path(tmp, f"{name}.token").read_text()
                c.check(rules.get(token) == [lib.flag_value(args, "name"), "segment"],
                        f"make-pki.sh: {name}.token should be bound to segment name "
                        f"{lib.flag_value(args, 'name')}, got {rules.get(token)}")
        c.check(rules.get(pathlib.Path(tmp, "admin.token").read_text(), [None, None])[1] ==
                "admin", "make-pki.sh: admin.token should have role admin")
        c.check(rules.get(pathlib.Path(tmp, "reader.token").read_text(), [None, None])[1] ==
                "reader", "make-pki.sh: reader.token should have role reader")
        segments = [n for n in commands if kvpool_services[n] == "kvpool-segment"]
        run_pool(c, commands, env, tmp, masters[0], segments[0])


def run_pool(c, commands, env, pki, master_name, segment_name):
    binaries = {b: lib.binary_path(b) for b in ("kvpool-master", "kvpool-segment", "kvpoolctl")}
    if not all(binaries.values()):
        c.note("kvpool-master/segment/kvpoolctl not built: the compose pool was not started")
        return
    import subprocess

    def local(args, replace):
        out = []
        for a in args:
            name = lib.flag_name(a)
            if name in replace and replace[name] is None:
                continue  # not for a pool of one master on this machine (etcd)
            out.append(f"--{name}={replace[name]}" if name in replace
                       else a.replace(PKI_DIR + "/", pki + "/"))
        return out

    procs = []
    try:
        # 0.0.0.0: not loopback, so the master starts only with TLS and tokens on.
        margs = local(commands[master_name], {
            "listen": "0.0.0.0:0", "http_listen": "0.0.0.0:0", "etcd": None, "etcd_prefix": None,
            "leader_lease": None, "advertise_address": None})
        master, m, seen = lib.start_process(
            [binaries["kvpool-master"]] + margs,
            r"listening grpc=\S*:(\d+) http=\S*:(\d+) .*tls=on auth=on http_auth=on")
        procs.append(master)
        if not c.check(m is not None, f"master with the compose flags did not start with "
                       f"tls=on auth=on: {''.join(seen)[-800:]}"):
            return
        port, master_http = m.group(1), m.group(2)
        sargs = local(commands[segment_name], {
            "master": f"127.0.0.1:{port}", "listen": "0.0.0.0:0", "http_listen": "0.0.0.0:0",
            "size": "64MiB", "advertise_host": "127.0.0.1"})
        # Segments dial the master's service name: check the certificate against that name.
        segment, m, seen = lib.start_process(
            [binaries["kvpool-segment"]] + sargs + [f"--tls_server_name={master_name}",
                                                    "--prefault=false"],
            r"kvpool-segment listening .*http=\S*:(\d+)")
        procs.append(segment)
        if not c.check(m is not None, f"{segment_name} with the compose flags did not mount: "
                       f"{''.join(seen)[-800:]}"):
            return
        # What Prometheus sees: /metrics with its token, and nothing without.
        reader = pathlib.Path(pki, "reader.token").read_text()
        for who, http_port in ((master_name, master_http), (segment_name, m.group(1))):
            status, body = lib.http_get(f"127.0.0.1:{http_port}", "/metrics")
            c.check(status == 401, f"{who}: /metrics without a token answered {status}")
            status, body = lib.http_get(f"127.0.0.1:{http_port}", "/metrics", reader)
            c.check(status == 200 and "kvpool_" in body,
                    f"{who}: /metrics with Prometheus's reader token answered {status}")
            status, _ = lib.http_get(f"127.0.0.1:{http_port}", "/healthz")
            c.check(status == 200, f"{who}: /healthz (the health check) answered {status}")
        ctl_env = dict(os.environ, **{k: v.replace(PKI_DIR + "/", pki + "/") for k, v in env.items()})
        ctl = [binaries["kvpoolctl"], f"--master=127.0.0.1:{port}", "status"]
        r = lib.kvpoolctl_until(ctl, ctl_env, segment_name)
        c.check(r.returncode == 0 and segment_name in r.stdout,
                f"kvpoolctl status with the master container's environment does not list "
                f"{segment_name}: {r.stdout}{r.stderr}")
        stranger = {k: v for k, v in ctl_env.items() if k != "KVPOOL_AUTH_TOKEN_FILE"}
        r = subprocess.run(ctl, capture_output=True, text=True, env=stranger, timeout=30)
        c.check(r.returncode != 0 and "requires authentication" in r.stdout + r.stderr,
                f"kvpoolctl without a token should be refused: {r.returncode} {r.stdout}{r.stderr}")
    finally:
        lib.stop_processes(procs)


def main():
    compose = pathlib.Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else COMPOSE
    c = lib.Checker("compose" if compose == COMPOSE else f"compose {compose.name}")
    compose_dir = compose.parent
    doc = yaml.safe_load(interpolate(c, compose.read_text(encoding="utf-8")))
    services = doc.get("services", {})
    networks = doc.get("networks", {}) or {}
    volumes = doc.get("volumes", {}) or {}
    required = REQUIRED.get(compose.name, set())
    c.check(required <= set(services),
            f"services should include {sorted(required)}; got {sorted(services)}")
    KVPOOL_SERVICES = {name: command_of(svc)[0] for name, svc in services.items()
                       if command_of(svc)[:1] and command_of(svc)[0].startswith("kvpool-")}
    masters = sorted(n for n, b in KVPOOL_SERVICES.items() if b == "kvpool-master")
    etcds = {n for n, svc in services.items() if command_of(svc)[:1] == ["etcd"]}
    c.check(bool(masters), "no kvpool-master service")
    c.check(bool(networks), "declare a private network for the pool")
    binaries = shipped_binaries()

    # Every service: on the private network, known volumes, dependencies, health checks.
    for name, svc in services.items():
        nets = svc.get("networks", [])
        nets = list(nets) if isinstance(nets, (list, dict)) else []
        c.check(bool(nets) and all(n in networks for n in nets),
                f"{name}: must join the declared private network(s) {sorted(networks)}, got {nets}")
        for entry in svc.get("volumes", []):
            source, target, _ = mount_source(entry)
            if source.startswith((".", "/")):
                path = (compose_dir / source).resolve()
                c.check(path.exists(), f"{name}: bind mount {source} does not exist ({lib.rel(path)})")
            else:
                c.check(source in volumes, f"{name}: volume {source} is not declared")
        for dep, cond in (svc.get("depends_on") or {}).items():
            c.check(dep in services, f"{name}: depends on unknown service {dep}")
            if isinstance(cond, dict) and cond.get("condition") == "service_healthy":
                c.check("healthcheck" in services.get(dep, {}),
                        f"{name}: waits for {dep} to be healthy, but {dep} has no healthcheck")
        one_shot = str(svc.get("restart")) == "no" and any(
            dict(other.get("depends_on") or {}).get(name, {}).get("condition") ==
            "service_completed_successfully" for other in services.values()
            if isinstance(other.get("depends_on"), dict))
        c.check("healthcheck" in svc or one_shot, f"{name}: no healthcheck")
        for published in svc.get("ports", []):
            c.check(str(published).startswith("127.0.0.1:"),
                    f"{name}: publish ports on the host's loopback only, not {published}")

    # kvpool services: the image built from the Dockerfile, commands and flags.
    listen = {}
    commands = {}
    for name, binary in KVPOOL_SERVICES.items():
        svc = services.get(name)
        if svc is None:
            continue
        build = svc.get("build", {})
        context = (compose_dir / build.get("context", ".")).resolve()
        c.check(context == ROOT, f"{name}: build context should be the repository root, got "
                f"{lib.rel(context)}")
        c.check((context / build.get("dockerfile", "Dockerfile")) ==
                ROOT / "deploy/docker/Dockerfile",
                f"{name}: build with deploy/docker/Dockerfile")
        c.check(svc.get("read_only") is True and "ALL" in svc.get("cap_drop", []),
                f"{name}: run with a read-only root and no capabilities")
        cmd = command_of(svc)
        c.check(bool(cmd) and cmd[0] == binary and binary in binaries,
                f"{name}: command should run {binary} (shipped by the image), got {cmd[:1]}")
        args = cmd[1:]
        known = lib.source_flags(binary)
        for a in args:
            c.check(lib.flag_name(a) in known, f"{name}: {a} is not a flag of {binary}")
        try:
            problem = lib.check_flags_with_binary(binary, args)
            c.check(problem is None, f"{name}: {binary} rejects its flags: {problem}")
        except LookupError:
            c.note(f"{binary} is not built: {name}'s flags checked against the sources only")
        commands[name] = args
        ports = listen_ports(binary, args)
        listen[name] = ports
        for flag in ("listen", "http_listen"):
            value = lib.flag_value(args, flag)
            c.check(value is not None and lib.host_port(value)[0] in ("0.0.0.0", "::"),
                    f"{name}: --{flag.replace('_', '-')} must listen on all addresses in the "
                    f"container (got {value}; the default is loopback only)")
        # Health check: kvpool-http-check on the service's HTTP port.
        test = svc.get("healthcheck", {}).get("test", [])
        c.check(test[:2] == ["CMD", "kvpool-http-check"] and len(test) >= 4,
                f"{name}: health check should run kvpool-http-check HOST:PORT PATH")
        if len(test) >= 4:
            host, port = lib.host_port(test[2])
            c.check(port == ports["http_listen"],
                    f"{name}: health check port {port}, but the service's HTTP port is "
                    f"{ports['http_listen']}")
            allowed = ("/healthz", "/readyz")
            if binary == "kvpool-master" and lib.flag_value(args, "etcd"):
                # One of several masters: a healthy standby must pass too.
                allowed = ("/healthz", "/readyz?standby=ok")
            c.check(test[3] in allowed, f"{name}: health check path {test[3]}, want one of "
                    f"{allowed}")
        for published in svc.get("ports", []):
            container_port = int(str(published).rsplit(":", 1)[1].split("/")[0])
            c.check(container_port in ports.values(),
                    f"{name}: publishes {container_port}, where nothing listens")

    # Several masters: each elects through a compose etcd and advertises its service name.
    def etcd_target_ok(target):
        for endpoint in target.split(","):
            host, port = lib.host_port(endpoint)
            urls = lib.flag_value(command_of(services.get(host, {}))[1:], "listen_client_urls")
            if host not in etcds or not urls or not urls.rstrip("/").endswith(f":{port}"):
                return False
        return True

    for name in masters:
        etcd = lib.flag_value(commands.get(name, []), "etcd")
        if len(masters) > 1:
            c.check(etcd is not None and etcd_target_ok(etcd),
                    f"{name}: one of several masters needs --etcd=SERVICE:PORT of a compose etcd, "
                    f"got {etcd}")
            c.check(lib.flag_value(commands.get(name, []), "advertise_address") ==
                    f"{name}:{listen.get(name, {}).get('listen')}",
                    f"{name}: --advertise-address should be {name}:PORT (what others resolve)")
            c.check(any(d in etcds for d in services[name].get("depends_on", {})),
                    f"{name}: should start after etcd")

    # Segments mount on the master (or the masters' leader, found through etcd) and advertise
    # a name the network resolves.
    names = set()
    for name, args in commands.items():
        if KVPOOL_SERVICES[name] != "kvpool-segment":
            continue
        target = lib.flag_value(args, "master") or "127.0.0.1:50051"
        if target.startswith("etcd://"):
            c.check(len(masters) > 1 and etcd_target_ok(target[len("etcd://"):]),
                    f"{name}: --master={target} is not the masters' compose etcd")
        else:
            for address in target.split(","):
                host, port = lib.host_port(address)
                c.check(host in masters and port == listen.get(host, {}).get("listen"),
                        f"{name}: --master={target}: {address} is not a master service's gRPC "
                        f"port")
        advertise = lib.flag_value(args, "advertise_host")
        c.check(advertise == name, f"{name}: --advertise-host should be the service name {name} "
                f"(what other containers resolve), got {advertise}")
        segment_name = lib.flag_value(args, "name")
        c.check(segment_name and segment_name not in names, f"{name}: --name must be unique")
        names.add(segment_name)
        depends = services[name].get("depends_on", {})
        c.check(any(m in depends for m in masters), f"{name}: should start after the master")
    check_security(c, services, commands, KVPOOL_SERVICES, masters)
    if "prometheus" not in services:
        return c.finish()

    # Prometheus: its configuration is the one in deploy/prometheus, its targets listen.
    prom = services.get("prometheus", {})
    mounts = {mount_source(v)[1]: mount_source(v) for v in prom.get("volumes", [])}
    config_arg = next((a.split("=", 1)[1] for a in prom.get("command", [])
                       if a.startswith("--config.file=")), "/etc/prometheus/prometheus.yml")
    config_mount = mounts.get(config_arg)
    c.check(config_mount is not None and
            (compose_dir / config_mount[0]).resolve() == ROOT / "deploy/prometheus/prometheus.yml",
            f"prometheus: {config_arg} should be deploy/prometheus/prometheus.yml")
    config = lib.load_yaml(ROOT / "deploy/prometheus/prometheus.yml")
    for rule_file in config.get("rule_files", []):
        m = mounts.get(rule_file)
        c.check(m is not None and (compose_dir / m[0]).resolve().is_file(),
                f"prometheus: rule file {rule_file} is not mounted from the tree")
    scraped = set()
    for job in config.get("scrape_configs", []):
        path = job.get("metrics_path", "/metrics")
        for static in job.get("static_configs", []):
            for target in static.get("targets", []):
                host, port = lib.host_port(target)
                if host in ("127.0.0.1", "localhost"):
                    c.check(port == PROMETHEUS_PORT, f"prometheus: target {target} is not itself")
                    continue
                c.check(host in services, f"prometheus job {job['job_name']}: target {target} "
                        f"is not a compose service")
                if host in listen:
                    c.check(port == listen[host]["http_listen"] and path == "/metrics",
                            f"prometheus job {job['job_name']}: {target}{path} is not the "
                            f"/metrics of {host} (HTTP port {listen[host]['http_listen']})")
                    scraped.add(host)
    c.check(scraped == set(KVPOOL_SERVICES), f"prometheus should scrape every kvpool service; "
            f"scrapes {sorted(scraped)}")
    jobs = {j["job_name"] for j in config.get("scrape_configs", [])}
    c.check({"kvpool-master", "kvpool-segment"} <= jobs,
            "prometheus job names kvpool-master and kvpool-segment are what the alert rules and "
            "the chart's ServiceMonitor use")
    for published in prom.get("ports", []):
        c.check(str(published).endswith(f":{PROMETHEUS_PORT}"), f"prometheus publishes {published}")

    # Grafana: provisioning and dashboards from deploy/grafana, data source = the Prometheus.
    graf = services.get("grafana", {})
    gm = {mount_source(v)[1]: mount_source(v) for v in graf.get("volumes", [])}
    prov = gm.get("/etc/grafana/provisioning")
    c.check(prov is not None and
            (compose_dir / prov[0]).resolve() == ROOT / "deploy/grafana/provisioning",
            "grafana: /etc/grafana/provisioning should be deploy/grafana/provisioning")
    datasources = lib.load_yaml(ROOT / "deploy/grafana/provisioning/datasources/prometheus.yaml")
    urls = [d.get("url", "") for d in datasources.get("datasources", [])]
    c.check(f"http://prometheus:{PROMETHEUS_PORT}" in urls,
            f"grafana: the data source should be http://prometheus:{PROMETHEUS_PORT}, got {urls}")
    c.check(any(d.get("type") == "prometheus" and d.get("isDefault") for d in
                datasources.get("datasources", [])), "grafana: a default Prometheus data source")
    providers = lib.load_yaml(ROOT / "deploy/grafana/provisioning/dashboards/kvpool.yaml")
    for p in providers.get("providers", []):
        path = p.get("options", {}).get("path")
        m = gm.get(path)
        c.check(m is not None and (compose_dir / m[0]).resolve() == ROOT / "deploy/grafana/dashboards",
                f"grafana: dashboards path {path} should be a mount of deploy/grafana/dashboards")
    home = graf.get("environment", {}).get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        m = next((m for t, m in gm.items() if home.startswith(t + "/")), None)
        c.check(m is not None and
                ((compose_dir / m[0]).resolve() / os.path.relpath(home, m[1])).is_file(),
                f"grafana: home dashboard {home} is not a mounted file")
    for published in graf.get("ports", []):
        c.check(str(published).endswith(f":{GRAFANA_PORT}"), f"grafana publishes {published}")
    return c.finish()


if __name__ == "__main__":
    lib.main_guard(main)
