"""``serve --workers N``: N server processes behind one port, one per core.

One Python process runs env steps, HTTP and the inference client on one core (the GIL), so a
server uses more cores by running more processes. The supervisor here binds the public port,
gives each worker an instance tag and a loopback socket of its own, and starts the workers.
On Linux every worker gets its own ``SO_REUSEPORT`` listener on the public port, and the kernel
spreads new connections evenly over them (elsewhere the workers share one listener, and
whichever is idle accepts). A worker owns what it creates; `grpo_service.serving.peers` forwards a
request that names another worker's ids to that worker over its loopback socket, and places
new rollouts on the least loaded worker. A worker that dies is started again (its live envs
and policies are lost; snapshots are on disk and restore anywhere); more than `MAX_RESTARTS`
deaths within `RESTART_WINDOW_S` stop the server.

    python -m grpo_service.serving.workers --public-fd A --private-fd B   (started by `serve_workers`)
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from grpo_service.config import Settings
from grpo_service.registry import INSTANCE_ENV_VAR
from grpo_service.serving.peers import WorkerLoads

log = logging.getLogger("grpo_service.serving.workers")

MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
STOP_TIMEOUT_S = 15.0
POLL_S = 0.2


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_workers(workers: int) -> int:
    """``workers``, with 0 meaning one per CPU this process may run on."""
    return workers if workers > 0 else cpu_count()


# Linux balances connections over SO_REUSEPORT listeners; other systems do not (or differently).
BALANCED_REUSEPORT = sys.platform == "linux" and hasattr(socket, "SO_REUSEPORT")


def bind(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def public_listeners(first: socket.socket, count: int) -> list[socket.socket]:
    """One listener per worker on ``first``'s address when the kernel balances them (``first``
    must have been bound with ``reuse_port``), else ``[first]``, shared by all workers."""
    if count == 1 or not BALANCED_REUSEPORT or not first.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT):
        return [first]
    host, port = first.getsockname()[:2]
    return [first, *(bind(host, port, reuse_port=True) for _ in range(count - 1))]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the worker gets SIGTERM if the supervisor dies, even by SIGKILL."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _shm_dir() -> str | None:
    """Memory-backed /dev/shm when there is one (Linux), else the temp directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@dataclass
class Worker:
    index: int
    instance: str
    private: socket.socket
    proc: subprocess.Popen[bytes] | None = None
    deaths: deque[float] = field(default_factory=deque)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.private.getsockname()[1]}"


class Supervisor:
    """Starts, watches, restarts and stops the workers of one server."""

    def __init__(self, settings: Settings, public: socket.socket, *, log_level: str = "info"):
        self.settings = settings
        self.log_level = log_level
        count = resolve_workers(settings.workers)
        self.public = public_listeners(public, count)
        tags: set[str] = set()
        while len(tags) < count:
            tags.add(secrets.token_hex(4))
        self.workers = [Worker(i, tag, bind("127.0.0.1", 0)) for i, tag in enumerate(sorted(tags))]
        peers = {w.instance: w.url for w in self.workers}
        fd, loads_file = tempfile.mkstemp(prefix="grpo-worker-loads-", dir=_shm_dir())
        os.close(fd)
        WorkerLoads.create(loads_file, count)
        self.loads_file = Path(loads_file)
        update = {"worker_peers": peers, "worker_loads_file": self.loads_file}
        self.environment = {**os.environ, **settings.model_copy(update=update).as_environment()}
        self.stopping = False

    def start(self, worker: Worker) -> None:
        public = self.public[worker.index % len(self.public)]
        cmd = [
            sys.executable,
            "-m",
            "grpo_service.serving.workers",
            "--public-fd",
            str(public.fileno()),
            "--private-fd",
            str(worker.private.fileno()),
            "--log-level",
            self.log_level,
        ]
        worker.proc = subprocess.Popen(
            cmd,
            pass_fds=[public.fileno(), worker.private.fileno()],
            env={**self.environment, INSTANCE_ENV_VAR: worker.instance},
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
        )
        log.info("worker %d (instance %s) started, pid %d", worker.index, worker.instance, worker.proc.pid)

    def run(self) -> int:
        """Serve until SIGINT/SIGTERM; the exit code is 0 unless workers kept dying."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for worker in self.workers:
                self.start(worker)
            while not self.stopping:
                for worker in self.workers:
                    if not self._check(worker):
                        return 1
                time.sleep(POLL_S)
            return 0
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _check(self, worker: Worker) -> bool:
        """Restart ``worker`` if it died; False when it dies too often to keep going."""
        assert worker.proc is not None
        code = worker.proc.poll()
        if code is None or self.stopping:
            return True
        now = time.monotonic()
        worker.deaths.append(now)
        while worker.deaths and now - worker.deaths[0] > RESTART_WINDOW_S:
            worker.deaths.popleft()
        if len(worker.deaths) > MAX_RESTARTS:
            log.error(
                "worker %d exited %d times within %.0f s (last code %s): stopping the server",
                worker.index,
                len(worker.deaths),
                RESTART_WINDOW_S,
                code,
            )
            return False
        log.warning(
            "worker %d (instance %s) exited with code %s: restarting it", worker.index, worker.instance, code
        )
        self.start(worker)
        return True

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stopping = True

    def stop(self) -> None:
        """SIGTERM every worker (uvicorn drains them), then SIGKILL what is left at the deadline."""
        self.stopping = True
        procs = [w.proc for w in self.workers if w.proc is not None and w.proc.poll() is None]
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5.0)
        for worker in self.workers:
            worker.private.close()
        for sock in self.public[1:]:  # the first is the caller's
            sock.close()
        self.loads_file.unlink(missing_ok=True)


def serve_workers(settings: Settings, *, sock: socket.socket | None = None, log_level: str = "info") -> int:
    """Serve ``settings`` with ``resolve_workers(settings.workers)`` processes; returns the exit code."""
    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.INFO), format="%(levelname)s: %(message)s"
    )
    public = sock or bind(settings.host, settings.port, reuse_port=BALANCED_REUSEPORT)
    public.set_inheritable(True)
    try:
        return Supervisor(settings, public, log_level=log_level).run()
    finally:
        public.close()


def main(argv: list[str] | None = None) -> None:
    """One worker: the app on its public listener and its own loopback socket."""
    import uvicorn

    from grpo_service.app import create_app

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--public-fd", type=int, required=True)
    parser.add_argument("--private-fd", type=int, required=True)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    settings = Settings(_env_file=None)  # type: ignore[call-arg]  # the supervisor's, via the environment
    sockets = [socket.socket(fileno=args.public_fd), socket.socket(fileno=args.private_fd)]
    config = uvicorn.Config(create_app(settings), log_level=args.log_level, timeout_graceful_shutdown=10)
    uvicorn.Server(config).run(sockets=sockets)


if __name__ == "__main__":
    main()
