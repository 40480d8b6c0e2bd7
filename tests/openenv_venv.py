"""OpenEnv 0.10's own clients and CLI, in a venv of their own.

`openenv` 0.10.0 cannot go into the service's environment: it pulls gradio 6, which pins
``pillow<13`` (the service runs Pillow 13), plus fastmcp and huggingface_hub, about 480 MB.
So the tests build a separate venv the first time they need it, as CI would, and reuse it:
``$OPENENV_VENV``, by default ``~/.cache/grpo-service/openenv-0.10.0``. Processes that need it
at the same time wait for one build (a file lock, under a deadline).
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest

OPENENV = "openenv==0.10.0"
VENV = Path(os.environ.get("OPENENV_VENV", Path.home() / ".cache" / "grpo-service" / "openenv-0.10.0"))
BUILD_TIMEOUT_S = 900.0


def openenv_venv() -> Path:
    """The venv's directory (``bin/python``, ``bin/openenv``), built if missing."""
    marker = VENV / ".installed"
    if marker.exists():
        return VENV
    VENV.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + BUILD_TIMEOUT_S
    with open(VENV.parent / f"{VENV.name}.lock", "w") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another process has been building {VENV} for too long") from None
                time.sleep(1.0)
        if not marker.exists():
            shutil.rmtree(VENV, ignore_errors=True)  # a build that died half way
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, timeout=120)
            remaining = max(60.0, deadline - time.monotonic())
            subprocess.run(
                [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", OPENENV],
                check=True,
                timeout=remaining,
            )
            marker.write_text(OPENENV + "\n")
    return VENV


class OpenEnvDriver:
    """``tests/openenv_play.py --serve`` in OpenEnv's venv, kept running for a test module: each
    `play` sends one spec and waits (under a deadline) for its JSON report, so OpenEnv's imports,
    seconds of CPU, are paid once per module instead of once per scenario."""

    def __init__(self) -> None:
        python = openenv_venv() / "bin" / "python"
        self.proc = subprocess.Popen(
            [str(python), str(Path(__file__).with_name("openenv_play.py")), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._pool = concurrent.futures.ThreadPoolExecutor(1)

    def play(self, spec: dict[str, Any], timeout_s: float = 300.0) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(spec) + "\n")
        self.proc.stdin.flush()
        try:
            line = self._pool.submit(self.proc.stdout.readline).result(timeout=timeout_s)
        except TimeoutError:
            self.proc.kill()  # still busy with this spec: never answer the next one with its report
            raise
        if not line:
            self.close()
            raise RuntimeError(f"the OpenEnv driver died: {self._stderr()}")
        report = json.loads(line)
        if "driver_error" in report:
            raise AssertionError(report["driver_error"])
        return report

    def _stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read()[-4000:]

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()  # the driver's loop ends at end of input
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._pool.shutdown(wait=False, cancel_futures=True)


_shared: OpenEnvDriver | None = None


def shared_driver(config: pytest.Config) -> OpenEnvDriver:
    """One driver for the whole test session, every module that plays OpenEnv's clients (its
    imports are seconds of CPU), closed when the session ends; a new one if the last one died."""
    global _shared
    if _shared is None or _shared.proc.poll() is not None:
        _shared = OpenEnvDriver()
        config.add_cleanup(_shared.close)
    return _shared
