#!/usr/bin/env bash
# pip_install_test.sh REPO: `pip install --no-build-isolation` of REPO (and of the mooncake shim)
# into a temporary target directory, offline, then checks from a clean environment that
# `import kvpool` gives the compiled module and the Mooncake API, that `kvpool --version`
# prints the version, and that the shim's `mooncake.store` is kvpool's.
set -euo pipefail
repo=$1
python=${PYTHON:-/usr/bin/python3}
target=$(mktemp -d)
trap 'rm -rf "$target"' EXIT
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PYTHONDONTWRITEBYTECODE=1
"$python" -m pip install -q --no-build-isolation --no-deps --target "$target" "$repo"
"$python" -m pip install -q --no-build-isolation --no-deps --target "$target" \
  "$repo/engine_plugin/python/mooncake_shim"
cd "$target"
version=$(env -u PYTHONPATH PYTHONPATH="$target" "$target/bin/kvpool" --version)
expected="kvpool $(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$repo/engine_plugin/python/kvpool/_version.py")"
[ "$version" = "$expected" ] || { echo "kvpool --version: '$version', expected '$expected'"; exit 1; }
env -u PYTHONPATH PYTHONPATH="$target" "$python" - "$target" <<'PY'
import os, sys
import kvpool, kvpool.store
from mooncake.store import MooncakeDistributedStore, ReplicateConfig
target = sys.argv[1]
assert kvpool.__file__.startswith(target), kvpool.__file__
assert kvpool._kvpool.__file__.startswith(target), kvpool._kvpool.__file__
assert MooncakeDistributedStore is kvpool.store.MooncakeDistributedStore
assert ReplicateConfig().replica_num == 1
assert os.path.exists(os.path.join(target, "kvpool", "store.pyi"))
assert os.path.exists(os.path.join(target, "kvpool", "py.typed"))
assert hasattr(kvpool, "detect_layout") or hasattr(kvpool, "TokenDatabase"), dir(kvpool)
print("pip install ok:", kvpool.__version__, kvpool._kvpool.__file__)
PY
# The README's way on Debian 12, whose pip refuses system-wide installs (PEP 668): a virtual
# environment that sees Debian's packages.
venv="$target/venv"
"$python" -m venv --system-site-packages "$venv"
"$venv/bin/pip" install -q --no-build-isolation --no-deps "$repo"
version=$(cd / && env -u PYTHONPATH "$venv/bin/kvpool" --version)
[ "$version" = "$expected" ] || { echo "venv kvpool --version: '$version', expected '$expected'"; exit 1; }
(cd / && env -u PYTHONPATH "$venv/bin/python" -c "
import kvpool, kvpool.store
assert kvpool.__file__.startswith('$venv'), kvpool.__file__
print('venv pip install ok:', kvpool.__file__)")
