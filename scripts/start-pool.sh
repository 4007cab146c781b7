#!/usr/bin/env bash
# Quick start: installs what is missing, builds, and runs a single-node pool on loopback
# (a master with an embedded segment) in the foreground. Ctrl-C stops it.
# Extra arguments go to kvpool-master, e.g. scripts/start-pool.sh --embedded-segment-size=4GiB
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
exec "${KVPOOL_BUILD_DIR:-$root/build}/server/master/kvpool-master" "$@"
