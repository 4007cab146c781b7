#!/usr/bin/env bash
# Installs the Debian 12 packages kvpool needs, and only those that are missing.
# Quiet and quick when everything is present; safe to run any number of times.
#
#   scripts/install-deps.sh          # what building and running a pool needs
#   scripts/install-deps.sh --test   # plus what the test suite and benchmarks need
set -euo pipefail

build_packages=(
  ca-certificates g++ cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libre2-dev libboost-dev libssl-dev libibverbs-dev prometheus-cpp-dev libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev
  # etcd's .proto files (the v3 API the masters' leader election speaks; common/etcd/)
  golang-etcd-server-dev
  python3 python3-dev pybind11-dev
  # pip install --no-build-isolation . (setup.py drives the CMake build of the module)
  python3-pip python3-setuptools python3-wheel python3-venv
)
test_packages=(
  python3-pytest python3-numpy python3-torch
  redis-server procps
  # tests/security_test makes its CA and certificates at test time with the openssl CLI
  openssl
  # the HA tests start their own etcd (tests/harness/etcd.h); the multi-host ones make network
  # namespaces, veth pairs and a bridge with iproute2's ip (tests/harness/netns.h; unshare and
  # nsenter come with util-linux, which every Debian has)
  etcd-server etcd-client iproute2
  # deploy checks (deploy/CMakeLists.txt): PyYAML, and Go with the sources of Helm's template
  # functions, to build deploy/tools/helmrender offline
  python3-yaml golang-go golang-github-masterminds-sprig-dev golang-gopkg-yaml.v2-dev
  # scripts/fuzz.sh (and .ci/run's short fuzz run): clang with libFuzzer (compiler-rt)
  clang libclang-rt-dev
)

packages=("${build_packages[@]}")
[ "${1:-}" = "--test" ] && packages+=("${test_packages[@]}")

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [ "$status" = "install ok installed" ] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
if ! { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  echo "install-deps: apt-get failed (full log: $log)" >&2
  exit 1
fi
rm -f "$log"
