#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang, AddressSanitizer and UBSan into
# build-fuzz/ (or $KVPOOL_FUZZ_BUILD_DIR), then runs each for SECONDS (default 60) from its
# seed corpus (tests/fuzz/corpus/NAME, never written: new inputs go to build-fuzz/corpus/NAME).
# Exits non-zero on the first crash, leak or failed check, leaving the input in build-fuzz/.
#   scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVPOOL_FUZZ_BUILD_DIR:-$root/build-fuzz}
seconds=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(frame_fuzz capability_fuzz credential_table_fuzz size_fuzz exposure_fuzz
           shm_handshake_fuzz rdma_handshake_fuzz store_config_fuzz http_request_fuzz
           master_core_fuzz)
fi
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVPOOL_FUZZ=ON \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
    -DCMAKE_C_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer" >/dev/null
fi
cmake --build "$build" -j "${KVPOOL_JOBS:-$(nproc)}" --target "${targets[@]}"
for target in "${targets[@]}"; do
  name=${target%_fuzz}
  mkdir -p "$build/corpus/$name" "$build/artifacts/$name"
  echo "== $target for ${seconds}s"
  (cd "$build/artifacts/$name" &&
    "$build/tests/fuzz/$target" -max_total_time="$seconds" -print_final_stats=1 \
      -artifact_prefix="$build/artifacts/$name/" "$build/corpus/$name" "$root/tests/fuzz/corpus/$name")
done
echo "fuzz: ${#targets[@]} targets, ${seconds}s each, no findings"
