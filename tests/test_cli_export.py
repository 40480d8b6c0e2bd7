"""``grpo-service export-sft`` and ``traces`` on a DB a real server wrote from real rollouts."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grpo_service.cli import app
from grpo_service.tracing import TraceReader, TraceWriter
from grpo_service.tracing.export import validate_example
from tests.conftest import MODEL
from tools.fake_server import FakeInferenceServer
from tools.server_thread import ServerThread
from tools.synthetic_traces import synthetic_trace

runner = CliRunner()


@pytest.fixture
def collected(
    start_server: Callable[..., ServerThread],
    fake_llm: FakeInferenceServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    """A traces/v3 DB holding 6 crafter-react episodes collected with ``grpo-service eval``."""
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "traces" / "v3" / "task_app_traces_2025-01-01_00-00-00.db"
    server = start_server(vllm_base_url=fake_llm.base_url, trace_db=db)
    args = ["eval", "--base-url", server.base_url, "--model", MODEL, "--seeds", "0-5", "--max-turns", "6"]
    result = runner.invoke(app, [*args, "--concurrency", "3"])
    assert result.exit_code == 0, result.output
    server.stop()  # flushes the trace writer
    return db


def export(*args: str, exit_code: int = 0) -> tuple[str, list[dict]]:
    """Export the fixture's eval episodes (``--mode eval``: eval sessions are left out by default)."""
    out = Path("sft.jsonl")
    result = runner.invoke(app, ["export-sft", "--out", str(out), "--mode", "eval", *args])
    assert result.exit_code == exit_code, result.output
    return result.output, [json.loads(line) for line in out.read_text().splitlines()]


def test_export_real_rollouts_with_filters_that_select(collected: Path) -> None:
    with TraceReader(collected) as reader:
        sessions = reader.sessions()
        turns = sum(s["num_turns"] for s in sessions)
    assert len(sessions) == 6

    output, examples = export("--in", str(collected))
    assert "sessions kept" in output and f"wrote {len(examples)} examples" in output
    bad_turns = sum(1 for s in sessions if s["stop_reason"].startswith("policy_error"))
    assert len(examples) == turns - bad_turns
    for example in examples:
        assert validate_example(example) == []
        assert example["metadata"]["model"] == MODEL and example["tools"]

    # Filters act on what the rollouts really recorded.
    unlocked = [a for s in sessions for a in s["achievements"]]
    if unlocked:
        target = unlocked[0]
        _, kept = export("--in", str(collected), "--require-achievement", target)
        expected = {s["session_id"] for s in sessions if target in s["achievements"]}
        assert {e["metadata"]["session_id"] for e in kept} == expected
    with_any = {s["session_id"] for s in sessions if s["achievements"]}
    _, kept = export("--in", str(collected), "--min-achievements", "1")
    assert {e["metadata"]["session_id"] for e in kept} == with_any
    best = max(s["total_reward"] for s in sessions)
    _, kept = export("--in", str(collected), "--min-reward", str(best))
    assert {e["metadata"]["session_id"] for e in kept} == {
        s["session_id"] for s in sessions if s["total_reward"] >= best
    }
    output, kept = export("--in", str(collected), "--model", "someone-else", exit_code=1)
    assert kept == [] and "session skipped: model" in output and "no examples" in output
    _, kept = export("--in", str(collected), "--limit", "2")
    assert {e["metadata"]["session_id"] for e in kept} == {s["session_id"] for s in sessions[:2]}


async def test_export_finds_trace_dbs_and_asks_which(
    collected: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    older = tmp_path / "old_runs" / "task_app_traces_2024-01-01_00-00-00.db"
    writer = TraceWriter(older)
    await writer.start()
    writer.submit(synthetic_trace("from-the-old-db", turns=2))
    await writer.close()
    for path in (older, older.with_name(older.name + "-wal")):  # a WAL left behind counts as a write
        if path.exists():
            os.utime(path, (time.time() - 3600, time.time() - 3600))

    result = runner.invoke(app, ["export-sft", "--mode", "all"])  # not a terminal: the newest is taken
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    first = next(i for i, line in enumerate(lines) if "task_app_traces_2025" in line)
    assert "← most recent" in lines[first] and "task_app_traces_2024" in lines[first + 1], result.output
    assert "not a terminal" in result.output
    assert Path("ft_data/crafter_sft.jsonl").exists()  # the default --out

    monkeypatch.setattr("grpo_service.cli.export._interactive", lambda: True)
    result = runner.invoke(app, ["export-sft", "--mode", "all", "--out", "old.jsonl"], input="2\n")
    assert result.exit_code == 0, result.output
    (example, _) = [json.loads(line) for line in Path("old.jsonl").read_text().splitlines()]
    assert example["metadata"]["run_id"] == "from-the-old-db"


def test_traces_summary_and_a_missing_db(collected: Path) -> None:
    result = runner.invoke(app, ["traces", "--in", str(collected)])
    assert result.exit_code == 0, result.output
    assert "sessions" in result.output and "dropped" in result.output
    result = runner.invoke(app, ["export-sft", "--in", "nope.db"])
    assert result.exit_code == 2 and "no trace DB" in result.output


async def test_a_db_named_with_trace_db_is_found_and_other_sqlite_files_are_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRACE_DB", raising=False)
    writer = TraceWriter(tmp_path / "runs" / "my-experiment.db")  # serve --trace-db runs/my-experiment.db
    await writer.start()
    writer.submit(synthetic_trace("named-db", turns=2))
    await writer.close()
    other = sqlite3.connect(tmp_path / "runs" / "unrelated.db")
    other.execute("CREATE TABLE t (x)")
    other.close()

    result = runner.invoke(app, ["traces"])
    assert result.exit_code == 0 and "my-experiment.db" in result.output, result.output
    assert "unrelated.db" not in result.output
    shown = runner.invoke(app, ["traces", "show", "named-db"])
    assert shown.exit_code == 0 and "turn 1 (episode 0)" in shown.output, shown.output
