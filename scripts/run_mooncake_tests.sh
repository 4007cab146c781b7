#!/usr/bin/env bash
# Runs Mooncake's own Python store tests, unchanged, against kvpool: only `mooncake.store` is
# redirected (the opt-in shim comes first on PYTHONPATH; Mooncake's other pure-Python modules,
# e.g. mooncake.mooncake_config, still come from the checkout). Each file gets a fresh
# kvpool-master on a free loopback port, with a 500 ms lease as Mooncake's CI runs its master
# (scripts/run_tests.sh: --default_kv_lease_ttl=500, DEFAULT_KV_LEASE_TTL=500); the tests find
# it through their usual environment variables. Prints one summary line per file.
#
#   scripts/run_mooncake_tests.sh MOONCAKE_CHECKOUT [TEST_FILE...]
#
# MOONCAKE_CHECKOUT is a checkout (or an extracted copy) of kvcache-ai/Mooncake, outside this
# tree; TEST_FILE paths are relative to it (default: the store tests listed below).
# KVPOOL_BUILD_DIR (default build/) holds kvpool-master and the Python package;
# KVPOOL_MOONCAKE_MASTER_ARGS adds flags to every kvpool-master started (e.g. --lease-on-put,
# with which test_batch_replica_clear.py's two active-lease cases pass: see
# docs/engine_plugin.md); KVPOOL_MOONCAKE_TEST_TIMEOUT (default 2400 s) bounds each pytest file (test_tensor_api.py's
# benchmark and stress cases move GiBs and take over 15 minutes on a loaded 2-core machine).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# Absolute: each test file runs from its own directory.
build=$(cd "${KVPOOL_BUILD_DIR:-$root/build}" && pwd) ||
  { echo "run_mooncake_tests: no build directory ${KVPOOL_BUILD_DIR:-$root/build}" >&2; exit 2; }
