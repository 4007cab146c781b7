#!/usr/bin/python3
"""Static checks of deploy/docker/Dockerfile and .dockerignore (no Docker engine needed).

  check_docker.py              structure, files, scripts, ports, users, default command
  check_docker.py --packages   the runtime packages: they exist in Debian 12 (apt-cache) and,
                               with their dependencies, provide every shared library the built
                               binaries load (ldd + dpkg -S); exits 77 (skipped) when apt has no
                               package lists.
"""

import argparse
import os
import re
import shlex
import subprocess
import sys

import deploylib as lib
from deploylib import ROOT

DOCKERFILE = ROOT / "deploy/docker/Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
DEBIAN_12_IMAGES = re.compile(r"^debian:bookworm(-slim)?(@sha256:[0-9a-f]{64})?$")
REQUIRED_SCRIPTS = ["scripts/install-deps.sh", "scripts/build.sh"]
REQUIRED_BINARIES = ["kvpool-master", "kvpool-segment", "kvpoolctl"]
# Packages of debian:bookworm-slim itself (dependencies of dpkg and apt), never listed.
BASE_IMAGE_PACKAGES = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g"}


def parse_dockerfile(text):
    """[(line number, INSTRUCTION, arguments)] with continuations joined and comments dropped."""
    out = []
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        pending += stripped
        word, _, rest = pending.partition(" ")
        out.append((start, word.upper(), rest.strip()))
        pending = ""
    return out


def substitute(text, args):
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)),
                  text)


class DockerIgnore:
    """The .dockerignore rules, with Docker's semantics (last matching rule wins; a rule that
    matches a folder excludes what is under it; "!" re-includes)."""

    def __init__(self, text):
        self.rules = []
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            pattern = line[1:] if negate else line
            pattern = pattern.strip().strip("/")
            self.rules.append((negate, self._regex(pattern)))

    @staticmethod
    def _regex(pattern):
        out, i = "", 0
        while i < len(pattern):
            c = pattern[i]
            if pattern.startswith("**/", i):
                out += "(?:.*/)?"
                i += 3
                continue
            if pattern.startswith("**", i):
                out += ".*"
                i += 2
                continue
            out += {"*": "[^/]*", "?": "[^/]"}.get(c, re.escape(c))
            i += 1
        return re.compile(out + "$")

    def excluded(self, path):
        parts = path.strip("/").split("/")
        result = False
        for negate, regex in self.rules:
            for n in range(1, len(parts) + 1):
                if regex.match("/".join(parts[:n])):
                    result = not negate
                    break
        return result


def needed_by_build(path):
    """Whether a tracked file may be read by the image build (the C++ tree, CMake, scripts)."""
    name = os.path.basename(path)
    return (name == "CMakeLists.txt" or path.startswith("scripts/")
            or name.endswith((".cc", ".h", ".proto", ".cmake", ".cu", ".cuh", ".in")))


