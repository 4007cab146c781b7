#!/usr/bin/python3
"""Runs deploy/docker/kvpool-http-check (the image's health-check command) against a real
kvpool-master on free loopback ports: 0 for /healthz, 1 for a path the server does not serve
and for a port where nothing listens. Then the readiness endpoint, when the master serves it.
Stops the master it started."""

import os
import re
import socket
import subprocess
import sys
import time

import deploylib as lib
from deploylib import ROOT

CHECK = ROOT / "deploy/docker/kvpool-http-check"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_check(address, path):
    return subprocess.run([str(CHECK), address, path, "3"], capture_output=True, text=True,
                          timeout=20).returncode


def main():
    c = lib.Checker("http-check")
    master = lib.binary_path("kvpool-master")
    if master is None:
        c.fail("kvpool-master is not built")
        return c.finish()
    proc = subprocess.Popen([master, "--listen=127.0.0.1:0", "--http-listen=127.0.0.1:0",
                             "--embedded-segment-size=4MiB", "--prefault=false"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        http = None
        lines = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"http=([\d.]+:\d+)", line)
            if m:
                http = m.group(1)
                break
        if not c.check(http is not None, f"kvpool-master did not report its HTTP address: {lines}"):
            return c.finish()
        c.check(run_check(http, "/healthz") == 0, f"kvpool-http-check {http} /healthz should pass")
        c.check(run_check(http, "/no-such-path") == 1,
                f"kvpool-http-check {http} /no-such-path should fail")
        c.check(run_check(f"127.0.0.1:{free_port()}", "/healthz") == 1,
                "kvpool-http-check on a closed port should fail")
        ready = run_check(http, "/readyz")
        if ready == 0:
            print(f"http-check: {http}/readyz answers 200")
        else:
            c.note("kvpool-master does not serve /readyz yet (issue 4's metrics work adds it); "
                   "the compose health checks and the chart's readiness probes wait on it")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return c.finish()


if __name__ == "__main__":
    lib.main_guard(main)