mc=$(cd "${1:?usage: run_mooncake_tests.sh MOONCAKE_CHECKOUT [TEST_FILE...]}" && pwd)
shift
files=("$@")
if [ ${#files[@]} -eq 0 ]; then
  files=(mooncake-wheel/tests/test_distributed_object_store.py
         mooncake-wheel/tests/test_replicated_distributed_object_store.py
         mooncake-wheel/tests/test_put_get_tensor.py
         mooncake-wheel/tests/test_safetensor_functions.py
         mooncake-wheel/tests/test_batch_replica_clear.py
         mooncake-wheel/tests/test_dummy_client.py
         mooncake-wheel/tests/test_multi_dummy_clients.py
         scripts/test_tensor_api.py
         scripts/test_upsert_api.py
         scripts/test_async_store.py
         scripts/test_copy_move_api.py
         mooncake-store/benchmarks/test_store_kv_bench.py
         mooncake-store/tests/e2e/session_ranges_tcp_e2e.py)
fi
python=${PYTHON:-/usr/bin/python3}
site=$build/engine_plugin/python/site
shim=$build/engine_plugin/python/site_mooncake
logs=${KVPOOL_MOONCAKE_TEST_LOGS:-$(mktemp -d)}
echo "logs in $logs"
# Mooncake's wheel also packages mooncake-integration/store/async_store.py as
# mooncake.async_store (a subclass of mooncake.store's class): serve it from the checkout too.
overlay=$(mktemp -d)
mkdir -p "$overlay/mooncake"
[ -f "$mc/mooncake-integration/store/async_store.py" ] &&
  ln -s "$mc/mooncake-integration/store/async_store.py" "$overlay/mooncake/async_store.py"
# Mooncake's e2e scripts import its compiled module as a top-level `store` (they run with
# PYTHONPATH=build/mooncake-integration): the same redirect, under that name.
echo 'from mooncake.store import *  # noqa: F401,F403' >"$overlay/store.py"

# start_master [LISTEN [EMBEDDED_SIZE [PREFAULT]]]: sets master_pid, grpc, http.
start_master() {
  exec {out}< <(exec "$build/server/master/kvpool-master" --listen="${1:-127.0.0.1:0}" \
    --http-listen=127.0.0.1:0 --embedded-segment-size="${2:-0}" --lease-ttl=500ms \
    --prefault="${3:-false}" ${KVPOOL_MOONCAKE_MASTER_ARGS:-} 2>"$logs/master.err")
  master_pid=$!
  local line
  # Prefaulting 4 GiB takes a while on a loaded machine.
  while read -r -t 180 line <&$out; do
    case $line in
      "kvpool-master listening"*)
        grpc=$(sed -n 's/.*grpc=\([^ ]*\).*/\1/p' <<<"$line")
        http=$(sed -n 's/.*http=\([^ ]*\).*/\1/p' <<<"$line")
        return 0 ;;
    esac
  done
  echo "kvpool-master did not start: $(tail -3 "$logs/master.err")" >&2
  kill "$master_pid" 2>/dev/null
  exit 1
}

stop_master() {
  kill "$master_pid" 2>/dev/null
  wait "$master_pid" 2>/dev/null
  exec {out}<&-
}
trap 'stop_master; rm -rf "$overlay"' EXIT

total_pass=0 total_run=0
for file in "${files[@]}"; do
  case $file in
    # Mooncake's dummy clients attach to a local "real client" daemon at 127.0.0.1:50052;
    # kvpool's thin clients attach to the master itself, which holds the memory there. It is
    # prefaulted, as kvpool-master's pool is by default: a client that maps a same-host pool
    # whose pages were never touched populates them all (4 GiB: a minute on a loaded 2-core
    # machine), and Mooncake's two-process test waits only 10 s for the other's first put.
    *dummy*) start_master 127.0.0.1:50052 4GiB true ;;
    *) start_master ;;
  esac
  name=$(basename "$file" .py)
  run_env=(env PYTHONPATH="$shim:$site:$mc/mooncake-wheel:$overlay" PYTHONDONTWRITEBYTECODE=1
       MASTER_SERVER="$grpc" MOONCAKE_MASTER="$grpc" MC_METADATA_SERVER=P2PHANDSHAKE
       MOONCAKE_TE_META_DATA_SERVER=P2PHANDSHAKE LOCAL_HOSTNAME=localhost
       MOONCAKE_LOCAL_HOSTNAME=localhost PROTOCOL=tcp MOONCAKE_PROTOCOL=tcp DEVICE_NAME=
       MOONCAKE_DEVICE= MOONCAKE_MASTER_METRICS_PORT="${http##*:}" DEFAULT_KV_LEASE_TTL=500)
  cd "$mc/$(dirname "$file")"
  case $file in
    *test_multi_dummy_clients.py)
      # Two processes that wait for each other's keys, as Mooncake's CI runs them.
      "${run_env[@]}" timeout 300 "$python" "$(basename "$file")" --client-id client1 \
        >"$logs/$name.client1.log" 2>&1 &
      first=$!
      "${run_env[@]}" timeout 300 "$python" "$(basename "$file")" --client-id client2 \
        >"$logs/$name.client2.log" 2>&1
      wait "$first"
      ok=$(grep -lx "OK" "$logs/$name.client1.log" "$logs/$name.client2.log" | wc -l)
      printf '%s (run as client1 and client2)\n' "$([ "$ok" = 2 ] && echo "1 passed" || echo "1 failed")" \
        >"$logs/$name.log" ;;
    */e2e/*.py)
      # A script, not a pytest file: one test, passed when it exits 0.
      "${run_env[@]}" timeout 300 "$python" "$(basename "$file")" >"$logs/$name.out" 2>&1
      rc=$?
      { cat "$logs/$name.out"
        printf '%s (exit status %d)\n' "$([ $rc = 0 ] && echo "1 passed" || echo "1 failed")" $rc
      } >"$logs/$name.log" ;;
    *)
      "${run_env[@]}" timeout "${KVPOOL_MOONCAKE_TEST_TIMEOUT:-2400}" "$python" -m pytest -q \
        -p no:cacheprovider -rfEs \
        "$(basename "$file")" >"$logs/$name.log" 2>&1 ;;
  esac
  cd "$root"
  stop_master
  summary=$(grep -E "^(=+ )?[0-9]+ (passed|failed|error)|no tests ran|(passed|failed|error).* in [0-9.]+s" \
            "$logs/$name.log" | tail -1)
  passed=$(grep -oE "[0-9]+ passed" <<<"$summary" | grep -oE "[0-9]+" || echo 0)
  others=0  # failed, errors and skipped, summed in the shell (no bc on the GPU machines)
  for n in $(grep -oE "[0-9]+ (failed|error|errors|skipped)" <<<"$summary" | grep -oE "^[0-9]+"); do
    others=$((others + n))
  done
  run=$((passed + others))
  total_pass=$((total_pass + passed)) total_run=$((total_run + run))
  printf '%-48s %3d/%-3d  %s\n' "$file" "$passed" "$run" "${summary:-(no summary: see $logs/$name.log)}"
done
echo "total: $total_pass/$total_run passed"
