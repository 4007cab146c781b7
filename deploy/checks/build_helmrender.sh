#!/usr/bin/env bash
# Builds deploy/tools/helmrender (a renderer of Helm charts; Helm is not in Debian 12) offline,
# from the Go standard library and Debian's Go source packages in GOPATH mode: golang-go,
# golang-github-masterminds-sprig-dev (and its dependencies), golang-gopkg-yaml.v2-dev, all
# installed by scripts/install-deps.sh --test. Nothing is downloaded.
#
#   deploy/checks/build_helmrender.sh OUTPUT_BINARY [--test]
#
# --test also runs gofmt, go vet and the renderer's unit tests (deploy/tools/helmrender/*_test.go).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: build_helmrender.sh OUTPUT_BINARY [--test]}
mode=${2:-}
gopath=/usr/share/gocode

if ! command -v go >/dev/null; then
  echo "build_helmrender: go is missing (scripts/install-deps.sh --test installs golang-go)" >&2
  exit 1
fi
for dir in github.com/Masterminds/sprig gopkg.in/yaml.v2; do
  if [ ! -d "$gopath/src/$dir" ]; then
    echo "build_helmrender: $gopath/src/$dir is missing (scripts/install-deps.sh --test" \
      "installs golang-github-masterminds-sprig-dev and golang-gopkg-yaml.v2-dev)" >&2
    exit 1
  fi
done

mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
export GO111MODULE=off GOPATH=$gopath GOFLAGS= GOPROXY=off GOENV=off GOTOOLCHAIN=local
export GOCACHE=${GOCACHE:-$(dirname "$out")/gocache}
cd "$root"
pkg=./deploy/tools/helmrender
if [ "$mode" = --test ]; then
  unformatted=$(gofmt -l deploy/tools/helmrender)
  if [ -n "$unformatted" ]; then
    echo "build_helmrender: not gofmt-formatted: $unformatted" >&2
    exit 1
  fi
  go vet "$pkg"
  go test "$pkg"
fi
go build -o "$out" "$pkg"
echo "build_helmrender: built $out ($(go version | cut -d' ' -f3))"
