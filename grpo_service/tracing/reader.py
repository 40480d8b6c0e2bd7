"""`TraceReader`: reads a trace DB on its own (synchronous) connection.

Used by the exporter, the CLI and tests. Opening a DB brings an old schema up to date (the
migrations only add), so files from earlier versions keep working, and derives the detail tables
of the rollouts written since it was last read (`tracing.derive`); a read-only file, or one from
a newer version, is read as it is.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any, Self

from grpo_service.tracing.codec import join_message, loads, unpack_token_ids
from grpo_service.tracing.derive import derive_pending
from grpo_service.tracing.schema import CONNECTION_PRAGMAS, SchemaTooNew, migrate_sync, schema_version

log = logging.getLogger(__name__)

SESSION_JSON = ("env_config", "policy_config", "sampling", "achievements", "metrics", "request")


# The columns of a turn (its decision, LLM call and env step) that hold JSON text.
_JSON_COLUMNS = frozenset(
    {
        "observation",
        "tool_calls",
        "llm_request",
        "llm_response",
        "usage",
        "prompt_token_ids",
        "completion_token_ids",
        "completion_logprobs",
        "actions",
        "achievements_unlocked",
    }
)


def _columns(row: sqlite3.Row, *columns: str, **renamed: str) -> dict[str, Any]:
    """Columns of ``row`` under their own names (``renamed``: key=column), JSON text decoded."""
    picked = {**{c: c for c in columns}, **renamed}
    return {key: loads(row[c]) if c in _JSON_COLUMNS else row[c] for key, c in picked.items()}


class TraceDBError(RuntimeError):
    """The file is missing or is not a trace DB."""


def connect(path: str | Path, *, migrate: bool = True) -> sqlite3.Connection:
    path = Path(path)
    if not path.is_file():
        raise TraceDBError(f"no trace DB at {path}")
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    try:
        for pragma in CONNECTION_PRAGMAS:
            conn.execute(pragma)
        if migrate:
            try:
                migrate_sync(conn)
            except SchemaTooNew as exc:
                log.warning("%s; reading it as it is", exc)
            except sqlite3.OperationalError as exc:  # e.g. a read-only file
                log.warning("cannot migrate %s (%s); reading it as it is", path, exc)
        if schema_version(conn) < 1:
            raise TraceDBError(f"{path} is not a grpo-service trace DB (no schema_version table)")
        if migrate:
            try:
                derive_pending(conn)
            except sqlite3.OperationalError as exc:  # read-only, or locked past the busy timeout
                log.warning(
                    "cannot derive the rollout records of %s now (%s); reading it as it is", path, exc
                )
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise TraceDBError(f"{path} is not a readable SQLite DB: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    return conn


# The turns of a session with their LLM call and env step, if any (aliases t, l, e).
TURNS_JOINED = """FROM turns t
               LEFT JOIN llm_calls l ON l.session_id = t.session_id AND l.turn = t.turn
               LEFT JOIN env_steps e ON e.session_id = t.session_id AND e.turn = t.turn"""
MESSAGE_COLUMNS = "idx, role, content, tool_calls, tool_call_id, name, extra"


def message_from_row(row: sqlite3.Row) -> dict[str, Any]:
    """A chat message exactly as it was sent, from a ``messages`` row (`MESSAGE_COLUMNS`)."""
    columns = {
        "content": row["content"],
        "tool_calls": loads(row["tool_calls"]),
        "tool_call_id": row["tool_call_id"],
        "name": row["name"],
    }
    return join_message(row["role"], columns, loads(row["extra"]))


def _session(row: sqlite3.Row) -> dict[str, Any]:
    out = dict(row)
    for key in SESSION_JSON:
        if key in out:
            out[key] = loads(out[key])
    return out


class TraceReader:
    def __init__(self, path: str | Path, *, migrate: bool = True) -> None:
        self.path = Path(path)
        self.conn = connect(self.path, migrate=migrate)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------- sessions

    def version(self) -> int:
        return schema_version(self.conn)

    def count(self, table: str = "sessions") -> int:
        if table not in {
            "sessions",
            "turns",
            "messages",
            "llm_calls",
            "env_steps",
            "rewards",
            "streams",
            "prompt_token_ids",
            "rollout_records",
        }:
            raise ValueError(f"unknown table {table!r}")
        return int(self.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])

    def sessions(self, *, order: str = "started_at") -> list[dict[str, Any]]:
        if order not in ("started_at", "recorded_at"):
            raise ValueError(f"cannot order by {order!r}")
        rows = self.conn.execute(f"SELECT * FROM sessions ORDER BY {order}, rowid")
        return [_session(r) for r in rows]

    def session(self, session_id: str) -> dict[str, Any]:
        row = self.conn.execute("SELECT * FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        if row is None:
            raise KeyError(session_id)
        return _session(row)

    def session_ids(self, run_id: str) -> list[str]:
        """Sessions recorded for a run id, oldest first (a finished run id may be reused)."""
        rows = self.conn.execute(
            "SELECT session_id FROM sessions WHERE run_id = ? ORDER BY recorded_at, rowid", (run_id,)
        )
        return [r[0] for r in rows]

    def writers(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.conn.execute("SELECT * FROM trace_writers ORDER BY id")]

    def dropped(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.conn.execute("SELECT * FROM dropped_rollouts ORDER BY id")]

    # -------------------------------------------------------------------------------- turns

    def messages(self, session_id: str) -> dict[int, dict[str, Any]]:
        rows = self.conn.execute(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_id = ? ORDER BY idx", (session_id,)
        )
        return {r["idx"]: message_from_row(r) for r in rows}

    def prompt_token_ids(self, session_id: str) -> dict[int, list[int]]:
        """Each LLM call's prompt token ids by turn, from the session's packed record (empty for a
        session written before schema version 6, whose `llm_calls` rows hold their own)."""
        try:
            row = self.conn.execute(
                "SELECT codec, data FROM prompt_token_ids WHERE session_id = ?", (session_id,)
            ).fetchone()
        except sqlite3.OperationalError:  # an old DB read as it is (read-only): no such table
            return {}
        return {} if row is None else unpack_token_ids(row["codec"], row["data"])

    def turns(self, session_id: str) -> list[dict[str, Any]]:
        """Every decision of a session with its prompt, reply, LLM call and env step."""
        messages = self.messages(session_id)
        packed = self.prompt_token_ids(session_id)
        rows = self.conn.execute(
            """SELECT t.turn, t.episode, t.observation, t.tool_calls, t.decision_error,
                      t.decision_error_detail, t.prompt_messages, t.completion_message,
                      l.turn IS NOT NULL AS has_llm_call, l.model, l.request AS llm_request,
                      l.response AS llm_response, l.finish_reason, l.usage, l.latency_ms, l.attempts,
                      l.error AS llm_error, l.prompt_token_ids, l.completion_token_ids,
                      l.completion_logprobs, l.weights_version,
                      e.turn IS NOT NULL AS has_env_step, e.actions, e.actions_executed, e.reward, e.done,
                      e.truncated, e.step_idx, e.achievements_unlocked, e.env_ms
               """
            + TURNS_JOINED
            + " WHERE t.session_id = ? ORDER BY t.turn",
            (session_id,),
        )
        out = []
        for r in rows:
            prompt_ids = loads(r["prompt_messages"])
            completion = r["completion_message"]
            llm = (
                _columns(
                    r,
                    "model",
                    "finish_reason",
                    "usage",
                    "latency_ms",
                    "attempts",
                    "prompt_token_ids",
                    "completion_token_ids",
                    "completion_logprobs",
                    "weights_version",
                    request="llm_request",
                    response="llm_response",
                    error="llm_error",
                )
                if r["has_llm_call"]
                else None
            )
            if llm is not None and llm["prompt_token_ids"] is None:
                llm["prompt_token_ids"] = packed.get(r["turn"])
            out.append(
                {
                    **_columns(
                        r,
                        "turn",
                        "episode",
                        "observation",
                        "tool_calls",
                        "decision_error",
                        "decision_error_detail",
                    ),
                    "prompt": None if prompt_ids is None else [messages[i] for i in prompt_ids],
                    "completion": None if completion is None else messages[completion],
                    "llm": llm,
                    "env": {
                        **_columns(
                            r,
                            "actions",
                            "actions_executed",
                            "reward",
                            "step_idx",
                            "achievements_unlocked",
                            "env_ms",
                        ),
                        "done": bool(r["done"]),
                        "truncated": bool(r["truncated"]),
                    }
                    if r["has_env_step"]
                    else None,
                }
            )
        return out

    def rewards(self, session_id: str) -> list[dict[str, Any]]:
        rows = self.conn.execute(
            "SELECT scope, turn, episode, kind, value, annotation FROM rewards WHERE session_id = ? "
            "ORDER BY id",
            (session_id,),
        )
        return [{**dict(r), "annotation": loads(r["annotation"])} for r in rows]

    def streams(self, session_id: str) -> list[dict[str, Any]]:
        """The session's token streams (`grpo_service.models.TokenStream` fields, plus ``episode``),
        in order; none for a rollout played per decision."""
        rows = self.conn.execute(
            "SELECT episode, start_reason, end_reason, token_ids, sampled, logprobs, spans FROM streams "
            "WHERE session_id = ? ORDER BY episode, idx",
            (session_id,),
        )
        return [
            {
                "episode": r["episode"],
                "start_reason": r["start_reason"],
                "end_reason": r["end_reason"],
                "token_ids": loads(r["token_ids"]),
                "sampled": loads(r["sampled"]),
                "logprobs": loads(r["logprobs"]),
                "spans": loads(r["spans"]),
            }
            for r in rows
        ]

    # --------------------------------------------------------------------------- trace dict

    def trace_dict(self, session_id: str) -> dict[str, Any]:
        """The session in `RolloutTrace.to_dict()` form: equal to what ``return_trace`` returned."""
        s = self.session(session_id)
        turns = []
        for t in self.turns(session_id):
            llm, env = t["llm"], t["env"]
            turns.append(
                {
                    "turn": t["turn"],
                    "messages": t["prompt"] if llm else None,
                    "response": llm["response"] if llm else None,
                    "tool_calls": t["tool_calls"],
                    "error": t["decision_error"],
                    "reward": env["reward"] if env else None,
                    "done": env["done"] if env else None,
                    "achievements_unlocked": env["achievements_unlocked"] if env else None,
                }
            )
        return {
            "run_id": s["run_id"],
            "group_id": s["group_id"],
            "group_index": s["group_index"],
            "env_name": s["env_name"],
            "policy_name": s["policy_name"],
            "seed": s["seed"],
            "started_at": s["started_at"],
            "finished_at": s["finished_at"],
            "stop_reason": s["stop_reason"],
            "turns": turns,
        }