def stages(instructions):
    """[{name, image, line, instructions}] per FROM, and the global ARG defaults."""
    global_args, result = {}, []
    for line, word, rest in instructions:
        if word == "FROM":
            m = re.match(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$", rest, re.I)
            result.append({"image": m.group(1), "name": m.group(2), "line": line,
                           "instructions": []})
        elif not result:
            if word == "ARG":
                name, _, default = rest.partition("=")
                global_args[name.strip()] = default.strip()
        else:
            result[-1]["instructions"].append((line, word, rest))
    return global_args, result


def runtime_packages(stage):
    for _, word, rest in stage["instructions"]:
        if word == "RUN" and "apt-get install" in rest:
            tail = rest.split("apt-get install", 1)[1].split("&&")[0]
            return [t for t in tail.split() if not t.startswith("-") and t != "\\"]
    return []


def shipped_binaries(stage):
    for _, word, rest in stage["instructions"]:
        m = re.search(r"for\s+binary\s+in\s+([^;]+);", rest)
        if word == "RUN" and m:
            return m.group(1).split()
    return []


def check_structure(c):
    text = DOCKERFILE.read_text(encoding="utf-8")
    instructions = parse_dockerfile(text)
    global_args, st = stages(instructions)
    c.check(len(st) >= 2, "multi-stage: want a build stage and a runtime stage")
    names = [s["name"] for s in st]
    c.check(len(set(names)) == len(names), f"stage names must be unique: {names}")
    c.check(names[:1] == ["build"] and names[-1:] == ["runtime"],
            f"stages should be build ... runtime, got {names}")
    for s in st:
        image = substitute(s["image"], global_args)
        c.check(bool(DEBIAN_12_IMAGES.match(image)),
                f"line {s['line']}: FROM {image}: want Debian 12 (debian:bookworm[-slim])")
    build = st[0]
    runtime = st[-1]
    seen = set()
    ignore = DockerIgnore(DOCKERIGNORE.read_text(encoding="utf-8"))

    # COPY sources exist in the context and are not ignored; --from names an earlier stage.
    for s in st:
        for line, word, rest in s["instructions"]:
            c.check(word != "ADD", f"line {line}: use COPY, not ADD")
            if word != "COPY":
                continue
            tokens = shlex.split(rest)
            options = [t for t in tokens if t.startswith("--")]
            paths = [t for t in tokens if not t.startswith("--")]
            sources = paths[:-1]
            from_stage = next((o.split("=", 1)[1] for o in options if o.startswith("--from=")),
                              None)
            if from_stage is not None:
                c.check(from_stage in seen,
                        f"line {line}: COPY --from={from_stage}: no earlier stage of that name")
                continue
            for src in sources:
                if src == ".":
                    continue
                path = ROOT / src
                c.check(path.exists(), f"line {line}: COPY {src}: no such file in the tree")
                c.check(not ignore.excluded(src),
                        f"line {line}: COPY {src}: excluded by .dockerignore")
        seen.add(s["name"])

    # The build stage runs the project's own scripts, the ones CI runs.
    build_runs = " ".join(rest for _, w, rest in build["instructions"] if w == "RUN")
    for script in REQUIRED_SCRIPTS:
        c.check(script in build_runs, f"the build stage must run {script}")
    for script in sorted(set(re.findall(r"\bscripts/[\w.-]+", build_runs))):
        path = ROOT / script
        c.check(path.is_file() and os.access(path, os.X_OK),
                f"the build stage runs {script}, which is not an executable file of the tree")
    ci = (ROOT / ".ci/run").read_text(encoding="utf-8")
    test_sh = (ROOT / "scripts/test.sh").read_text(encoding="utf-8")
    c.check("scripts/test.sh" in ci and "install-deps.sh" in test_sh and "build.sh" in test_sh,
            ".ci/run must run scripts/test.sh, which runs install-deps.sh and build.sh "
            "(so a green CI exercises the image's build steps)")
    # What the build reads must be in the context.
    for path in lib.git_tracked_files():
        if needed_by_build(path):
            c.check(not ignore.excluded(path), f".dockerignore excludes {path}, which the build needs")
    for sub in re.findall(r"add_subdirectory\((\w+)\)", (ROOT / "CMakeLists.txt").read_text()):
        c.check((ROOT / sub / "CMakeLists.txt").is_file() and
                not ignore.excluded(f"{sub}/CMakeLists.txt"),
                f"{sub}/CMakeLists.txt (add_subdirectory) must exist and be in the context")
    c.check(ignore.excluded("build/CMakeCache.txt") and ignore.excluded(".git"),
            ".dockerignore should keep build/ and .git out of the context")

    # Binaries: every executable the tree defines ships; the required ones are defined.
    binaries = shipped_binaries(build)
    defined = lib.cmake_binaries()
    for b in REQUIRED_BINARIES:
        c.check(b in binaries, f"the image must ship {b}")
        c.check(b in defined, f"{b} is not a target of the tree's CMakeLists")
    for b in sorted(defined):
        c.check(b in binaries, f"the tree builds {b} but the image does not ship it")
    for b in binaries:
        if b not in defined:
            c.note(f"the image ships {b} when built; the tree does not define it yet")

    # Runtime: packages installed tidily, a non-root user, ports, default command.
    packages = runtime_packages(runtime)
    c.check(len(packages) > 0, "the runtime stage installs no packages")
    c.check(not any(p.endswith("-dev") for p in packages),
            f"runtime packages must be libraries, not -dev packages: {packages}")
    run_text = " ".join(rest for _, w, rest in runtime["instructions"] if w == "RUN")
    c.check("--no-install-recommends" in run_text and "rm -rf /var/lib/apt/lists" in run_text,
            "runtime apt-get: use --no-install-recommends and remove /var/lib/apt/lists")
    users = [rest for _, w, rest in runtime["instructions"] if w == "USER"]
    c.check(bool(users), "the runtime stage must set USER")
    if users:
        uid = users[-1].split(":")[0]
        c.check(uid.isdigit() and uid != "0",
                f"USER {users[-1]}: want a numeric non-root uid (Kubernetes runAsNonRoot)")
        c.check(f"--uid {uid}" in run_text, f"USER {uid} is not created with useradd --uid {uid}")
    expose = set()
    for _, w, rest in runtime["instructions"]:
        if w == "EXPOSE":
            expose.update(int(p.split("/")[0]) for p in rest.split())
    defaults = {
        "kvpool-master --listen": lib.default_port("kvpool-master", "listen"),
        "kvpool-master --http-listen": lib.default_port("kvpool-master", "http_listen"),
        "kvpool-segment --listen": lib.default_port("kvpool-segment", "listen"),
        "kvpool-segment --http-listen": lib.default_port("kvpool-segment", "http_listen"),
    }
    for what, port in defaults.items():
        c.check(port in expose, f"EXPOSE lacks {port}, the default port of {what}")
    copies = " ".join(rest for _, w, rest in runtime["instructions"] if w == "COPY")
    c.check("--from=build" in copies, "the runtime stage must copy the binaries from the build stage")
    check = ROOT / "deploy/docker/kvpool-http-check"
    c.check(check.is_file() and os.access(check, os.X_OK) and "kvpool-http-check" in copies,
            "the runtime image must carry deploy/docker/kvpool-http-check (compose health checks)")
    cmds = [rest for _, w, rest in runtime["instructions"] if w == "CMD"]
    entry = [rest for _, w, rest in runtime["instructions"] if w == "ENTRYPOINT"]
    c.check(not entry, "no ENTRYPOINT: the command names the binary (one image, many binaries)")
    c.check(len(cmds) == 1, "the runtime stage needs one CMD")
    if cmds:
        import json
        try:
            cmd = json.loads(cmds[0])
        except ValueError:
            cmd = None
        c.check(isinstance(cmd, list), "CMD must be in exec (JSON) form so signals reach the server")
        if isinstance(cmd, list) and cmd:
            c.check(cmd[0] in binaries, f"CMD runs {cmd[0]}, which the image does not ship")
            if cmd[0] in lib.BINARY_SOURCES:
                try:
                    problem = lib.check_flags_with_binary(cmd[0], cmd[1:])
                    c.check(problem is None, f"CMD flags rejected by {cmd[0]}: {problem}")
                except LookupError:
                    c.note(f"{cmd[0]} is not built: CMD flags checked against the sources only")
                known = lib.source_flags(cmd[0])
                for a in cmd[1:]:
                    c.check(lib.flag_name(a) in known, f"CMD flag {a} is not a flag of {cmd[0]}")


def apt_lists_present():
    r = subprocess.run(["apt-cache", "policy", "libc6"], capture_output=True, text=True)
    return r.returncode == 0 and "Candidate: (none)" not in r.stdout and "Candidate:" in r.stdout


def dependency_closure(packages):
    r = subprocess.run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
                        "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"]
                       + packages, capture_output=True, text=True, check=True)
    closure = set()
    for line in r.stdout.splitlines():
        line = line.strip()
        if not line:
            continue
        m = re.match(r"\|?(?:Pre)?Depends:\s*<?([\w.+-]+)>?", line)
        if m:
            closure.add(m.group(1))
        elif ":" not in line:
            closure.add(line.strip("<>"))
    return closure


