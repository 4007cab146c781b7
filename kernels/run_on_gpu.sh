#!/usr/bin/env bash
# On a GPU machine: builds kernels/ standalone (no server stack needed), checks every kernel
# against its CPU reference, then benchmarks them next to their ceilings and PyTorch SDPA.
# Logs and tables go to $OUT (or ./gpu-out).
#
#   bash kernels/run_on_gpu.sh [check] [bench] [bench-copy] [bench-attn] [sdpa] [bench-mla]
#                              [bench-gqa] [ncu] [ncu-split] [ncu-source] [phases] [ab]
#   (default: check bench sdpa; bench-copy: the block copies only; bench-attn: the read ceiling
#   and the attention matrix only;
#   bench-mla / bench-gqa: the read ceiling and the MLA / GQA rows)
# ncu profiles a few rows of the benchmark (hardware counters; clocks left alone); ncu-split
# gives the time of each kernel of a split row's launch (attention, then merge) on the rows
# that fall furthest below the ceiling, whose times the bench only reports together.
# phases: cycles per phase of the wgmma MLA kernel's loops and the rates of its wgmma shapes
# (kvpool-mla-phases; MLA_PHASE_ROWS="heads:batch:len ..." picks the rows).
# ab: the working tree's kernels against a base tree's, in one call: KVPOOL_AB_BASE names a
# folder holding the base's kernels/ (made beside the checkout, e.g.
#   mkdir -p .devcarry/base && git archive main kernels | tar -x -C .devcarry/base
# with .devcarry carried), built in the background while this tree builds and checks; then
# kvpool-kernels-bench --sections ${KVPOOL_AB_SECTIONS:-mla} (rows from KVPOOL_BENCH_ROWS) runs
# base, new, base, new (KVPOOL_AB_RUNS pairs, default 2) into ab.md.
# KVPOOL_CHECKS=copy (or gqa, mla, a comma list) runs only those families of checks.
# KVPOOL_BENCH_ROWS="matrix,spans" keeps only the GQA and MLA rows whose label holds one of
# these.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/gpu-out}
build=${KVPOOL_KERNELS_BUILD:-/tmp/kvpool-kernels-build}
steps=${*:-check bench sdpa}
mkdir -p "$out"
export PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv >"$out/gpu.txt" 2>&1 || true
generator=(-G Ninja)
command -v ninja >/dev/null || generator=()
start=$(date +%s)
base_build=/tmp/kvpool-kernels-base
if [[ " $steps " == *" ab "* ]]; then
  if [ ! -f "${KVPOOL_AB_BASE:-}/kernels/CMakeLists.txt" ]; then
    echo "run_on_gpu: ab needs KVPOOL_AB_BASE, a folder holding the base's kernels/" \
      "(KVPOOL_AB_BASE=${KVPOOL_AB_BASE:-unset})"
    exit 2
  fi
  { cmake -S "$KVPOOL_AB_BASE/kernels" -B "$base_build" "${generator[@]}" \
      -DCMAKE_BUILD_TYPE=Release && cmake --build "$base_build" -j "$(nproc)"; } >"$out/build_base.log" 2>&1 &
  base_pid=$!
fi
if ! { cmake -S "$root/kernels" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release &&
       cmake --build "$build" -j "$(nproc)"; } >"$out/build.log" 2>&1; then
  tail -n 60 "$out/build.log"
  echo "run_on_gpu: build failed"
  exit 1
fi
echo "run_on_gpu: built in $(($(date +%s) - start)) s"
rc=0
if [[ " $steps " == *" check "* ]]; then
  timeout ${KVPOOL_CHECK_TIMEOUT:-300} "$build/kvpool-kernels-check" 20240601 \
    "${KVPOOL_CHECKS:-copy,gqa,mla}" 2>&1 | tee "$out/check.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [[ " $steps " == *" bench "* ]]; then
  timeout 400 "$build/kvpool-kernels-bench" --csv "$out/bench.csv" 2>&1 | tee "$out/bench.md"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [[ " $steps " == *" bench-copy "* ]]; then
  timeout 300 "$build/kvpool-kernels-bench" --sections copy 2>&1 | tee "$out/bench_copy.md"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [[ " $steps " == *" bench-attn "* ]]; then
  timeout 300 "$build/kvpool-kernels-bench" --sections gqa,mla --csv "$out/bench.csv" 2>&1 |
    tee "$out/bench_attn.md"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [[ " $steps " == *" bench-mla "* ]]; then
  timeout 300 "$build/kvpool-kernels-bench" --sections mla \
    ${KVPOOL_BENCH_ROWS:+--rows "$KVPOOL_BENCH_ROWS"} 2>&1 | tee "$out/bench_mla.md"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [[ " $steps " == *" bench-gqa "* ]]; then
  timeout 300 "$build/kvpool-kernels-bench" --sections gqa \
    ${KVPOOL_BENCH_ROWS:+--rows "$KVPOOL_BENCH_ROWS"} 2>&1 | tee "$out/bench_gqa.md"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [[ " $steps " == *" phases "* ]]; then
  timeout 200 "$build/kvpool-mla-phases" ${MLA_PHASE_ROWS:-} 2>&1 | tee "$out/mla_phases.md"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [[ " $steps " == *" ab "* ]]; then
  if ! wait "$base_pid"; then
    tail -n 30 "$out/build_base.log"
    echo "run_on_gpu: the base build failed"
    rc=1
  else
    for i in $(seq "${KVPOOL_AB_RUNS:-2}"); do
      for v in base new; do
        bin=$build/kvpool-kernels-bench
        [ $v = base ] && bin=$base_build/kvpool-kernels-bench
        echo "=== $v, run $i"
        timeout 200 "$bin" --sections "${KVPOOL_AB_SECTIONS:-mla}" \
          ${KVPOOL_BENCH_ROWS:+--rows "$KVPOOL_BENCH_ROWS"} || rc=1
      done
    done > >(tee "$out/ab.md") 2>&1
  fi
