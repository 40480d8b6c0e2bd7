"""A real Ray cluster of several nodes on this machine (tests, benchmark): ``ray start`` processes.

Each node is one ``ray start --block`` process in a session of its own, so that killing its
whole process tree (raylet, workers, agents) is exactly a node lost. The cluster has its own
auth token, temp dir and ports; nothing is shared with other Ray clusters on the machine, and
``ray stop`` (which stops every cluster of the user) is never used.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import psutil

STARTED = "Ray runtime started"
OBJECT_STORE_BYTES = 100_000_000  # Ray's minimum is about 75 MB


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Node:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> None:
        """SIGKILL the node's whole process tree at once: the node is lost, as a machine dies."""
        procs = self.tree()
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGKILL)
        psutil.wait_procs(procs, timeout=10)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)

    def pids_with_env(self, name: str) -> dict[str, int]:
        """Processes of this node whose environment sets ``name``: value → pid."""
        found = {}
        for proc in self.tree():
            with contextlib.suppress(psutil.Error):
                value = proc.environ().get(name)
                if value:
                    found[value] = proc.pid
        return found


class RayCluster:
    """``with RayCluster(workdir) as cluster: cluster.add_node(...)``; the first node is the head."""

    def __init__(self, workdir: Path, *, start_timeout_s: float = 60.0) -> None:
        self.workdir = workdir
        self.start_timeout_s = start_timeout_s
        self.port = free_port()
        self.nodes: list[Node] = []
        self.temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: socket paths fit in 107 bytes
        self.environ = {
            **os.environ,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32),
            "RAY_USAGE_STATS_ENABLED": "0",
            # A lost node is known dead within seconds (Ray's default is about 30 s).
            "RAY_health_check_period_ms": "1000",
            "RAY_health_check_failure_threshold": "3",
        }

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def add_node(self, name: str, *, cpus: float, resources: dict[str, float] | None = None) -> Node:
        head = not self.nodes
        ray = str(Path(sys.executable).with_name("ray"))
        cmd = [ray, "start", "--block", "--node-ip-address", "127.0.0.1", "--num-cpus", str(cpus)]
        cmd += ["--resources", json.dumps(resources or {}), "--disable-usage-stats"]
        cmd += ["--object-store-memory", str(OBJECT_STORE_BYTES)]
        cmd += ["--dashboard-agent-listen-port", str(free_port()), "--metrics-export-port", str(free_port())]
        if head:
            cmd += [
                "--head",
                "--port",
                str(self.port),
                "--include-dashboard",
                "false",
                "--temp-dir",
                self.temp,
            ]
        else:
            cmd += ["--address", self.address]
        log = self.workdir / f"ray-{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd, env=self.environ, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        node = Node(name, proc, log)
        self.nodes.append(node)
        deadline = time.monotonic() + self.start_timeout_s
        while STARTED not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                text = log.read_text(errors="replace")[-3000:]
                self.stop()
                raise RuntimeError(f"ray node {name} did not start:\n{text}")
            time.sleep(0.2)
        return node

    def stop(self) -> None:
        """Kill every node, workers last started first."""
        for node in reversed(self.nodes):
            node.kill()
        self.nodes.clear()
        shutil.rmtree(self.temp, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
