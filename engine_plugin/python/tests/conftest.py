"""Fixtures that run real kvpool-master / kvpool-segment processes on free loopback ports.

The binaries come from KVPOOL_MASTER_BIN / KVPOOL_SEGMENT_BIN (set by CTest); every process
is started with port 0, waited for by its readiness line on stdout, and stopped at the end of
the test that started it.
"""

import os
import select
import subprocess
import time

import pytest


def _binary(env_name, default_relative):
    path = os.environ.get(env_name)
    if not path:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
        path = os.path.join(root, "build", default_relative)
    if not os.access(path, os.X_OK):
        pytest.skip(f"{env_name} not set and {path} is not built")
    return path


def _fields(line):
    return dict(token.split("=", 1) for token in line.split() if "=" in token)


class Process:
    """A child process whose stdout is read line by line (unbuffered, so no line is missed)."""

    def __init__(self, argv):
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, bufsize=0)
        self._fd = self.proc.stdout.fileno()
        self._buffer = b""
        # Lines read while waiting for another: a segment's "mounted" line (printed by its
        # master link's thread) may come before its "listening" line.
        self._passed = []

    def wait_for_line(self, prefix, timeout=30.0):
        for i, line in enumerate(self._passed):
            if line.startswith(prefix):
                return self._passed.pop(i).strip()
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                if line.decode().startswith(prefix):
                    return line.decode().strip()
                self._passed.append(line.decode())
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.argv[0]} did not print {prefix!r} within {timeout}s")
            ready, _, _ = select.select([self._fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._fd, 4096)
            if not chunk:
                raise RuntimeError(f"{self.argv[0]} exited ({self.proc.poll()}) before {prefix!r}")
            self._buffer += chunk

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


class Pool:
    """Starts pool processes for one test and stops them afterwards."""

    def __init__(self):
        self.processes = []

    def master(self, embedded_segment_size="64MiB"):
        return self.master_with_http(embedded_segment_size)["grpc"]

    def master_with_http(self, embedded_segment_size="64MiB", extra_args=()):
        """The master's readiness fields: grpc and http addresses, embedded_segment, ...
        extra_args: more kvpool-master flags (TLS, --auth-tokens, ...)."""
        proc = Process([_binary("KVPOOL_MASTER_BIN", "server/master/kvpool-master"),
                        "--listen=127.0.0.1:0", "--http-listen=127.0.0.1:0",
                        f"--embedded-segment-size={embedded_segment_size}", "--prefault=false",
                        *extra_args])
        self.processes.append(proc)
        return _fields(proc.wait_for_line("kvpool-master listening"))

    def segment(self, master, size="64MiB", prefault=False, extra_args=()):
        """prefault: touch the whole pool at start (the daemon's default; tests skip it).
        extra_args: more kvpool-segment flags (benchmarks: --verify-commits=false, ...).
        Returns the segment's name."""
        return self.segment_with_http(master, size, prefault, extra_args)["name"]

    def segment_with_http(self, master, size="64MiB", prefault=False, extra_args=()):
        """As segment(), returning the readiness fields: name, http address, ..."""
        proc = Process([_binary("KVPOOL_SEGMENT_BIN", "server/segment/kvpool-segment"),
                        f"--master={master}", f"--size={size}", "--listen=127.0.0.1:0",
                        "--http-listen=127.0.0.1:0", f"--prefault={str(prefault).lower()}",
                        *extra_args])
        self.processes.append(proc)
        fields = _fields(proc.wait_for_line("kvpool-segment listening"))
        proc.wait_for_line("kvpool-segment mounted")
        return fields

    def stop(self):
        for proc in reversed(self.processes):
            proc.stop()


@pytest.fixture
def pool():
    p = Pool()
    yield p
    p.stop()


@pytest.fixture
def open_store():
    """open_store(master, **config) -> a kvpool.Store set up with the config, closed after."""
    import kvpool

    stores = []

    def _open(master, **config):
        store = kvpool.Store()
        config.setdefault("global_segment_size", 0)
        config.setdefault("local_buffer_size", 0)
        config.setdefault("protocol", "tcp")
        config.setdefault("local_hostname", "127.0.0.1")
        assert store.setup({"master_server_address": master, **config}) == 0
        stores.append(store)
        return store

    yield _open
    for store in stores:
        store.close()
