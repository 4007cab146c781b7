#!/usr/bin/env bash
# Builds the tree with sanitizers and runs the tests, timing the run:
#   scripts/sanitize.sh asan [CTEST ARGS...]   AddressSanitizer + UBSan, into build-asan/
#   scripts/sanitize.sh tsan [CTEST ARGS...]   ThreadSanitizer, into build-tsan/; by default
#                                              only the master and client tests
# TSan sees a lock only where the code that takes it is instrumented, and absl::Mutex (every
# lock of kvpool's) lives in Debian's uninstrumented libabsl: a tsan run first builds Debian's
# own abseil source package (the installed version, from Debian's archive, checksummed) with
# -fsanitize=thread into build-tsan/abseil, and runs the tests on those libraries
# (LD_LIBRARY_PATH; same sonames, same headers), so gRPC's and kvpool's locks are both seen.
# ASan/UBSan: a report fails the test that made it (halt_on_error; UBSan does not recover).
# TSan: the tests run on, and tests/sanitizers/tsan_triage.py fails the run on kvpool's races.
# KVPOOL_SANITIZE_TARGETS="a b" builds only those targets (then pass a matching -R to ctest).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kind=${1:-asan}
shift || true
case "$kind" in
  asan)
    flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    # Leaks inside libcrypto that gRPC's TLS handshaker leaves now and then (the file says why).
    export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/tests/sanitizers/lsan.supp}
    # AttackTest.ExhaustedDescriptorsDoNotSpinAndServingResumes runs a segment out of file
    # descriptors on purpose, and the sanitizer runtime needs one: UBSan's vptr check probes
    # the vtable's memory with pipe(2), which then fails, and it reports a valid Boost.System
    # error category as an "invalid vptr" (docs/testing.md). It runs in the normal suite only.
    export GTEST_FILTER=${GTEST_FILTER:--AttackTest.ExhaustedDescriptorsDoNotSpinAndServingResumes}
    ;;
  tsan)
    flags="-fsanitize=thread -fno-omit-frame-pointer"
    # Every process writes its reports to build-tsan/tsan-reports/; tests/sanitizers/
    # tsan_triage.py then fails the run on each report of kvpool's own code and counts the
    # rest (races TSan reports on memory gRPC hands between its uninstrumented threads).
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=0:exitcode=0:second_deadlock_stack=1:log_path=$root/build-tsan/tsan-reports/report}
    if [ $# -eq 0 ]; then
      tests="master_test range_allocator_test auth_policy_test tenant_usage_test client_test tcp_transport_test pool_test store_semantics_test transport_test security_test"
      : "${KVPOOL_SANITIZE_TARGETS:=$tests kvpool-master kvpool-segment kvpoolctl}"
      set -- -R "^(${tests// /|})\$"
    fi
    ;;
  *) echo "usage: scripts/sanitize.sh asan|tsan [ctest args]" >&2; exit 2 ;;
esac
build=$root/build-$kind

# Debian's abseil, built with TSan into $build/abseil/lib (once).
tsan_abseil() {
  local version want_orig want_debian dir=$build/abseil
  [ -f "$dir/lib/libabsl_synchronization.so.20220623" ] && return
  version=$(dpkg-query -W -f='${Version}' libabsl20220623)
  # Checksums of the Debian source package 20220623.1-1+deb12u2 (its .dsc).
  want_orig=abfe2897f3a30edaa74bc34365afe3c2a3cd012091a97dc7e008f7016adcd5fe
  want_debian=e08490fc7b6f3beca1925953b0c4fb92df2de5e2a01295e4641e2a3d4e528eeb
  if [ "$version" != "20220623.1-1+deb12u2" ]; then
    echo "sanitize.sh tsan: libabsl is $version; update the checksums in this script" >&2
    exit 1
  fi
  for tool in curl patch sha256sum; do
    command -v "$tool" >/dev/null || { echo "sanitize.sh tsan: needs $tool" >&2; exit 1; }
  done
  mkdir -p "$dir/src"
  local pool=http://deb.debian.org/debian/pool/main/a/abseil
  curl -sSf -o "$dir/orig.tar.gz" "$pool/abseil_20220623.1.orig.tar.gz"
  curl -sSf -o "$dir/debian.tar.xz" "$pool/abseil_${version}.debian.tar.xz"
  echo "$want_orig  $dir/orig.tar.gz" | sha256sum -c --quiet
  echo "$want_debian  $dir/debian.tar.xz" | sha256sum -c --quiet
  tar -xzf "$dir/orig.tar.gz" -C "$dir/src" --strip-components=1
  tar -xJf "$dir/debian.tar.xz" -C "$dir/src"
  while read -r patch; do
    [ -n "$patch" ] && patch -s -d "$dir/src" -p1 <"$dir/src/debian/patches/$patch"
  done <"$dir/src/debian/patches/series"
  cmake -S "$dir/src" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON -DBUILD_TESTING=OFF \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" \
    -DCMAKE_INSTALL_PREFIX="$dir" -DCMAKE_INSTALL_LIBDIR=lib >/dev/null
  cmake --build "$dir/build" -j "${KVPOOL_JOBS:-$(nproc)}" --target install >/dev/null
}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
    -DPython_EXECUTABLE=/usr/bin/python3 -DPYTHON_EXECUTABLE=/usr/bin/python3 >/dev/null
fi
start=$(date +%s)
if [ "$kind" = tsan ]; then
  tsan_abseil
  export LD_LIBRARY_PATH=$build/abseil/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  rm -rf "$build/tsan-reports" && mkdir -p "$build/tsan-reports"
fi
# shellcheck disable=SC2086
cmake --build "$build" -j "${KVPOOL_JOBS:-$(nproc)}" ${KVPOOL_SANITIZE_TARGETS:+--target $KVPOOL_SANITIZE_TARGETS}
built=$(date +%s)
cd "$build"
failed=0
run_tests() { ctest --output-on-failure --no-tests=error -j "${KVPOOL_TEST_JOBS:-2}" "$@" || failed=1; }
if [ "$kind" = asan ] && [ $# -eq 0 ]; then
  # deploy_docker_packages checks a release build's libraries (an instrumented binary needs
  # libasan). The Python tests load the instrumented module into an uninstrumented
  # interpreter: ASan's runtime must come first, and the interpreter's own leaks at exit are
  # not kvpool's.
  run_tests -LE 'gpu|python' -E '^deploy_docker_packages$'
  cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' CMakeCache.txt)
  LD_PRELOAD="$("$cxx" -print-file-name=libasan.so) $("$cxx" -print-file-name=libubsan.so)" \
    ASAN_OPTIONS=${ASAN_OPTIONS/detect_leaks=1/detect_leaks=0} run_tests -L python -LE gpu
else
  run_tests -LE gpu "$@"
fi
if [ "$kind" = tsan ]; then
  python3 "$root/tests/sanitizers/tsan_triage.py" "$root" "$build"/tsan-reports/* || failed=1
fi
done_at=$(date +%s)
echo "sanitize $kind: build $((built - start))s, tests $((done_at - built))s"
exit "$failed"
