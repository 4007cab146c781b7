#!/usr/bin/env bash
# Whether a kernel change leaves the generated code alone: compiles each given .cu file of
# kernels/ to PTX at revision REV and in the working tree (nvcc only, no GPU) and compares the
# whole PTX files, comments and line information left out, with virtual registers and labels
# renumbered in order of first use (a refactor that moves code between functions renumbers them;
# the declared register counts and the path hash in anonymous namespaces' names are left out for
# the same reason). Exit 0 when every kernel is the same; otherwise it also lists, per kernel
# (numbered in file order), the instructions whose counts differ.
#
#   bash kernels/tools/same_ptx.sh REV [file.cu ...]   (default: kernels/mla_decode.cu)
#   NVCC_FLAGS="-arch=sm_80" bash kernels/tools/same_ptx.sh HEAD kernels/gqa_decode.cu
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
rev=${1:?usage: same_ptx.sh REV [file.cu ...]}
shift
files=("${@:-kernels/mla_decode.cu}")
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
flags=(${NVCC_FLAGS:--arch=sm_90a -DKVPOOL_HAVE_WGMMA=1})
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git -C "$root" archive "$rev" kernels | tar -x -C "$tmp"
mkdir -p "$tmp/base" "$tmp/new"

normalize() {  # PTX on stdin -> its code, registers and labels renumbered in order of use
  python3 -c '
import re, sys
lines = [l for l in sys.stdin.read().split("\n")
         if l.strip() and not re.match(r"\s*(//|\.loc|\.file|\.reg |\.version)", l)]
body = re.sub(r"_GLOBAL__N__[0-9a-f]+_", "_GLOBAL__N__", "\n".join(lines))  # the path hash
# Registers are named per function: number them afresh in each.
for function in re.split(r"\n(?=(?:\.visible |\.weak )?\.(?:entry|func) )", body):
    names = {}
    def renumber(m):
        prefix = re.sub(r"\d+$", "", m.group(0))
        seen = names.setdefault(prefix, {})
        return prefix + str(seen.setdefault(m.group(0), len(seen)))
    print(re.sub(r"%(?:rd|rs|r|fd|f|p|hh|h|b)\d+|\$L__BB\d+_\d+|\$L__tmp\d+", renumber,
                 function))
'
}

status=0
for f in "${files[@]}"; do
  name=$(basename "$f" .cu)
  "$nvcc" -std=c++17 -O3 "${flags[@]}" -I"$tmp" -ptx -o "$tmp/base/$name.ptx" "$tmp/$f"
  "$nvcc" -std=c++17 -O3 "${flags[@]}" -I"$root" -ptx -o "$tmp/new/$name.ptx" "$root/$f"
  normalize <"$tmp/base/$name.ptx" >"$tmp/base/$name.n"
  normalize <"$tmp/new/$name.ptx" >"$tmp/new/$name.n"
  kernels=$(grep -c "^\(\.visible \)\?\.entry" "$tmp/new/$name.n")
  if diff -q "$tmp/base/$name.n" "$tmp/new/$name.n" >/dev/null; then
    echo "same_ptx: $f: the same $kernels kernels as at $rev"
    continue
  fi
  status=1
  lines=$(diff "$tmp/base/$name.n" "$tmp/new/$name.n" | grep -c '^[<>]' || true)
  echo "same_ptx: $f: differs from $rev in $lines lines; instruction counts that differ" \
    "(count, kernel, opcode):"
  for v in base new; do  # kernel number, opcode (with its guard), count
    awk '/\.entry /{n++} /^\t[a-z@]/{print n, $1, ($1 ~ /^@/ ? $2 : "")}' "$tmp/$v/$name.n" |
      sort | uniq -c >"$tmp/$v/$name.ops"
  done
  counts=$(diff "$tmp/base/$name.ops" "$tmp/new/$name.ops" | grep '^[<>]' || true)
  echo "${counts:-  none: the same instructions, in another order}"
done
exit $status
