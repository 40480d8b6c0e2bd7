"""A real task app on loopback that traces every rollout into a SQLite file (viewer tests, bench)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from grpo_service import Settings, create_app
from grpo_service.client.task_app import TaskAppClient
from tools.server_thread import ServerThread


@contextmanager
def recording_task_app(
    trace_db: Path, state_dir: Path, *, name: str, timeout_s: float, **settings: Any
) -> Iterator[TaskAppClient]:
    """``with recording_task_app(db, state) as app:`` plays rollouts over real HTTP; on exit the
    server stops, which closes the trace writer: every rollout is in ``trace_db``. ``settings``:
    further `Settings` fields (e.g. ``vllm_base_url``)."""
    settings.setdefault("snapshot_secret", "recording-" + "x" * 32)
    config = Settings(
        _env_file=None, state_dir=state_dir, trace_db=trace_db, reaper_interval_s=3600.0, **settings
    )
    server = ServerThread(create_app(config), name=name).start()
    try:
        with TaskAppClient(server.base_url, timeout_s=timeout_s) as app:
            yield app
    finally:
        server.stop()
