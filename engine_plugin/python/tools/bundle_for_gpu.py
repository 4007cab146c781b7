#!/usr/bin/env python3
"""Packs what engine_plugin/python/tools/run_on_gpu.sh needs to build and test the `kvpool`
Python module on a GPU machine that has CUDA, PyTorch, pybind11 and a compiler but not the
server stack (no gRPC, Abseil, Protobuf, Boost, Prometheus-cpp), for that machine's Python.

Only the five binding sources are compiled there, for its Python and pybind11; everything
else comes prebuilt from this build tree:

  DIR/src/        the repository's files (tracked and new, not ignored)
  DIR/bundle/
    include.tar.gz  every header the bindings include that is not kvpool's own, the C/C++
                    library's, Python's, pybind11's or CUDA's (found by the compiler: g++ -M)
    gen/            headers generated into the build tree (protobuf's *.pb.h)
    static/         kvpool's static libraries the module links (debug info stripped)
    lib/            the shared libraries the module and the two servers load (bundle-libs rule:
                    all but glibc's, the compiler runtime's and the driver's), by soname
    bin/            kvpool-master, kvpool-segment, kvpool-bench (stripped)
    link.args       the module's link line, rewritten to the files above

    engine_plugin/python/tools/bundle_for_gpu.py [DIR]   (default: .devcarry/py-gpu)

Run it after the build (scripts/build.sh); it rebuilds nothing.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BUILD = os.environ.get("KVPOOL_BUILD_DIR", os.path.join(ROOT, "build"))
BINDINGS = ["kvpool_module.cc", "store_bindings.cc", "engine_bindings.cc", "gpu_bindings.cc",
            "py_ready_event.cc"]
# Runtime libraries every Linux has (or that must come from the machine itself).
SYSTEM = re.compile(r"/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*|"
                    r"libcuda|libnvidia[^/]*|libpython[^/]*)\.so")


def run(*argv, **kw):
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw).stdout


def soname(path):
    out = run("objdump", "-p", path)
    m = re.search(r"SONAME\s+(\S+)", out)
    return m.group(1) if m else os.path.basename(path)


def main():
    dest = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, ".devcarry", "py-gpu"))
    if os.path.exists(dest):
        shutil.rmtree(dest)
    src, bundle = os.path.join(dest, "src"), os.path.join(dest, "bundle")
    for d in ("gen", "static", "lib", "bin"):
        os.makedirs(os.path.join(bundle, d))

    # The repository's files.
    files = run("git", "-C", ROOT, "ls-files", "-co", "--exclude-standard").split("\n")
    for f in filter(None, files):
        if os.path.isfile(os.path.join(ROOT, f)):
            os.makedirs(os.path.dirname(os.path.join(src, f)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, f), os.path.join(src, f))

    # Headers: what the compiler reads for the bindings, split into generated and third-party.
    commands = {os.path.basename(e["file"]): e for e in
                json.load(open(os.path.join(BUILD, "compile_commands.json")))
                if "/engine_plugin/python/" in e["file"]}
    headers = set()
    for name in BINDINGS:
        entry = commands[name]
        argv = shlex.split(entry["command"])
        flags = []
        for i, a in enumerate(argv[1:], start=1):
            if a.startswith(("-I", "-D", "-std")) or a == "-isystem" or argv[i - 1] == "-isystem":
                flags.append(a)
        deps = run("g++", "-M", *flags, entry["file"], cwd=entry["directory"])
        headers.update(deps.replace("\\\n", " ").split()[1:])
    third_party = []
    for h in sorted(headers):
        h = os.path.abspath(h)
        if not os.path.isfile(h) or h.endswith((".cc", ".o")) or h.endswith(":"):
            continue
        if h.startswith(BUILD + "/"):
            rel = os.path.relpath(h, BUILD)
            os.makedirs(os.path.dirname(os.path.join(bundle, "gen", rel)), exist_ok=True)
            shutil.copy2(h, os.path.join(bundle, "gen", rel))
        elif h.startswith("/usr/include/"):
            rel = os.path.relpath(h, "/usr/include")
            top = rel.split("/")[0]
            if top in ("absl", "google", "grpc", "grpcpp", "grpc++", "boost", "nlohmann",
                       "prometheus", "openssl", "infiniband", "xxhash.h", "re2"):
                third_party.append((h, rel))
    with tarfile.open(os.path.join(bundle, "include.tar.gz"), "w:gz") as tar:
        for h, rel in third_party:
            tar.add(h, arcname=rel)

    # The module's link line, from the build tree, rewritten to bundled files.
    ninja = open(os.path.join(BUILD, "build.ninja")).read()
    block = ninja[ninja.index("build engine_plugin/python/site/kvpool/_kvpool"):]
    libs = re.search(r"LINK_LIBRARIES = (.*)", block).group(1).split()
    args = []
    for token in libs:
        if token.endswith(".a") and not token.startswith("/"):
            name = os.path.basename(token)
            target = os.path.join(bundle, "static", name)
            if not os.path.exists(target):
                built = os.path.join(BUILD, token)
                if not os.path.exists(built):  # not rebuilt here: the other tree's (same sources)
                    built = os.path.join(os.environ.get("KVPOOL_SERVER_BUILD_DIR", BUILD), token)
                run("strip", "-g", "-o", target, built)
            args.append("static/" + name)
        elif token.startswith("/") and ".so" in token:
            if "/cuda/" in token:
                continue  # the machine's own CUDA runtime (-lcudart below)
            real = os.path.realpath(token)
            name = soname(real)
            if not SYSTEM.search("/" + name):
                shutil.copy2(real, os.path.join(bundle, "lib", name))
                args.append("lib/" + name)
        elif token.startswith("-l"):
            if token in ("-lcudadevrt", "-lcudart_static", "-lcudart"):
                continue
            lib = run("g++", f"-print-file-name=lib{token[2:]}.so").strip()
            if os.path.isabs(lib) and not SYSTEM.search(lib) and token not in ("-latomic",):
                name = soname(os.path.realpath(lib))
                shutil.copy2(os.path.realpath(lib), os.path.join(bundle, "lib", name))
                args.append("lib/" + name)
            else:
                args.append(token)
        elif token in ("-pthread",) or token.startswith("-Wl,--push-state") or token.startswith("-Wl,--pop-state"):
            args.append(token)
    static = [a for a in args if a.startswith("static/")]
    rest = [a for a in args if not a.startswith("static/")]
    seen = set()
    static = [a for a in static if not (a in seen or seen.add(a))]
    with open(os.path.join(bundle, "link.args"), "w") as f:
        f.write(" ".join(["-Wl,--start-group", *static, "-Wl,--end-group", *rest,
                          "-L/usr/local/cuda/lib64", "-lcudart", "-ldl", "-lrt", "-lpthread"]))

    # The servers, and every shared library the module and they load at run time.
    module = None
    for tree in (BUILD, os.environ.get("KVPOOL_SERVER_BUILD_DIR", BUILD)):
        site = os.path.join(tree, "engine_plugin", "python", "site", "kvpool")
        found = [f for f in os.listdir(site) if f.startswith("_kvpool")] if os.path.isdir(site) else []
        if found:
            module = os.path.join(site, found[0])
            break
    # (KVPOOL_SERVER_BUILD_DIR: another build tree of the same server sources, if this one
    # did not build the servers.)
    servers = os.environ.get("KVPOOL_SERVER_BUILD_DIR", BUILD)
    binaries = (("kvpool-master", "server/master/kvpool-master"),
                ("kvpool-segment", "server/segment/kvpool-segment"),
                ("kvpool-bench", "client/kvpool-bench"))
    for name, rel in binaries:
        run("strip", "-o", os.path.join(bundle, "bin", name), os.path.join(servers, rel))
    for binary in ([module] if module else []) + [os.path.join(bundle, "bin", name)
                                                  for name, _ in binaries]:
        for line in run("ldd", binary).splitlines():
            m = re.search(r"=> (/\S+)", line)
            if m and not SYSTEM.search(m.group(1)) and "/cuda/" not in m.group(1):
                target = os.path.join(bundle, "lib", os.path.basename(m.group(1)))
                if not os.path.exists(target):
                    shutil.copy2(os.path.realpath(m.group(1)), target)
    size = run("du", "-sh", dest).split()[0]
    print(f"bundle_for_gpu: {dest} ({size}): {len(third_party)} headers, {len(static)} static "
          f"libraries, {len(os.listdir(os.path.join(bundle, 'lib')))} shared libraries")


if __name__ == "__main__":
    main()
