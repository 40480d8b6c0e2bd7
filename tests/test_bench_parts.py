"""Every part of the benchmark imports and answers ``--help`` (the runs themselves are slow:
tests/test_bench.py, tests/test_bench_train.py)."""

from __future__ import annotations

import importlib
import os
import pkgutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import tools.bench
from grpo_service.cli import app

PARTS = sorted(m.name for m in pkgutil.iter_modules(tools.bench.__path__))


@pytest.mark.parametrize("part", PARTS)
def test_each_bench_module_imports(part: str) -> None:
    importlib.import_module(f"tools.bench.{part}")


def test_bench_help_lists_its_parts() -> None:
    result = CliRunner().invoke(app, ["bench", "--help"])
    assert result.exit_code == 0, result.output
    assert "--quick" in result.output


async def _hold(tmp_path: Path, transport: str, **plan: Any) -> dict[str, Any]:
    """The live-sessions part against an embedded server: a few sessions, seconds."""
    from grpo_service import Settings, create_app
    from tools.bench.sessions import SessionsPlan, hold_sessions
    from tools.server_thread import ServerThread

    settings = Settings(_env_file=None, state_dir=tmp_path / "state", snapshot_secret="b" * 40)
    server = ServerThread(create_app(settings), name="bench-sessions").start()
    try:
        sessions = SessionsPlan(**{"levels": (2, 5), "period_s": 0.2, "hold_s": 0.6, "drain_s": 10.0, **plan})
        pid = os.getpid()
        return await hold_sessions(server.base_url, sessions, pid, lambda _: None, transport=transport)
    finally:
        server.stop()


@pytest.mark.parametrize("transport", ["openenv", "http"])
async def test_live_sessions_part_holds_a_few_and_leaks_none(tmp_path: Path, transport: str) -> None:
    report = await _hold(tmp_path, transport)
    assert report["sessions_held"] == 5 and report["first_failing_level"] is None, report
    assert report["leaked_after_drop"] == 0 and report["success_rate"] == 1.0, report
    assert all(level["steps"] > 0 and level["p99_ms"] is not None for level in report["levels"]), report


async def test_a_level_not_open_by_its_deadline_fails_and_leaks_nothing(tmp_path: Path) -> None:
    report = await _hold(tmp_path, "openenv", levels=(3,), open_s=0.0)
    (level,) = report["levels"]
    assert level["opened"] == 0 and level["refused"] == 3 and not level["held"], report
    assert level["errors"] == {"open: not open within 0 s": 3}, report
    assert report["sessions_held"] == 0 and report["first_failing_level"] == 3, report
    assert report["leaked_after_drop"] == 0, report
