#!/usr/bin/env bash
# The cost of TLS side by side (docs/benchmarks.md, "TLS on the control and data planes"):
# kvpool-bench over TCP with a master and one kvpool-segment on loopback, in three setups,
# interleaved round by round so that the load of a shared machine falls on all of them alike:
#   plain     no TLS anywhere
#   ctl-tls   TLS to the master (server certificate), data plane plaintext
#   data-tls  TLS to the master and on the segment's data port (--data-tls)
# Each round runs: get/put 32 x 512 KiB, get/put 32 x 4 KiB, and single-key control-plane
# calls (meta: BatchPutStart+Revoke, BatchExist). Certificates (ECDSA P-256) are made in a
# temporary directory with openssl. Results: one JSON per run under $OUT (default
# /tmp/kvpool-bench-tls), and a summary table on stdout.
#
#   scripts/bench_tls.sh [ROUNDS] [DURATION]      (defaults: 2 rounds, 3s per workload)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVPOOL_BUILD_DIR:-$root/build}
rounds=${1:-2}
duration=${2:-3s}
out=${OUT:-/tmp/kvpool-bench-tls}
bench=$build/client/kvpool-bench
mkdir -p "$out"
pki=$(mktemp -d)
trap 'rm -rf "$pki"' EXIT

ec() { openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "$@" 2>/dev/null; }
ec -x509 -days 2 -keyout "$pki/ca.key" -out "$pki/ca.pem" -subj /CN=bench-ca
for name in master segment; do
  ec -keyout "$pki/$name.key" -out "$pki/$name.csr" -subj "/CN=$name"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.pem" -CAkey "$pki/ca.key" \
    -CAcreateserial -days 2 -out "$pki/$name.pem" 2>/dev/null \
    -extfile <(echo "subjectAltName=IP:127.0.0.1,DNS:localhost")
done

common=(--start-pool --segments=1 --baselines=none --transport=tcp --warmup=1s
        --duration="$duration" --progress=off)
master_tls="--tls-cert=$pki/master.pem --tls-key=$pki/master.key"
segment_tls="--tls-ca=$pki/ca.pem --tls-cert=$pki/segment.pem --tls-key=$pki/segment.key"

run() {  # setup round name args...
  local setup=$1 round=$2 name=$3
  shift 3
  local flags=()
  case $setup in
    plain) ;;
    ctl-tls) flags=(--master-args="$master_tls" --segment-args="$segment_tls"
                    --tls-ca="$pki/ca.pem") ;;
    data-tls) flags=(--master-args="$master_tls" --segment-args="$segment_tls --data-tls"
                     --tls-ca="$pki/ca.pem" --data-tls) ;;
  esac
  "$bench" "${common[@]}" "${flags[@]}" "$@" --json_out="$out/$setup-$name-$round.json" \
    >"$out/$setup-$name-$round.txt" 2>&1 || { echo "FAILED: $setup $name $round" >&2;
                                            tail -20 "$out/$setup-$name-$round.txt" >&2; }
}

for round in $(seq 1 "$rounds"); do
  for setup in plain ctl-tls data-tls; do
    echo "round $round: $setup (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    run "$setup" "$round" large --workloads=get,put --value-size=512KiB --batch-size=32 \
      --keys=256 --pool-size=1GiB
    run "$setup" "$round" small --workloads=get,put --value-size=4KiB --batch-size=32 \
      --keys=4096 --pool-size=256MiB
    run "$setup" "$round" meta --workloads=meta --value-size=4KiB --batch-size=1 \
      --pool-size=256MiB
  done
done
echo "results in $out" >&2

# Summary: per setup and workload, each round's GB/s or calls/s and p50 us.
/usr/bin/python3 - "$out" "$rounds" <<'PY'
import json, sys, glob, collections
out, rounds = sys.argv[1], int(sys.argv[2])
rows = collections.OrderedDict()
for setup in ("plain", "ctl-tls", "data-tls"):
    for name in ("large", "small", "meta"):
        for r in range(1, rounds + 1):
            try:
                doc = json.load(open(f"{out}/{setup}-{name}-{r}.json"))
            except OSError:
                continue
            for res in doc["results"]:
                if res["system"] != "kvpool" or "failure" in res:
                    continue
                key = (res["workload"], res["value_size"], res["batch_size"])
                rate = (f'{res["gb_per_s"]:.3f} GB/s' if name != "meta"
                        else f'{res["calls_per_s"]:.0f}/s')
                cell = f'{rate} p50 {res["latency_us"]["p50"]:.0f}us' + \
                       (f' err {res["errors"]}' if res["errors"] else "")
                rows.setdefault(key, collections.defaultdict(list))[setup].append(cell)
for key, cells in rows.items():
    print(f"{key[0]} {key[2]} x {key[1]} B")
    for setup in ("plain", "ctl-tls", "data-tls"):
        print(f"  {setup:9s} " + " | ".join(cells.get(setup, [])))
PY
