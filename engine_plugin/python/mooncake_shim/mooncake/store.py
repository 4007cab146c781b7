"""`mooncake.store` served by kvpool: every name of kvpool.store (MooncakeDistributedStore,
ReplicateConfig, SoftPinAction, ReplicaDescriptor, MooncakeHostMemAllocator, ...)."""

from kvpool.store import *  # noqa: F401,F403
from kvpool.store import __all__  # noqa: F401
