#!/usr/bin/env bash
# The end-to-end run on a GPU machine: starts kvpool-master and a kvpool-segment on loopback,
# runs kvpool-gpu-e2e against them (store a GPU KV cache through the engine plugin, zero it,
# load it back, compare caches and GQA/MLA decode outputs, report bandwidth next to a pinned
# copy), and stops them. Results in $OUT (default ./gpu-e2e-out).
#
#   tests/gpu/run_gpu_e2e.sh [BIN_DIR]
#
# BIN_DIR holds kvpool-master, kvpool-segment and kvpool-gpu-e2e (default: the build tree), and
# optionally lib/ with the shared libraries they need where the machine lacks them (gRPC,
# Abseil, Protobuf, Boost, Prometheus-cpp): tests/gpu/bundle_for_gpu.sh makes such a folder.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:-}
out=${OUT:-$PWD/gpu-e2e-out}
mkdir -p "$out"
find_bin() {
  if [ -n "$bin" ]; then echo "$bin/$1"; else find "$root/build" -name "$1" -type f | head -n 1; fi
}
master_bin=$(find_bin kvpool-master)
segment_bin=$(find_bin kvpool-segment)
e2e_bin=$(find_bin kvpool-gpu-e2e)
[ -n "$bin" ] && [ -d "$bin/lib" ] && export LD_LIBRARY_PATH="$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# Waits up to 60 s for a line starting with $2 in file $1 and prints it.
wait_line() {
  for _ in $(seq 600); do
    line=$(grep -m1 "^$2" "$1" 2>/dev/null || true)
    [ -n "$line" ] && { echo "$line"; return 0; }
    sleep 0.1
  done
  echo "run_gpu_e2e: no \"$2\" in $1" >&2
  return 1
}

"$master_bin" --listen=127.0.0.1:0 --http-listen=127.0.0.1:0 --embedded-segment-size=0 \
  >"$out/master.out" 2>"$out/master.log" &
pids+=($!)
grpc=$(wait_line "$out/master.out" "kvpool-master listening" | sed 's/.*grpc=\([^ ]*\).*/\1/')
"$segment_bin" --master="$grpc" --size="${KVPOOL_E2E_POOL:-4GiB}" --listen=127.0.0.1:0 \
  --http-listen=127.0.0.1:0 --threads=4 >"$out/segment.out" 2>"$out/segment.log" &
pids+=($!)
wait_line "$out/segment.out" "kvpool-segment mounted" >/dev/null
echo "run_gpu_e2e: master $grpc, segment mounted"
"$e2e_bin" --master="$grpc" --json="$out/e2e.json" "${@:2}" 2>&1 | tee "$out/e2e.md"
exit "${PIPESTATUS[0]}"
