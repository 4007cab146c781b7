#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (unit, integration, Python).
# Every test starts the servers it needs on free loopback ports and stops them.
# Extra arguments go to ctest, e.g. scripts/test.sh -R index
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVPOOL_BUILD_DIR:-$root/build}
"$root/scripts/install-deps.sh" --test
"$root/scripts/build.sh"
cd "$build"
ctest --output-on-failure --no-tests=error -j "${KVPOOL_TEST_JOBS:-2}" "$@"
