"""TLS on the data plane from Python, against real kvpool-master and kvpool-segment processes.

The master serves TLS and authenticates every caller; the store takes its credentials from
the environment (KVPOOL_TLS_CA, KVPOOL_TLS_CERT/KEY, KVPOOL_AUTH_TOKEN_FILE,
KVPOOL_SEGMENT_AUTH_TOKEN_FILE) and, with KVPOOL_DATA_TLS=1, speaks TLS to every segment's TCP
data port, and serves its in-process segment's over TLS too. Certificates are made at test
time with the openssl CLI; no key is committed.
"""

import os
import shutil
import socket
import subprocess
import urllib.request

import pytest

kvpool = pytest.importorskip("kvpool")

ENGINE_TOKEN = "engine-a-token-0000000001"
SEGMENT_TOKEN = "segment-1-token-00000003"
IN_PROCESS_TOKEN = "in-process-token-0000005"
KEY_OPTIONS = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


class Pki:
    """A throwaway CA in `directory` and the certificates it issues (SAN 127.0.0.1)."""

    def __init__(self, directory, name):
        self.directory = directory
        self.name = name
        self.ca = os.path.join(directory, f"{name}-ca.pem")
        self._ca_key = os.path.join(directory, f"{name}-ca.key")
        _openssl("req", "-x509", *KEY_OPTIONS, "-keyout", self._ca_key, "-out", self.ca,
                 "-days", "3", "-subj", f"/CN={name}-test-ca")

    def issue(self, common_name):
        base = os.path.join(self.directory, f"{self.name}-{common_name}")
        with open(base + ".ext", "w") as ext:
            ext.write(f"subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:{common_name}\n")
        _openssl("req", *KEY_OPTIONS, "-keyout", base + ".key", "-out", base + ".csr",
                 "-subj", f"/CN={common_name}")
        _openssl("x509", "-req", "-in", base + ".csr", "-CA", self.ca, "-CAkey", self._ca_key,
                 "-CAcreateserial", "-out", base + ".pem", "-days", "2", "-extfile",
                 base + ".ext")
        return base + ".pem", base + ".key"


def _write(path, text):
    with open(path, "w") as out:
        out.write(text)
    return path


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metric(http, name):
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=10) as page:
        for line in page.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


