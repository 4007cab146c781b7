#!/usr/bin/env bash
# Packs what tests/gpu/run_gpu_e2e.sh needs on a GPU machine that has CUDA but not the server
# stack: the three binaries (stripped) and the shared libraries they link that such a machine
# lacks, into DIR/ and DIR/lib/ (default .devcarry/gpu-e2e, which git ignores).
#
#   tests/gpu/bundle_for_gpu.sh [DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:-$root/.devcarry/gpu-e2e}
build=${KVPOOL_BUILD_DIR:-$root/build}
"$root/scripts/build.sh"
rm -rf "$dir" && mkdir -p "$dir"
for name in kvpool-master kvpool-segment kvpool-gpu-e2e; do
  path=$(find "$build" -name "$name" -type f | head -n 1)
  [ -n "$path" ] || { echo "bundle_for_gpu: $name was not built (is nvcc there?)" >&2; exit 1; }
  strip -o "$dir/$name" "$path"
done
bundler=$root/../shared/tools/bundle-libs
if [ -x "$bundler" ]; then
  "$bundler" "$dir/lib" "$dir/kvpool-master" "$dir/kvpool-segment" "$dir/kvpool-gpu-e2e"
else
  # The same rule: every library they load, but glibc's, the compiler runtime's and the driver.
  mkdir -p "$dir/lib"
  ldd "$dir"/kvpool-* | awk '/=>/ && $3 ~ /^\// {print $3}' | sort -u |
    grep -vE '/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so' |
    grep -vE '/libcuda\.so|/libnvidia' | xargs -r -I{} cp -L {} "$dir/lib/"
fi
du -sh "$dir"
