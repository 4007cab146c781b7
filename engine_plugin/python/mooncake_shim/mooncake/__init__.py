"""kvpool's stand-in for Mooncake's `mooncake` package, as far as its store goes.

Installed only on request (`pip install --no-build-isolation engine_plugin/python/mooncake_shim`,
or PYTHONPATH=build/engine_plugin/python/site_mooncake), so that engines written for Mooncake
Store run unchanged against a kvpool pool:

    from mooncake.store import MooncakeDistributedStore, ReplicateConfig   # -> kvpool.store

Only `mooncake.store` is provided; Mooncake's transfer engine, EP and CLI modules are not.
Do not install it next to a real Mooncake: both are the top-level package `mooncake`.
"""

from pkgutil import extend_path

from kvpool import __version__ as kvpool_version  # noqa: F401

# Other `mooncake` directories later on sys.path (e.g. Mooncake's pure-Python modules such as
# mooncake.mooncake_config) may still provide the modules this shim does not; mooncake.store
# is always this one, as long as this directory comes first.
__path__ = extend_path(__path__, __name__)

__version__ = kvpool_version
BACKEND = "kvpool"
