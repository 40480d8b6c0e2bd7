"""Starting, pinning and stopping the benchmark's server processes (all on 127.0.0.1)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

HOST = "127.0.0.1"


def cpu_count() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def pin(pid: int, cpus: set[int] | None) -> None:
    """Restrict ``pid`` to ``cpus`` (no-op when None or unsupported)."""
    if cpus is None or not hasattr(os, "sched_setaffinity"):
        return
    with contextlib.suppress(OSError):
        os.sched_setaffinity(pid, cpus)


@contextlib.contextmanager
def pinned(cpus: set[int] | None) -> Iterator[None]:
    """This process pinned to ``cpus`` while the block runs (nothing when None)."""
    if cpus is None or not hasattr(os, "sched_getaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    pin(0, cpus)
    try:
        yield
    finally:
        pin(0, before)


class ServerProcess:
    """A server in its own process, on a socket bound here and handed over as ``--fd N``."""

    name = "server"  # for errors: "<name> server exited ..."

    def __init__(self, *, cpus: set[int] | None) -> None:
        self.cpus = cpus
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def spawn(self, cmd: list[str], *, env: dict[str, str] | None = None, log: Path | None = None) -> None:
        """Start ``cmd --fd N`` on a fresh loopback socket, pinned to ``cpus``."""
        sock = bind(HOST, 0)
        self.port = sock.getsockname()[1]
        fd = sock.fileno()
        os.set_inheritable(fd, True)
        out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
        try:
            cmd = [*cmd, "--fd", str(fd)]
            self.proc = subprocess.Popen(cmd, pass_fds=[fd], stdout=out, stderr=out, env=env)
        finally:
            sock.close()
            if out is not subprocess.DEVNULL:
                out.close()
        pin(self.proc.pid, self.cpus)

    def wait_http(self, path: str, timeout_s: float) -> None:
        """Until ``GET path`` answers 200; an exited process or the deadline is an error."""
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} server exited with code {self.proc.returncode}")
            try:
                with urllib.request.urlopen(self.base_url + path, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} server did not answer within {timeout_s:.0f} s")
            time.sleep(0.05)

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)


class ChildServer(ServerProcess):
    """A server in its own process: ``python -m tools.bench.child KIND ...``."""

    def __init__(self, kind: str, payload: dict[str, Any], *, cpus: set[int] | None, log: Path | None):
        super().__init__(cpus=cpus)
        self.kind = self.name = kind
        self.payload = payload
        self.log = log

    def start(self) -> ChildServer:
        flag = "--settings" if self.kind == "service" else "--config"
        cmd = [sys.executable, "-m", "tools.bench.child", self.kind, flag, json.dumps(self.payload)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), *sys.path]))}
        self.spawn(cmd, env=env, log=self.log)
        return self

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        self.wait_http("/v1/models" if self.kind == "fake" else "/health", timeout_s)

    def rss_bytes(self) -> int:
        return psutil.Process(self.pid).memory_info().rss
