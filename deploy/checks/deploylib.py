"""Shared pieces of the deploy checks (deploy/checks/check_*.py).

Facts about kvpool that the deploy files must agree with are read from the tree itself, never
restated here: flags and their defaults from the ABSL_FLAG definitions in the C++ sources, RPC
names from proto/kvpool/v1/master.proto, result codes from proto/kvpool/v1/common.proto, metric
names from deploy/metrics.yaml, the version from the root CMakeLists.txt. Where a built binary
is at hand, flags are also checked by the binary itself: `BINARY ARGS... --version` parses every
flag (unknown ones and bad values are errors, exit status 1) and exits 0 without starting.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
SKIP = 77  # CTest SKIP_RETURN_CODE of the checks that need an optional tool


class Checker:
    """Collects failures; prints them as they come and a summary at the end."""

    def __init__(self, name):
        self.name = name
        self.failures = []
        self.passed = 0
        self.notes = []

    def check(self, condition, message):
        if condition:
            self.passed += 1
        else:
            self.fail(message)
        return condition

    def fail(self, message):
        self.failures.append(message)
        print(f"FAIL {self.name}: {message}", flush=True)

    def note(self, message):
        self.notes.append(message)
        print(f"note {self.name}: {message}", flush=True)

    def finish(self):
        status = "FAILED" if self.failures else "ok"
        print(f"{self.name}: {status}: {self.passed} checks passed, {len(self.failures)} failed, "
              f"{len(self.notes)} notes", flush=True)
        return 1 if self.failures else 0


def rel(path):
    try:
        return str(pathlib.Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def load_yaml(path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def load_yaml_all(text):
    return [d for d in yaml.safe_load_all(text) if d is not None]


# --- the C++ tree ------------------------------------------------------------------------------

_FLAG_RE = re.compile(r"ABSL_FLAG\(\s*([^,]+?)\s*,\s*(\w+)\s*,\s*(.*?)\s*,\s*\"", re.S)

# Source files whose flags each binary has: its main and the libraries it links (every .cc of
# those folders but tests and other mains). A superset at worst; the built binary is the judge.
BINARY_SOURCES = {
    "kvpool-master": ["server/master/main.cc", "server/master", "server/segment", "server/common",
                      "common", "proto"],
    "kvpool-segment": ["server/segment/main.cc", "server/segment", "server/common", "common",
                       "proto"],
    "kvpoolctl": ["client/tools/kvpoolctl.cc", "client/tools/credential_flags.cc", "client",
                  "common", "proto"],
}


def _sources(entries):
    files = []
    for entry in entries:
        p = ROOT / entry
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            for f in sorted(p.glob("*.cc")):
                if f.name.endswith("_test.cc") or f.name == "main.cc":
                    continue
                files.append(f)
    return files


def source_flags(binary):
    """{flag name (underscores): default expression} from the ABSL_FLAG definitions."""
    flags = {}
    for f in _sources(BINARY_SOURCES[binary]):
        for m in _FLAG_RE.finditer(f.read_text(encoding="utf-8", errors="replace")):
            flags[m.group(2)] = m.group(3).strip()
    return flags


def default_port(binary, flag):
    """The port of a "host:port" flag default, e.g. default_port("kvpool-master", "listen")."""
    default = source_flags(binary).get(flag, "")
    m = re.search(r'"[^"]*:(\d+)"', default)
    return int(m.group(1)) if m else None


def cmake_binaries():
    """Names of the executables the tree builds for the server image (kvpool_binary and
    add_executable, no tests). GPU tools (under kernels/, or built from .cu sources) need CUDA,
    which the image has not."""
    names = set()
    for path in git_tracked_files():
        f = ROOT / path
        if f.name != "CMakeLists.txt" or f.relative_to(ROOT).parts[0] == "kernels":
            continue
        text = re.sub(r"#[^\n]*", "", f.read_text(encoding="utf-8"))
        names.update(name for name, sources in
                     re.findall(r"kvpool_binary\(\s*([\w-]+)\s+SRCS\s+([^)]*?)(?:DEPS|\))", text)
                     if ".cu" not in sources)
        names.update(n for n in re.findall(r"add_executable\(\s*([\w-]+)", text)
                     if not n.startswith("${"))
    return names


def project_version():
    text = (ROOT / "CMakeLists.txt").read_text(encoding="utf-8")
    m = re.search(r"project\(\s*kvpool\s+VERSION\s+([\d.]+)", text)
    return m.group(1) if m else None


def error_code_names():
    text = (ROOT / "proto/kvpool/v1/common.proto").read_text(encoding="utf-8")
    body = re.search(r"enum\s+ErrorCode\s*\{(.*?)\}", text, re.S).group(1)
    return set(re.findall(r"^\s*([A-Z][A-Z0-9_]*)\s*=", body, re.M))


def rpc_names():
    text = (ROOT / "proto/kvpool/v1/master.proto").read_text(encoding="utf-8")
    return set(re.findall(r"^\s*rpc\s+(\w+)\s*\(", text, re.M))


def git_tracked_files():
    """Files git tracks (or, outside a git checkout, every file but build outputs)."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], check=True,
                             capture_output=True).stdout
        return [p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                if p.is_file() and p.relative_to(ROOT).parts[0] not in ("build", ".git")]


