"""The trace DB: schema and migrations, the writer (batching, drops, failures, flush), the reader."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path

import pytest

from grpo_service.tracing import SCHEMA_VERSION, SchemaTooNew, TraceReader, TraceWriter
from grpo_service.tracing import rows as rows_module
from grpo_service.tracing.codec import dumps, dumps_redacted, join_message, redact, split_message
from grpo_service.tracing.schema import MIGRATIONS, migrate_sync
from tools.synthetic_traces import SYSTEM_PROMPT, synthetic_trace


async def write(path: Path, traces: list, **kwargs: object) -> TraceWriter:
    writer = TraceWriter(path, **kwargs)  # type: ignore[arg-type]
    await writer.start()
    for trace in traces:
        writer.submit(trace)
    await writer.close()
    return writer


def session_of(reader: TraceReader, run_id: str) -> str:
    (session_id,) = reader.session_ids(run_id)
    return session_id


async def test_db_trace_equals_the_returned_trace_dict(tmp_path: Path) -> None:
    trace = synthetic_trace("r1", turns=6, unlocks={2: ["collect_wood"], 4: ["place_table", "eat_cow"]})
    await write(tmp_path / "t.db", [trace])
    with TraceReader(tmp_path / "t.db") as reader:
        from_db = reader.trace_dict(session_of(reader, "r1"))
    assert from_db == json.loads(json.dumps(trace.to_dict()))
    assert from_db["turns"][4]["achievements_unlocked"] == ["place_table", "eat_cow"]


async def test_a_rollout_encoded_elsewhere_is_stored_as_the_writer_would(tmp_path: Path) -> None:
    """A Ray host encodes its rollouts (`encode_trace`) and the writer only inserts the rows:
    the DB holds what the writer's own encoding stores."""
    from grpo_service.tracing.writer import EncodedTrace, encode_trace

    trace = synthetic_trace("r1", turns=6, unlocks={2: ["collect_wood"]}, group_id="g", group_index=1)
    await write(tmp_path / "here.db", [trace])
    writer = TraceWriter(tmp_path / "there.db")
    await writer.start()
    encoded = encode_trace(trace, writer.writer_id, time.time())
    assert isinstance(encoded, EncodedTrace) and encoded.run_id == "r1"
    writer.submit(encoded)
    await writer.close()
    stored = []
    for name in ("here.db", "there.db"):
        with TraceReader(tmp_path / name) as reader:
            session_id = session_of(reader, "r1")
            own = ("session_id", "recorded_at")  # a new session's id; when it was encoded
            session = {k: v for k, v in reader.session(session_id).items() if k not in own}
            turns = [{k: v for k, v in turn.items() if k not in own} for turn in reader.turns(session_id)]
            stored.append((session, turns, reader.trace_dict(session_id)))
            assert reader.writers()[0]["written"] == 1
    assert stored[0] == stored[1]


async def test_session_columns_tokens_rewards_and_no_secrets(tmp_path: Path) -> None:
    trace = synthetic_trace(
        "r2", turns=5, seed=7, unlocks={1: ["collect_wood"]}, rewards={3: -0.1}, group_id="g", group_index=3
    )
    await write(tmp_path / "t.db", [trace])
    with TraceReader(tmp_path / "t.db") as reader:
        sid = session_of(reader, "r2")
        s = reader.session(sid)
        assert (s["group_id"], s["group_index"], s["seed"], s["env_name"]) == ("g", 3, 7, "crafter")
        assert (s["policy_name"], s["model"], s["status"], s["stop_reason"]) == (
            "crafter-react",
            "fake-qwen3",
            "completed",
            "completed",
        )
        assert s["sampling"] == {"temperature": 0.7, "top_p": 1.0, "max_tokens": 512}
        assert s["achievements"] == ["collect_wood"] and s["achievements_count"] == 1
        assert s["total_reward"] == pytest.approx(0.9) and s["num_turns"] == 5
        turns = reader.turns(sid)
        llm = turns[2]["llm"]
        assert llm["completion_token_ids"] == trace.decisions[2].decision.llm_call.completion_token_ids
        assert len(llm["completion_logprobs"]) == len(llm["completion_token_ids"])
        assert llm["latency_ms"] == 14.5 and llm["usage"]["prompt_tokens"] == 380
        assert turns[2]["completion"]["tool_calls"][0]["function"]["name"] == "interact_many"
        assert turns[1]["env"]["achievements_unlocked"] == ["collect_wood"]
        rewards = reader.rewards(sid)
        step = [(r["turn"], r["kind"], r["value"]) for r in rewards if r["scope"] == "step"]
        assert (1, "achievements", 1.0) in step and (3, "env", -0.1) in step
        assert len([r for r in step if r[1] == "env"]) == 5
        outcome = {(r["scope"], r["kind"]): r["value"] for r in rewards if r["scope"] != "step"}
        assert outcome[("session", "return")] == pytest.approx(0.9)
        assert outcome[("episode", "achievements")] == 1.0
    raw = (tmp_path / "t.db").read_bytes()  # closed: the WAL was checkpointed into the file
    assert b"sk-do-not-store" not in raw