@pytest.fixture
def secure_pool(pool, tmp_path, monkeypatch):
    """A TLS + authenticating master (no embedded segment), its CA and token files; the
    engine's credentials are in the environment, data-plane TLS not yet."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is not installed")
    directory = str(tmp_path)
    pki = Pki(directory, "pool")
    master_cert, master_key = pki.issue("master")
    in_process_name = f"127.0.0.1:{_free_port()}"
    tokens = _write(os.path.join(directory, "tokens"),
                    f"token {ENGINE_TOKEN} engine-a engine team-a\n"
                    f"token {SEGMENT_TOKEN} seg-1 segment\n"
                    f"token {IN_PROCESS_TOKEN} {in_process_name} segment\n")
    grpc = pool.master_with_http("0", [f"--auth-tokens={tokens}", f"--tls-cert={master_cert}",
                                       f"--tls-key={master_key}"])["grpc"]
    monkeypatch.setenv("KVPOOL_TLS_CA", pki.ca)
    monkeypatch.setenv("KVPOOL_AUTH_TOKEN_FILE",
                       _write(os.path.join(directory, "engine.token"), ENGINE_TOKEN))
    for name in ("KVPOOL_DATA_TLS", "KVPOOL_TLS_CERT", "KVPOOL_TLS_KEY",
                 "KVPOOL_SEGMENT_AUTH_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)

    class SecurePool:
        master = grpc
        in_process_hostname = in_process_name

        def __init__(self):
            self.pki = pki
            self.directory = directory

        def tls_segment(self):
            """A kvpool-segment serving --data-tls; its HTTP address. No shared memory: a
            client on this host would map the pool instead of dialling the data port."""
            cert, key = pki.issue("seg-1")
            token = _write(os.path.join(directory, "seg.token"), SEGMENT_TOKEN)
            return pool.segment_with_http(grpc, extra_args=[
                "--name=seg-1", f"--auth-token-file={token}", f"--tls-ca={pki.ca}",
                f"--tls-cert={cert}", f"--tls-key={key}", "--data-tls",
                "--shm-socket=none"])["http"]

    return SecurePool()


def _open(master, **config):
    store = kvpool.Store()
    config.setdefault("global_segment_size", 0)
    config.setdefault("local_buffer_size", 16 << 20)
    config.setdefault("protocol", "tcp")
    config.setdefault("local_hostname", "127.0.0.1")
    code = store.setup({"master_server_address": master, **config})
    return store, code


VALUES = {f"value-{size}": os.urandom(size) for size in (1, 100, 4096, 1 << 20, (4 << 20) + 3)}


def test_a_tls_segment_takes_and_serves_the_right_bytes_only_over_tls(secure_pool, monkeypatch):
    http = secure_pool.tls_segment()
    monkeypatch.setenv("KVPOOL_DATA_TLS", "1")
    store, code = _open(secure_pool.master)
    assert code == 0
    try:
        for key, value in VALUES.items():
            assert store.put(key, value) == 0, key
        for key, value in VALUES.items():
            assert store.get(key) == value, key
    finally:
        store.close()

    # Plaintext against the TLS port: the handshake fails on the segment; nothing is stored
    # and nothing is served.
    refused_before = _metric(http, 'kvpool_data_rejected_total{reason="tls_handshake"}')
    monkeypatch.delenv("KVPOOL_DATA_TLS")
    plain, code = _open(secure_pool.master)
    assert code == 0
    try:
        assert plain.put("plaintext", b"never stored") != 0
        assert plain.get("value-100") == b""
        assert plain.is_exist("plaintext") == 0
    finally:
        plain.close()
    assert _metric(http, 'kvpool_data_rejected_total{reason="tls_handshake"}') > refused_before


def test_the_in_process_segment_serves_its_data_port_over_tls(secure_pool, monkeypatch):
    cert, key = secure_pool.pki.issue("in-process")
    monkeypatch.setenv("KVPOOL_DATA_TLS", "1")
    monkeypatch.setenv("KVPOOL_TLS_CERT", cert)
    monkeypatch.setenv("KVPOOL_TLS_KEY", key)
    monkeypatch.setenv("KVPOOL_SEGMENT_AUTH_TOKEN_FILE",
                       _write(os.path.join(secure_pool.directory, "in-process.token"),
                              IN_PROCESS_TOKEN))
    # The pool's only segment is this store's own.
    owner, code = _open(secure_pool.master, global_segment_size=32 << 20,
                        local_hostname=secure_pool.in_process_hostname)
    assert code == 0
    try:
        for key_name, value in VALUES.items():
            assert owner.put(key_name, value) == 0, key_name
        assert owner.get("value-4096") == VALUES["value-4096"]

        # Another engine reads the in-process segment's bytes over TLS...
        for name in ("KVPOOL_TLS_CERT", "KVPOOL_TLS_KEY", "KVPOOL_SEGMENT_AUTH_TOKEN_FILE"):
            monkeypatch.delenv(name)
        reader, code = _open(secure_pool.master)
        assert code == 0
        try:
            for key_name, value in VALUES.items():
                assert reader.get(key_name) == value, key_name
        finally:
            reader.close()
        # ...and one in plaintext reads nothing.
        monkeypatch.delenv("KVPOOL_DATA_TLS")
        plain, code = _open(secure_pool.master)
        assert code == 0
        try:
            assert plain.get("value-4096") == b""
            assert plain.put("plaintext", b"never stored") != 0
        finally:
            plain.close()
    finally:
        owner.close()


def test_an_in_process_tls_segment_without_a_certificate_is_refused_at_setup(secure_pool,
                                                                           monkeypatch):
    monkeypatch.setenv("KVPOOL_DATA_TLS", "1")
    monkeypatch.setenv("KVPOOL_SEGMENT_AUTH_TOKEN_FILE",
                       _write(os.path.join(secure_pool.directory, "in-process.token"),
                              IN_PROCESS_TOKEN))
    store, code = _open(secure_pool.master, global_segment_size=32 << 20,
                        local_hostname=secure_pool.in_process_hostname)
    assert code == kvpool.INVALID_PARAMS
    store.close()