# --- binaries --------------------------------------------------------------------------------

def binary_path(name):
    """The built binary: $<NAME>_BIN (KVPOOL_MASTER_BIN for kvpool-master), or the one under
    $KVPOOL_BUILD_DIR (default build/), or None."""
    env = name.upper().replace("-", "_") + "_BIN"
    if os.environ.get(env):
        return os.environ[env]
    build = pathlib.Path(os.environ.get("KVPOOL_BUILD_DIR", ROOT / "build"))
    for candidate in build.rglob(name):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def check_flags_with_binary(binary, args, flagfile_text=None):
    """Runs BINARY [--flagfile=F] ARGS --version. Returns None if the flags parse, else the
    binary's complaint; raises LookupError if the binary is not built."""
    path = binary_path(binary)
    if path is None:
        raise LookupError(binary)
    argv = [path]
    tmp = None
    try:
        if flagfile_text is not None:
            tmp = tempfile.NamedTemporaryFile("w", suffix=".flags", delete=False)
            tmp.write(flagfile_text)
            tmp.close()
            argv.append(f"--flagfile={tmp.name}")
        argv += list(args) + ["--version"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if r.returncode == 0:
            return None
        return (r.stderr.strip() or r.stdout.strip() or f"exit status {r.returncode}")
    finally:
        if tmp is not None:
            os.unlink(tmp.name)


def start_process(argv, pattern, env=None, timeout=60):
    """Starts argv (stderr into stdout) and reads its output until a line matches `pattern`.
    Returns (process, match or None, lines read); the caller stops the process."""
    import re
    import selectors
    import time
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline, seen = time.time() + timeout, []
    while time.time() < deadline:
        if sel.select(timeout=1):
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            seen.append(line)
            m = re.search(pattern, line)
            if m:
                return proc, m, seen
    return proc, None, seen


def stop_processes(procs):
    for p in reversed(procs):
        p.terminate()
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def http_get(address, path, token=None):
    """(status, body) of GET http://address/path, with a bearer token if given."""
    import urllib.error
    import urllib.request
    request = urllib.request.Request(f"http://{address}{path}")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def kvpoolctl_until(argv, env, want, tries=30):
    """Runs kvpoolctl argv until it exits 0 printing `want` (once a second); the last result."""
    import time
    r = None
    for _ in range(tries):
        r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30)
        if r.returncode == 0 and want in r.stdout:
            break
        time.sleep(1)
    return r


def flag_name(arg):
    """'--http-listen=0.0.0.0:9003' -> 'http_listen'; None for a non-flag."""
    if not arg.startswith("-"):
        return None
    return arg.lstrip("-").split("=", 1)[0].replace("-", "_")


def flag_value(args, name):
    """The value of the last --name=value in args (dashes or underscores), or None."""
    value = None
    for a in args:
        if flag_name(a) == name and "=" in a:
            value = a.split("=", 1)[1]
    return value


def host_port(text):
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def which(tool, env=None):
    if env and os.environ.get(env):
        return os.environ[env]
    return shutil.which(tool)


def main_guard(fn):
    try:
        sys.exit(fn())
    except KeyboardInterrupt:
        sys.exit(130)