async def test_repeated_messages_are_stored_once_per_session(tmp_path: Path) -> None:
    await write(tmp_path / "t.db", [synthetic_trace("r", turns=10)])
    with TraceReader(tmp_path / "t.db") as reader:
        sid = session_of(reader, "r")
        messages = reader.messages(sid)
        turns = reader.turns(sid)
    assert sum(m["content"] == SYSTEM_PROMPT for m in messages.values()) == 1
    shown = sum(len(t["prompt"]) + 1 for t in turns)
    assert len(messages) < shown / 2
    # Every turn's prompt is rebuilt exactly: system, up to 4 past turns of 3 messages, observation.
    assert [len(t["prompt"]) for t in turns] == [2, 5, 8, 11, 14, 14, 14, 14, 14, 14]


def test_a_value_is_redacted_as_redact_would_whichever_path_it_takes() -> None:
    """`dumps_redacted` encodes a value once and walks it only when a secret-looking marker is in
    its JSON: the stored text is `dumps(redact(value))` either way."""
    values = [
        None,
        {},
        {"model": "m", "top_p": 0.7, "extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
        {"policy": {"config": {"API_KEY": "sk-1", "inference_url": "http://h"}}, "n": [1, (2, 3)]},
        {"headers": [{"Authorization": "Bearer x"}], "Password": None, "secret_name": 3},
        {"text": "the key is under the mat", "notes": ["no secrets here"]},  # markers in values only
        {1: "a", "keys": {"monkey": "banana"}},  # a key that is not a string; a marker inside a word
        {"\u212aEY": "sk-2", "note": "café"},  # the Kelvin sign lowers to an ASCII "k"
    ]
    for value in values:
        assert dumps_redacted(value) == dumps(redact(value))
    stored = [dumps_redacted(values[3]) or "", dumps_redacted(values[-1]) or ""]
    assert "sk-1" not in stored[0] and "sk-2" not in stored[1]


def test_message_split_join_round_trip() -> None:
    cases = [
        {"role": "system", "content": "s"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "a", "type": "function"}]},
        {"role": "assistant", "tool_calls": []},
        {"role": "tool", "tool_call_id": "a", "content": "ok", "name": None},
        {"role": "user", "content": [{"type": "text", "text": "hi"}], "weird": {"x": 1}},
    ]
    for message in cases:
        assert join_message(*split_message(message)) == message


async def test_old_schema_is_migrated_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    assert migrate_sync(conn, MIGRATIONS[:1]) == 1  # a DB written by the first release
    conn.close()
    await write(path, [synthetic_trace("before", turns=2)])
    with TraceReader(path) as reader:
        assert reader.version() == SCHEMA_VERSION
        assert reader.session_ids("before")
        assert reader.conn.execute("SELECT COUNT(*) FROM session_summary").fetchone()[0] == 1
        versions = [r[0] for r in reader.conn.execute("SELECT version FROM schema_version ORDER BY version")]
    assert versions == list(range(1, SCHEMA_VERSION + 1))


