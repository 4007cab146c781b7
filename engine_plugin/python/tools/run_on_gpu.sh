#!/usr/bin/env bash
# On a GPU machine (CUDA, PyTorch, pybind11, a compiler; no server stack): builds the `kvpool`
# Python module for this machine's python3 from the repository here and the prebuilt parts that
# engine_plugin/python/tools/bundle_for_gpu.py packed into BUNDLE, then runs the GPU Python
# tests and the benchmarks (engine_plugin/python/tools/gpu_bench.py) in one go. Logs, tables
# and JSON go to $OUT (default ./py-gpu-out): machine.txt, build.log, test_gpu.log, bench.log,
# bench.md, bench.json, example.log.
#
#   engine_plugin/python/tools/run_on_gpu.sh BUNDLE [host] [build] [test] [example] [bench]
#                                            [mooncake] [-- BENCH_ARGS...]
#   (default: build test example bench; example: examples/gpu_prefix_from_pool.py --start-pool,
#   a producer and a consumer process over a Llama-3.1-8B-shaped model; host: what this
#   machine charges for the round trips at a store's and a load's ends, into host.log:
#   starting and waking a thread, a loopback TCP round trip, a call to the master, a 2 MiB x 32
#   shared-memory put; mooncake: Mooncake's own store tests, CUDA ones included, against the
#   module built here (scripts/run_mooncake_tests.sh), from the copy of kvcache-ai/Mooncake at
#   $MOONCAKE (carried: nothing of it is in this tree), the files $MOONCAKE_TESTS (default: the
#   two with CUDA tests), modules they need that this machine lacks (msgpack) from
#   $MOONCAKE_PYLIB if set; logs into mooncake_logs.tgz)
set -uo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
bundle=$(cd "${1:?usage: run_on_gpu.sh BUNDLE [steps]}" && pwd)
shift
steps=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do steps+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#steps[@]} -eq 0 ] && steps=(build test example bench)
out=${OUT:-$PWD/py-gpu-out}
work=${KVPOOL_PY_GPU_WORK:-/tmp/kvpool-py-gpu}
site=$work/site
mkdir -p "$out" "$work/obj" "$site/kvpool"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
has() { [[ " ${steps[*]} " == *" $1 "* ]]; }
start=$(date +%s)
rc=0

{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
  python3 -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name())'
  g++ --version | head -n1
} 2>&1 | tee "$out/machine.txt"

if has host; then
  {
    uname -r; nproc; grep -m1 'model name' /proc/cpuinfo
    g++ -O2 -pthread -o "$work/thread_start" "$root/engine_plugin/python/tools/thread_start.cc" &&
      "$work/thread_start"
    b=("$bundle/bin/kvpool-bench" --start-pool --segments=1 --duration=3s --quiet-below=0)
    "${b[@]}" --pool-size=256MiB --transport=tcp --workloads=get --value-size=4KiB \
      --batch-size=1 --keys=1024 --baselines=tcp
    "${b[@]}" --pool-size=256MiB --workloads=meta-exist --batch-size=1 --baselines=none
    "${b[@]}" --pool-size=4GiB --transport=shm --workloads=put --value-size=2MiB \
      --batch-size=32 --baselines=none
  } 2>&1 | tee "$out/host.log" | grep -v '^\s*$' | tail -n 60
fi