fi
if [[ " $steps " == *" sdpa "* ]] && [ -f "$out/bench.csv" ]; then
  timeout 300 python3 "$root/kernels/bench_sdpa.py" "$out/bench.csv" 2>&1 | tee "$out/sdpa.md"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [[ " $steps " == *" ncu "* ]]; then
  for row in ${NCU_ROWS:-gqa:8:1:128:8192 mla:128:bf16:16:8192 mla:16:bf16:1:65536}; do
    echo "=== ncu $row"
    timeout 240 ncu --clock-control none --launch-skip 3 --launch-count 1 \
      -k regex:'GqaDecodeKernel|MlaDecodeKernel|MlaWgmmaKernel' --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
      --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
      "$build/kvpool-kernels-bench" --only "$row" --reps 2 >"$out/ncu_${row//:/_}.txt" 2>&1
    grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Issue Slots|No Eligible|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Stall|L2 Hit|Mem Pipes|Executed Ipc A" \
      "$out/ncu_${row//:/_}.txt" | head -30
  done
fi
if [[ " $steps " == *" ncu-split "* ]]; then
  for row in ${NCU_SPLIT_ROWS:-gqa:8:1:1:131072 mla:16:bf16:1:65536 gqa:8:1:128:8192 gqa:32:8:8:32768}; do
    echo "=== ncu-split $row (kernel, grid x block, duration)"
    timeout 240 ncu --clock-control none --launch-skip 6 --launch-count 6 \
      -k regex:'DecodeKernel|Merge' --section SpeedOfLight --section LaunchStats \
      "$build/kvpool-kernels-bench" --only "$row" --reps 3 >"$out/ncu_split_${row//:/_}.txt" 2>&1
    awk '/^  [A-Za-z_].*\(/ { name = $0; gsub(/void |kvpool::kernels::|\(anonymous namespace\)::/, "", name)
                               sub(/, Context.*/, "", name); name = substr(name, 3) }
         /^ +Duration/ { print substr(name, 1, 60), "...", substr(name, length(name) - 30), "|", $(NF-1), $NF }' \
      "$out/ncu_split_${row//:/_}.txt"
  done
fi
if [[ " $steps " == *" ncu-source "* ]]; then
  # Per-SASS-instruction warp stall samples of one MLA row: where the time goes.
  row=${NCU_SOURCE_ROW:-mla:128:bf16:16:8192}
  timeout 300 ncu --clock-control none --launch-skip 3 --launch-count 1 -k regex:'MlaDecodeKernel|MlaWgmmaKernel' \
    --section SourceCounters --section WarpStateStats --page source --csv \
    --print-source sass "$build/kvpool-kernels-bench" --only "$row" --reps 2 \
    >"$out/ncu_source.csv" 2>&1
  python3 - "$out/ncu_source.csv" <<'PY' | tee "$out/ncu_source_top.txt"
import csv, sys
lines = open(sys.argv[1]).read().splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith('"'))
rows = list(csv.DictReader(lines[start:]))
cols = rows[0].keys()
key = next(c for c in cols if "Warp Stall Sampling (All" in c)
src = next(c for c in cols if c.strip('"') == "Source")
total = sum(float(r[key] or 0) for r in rows)
print("total samples", total, "columns:", [c for c in cols if "stall" in c.lower()][:40])
for r in sorted(rows, key=lambda r: -float(r[key] or 0))[:40]:
    print("%6.2f%%  %s" % (100 * float(r[key] or 0) / total, r[src][:110]))
PY
fi
echo "run_on_gpu: done in $(($(date +%s) - start)) s, status $rc"
exit $rc