async def test_a_new_db_has_large_pages_and_an_old_one_keeps_its_own(tmp_path: Path) -> None:
    """16 KiB pages for a new DB (a call's token ids spill over 4 KiB pages); a DB made with
    SQLite's default 4 KiB keeps them, and takes rollouts as before."""
    await write(tmp_path / "new.db", [synthetic_trace("r", turns=3, with_tokens=True)])
    old = tmp_path / "old.db"
    conn = sqlite3.connect(old, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    migrate_sync(conn, MIGRATIONS[:1])
    conn.close()
    await write(old, [synthetic_trace("r", turns=3, with_tokens=True)])
    for name, page_size in (("new.db", 16384), ("old.db", 4096)):
        with TraceReader(tmp_path / name) as reader:
            assert reader.conn.execute("PRAGMA page_size").fetchone()[0] == page_size
            assert reader.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            (turn,) = reader.turns(session_of(reader, "r"))[-1:]
            assert turn["llm"]["prompt_token_ids"] == list(range(300 + 40 * 2))


async def test_prompt_token_ids_are_one_compressed_record_per_rollout(tmp_path: Path) -> None:
    """Each call's prompt ids come back exactly, from one packed record per rollout rather than a
    JSON list per `llm_calls` row: a prompt repeats most of the one before it."""
    trace = synthetic_trace("r", turns=8, with_tokens=True)
    sent = {d.turn: d.decision.llm_call.prompt_token_ids for d in trace.decisions}
    await write(tmp_path / "t.db", [trace])
    with TraceReader(tmp_path / "t.db") as reader:
        sid = session_of(reader, "r")
        assert {t["turn"]: t["llm"]["prompt_token_ids"] for t in reader.turns(sid)} == sent
        assert reader.prompt_token_ids(sid) == sent
        assert reader.count("prompt_token_ids") == 1
        stored = reader.conn.execute("SELECT prompt_token_ids FROM llm_calls").fetchall()
        assert [r[0] for r in stored] == [None] * len(sent)
        codec, data = reader.conn.execute("SELECT codec, data FROM prompt_token_ids").fetchone()
    assert codec == "zstd+json"
    assert len(data) * 10 < len(json.dumps(list(sent.values())))


async def test_prompt_token_ids_written_row_by_row_are_still_read(tmp_path: Path) -> None:
    """A DB written before the packed record (its ids in `llm_calls.prompt_token_ids`) reads as
    before, migrated or as it is."""
    path = tmp_path / "old.db"
    trace = synthetic_trace("r", turns=3, with_tokens=True)
    await write(path, [trace])
    TraceReader(path).close()  # its detail derived into the tables, as version 5 wrote them
    conn = sqlite3.connect(path, isolation_level=None)
    for d in trace.decisions:  # the ids where schema version 5 kept them
        ids = json.dumps(d.decision.llm_call.prompt_token_ids)
        conn.execute("UPDATE llm_calls SET prompt_token_ids = ? WHERE turn = ?", (ids, d.turn))
    conn.execute("DROP TABLE prompt_token_ids")
    conn.execute("DROP TABLE rollout_records")
    conn.execute("DELETE FROM schema_version WHERE version >= 6")
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()
    expected = [d.decision.llm_call.prompt_token_ids for d in trace.decisions]
    with TraceReader(path, migrate=False) as reader:  # as a read-only file is read: as it is
        assert reader.version() == 5
        assert [t["llm"]["prompt_token_ids"] for t in reader.turns(session_of(reader, "r"))] == expected
    with TraceReader(path) as reader:  # writable: migrated, the old rows untouched
        assert reader.version() == SCHEMA_VERSION
        assert [t["llm"]["prompt_token_ids"] for t in reader.turns(session_of(reader, "r"))] == expected


async def test_newer_schema_is_refused_for_writing_but_readable(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    await write(path, [synthetic_trace("r", turns=1)])
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO schema_version VALUES (999, 0, 'from the future')")
    conn.commit()
    conn.close()
    with pytest.raises(SchemaTooNew):
        await TraceWriter(path).start()
    with TraceReader(path) as reader:
        assert reader.session_ids("r")


async def test_full_queue_drops_counts_and_names_the_rollouts(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path / "t.db", queue_size=2)
    # Not started yet: nothing drains the queue, so it fills at once.
    started = time.perf_counter()
    for i in range(5):
        writer.submit(synthetic_trace(f"r{i}", turns=1))
    assert time.perf_counter() - started < 0.5  # submit never waits
    assert writer.stats()["dropped"] == 3 and writer.stats()["queued"] == 2
    await writer.start()
    await writer.close()
    writer.submit(synthetic_trace("late", turns=1))  # after close: dropped too, never an error
    stats = writer.stats()
    assert (stats["submitted"], stats["written"], stats["dropped"]) == (6, 2, 4)
    with TraceReader(tmp_path / "t.db") as reader:
        assert reader.count() == 2
        assert [(d["run_id"], d["reason"]) for d in reader.dropped()] == [
            ("r2", "queue_full"),
            ("r3", "queue_full"),
            ("r4", "queue_full"),
        ]
        (w,) = reader.writers()
        assert (w["written"], w["dropped"], w["failed"]) == (2, 3, 0) and w["closed_at"] is not None


async def test_a_bad_rollout_does_not_sink_its_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = rows_module.written_rows

    def sabotaged(trace, session_id, writer_id, recorded_at):  # type: ignore[no-untyped-def]
        out = real(trace, session_id, writer_id, recorded_at)
        if trace.response.run_id == "bad-sql":  # violates NOT NULL: the whole batch's transaction fails
            row = list(out.tables["sessions"][0])
            row[rows_module.SESSION_COLUMNS.index("env_name")] = None
            out.tables["sessions"][0] = tuple(row)
        if trace.response.run_id == "bad-encode":
            raise ValueError("cannot encode")
        return out

    monkeypatch.setattr("grpo_service.tracing.writer.written_rows", sabotaged)
    names = ["a", "bad-sql", "b", "bad-encode", "c"]
    writer = TraceWriter(tmp_path / "t.db")
    for name in names:  # queued before start: they form one batch
        writer.submit(synthetic_trace(name, turns=2))
    await writer.start()
    await writer.close()
    assert (writer.stats()["written"], writer.stats()["failed"]) == (3, 2)
    with TraceReader(tmp_path / "t.db") as reader:
        assert sorted(s["run_id"] for s in reader.sessions()) == ["a", "b", "c"]
        reasons = {d["run_id"]: d["reason"] for d in reader.dropped()}
    assert reasons["bad-encode"].startswith("write_error: ValueError")
    assert reasons["bad-sql"].startswith("write_error: IntegrityError")


async def test_concurrent_rollouts_and_readers(tmp_path: Path) -> None:
    """Many rollouts finishing at once while a reader polls: no lock errors, nothing lost."""
    path = tmp_path / "t.db"
    writer = TraceWriter(path)
    await writer.start()
    traces = [synthetic_trace(f"r{i}", turns=10) for i in range(200)]
    seen: list[int] = []

    async def read_while_writing() -> None:
        reader = TraceReader(path)
        try:
            while not seen or seen[-1] < len(traces):
                seen.append(await asyncio.to_thread(reader.count))
                await asyncio.sleep(0.005)
        finally:
            reader.close()

    polling = asyncio.create_task(read_while_writing())
    started = time.perf_counter()
    for i, trace in enumerate(traces):
        writer.submit(trace)
        if i % 20 == 0:
            await asyncio.sleep(0)
    await asyncio.wait_for(polling, 30)
    elapsed = time.perf_counter() - started
    await writer.close()
    stats = writer.stats()
    assert stats["written"] == 200 and stats["dropped"] == stats["failed"] == 0
    assert seen == sorted(seen)  # readers see whole rollouts appear, never a partial one undone
    print(f"\n{stats['rows']} rows, 200 rollouts in {elapsed:.2f}s ({stats['rows'] / elapsed:,.0f} rows/s)")


async def test_close_flushes_everything_queued(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path / "t.db", max_batch=4)
    await writer.start()
    for i in range(30):
        writer.submit(synthetic_trace(f"r{i}", turns=3))
    await writer.close()
    await writer.close()  # idempotent
    with TraceReader(tmp_path / "t.db") as reader:
        assert reader.count() == 30
        assert reader.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert reader.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_flush_waits_for_what_was_submitted_and_the_writer_goes_on(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path / "t.db", max_batch=4)
    await writer.flush()  # not started: nothing to wait for
    await writer.start()
    for round_ in range(2):
        for i in range(10):
            writer.submit(synthetic_trace(f"r{round_}-{i}", turns=2))
        await writer.flush()
        with TraceReader(tmp_path / "t.db") as reader:
            assert reader.count() == 10 * (round_ + 1)  # written, readable, before close
    await asyncio.gather(writer.flush(), writer.flush())
    await writer.close()
    await writer.flush()  # closed: returns at once
    stats = writer.stats()
    assert stats["written"] == 20 and stats["batches"] >= 5  # at most 4 rollouts a batch
    assert 0 < stats["cpu_s"] <= stats["write_s"]  # the writer thread's CPU, within its time


async def test_closing_a_writer_that_never_started_counts_what_it_held(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path / "t.db")
    writer.submit(synthetic_trace("a", turns=1))
    writer.submit(synthetic_trace("b", turns=1))
    await writer.close()
    assert (writer.stats()["dropped"], writer.stats()["queued"], writer.stats()["written"]) == (2, 0, 0)
