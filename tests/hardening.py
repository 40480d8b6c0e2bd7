"""Helpers shared by the ``tests/test_hardening_*.py`` files (reliability under abuse and faults)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[1]
COUNTS = ("envs", "policies", "runs_active")


def counts(client: httpx.Client) -> dict[str, int]:
    """The live counts /health reports."""
    health = client.get("/health")
    assert health.status_code == 200, health.text
    return {k: health.json()[k] for k in COUNTS}


def file_tree(root: Path, *, exclude: Path | None = None) -> dict[str, tuple[int, int]]:
    """Every file and link under ``root`` (hidden ones too) → (size, mtime_ns), without following links."""
    tree: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):  # does not descend into linked directories
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if exclude is None or here / d != exclude]
        links = [here / d for d in dirnames if (here / d).is_symlink()]
        for path in [here / name for name in filenames] + links:
            st = path.lstat()
            tree[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return tree


@contextlib.contextmanager
def nothing_changes(client: httpx.Client, *dirs: Path) -> Iterator[None]:
    """Assert that the live counts and every file under ``dirs`` are the same after the block."""
    before = counts(client), [file_tree(d) for d in dirs]
    yield
    after = counts(client), [file_tree(d) for d in dirs]
    assert after == before


def rss_mb(pid: int | None = None) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    """A clear 4xx: the expected status and a body with a machine-readable code and a detail."""
    assert response.status_code == status, (response.status_code, response.text[:500])
    body = response.json()
    assert set(body) == {"code", "detail"} and body["detail"], body
    if code is not None:
        assert body["code"] == code, body
    return body


@dataclass
class ServiceProcess:
    """The task app as a real subprocess (``python -m uvicorn main:app``), logging to a file."""

    proc: subprocess.Popen[bytes]
    base_url: str
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill9(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill9()


def start_service(
    workdir: Path, environ: dict[str, str], *, log_level: str = "info", wait_s: float = 60.0
) -> ServiceProcess:
    """Start ``uvicorn main:app`` in ``workdir`` with Settings taken from ``environ`` (no .env file)."""
    port = free_port()
    log = workdir / f"service-{port}.log"
    env = {k: v for k, v in os.environ.items() if k not in ("TRACE_DB", "ENVIRONMENT_API_KEY")}
    env.update(PYTHONPATH=str(REPO), **environ)
    cmd = [sys.executable, "-m", "uvicorn", "main:app", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--log-level", log_level]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    service = ServiceProcess(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"service exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(service.base_url + "/health", timeout=1).status_code == 200:
                return service
        time.sleep(0.1)
    service.kill9()
    raise AssertionError(f"service did not start within {wait_s} s:\n{log.read_text()[-3000:]}")
