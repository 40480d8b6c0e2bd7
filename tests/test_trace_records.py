"""A rollout is written as one compressed record and its detail tables derived when the DB is read:
what the writer stores, what a reader derives, and what happens to a record that cannot be."""

from __future__ import annotations

import copy
import logging
import sqlite3
import time
from pathlib import Path

import orjson
import pytest

from grpo_service.tracing import TraceReader, TraceWriter
from grpo_service.tracing.codec import RECORD_CODEC, pack_token_ids, unpack_token_ids
from grpo_service.tracing.derive import DeriveReport, derive_file, derive_pending
from grpo_service.tracing.record import record_of, unpack_record
from grpo_service.tracing.rows import DERIVED_TABLES, detail_rows
from tools.synthetic_traces import synthetic_trace


async def write(path: Path, traces: list) -> None:
    writer = TraceWriter(path)
    await writer.start()
    for trace in traces:
        writer.submit(trace)
    await writer.close()


def counts(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        return {
            table: conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
            for table in ("sessions", "prompt_token_ids", "rollout_records", *DERIVED_TABLES)
        }


async def test_the_writer_stores_three_rows_per_rollout_and_a_reader_derives_the_rest(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    traces = [synthetic_trace(f"r{i}", turns=6, unlocks={2: ["collect_wood"]}) for i in range(3)]
    await write(db, traces)
    written = counts(db)
    assert (written["sessions"], written["prompt_token_ids"], written["rollout_records"]) == (3, 3, 3)
    assert all(written[table] == 0 for table in DERIVED_TABLES)
    with sqlite3.connect(db) as conn:
        codec, data = conn.execute("SELECT codec, data FROM rollout_records LIMIT 1").fetchone()
    assert codec == RECORD_CODEC and len(unpack_record(codec, data)["decisions"]) == 6

    with TraceReader(db) as reader:
        turns = reader.turns(reader.session_ids("r1")[0])
    assert [t["turn"] for t in turns] == list(range(6))
    derived = counts(db)
    assert derived["rollout_records"] == 0  # derived and deleted
    assert (derived["turns"], derived["llm_calls"], derived["env_steps"]) == (18, 18, 18)
    with TraceReader(db):  # nothing left to derive: the tables stay as they are
        pass
    assert counts(db) == derived


def test_a_record_round_trips_to_the_rows_of_its_trace() -> None:
    """What is derived from the packed record equals what is derived from the trace itself: the
    record's JSON loses nothing the tables keep."""
    from grpo_service.tracing.record import pack_record

    trace = synthetic_trace("r", turns=9, unlocks={3: ["place_table"]}, error_turn=8)
    record = record_of(trace)
    direct = detail_rows(copy.deepcopy(record), "s")
    packed = detail_rows(unpack_record(*pack_record(record)), "s")
    assert packed.tables == direct.tables
    assert [r[1] for r in packed.tables["turns"]] == list(range(9))
    assert packed.tables["turns"][8][5] == "no_tool_call"  # the decision error, kept


def test_prompt_token_ids_pack_the_same_from_their_checked_json() -> None:
    """A turn's ids come as the client's compact JSON of them (`LLMCall.prompt_token_ids_json`)
    or as the list: the stored record is the same bytes either way."""
    by_turn = {0: [151644, 8948, 198], 1: [151644, 8948, 198, 2610, -1, 0], 12: []}
    as_json = {turn: orjson.dumps(ids) for turn, ids in by_turn.items()}
    mixed = {0: as_json[0], 1: by_turn[1], 12: as_json[12]}
    packed = pack_token_ids(by_turn)
    assert pack_token_ids(as_json) == pack_token_ids(mixed) == packed
    assert unpack_token_ids(RECORD_CODEC, packed) == by_turn


def test_a_prompt_message_rebuilt_each_turn_is_kept_once() -> None:
    trace = synthetic_trace("r", turns=6, history_window=4)
    for d in trace.decisions:  # an agent that builds every message anew each turn
        request = d.decision.llm_call.request
        request["messages"] = [dict(m) for m in request["messages"]]
        request["tools"] = copy.deepcopy(request.get("tools"))
    record = record_of(trace)
    systems = [m for m in record["messages"] if m.get("role") == "system"]
    assert len(systems) == 1
    assert len(record["tools"]) <= 1 and len(record["params"]) <= 2  # tools and parameters once
    prompts = [d["call"]["prompt"] for d in record["decisions"]]
    assert [[record["messages"][i] for i in p] for p in prompts] == [
        d.decision.llm_call.request["messages"] for d in trace.decisions
    ]


async def test_a_record_that_cannot_be_derived_is_kept_with_its_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "t.db"
    await write(db, [synthetic_trace("good", turns=3), synthetic_trace("bad", turns=3)])
    with sqlite3.connect(db) as conn:
        (bad,) = conn.execute("SELECT session_id FROM sessions WHERE run_id = 'bad'").fetchone()
        conn.execute("UPDATE rollout_records SET data = ? WHERE session_id = ?", (b"not zstd", bad))
    with caplog.at_level(logging.WARNING), TraceReader(db) as reader:
        assert len(reader.turns(reader.session_ids("good")[0])) == 3
        assert reader.turns(bad) == []  # its session is listed, its detail is not derived
        assert {s["run_id"] for s in reader.sessions()} == {"good", "bad"}
    assert "cannot derive the rollout record" in caplog.text
    with sqlite3.connect(db) as conn:
        ((session_id, error),) = conn.execute("SELECT session_id, error FROM rollout_records").fetchall()
    assert session_id == bad and error.startswith("ValueError: a corrupt record")
    with sqlite3.connect(db, isolation_level=None) as conn:  # not tried again
        assert derive_pending(conn).failed == 0 and derive_pending(conn).kept == 1


async def test_a_db_that_cannot_be_written_now_is_read_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Another connection holds the write lock past the busy timeout (as a read-only file
    refuses writes): the reader warns and reads the tables as they are."""
    db = tmp_path / "t.db"
    await write(db, [synthetic_trace("r", turns=3)])
    quick = ("PRAGMA busy_timeout = 50", "PRAGMA foreign_keys = ON")
    monkeypatch.setattr("grpo_service.tracing.derive.CONNECTION_PRAGMAS", quick)
    monkeypatch.setattr("grpo_service.tracing.reader.CONNECTION_PRAGMAS", quick)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with caplog.at_level(logging.WARNING):
            assert derive_file(db) is None
            with TraceReader(db) as reader:
                (session,) = reader.sessions()
                assert session["run_id"] == "r" and reader.turns(session["session_id"]) == []
        assert caplog.text.count("reading it as") == 2
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with TraceReader(db) as reader:  # free again: derived on the next read
        assert len(reader.turns(reader.sessions()[0]["session_id"])) == 3


async def test_derive_stops_at_its_budget_and_the_rest_stays_pending(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    await write(db, [synthetic_trace(f"r{i}", turns=2) for i in range(40)])
    with sqlite3.connect(db, isolation_level=None) as conn:
        (last,) = conn.execute("SELECT session_id FROM sessions WHERE run_id = 'r39'").fetchone()
        # The session asked for first, then one batch begun before the budget ran out.
        report = derive_pending(conn, batch=16, budget_s=0.0, first=last)
        assert (report.derived, report.failed) == (17, 0)
        left = {r[0] for r in conn.execute("SELECT session_id FROM rollout_records")}
        assert len(left) == 23 and last not in left
        assert derive_pending(conn, batch=16).derived == 23
    assert counts(db)["rollout_records"] == 0


async def test_the_viewer_shows_a_rollout_written_since_the_last_page(tmp_path: Path) -> None:
    """The service's viewer reads a live DB: a rollout written after the DB was last read has its
    turns on the next page."""
    from fastapi.testclient import TestClient

    from grpo_service.api.routes.viewer import create_viewer_app

    db = tmp_path / "task_app_traces_live.db"
    await write(db, [synthetic_trace("first", turns=2)])
    client = TestClient(create_viewer_app(db))
    assert client.get("/viewer/api/rollouts").status_code == 200
    await write(db, [synthetic_trace("later", turns=4)])
    assert counts(db)["rollout_records"] == 1
    rollouts = client.get("/viewer/api/rollouts").json()
    later = next(r for r in rollouts["rows"] if r["run_id"] == "later")
    turns = client.get(f"/viewer/api/rollouts/{later['session_id']}/turns").json()["turns"]
    assert [t["turn"] for t in turns] == [0, 1, 2, 3]


async def test_nothing_pending_takes_no_write_lock(tmp_path: Path) -> None:
    """A reader of a DB with nothing to derive (a viewer page after page) never waits for the
    write lock, and so never fails on a DB another connection is writing."""
    db = tmp_path / "t.db"
    await write(db, [synthetic_trace("r", turns=2)])
    assert derive_file(db) == DeriveReport(derived=1)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a writer mid-transaction
    try:
        started = time.monotonic()
        assert derive_file(db) == DeriveReport()
        assert time.monotonic() - started < 1.0  # not the 5 s busy timeout
    finally:
        holder.execute("ROLLBACK")
        holder.close()
