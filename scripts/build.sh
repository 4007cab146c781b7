#!/usr/bin/env bash
# Configures and builds kvpool into build/ (or $KVPOOL_BUILD_DIR). Incremental after the first run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVPOOL_BUILD_DIR:-$root/build}
jobs=${KVPOOL_JOBS:-$(nproc)}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${KVPOOL_BUILD_TYPE:-RelWithDebInfo} \
    -DPython_EXECUTABLE=/usr/bin/python3 -DPYTHON_EXECUTABLE=/usr/bin/python3 >/dev/null
fi
cmake --build "$build" -j "$jobs" -- ${KVPOOL_NINJA_FLAGS:-}
