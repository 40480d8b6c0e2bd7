"""Synth's trace schema v3 over our DB: the ``synth_*`` views and the Synth-named copy agree with
what the reader gives back, row for row."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from typer.testing import CliRunner

from grpo_service.cli import app
from grpo_service.tracing import TraceReader, TraceWriter
from grpo_service.tracing.synth import VIEWS, export_synth_db, install_views
from tools.synthetic_traces import synthetic_trace

SYNTH_TABLES = {
    "session_traces",
    "session_timesteps",
    "events",
    "messages",
    "outcome_rewards",
    "event_rewards",
}


async def make_db(path: Path) -> Path:
    writer = TraceWriter(path)
    await writer.start()
    writer.submit(synthetic_trace("r1", turns=4, unlocks={1: ["collect_wood"]}, group_id="g", group_index=0))
    writer.submit(synthetic_trace("r2", turns=3, error_turn=2))
    await writer.close()
    return path


async def test_views_map_sessions_turns_calls_steps_messages_and_rewards(tmp_path: Path) -> None:
    db = await make_db(tmp_path / "traces.db")
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    assert set(install_views(conn)) == {f"synth_{t}" for t in SYNTH_TABLES} == {f"synth_{t}" for t in VIEWS}
    with TraceReader(db) as reader:
        sessions = {s["session_id"]: s for s in reader.sessions()}
        traces = conn.execute("SELECT * FROM synth_session_traces").fetchall()
        assert {t["session_id"] for t in traces} == set(sessions)
        for t in traces:
            metadata = json.loads(t["metadata"])
            session = sessions[t["session_id"]]
            assert metadata["run_id"] == session["run_id"]
            assert metadata["final_achievements"] == session["achievements"]
            assert t["num_timesteps"] == session["num_turns"]

            turns = reader.turns(t["session_id"])
            cais = conn.execute(
                "SELECT * FROM synth_events WHERE session_id = ? AND event_type = 'cais' ORDER BY id",
                (t["session_id"],),
            ).fetchall()
            with_llm = [turn for turn in turns if turn["llm"]]
            assert len(cais) == len(with_llm)
            for event, turn in zip(cais, with_llm, strict=True):
                (record,) = json.loads(event["call_records"])
                assert [(m["role"], m["parts"][0]["text"]) for m in record["input_messages"]] == [
                    (m["role"], m["content"] or "") for m in turn["prompt"]
                ]
                calls = (turn["completion"] or {}).get("tool_calls") or []
                assert [c["name"] for c in record["output_tool_calls"]] == [
                    c["function"]["name"] for c in calls
                ]
                assert event["model_name"] == turn["llm"]["model"]

            env_events = conn.execute(
                "SELECT reward, terminated FROM synth_events "
                "WHERE session_id = ? AND event_type = 'environment' ORDER BY id",
                (t["session_id"],),
            ).fetchall()
            assert [e["reward"] for e in env_events] == [
                turn["env"]["reward"] for turn in turns if turn["env"]
            ]

        types = {r[0] for r in conn.execute("SELECT DISTINCT message_type FROM synth_messages")}
        assert types <= {"user", "assistant", "system", "tool_use", "tool_result"}  # Synth's CHECK
        (outcome,) = conn.execute(
            "SELECT o.* FROM synth_outcome_rewards o JOIN sessions s USING (session_id) WHERE s.run_id = 'r1'"
        ).fetchall()
        assert outcome["achievements_count"] == 1
        unlocks = conn.execute(
            "SELECT turn_number, reward_value, annotation FROM synth_event_rewards "
            "WHERE reward_type = 'achievement_delta' AND reward_value > 0"
        ).fetchall()
        assert [(u["turn_number"], json.loads(u["annotation"])["achievements"]) for u in unlocks] == [
            (1, ["collect_wood"])
        ]
        event_ids = {r[0] for r in conn.execute("SELECT id FROM synth_events")}
        assert {r[0] for r in conn.execute("SELECT event_id FROM synth_event_rewards")} <= event_ids
    conn.close()


async def test_export_writes_synth_named_tables_that_a_synth_reader_queries(tmp_path: Path) -> None:
    db = await make_db(tmp_path / "traces.db")
    out = tmp_path / "traces" / "v3" / "synth_ai.db"
    result = CliRunner().invoke(app, ["traces", "export-synth", "--in", str(db), "--out", str(out)])
    assert result.exit_code == 0, result.output
    conn = sqlite3.connect(out)
    assert {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")} == SYNTH_TABLES
    # What Synth's SFT exporter reads: the cais events' call records and the outcome rewards.
    records = [
        json.loads(r[0])[0] for r in conn.execute("SELECT call_records FROM events WHERE event_type = 'cais'")
    ]
    assert len(records) == 4 + 3 and all(r["input_messages"][0]["role"] == "system" for r in records)
    assert conn.execute("SELECT COUNT(*) FROM outcome_rewards").fetchone()[0] == 2
    conn.close()
    again = CliRunner().invoke(app, ["traces", "export-synth", "--in", str(db), "--out", str(out)])
    assert again.exit_code == 2 and "exists" in again.output
    assert export_synth_db(db, tmp_path / "second.db")["session_traces"] == 2
