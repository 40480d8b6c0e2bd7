"""OpenEnv 0.10's own clients, CLI and server, in a venv of their own, built on first use.

`openenv` 0.10.0 cannot go into the service's environment: it pulls gradio 6, which pins
``pillow<13`` (the service runs Pillow 13), plus fastmcp and huggingface_hub, about 480 MB.
The tests (`tests/openenv_venv.py`) and the bench's peer part (`tools/bench/peers.py`) build it
the first time they need it, from the package registry, and reuse it: ``$OPENENV_VENV``, by
default ``~/.cache/grpo-service/openenv-0.10.0``. Processes that need it at the same time wait
for one build (a file lock, under a deadline).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

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