if has build; then
  ext=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  py_includes=$(python3 -m pybind11 --includes)
  inc=$work/include
  rm -rf "$inc" && mkdir -p "$inc" && tar -xzf "$bundle/include.tar.gz" -C "$inc"
  flags=(-std=c++20 -O2 -DNDEBUG -fPIC -fvisibility=hidden -pthread -DKVPOOL_HAVE_CUDA
         -DBOOST_ALL_NO_LIB -I"$root" -I"$bundle/gen" -I"$root/client/include"
         -I"$bundle/gen/proto" $py_includes -isystem "$inc" -isystem /usr/local/cuda/include
         -Wno-deprecated-declarations)
  pids=()
  for src in kvpool_module store_bindings engine_bindings gpu_bindings py_ready_event; do
    g++ "${flags[@]}" -c "$root/engine_plugin/python/$src.cc" -o "$work/obj/$src.o" \
      >"$work/build_$src.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  cat "$work"/build_*.log >"$out/build.log"
  if [ $rc -ne 0 ]; then
    tail -n 40 "$out/build.log"
    echo "run_on_gpu: compiling the bindings failed"
    exit 1
  fi
  (cd "$bundle" && g++ -shared -o "$site/kvpool/_kvpool$ext" "$work"/obj/*.o $(cat link.args) \
     -Wl,-rpath-link,"$bundle/lib") >>"$out/build.log" 2>&1 ||
    { tail -n 40 "$out/build.log"; echo "run_on_gpu: linking the module failed"; exit 1; }
  cp "$root"/engine_plugin/python/kvpool/*.py "$root"/engine_plugin/python/kvpool/py.typed \
    "$site/kvpool/"
  echo "run_on_gpu: built _kvpool$ext in $(($(date +%s) - start)) s"
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
python3 -c 'import kvpool, kvpool.ops as ops; print("kvpool", kvpool.__version__, "HAS_CUDA", kvpool.HAS_CUDA, "custom ops", ops._CUSTOM_OPS)' 2>&1 |
  tee -a "$out/machine.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "run_on_gpu: import kvpool failed"; exit 1; }

if has test; then
  KVPOOL_MASTER_BIN="$bundle/bin/kvpool-master" KVPOOL_SEGMENT_BIN="$bundle/bin/kvpool-segment" \
    timeout ${KVPOOL_TEST_TIMEOUT:-200} python3 -m pytest -q -rs -p no:cacheprovider \
    "$root/engine_plugin/python/tests/test_gpu.py" "$root/engine_plugin/python/tests/test_ops.py" \
    2>&1 | tee "$out/test_gpu.log" | tail -n 40
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi

if has example; then
  KVPOOL_MASTER_BIN="$bundle/bin/kvpool-master" KVPOOL_SEGMENT_BIN="$bundle/bin/kvpool-segment" \
    timeout ${KVPOOL_EXAMPLE_TIMEOUT:-240} python3 "$root/examples/gpu_prefix_from_pool.py" \
    --start-pool 2>&1 | tee "$out/example.log" | grep -E '^\{|Error|error' | tail -n 20
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi

if has mooncake; then
  # The runner expects a build tree: links to this machine's module and the bundle's master.
  links=$work/build-links
  mkdir -p "$links/server/master" "$links/engine_plugin/python" "$work/mooncake_logs"
  ln -sfn "$bundle/bin/kvpool-master" "$links/server/master/kvpool-master"
  ln -sfn "$site" "$links/engine_plugin/python/site"
  ln -sfn "$root/engine_plugin/python/mooncake_shim" "$links/engine_plugin/python/site_mooncake"
  [ -n "${MOONCAKE_PYLIB:-}" ] && cp -r "$MOONCAKE_PYLIB"/. "$site/"
  KVPOOL_BUILD_DIR=$links PYTHON=python3 KVPOOL_MOONCAKE_TEST_LOGS=$work/mooncake_logs \
    KVPOOL_MOONCAKE_TEST_TIMEOUT=${KVPOOL_MOONCAKE_TEST_TIMEOUT:-150} \
    timeout 300 bash "$root/scripts/run_mooncake_tests.sh" "${MOONCAKE:?mooncake: set MOONCAKE}" \
    ${MOONCAKE_TESTS:-mooncake-wheel/tests/test_put_get_tensor.py mooncake-wheel/tests/test_dummy_client.py} \
    2>&1 | tee "$out/mooncake.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  grep -q "^total: \([0-9]*\)/\1 passed" "$out/mooncake.log" || rc=1
  tar -czf "$out/mooncake_logs.tgz" -C "$work" mooncake_logs
fi

if has bench; then
  KVPOOL_MASTER_BIN="$bundle/bin/kvpool-master" KVPOOL_SEGMENT_BIN="$bundle/bin/kvpool-segment" \
    timeout ${KVPOOL_BENCH_TIMEOUT:-330} python3 "$root/engine_plugin/python/tools/gpu_bench.py" \
    --out "$out" "$@" 2>&1 | tee "$out/bench.log" | tail -n 60
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
echo "run_on_gpu: done in $(($(date +%s) - start)) s, status $rc"
exit $rc
