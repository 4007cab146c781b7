"""torch, imported on first use, so that `import kvpool` (and `mooncake.store` through the shim)
costs no torch import unless a tensor call needs it: torch is about 90% of the import time
(2-3 s on an idle machine, over a minute on a loaded one, which is more than Mooncake's tests
give a spawned client process to start)."""

import importlib
import threading


class _Torch:
    """Forwards attribute access to the torch module, importing it the first time."""

    _module = None

    def __getattr__(self, name):
        module = _Torch._module
        if module is None:
            module = _Torch._module = importlib.import_module("torch")
        return getattr(module, name)


torch = _Torch()


class LazyTable(dict):
    """A dict filled by `build()` (which may use torch) on its first lookup. Thread-safe."""

    def __init__(self, build):
        super().__init__()
        self._build = build
        self._lock = threading.Lock()

    def _ready(self):
        if self._build is not None:
            with self._lock:
                if self._build is not None:
                    self.update(self._build())
                    self._build = None

    def __getitem__(self, key):
        self._ready()
        return super().__getitem__(key)

    def __contains__(self, key):
        self._ready()
        return super().__contains__(key)

    def get(self, key, default=None):
        self._ready()
        return super().get(key, default)
