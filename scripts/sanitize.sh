#!/usr/bin/env bash
# Builds the tree with sanitizers and runs the tests, timing the run:
#   scripts/sanitize.sh asan [CTEST ARGS...]   AddressSanitizer + UBSan, into build-asan/
#   scripts/sanitize.sh tsan [CTEST ARGS...]   ThreadSanitizer, into build-tsan/; by default
#                                              only the master and client tests
# A report fails the test that made it (halt_on_error; UBSan does not recover).
# KVPOOL_SANITIZE_TARGETS="a b" builds only those targets (then pass a matching -R to ctest).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kind=${1:-asan}
shift || true
case "$kind" in
  asan)
    flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1}
    # tests/sanitizers/ubsan.supp says why each suppression is there.
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:suppressions=$root/tests/sanitizers/ubsan.supp}
    ;;
  tsan)
    flags="-fsanitize=thread -fno-omit-frame-pointer"
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
    [ $# -eq 0 ] && set -- -R 'master_test|range_allocator_test|auth_policy_test|pool_test|security_test|store_semantics_test'
    ;;
  *) echo "usage: scripts/sanitize.sh asan|tsan [ctest args]" >&2; exit 2 ;;
esac
build=$root/build-$kind
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
    -DPython_EXECUTABLE=/usr/bin/python3 -DPYTHON_EXECUTABLE=/usr/bin/python3 >/dev/null
fi
start=$(date +%s)
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
done_at=$(date +%s)
echo "sanitize $kind: build $((built - start))s, tests $((done_at - built))s"
exit "$failed"
