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
# The huge-page tests need 16 free 2 MiB pages. Where we may (root, writable /proc/sys), lend
# them for this run and give them back after; elsewhere those tests skip and say so.
hugepages_file=/proc/sys/vm/nr_hugepages
if [ -w "$hugepages_file" ] && [ "$(cat "$hugepages_file")" -lt 16 ]; then
  hugepages_before=$(cat "$hugepages_file")
  trap 'echo "$hugepages_before" >"$hugepages_file" 2>/dev/null || true' EXIT
  echo 16 >"$hugepages_file" 2>/dev/null || true
fi
ctest --output-on-failure --no-tests=error -j "${KVPOOL_TEST_JOBS:-2}" "$@"