def library_packages(binaries):
    """{binary: {package: [libraries]}} for the shared libraries the built binaries load."""
    loads = {}
    for binary, path in binaries.items():
        out = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
        loads[binary] = re.findall(r"=>\s*(/\S+)", out)
    paths = sorted({p for libs in loads.values() for p in libs})
    candidates = sorted(set(paths) | {os.path.realpath(p) for p in paths})
    # One dpkg -S for all (it is slow per call); it prints "package: path" for each it knows.
    out = subprocess.run(["dpkg", "-S"] + candidates, capture_output=True, text=True).stdout
    owner = {}
    for line in out.splitlines():
        package, _, path = line.partition(": ")
        for p in path.split(", "):
            owner[p.strip()] = package.split(":")[0].strip()
    result = {}
    for binary, libs in loads.items():
        per = result.setdefault(binary, {})
        for p in libs:
            package = owner.get(p) or owner.get(os.path.realpath(p)) or f"(no package owns {p})"
            per.setdefault(package, []).append(p)
    return result


def check_packages(c):
    if not (lib.which("apt-cache") and lib.which("dpkg")):
        print("skipped: apt-cache or dpkg is missing (not a Debian machine)")
        return lib.SKIP
    if not apt_lists_present():
        print("skipped: apt has no package lists here (run apt-get update)")
        return lib.SKIP
    _, st = stages(parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8")))
    packages = runtime_packages(st[-1])
    r = subprocess.run(["apt-cache", "show", "--no-all-versions"] + packages,
                       capture_output=True, text=True)
    shown = set(re.findall(r"^Package: (\S+)", r.stdout, re.M))
    for p in packages:
        c.check(p in shown, f"runtime package {p} does not exist in this machine's Debian archive")
    closure = dependency_closure([p for p in packages if p in shown]) | set(packages) | \
        BASE_IMAGE_PACKAGES
    binaries = {}
    for binary in list(lib.BINARY_SOURCES) + ["kvpool-bench"]:
        path = lib.binary_path(binary)
        if path is not None:
            binaries[binary] = path
        elif binary != "kvpool-bench":
            c.fail(f"{binary} is not built: cannot check its shared libraries")
    needed = set()
    for binary, packages_libs in library_packages(binaries).items():
        for package, libs in packages_libs.items():
            needed.add(package)
            c.check(package in closure,
                    f"{binary} loads {', '.join(libs)} from package {package}, which the "
                    f"runtime stage does not install")
    unused = [p for p in packages if p not in needed]
    if unused:
        c.note(f"installed for what the tree links but the binaries do not load yet: "
               f"{', '.join(unused)}")
    return c.finish()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", action="store_true")
    args = parser.parse_args()
    if args.packages:
        return check_packages(lib.Checker("docker-packages"))
    c = lib.Checker("dockerfile")
    check_structure(c)
    return c.finish()


if __name__ == "__main__":
    lib.main_guard(main)
