#!/bin/sh
# The compose pool's certificates and tokens, made once by the one-shot "pki" service into the
# kvpool-pki volume (mounted at $1, default /etc/kvpool-pki) and kept there: `docker compose
# down -v` (or removing the volume) makes new ones at the next `up`.
#   ca.crt                     the pool's CA (its key is not kept: nothing is signed later)
#   master.crt, master.key     the masters' certificate; SANs: master, master-1 .. master-3
#                              (the names segments and clients on the network dial: the
#                              one-master pool's and docker-compose.ha.yaml's), localhost,
#                              127.0.0.1
#   tokens                     the master's --auth-tokens file
#   segment-1.token, segment-2.token   each segment's token, bound to its --name
#   admin.token, engine.token, reader.token   kvpoolctl, engines (global namespace), readers
# A second directory ($2), if given, gets a world-readable copy of reader.token alone, for
# Prometheus (which runs as another user) to scrape /metrics with.
# deploy/checks/check_compose.py runs this script and a pool on what it makes.
set -eu
dir=${1:-/etc/kvpool-pki}
scrape=${2:-}
copy_reader_token() {
  if [ -n "$scrape" ]; then
    cp "$dir/reader.token" "$scrape/reader.token.tmp"
    chmod 0444 "$scrape/reader.token.tmp"
    mv "$scrape/reader.token.tmp" "$scrape/reader.token"
  fi
}
if [ -s "$dir/tokens" ] && [ -s "$dir/master.crt" ]; then
  copy_reader_token
  echo "make-pki: $dir already holds a CA, the master's certificate and tokens; kept"
  exit 0
fi
umask 077
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
  -keyout "$work/ca.key" -out "$work/ca.crt" -subj /CN=kvpool-compose-ca 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$work/master.key" -out "$work/master.csr" -subj /CN=master 2>/dev/null
printf 'subjectAltName=DNS:master,DNS:master-1,DNS:master-2,DNS:master-3,DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' \
  >"$work/ext"
openssl x509 -req -in "$work/master.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" \
  -CAcreateserial -days 825 -extfile "$work/ext" -out "$work/master.crt" 2>/dev/null
{
  echo "# token <secret> <identity> <role> [<tenant>] (docs/operations.md, \"Security\")"
  for who in segment-1:segment segment-2:segment admin:admin engine:engine reader:reader; do
    name=${who%%:*}
    token=$(openssl rand -hex 32)
    printf '%s' "$token" >"$work/$name.token"
    echo "token $token $name ${who#*:}"
  done
} >"$work/tokens"
for f in ca.crt master.crt master.key tokens segment-1.token segment-2.token admin.token \
  engine.token reader.token; do
  cp "$work/$f" "$dir/$f.tmp"
  mv "$dir/$f.tmp" "$dir/$f"
done
copy_reader_token
echo "make-pki: made a CA, the master's certificate and tokens in $dir"
