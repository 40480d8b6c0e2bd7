"""OpenEnv 0.10's own clients in their venv (`tools.openenv_venv`, built on first use), driven
from the tests: one driver process per session plays the scenarios the tests send it."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.openenv_venv import openenv_venv

if TYPE_CHECKING:
    import pytest


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
