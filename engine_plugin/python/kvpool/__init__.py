"""kvpool: a distributed KV-cache pool for LLM inference engines.

    import kvpool
    store = kvpool.MooncakeDistributedStore()   # Mooncake's API and return conventions
    store.setup("localhost", "P2PHANDSHAKE", 1 << 30, 0, "tcp", "", "127.0.0.1:50051")

`kvpool.store` mirrors `mooncake.store` (MooncakeDistributedStore, ReplicateConfig,
SoftPinAction, ...); the opt-in `mooncake` shim makes `import mooncake.store` resolve to it.
`kvpool.Store` is the native store underneath, with kvpool's own conventions (batch puts give
the bytes stored per key) and extras (cluster_status, segment_stats). The engine plugin pieces
(detect_layout, TokenDatabase, StoreWorker, ...) come from the compiled kvpool._kvpool.
"""

from kvpool._kvpool import *  # noqa: F401,F403  (the compiled bindings)
from kvpool._kvpool import (  # noqa: F401
    INVALID_PARAMS,
    NO_AVAILABLE_HANDLE,
    OBJECT_ALREADY_EXISTS,
    OBJECT_HAS_LEASE,
    OBJECT_NOT_FOUND,
    Store,
)
from kvpool._version import __version__  # noqa: F401
from kvpool import store  # noqa: F401  (kvpool.store, like mooncake.store)
from kvpool.store import MooncakeDistributedStore, ReplicateConfig  # noqa: F401
