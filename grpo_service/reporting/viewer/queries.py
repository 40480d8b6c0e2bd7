"""What the viewer reads from a trace DB: the filtered run list, one rollout, one GRPO group.

Every read opens the file read-only (a viewer never migrates or writes a DB, foreign or not),
runs under a deadline (SQLite's progress handler interrupts a query past it), and turns every
problem with the file into a clear 4xx: no file 404, not SQLite or not a trace DB 422, a query
that would outlast its deadline 422 naming the filter to narrow. Rows come back as plain dicts.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import sqlite3
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from grpo_service.errors import NotFound, Unprocessable
from grpo_service.tracing.codec import loads
from grpo_service.tracing.derive import derive_file
from grpo_service.tracing.reader import MESSAGE_COLUMNS, TURNS_JOINED, message_from_row

QUERY_DEADLINE_S = 10.0
REQUIRED_TABLES = frozenset({"sessions", "turns", "messages", "llm_calls", "env_steps"})
MAX_TURN_CHUNK = 200

SortKey = Literal[
    "started_at",
    "total_reward",
    "achievements_count",
    "num_turns",
    "num_steps",
    "wall_s",
    "env_name",
    "model",
    "stop_reason",
    "seed",
]
SORT_SQL: dict[str, str] = {
    "started_at": "s.started_at",
    "total_reward": "s.total_reward",
    "achievements_count": "s.achievements_count",
    "num_turns": "s.num_turns",
    "num_steps": "s.num_steps",
    "wall_s": "(s.finished_at - s.started_at)",
    "env_name": "s.env_name",
    "model": "s.model",
    "stop_reason": "s.stop_reason",
    "seed": "s.seed",
}


class QueryTooSlow(Unprocessable, code="query_too_slow"):
    """A run-list query that ran past its time limit."""


class RunFilters(BaseModel):
    """The run list's query string: filters, sort and page."""

    model_config = ConfigDict(extra="forbid")

    env: str | None = Field(None, description="Environment name (exact).")
    model: str | None = Field(None, description="Model id (exact).")
    policy: str | None = Field(None, description="Policy name (exact).")
    weights_version: str | None = Field(None, description="Weights version, when the trace records one.")
    stop_reason: str | None = Field(None, description="Stop reason (exact), or a family: `policy_error:*`.")
    status: str | None = None
    achievement: list[str] = Field(default_factory=list, description="Every one of these was unlocked.")
    min_reward: float | None = Field(None, allow_inf_nan=False)
    max_reward: float | None = Field(None, allow_inf_nan=False)
    min_achievements: int | None = Field(None, ge=0)
    since: str | None = Field(None, description="Started on or after this date/time (ISO 8601, UTC).")
    until: str | None = Field(None, description="Started before the end of this date/time (ISO 8601, UTC).")
    q: str | None = Field(None, max_length=200, description="Part of a session, run or group id.")
    run_id: str | None = None
    group_id: str | None = None
    sort: SortKey = "started_at"
    order: Literal["asc", "desc"] = "desc"
    page: int = Field(1, ge=1, le=1_000_000)
    per_page: int = Field(50, ge=1, le=500)

    @field_validator("since", "until")
    @classmethod
    def _iso(cls, value: str | None) -> str | None:
        if value:
            parse_time(value, end=False)
        return value or None


def parse_time(value: str, *, end: bool) -> float:
    """Seconds since the epoch of an ISO date or date-time (UTC unless it names a zone). With
    ``end``, a bare date means the end of that day (``until=2026-11-23`` includes the 23rd)."""
    try:
        if len(value) == 10:
            day = dt.datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=dt.UTC)
            return (day + dt.timedelta(days=1) if end else day).timestamp()
        moment = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{value!r} is not an ISO date (2026-11-23) or date-time (2026-11-23T06:30)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()


# ------------------------------------------------------------------------------------ opening


@contextlib.contextmanager
def open_trace_db(
    path: Path, *, deadline_s: float | None = None, session_id: str | None = None
) -> Iterator[sqlite3.Connection]:
    """A read-only connection whose queries stop at the deadline; file problems become 4xx.
    Rollouts written since the last page are derived first (``session_id``'s before others)."""
    deadline_s = QUERY_DEADLINE_S if deadline_s is None else deadline_s
    if not path.is_file():
        raise NotFound(f"no trace DB at {path}", code="no_trace_db")
    derive_file(path, budget_s=deadline_s / 2, first=session_id)
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
    except sqlite3.Error as exc:
        raise Unprocessable(f"cannot open {path.name}: {exc}", code="unreadable_trace_db") from None
    conn.row_factory = sqlite3.Row
    deadline = time.monotonic() + deadline_s
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 1_000)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        missing = REQUIRED_TABLES - tables
        if missing:
            raise Unprocessable(
                f"{path.name} is an SQLite DB but not a grpo-service trace DB (no "
                f"{', '.join(sorted(missing))} table); open a traces/v3/task_app_traces_*.db file",
                code="not_a_trace_db",
            )
        yield conn
    except json.JSONDecodeError as exc:
        raise Unprocessable(
            f"{path.name} holds a malformed JSON cell ({exc}); the file was edited or damaged",
            code="corrupt_trace_db",
        ) from None
    except sqlite3.OperationalError as exc:
        if "interrupted" in str(exc):
            raise QueryTooSlow(
                f"the query took longer than {deadline_s:.0f} s on {path.name}; narrow it with filters "
                "(environment, model, date)"
            ) from None
        raise Unprocessable(f"cannot read {path.name}: {exc}", code="unreadable_trace_db") from None
    except sqlite3.DatabaseError as exc:
        raise Unprocessable(
            f"{path.name} is not a readable SQLite DB ({exc}); open a traces/v3/task_app_traces_*.db file",
            code="not_a_trace_db",
        ) from None
    finally:
        conn.close()


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}


def _weights_sql(conn: sqlite3.Connection) -> str:
    """Where this DB keeps the policy weights version, if anywhere (a column, else the metrics)."""
    if "weights_version" in _columns(conn, "sessions"):
        return "s.weights_version"
    return "json_extract(s.metrics, '$.weights_version')"


# ------------------------------------------------------------------------------------ run list

LIST_COLUMNS = (
    "s.session_id, s.run_id, s.group_id, s.group_index, s.env_name, s.seed, s.policy_name, s.model, "
    "s.started_at, s.finished_at, s.finished_at - s.started_at AS wall_s, s.status, s.stop_reason, "
    "s.error, s.num_turns, s.num_steps, s.num_episodes, s.total_reward, s.achievements, "
    "s.achievements_count, s.llm_calls"
)


def _like(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _where(f: RunFilters, weights: str) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    for column, value in (
        ("s.env_name", f.env),
        ("s.model", f.model),
        ("s.policy_name", f.policy),
        ("s.status", f.status),
        ("s.run_id", f.run_id),
        ("s.group_id", f.group_id),
    ):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if f.weights_version is not None:
        clauses.append(f"CAST({weights} AS TEXT) = ?")
        params.append(f.weights_version)
    if f.stop_reason is not None:
        if f.stop_reason.endswith(":*"):
            clauses.append("s.stop_reason LIKE ? ESCAPE '\\'")
            params.append(_like(f.stop_reason[:-1])[1:])
        else:
            clauses.append("s.stop_reason = ?")
            params.append(f.stop_reason)
    for name in f.achievement:
        clauses.append("EXISTS (SELECT 1 FROM json_each(s.achievements) WHERE json_each.value = ?)")
        params.append(name)
    if f.min_reward is not None:
        clauses.append("s.total_reward >= ?")
        params.append(f.min_reward)
    if f.max_reward is not None:
        clauses.append("s.total_reward <= ?")
        params.append(f.max_reward)
    if f.min_achievements is not None:
        clauses.append("s.achievements_count >= ?")
        params.append(f.min_achievements)
    if f.since:
        clauses.append("s.started_at >= ?")
        params.append(parse_time(f.since, end=False))
    if f.until:
        clauses.append("s.started_at < ?")
        params.append(parse_time(f.until, end=True))
    if f.q:
        like = " LIKE ? ESCAPE '\\'"
        clauses.append(f"(s.session_id{like} OR s.run_id{like} OR s.group_id{like})")
        params.extend([_like(f.q)] * 3)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def _run_row(row: sqlite3.Row, weights: Any = None) -> dict[str, Any]:
    out = dict(row)
    out["achievements"] = loads(out["achievements"]) or []
    if weights is not None or "weights_version" in out:
        out["weights_version"] = weights if weights is not None else out.get("weights_version")
    return out


def list_runs(conn: sqlite3.Connection, filters: RunFilters) -> dict[str, Any]:
    weights = _weights_sql(conn)
    where, params = _where(filters, weights)
    total = int(conn.execute(f"SELECT COUNT(*) FROM sessions s{where}", params).fetchone()[0])
    order = "DESC" if filters.order == "desc" else "ASC"
    offset = (filters.page - 1) * filters.per_page
    rows = conn.execute(
        f"SELECT {LIST_COLUMNS}, {weights} AS weights_version FROM sessions s{where} "
        f"ORDER BY {SORT_SQL[filters.sort]} {order}, s.rowid {order} LIMIT ? OFFSET ?",
        [*params, filters.per_page, offset],
    )
    return {
        "total": total,
        "page": filters.page,
        "per_page": filters.per_page,
        "pages": max(1, math.ceil(total / filters.per_page)),
        "rows": [_run_row(r) for r in rows],
    }


@dataclass
class _FacetCache:
    lock: threading.Lock = field(default_factory=threading.Lock)
    entries: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)


_facets = _FacetCache()


def _file_key(path: Path) -> tuple[Any, ...]:
    wal = path.with_name(path.name + "-wal")
    st = path.stat()
    wst = wal.stat() if wal.exists() else None
    return (str(path.resolve()), st.st_mtime_ns, st.st_size, wst and wst.st_mtime_ns, wst and wst.st_size)


def facets(conn: sqlite3.Connection, path: Path) -> dict[str, Any]:
    """What the filters can choose from, with counts; cached until the file changes."""
    key = _file_key(path)
    with _facets.lock:
        if key in _facets.entries:
            return _facets.entries[key]
    weights = _weights_sql(conn)

    def counted(sql: str) -> list[dict[str, Any]]:
        return [{"value": r[0], "count": r[1]} for r in conn.execute(sql) if r[0] is not None]

    stats = conn.execute(
        "SELECT COUNT(*), MIN(started_at), MAX(started_at), MIN(total_reward), MAX(total_reward) "
        "FROM sessions"
    ).fetchone()
    out = {
        "db": path.name,
        "sessions": stats[0],
        "started": [stats[1], stats[2]],
        "reward": [stats[3], stats[4]],
        "env": counted("SELECT env_name, COUNT(*) FROM sessions GROUP BY 1 ORDER BY 2 DESC"),
        "model": counted("SELECT model, COUNT(*) FROM sessions GROUP BY 1 ORDER BY 2 DESC"),
        "policy": counted("SELECT policy_name, COUNT(*) FROM sessions GROUP BY 1 ORDER BY 2 DESC"),
        "stop_reason": counted("SELECT stop_reason, COUNT(*) FROM sessions GROUP BY 1 ORDER BY 2 DESC"),
        "status": counted("SELECT status, COUNT(*) FROM sessions GROUP BY 1 ORDER BY 2 DESC"),
        "weights_version": counted(
            f"SELECT CAST({weights} AS TEXT), COUNT(*) FROM sessions s GROUP BY 1 ORDER BY 2 DESC"
        ),
        "achievement": counted(
            "SELECT j.value, COUNT(*) FROM sessions s, json_each(s.achievements) j GROUP BY 1 ORDER BY 2 DESC"
        ),
        "groups": conn.execute("SELECT COUNT(DISTINCT group_id) FROM sessions").fetchone()[0],
    }
    with _facets.lock:
        if len(_facets.entries) > 16:
            _facets.entries.clear()
        _facets.entries[key] = out
    return out


# ------------------------------------------------------------------------------------ one rollout


def session(conn: sqlite3.Connection, session_id: str) -> dict[str, Any]:
    row = conn.execute("SELECT * FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
    if row is None:
        raise NotFound(f"no rollout {session_id!r} in this trace DB", code="unknown_rollout")
    out = dict(row)
    for key in ("env_config", "policy_config", "sampling", "achievements", "metrics", "request"):
        if key in out:
            out[key] = _json(out[key])
    out["wall_s"] = out["finished_at"] - out["started_at"]
    weights = conn.execute(f"SELECT {_weights_sql(conn)} FROM sessions s WHERE session_id = ?", (session_id,))
    out["weights_version"] = weights.fetchone()[0]
    return out


def _json(text: str | None) -> Any:
    try:
        return loads(text)
    except (TypeError, ValueError):  # a hand-edited or truncated cell: show it as it is
        return text


def _env_step(r: sqlite3.Row) -> dict[str, Any] | None:
    """A turn's env step from a `TURNS_JOINED` row, or None when the turn ran none."""
    if not r["has_env_step"]:
        return None
    return {
        "actions": _json(r["actions"]) or [],
        "reward": r["reward"],
        "done": bool(r["done"]),
        "truncated": bool(r["truncated"]),
        "step_idx": r["step_idx"],
        "unlocked": _json(r["achievements_unlocked"]) or [],
        "env_ms": r["env_ms"],
    }


def timeline(conn: sqlite3.Connection, session_id: str) -> list[dict[str, Any]]:
    """One light record per turn (for the slider, the reward chart and the vitals)."""
    rows = conn.execute(
        """SELECT t.turn, t.episode, t.decision_error,
                  json_extract(t.observation, '$.status') AS vitals,
                  json_extract(t.observation, '$.step_idx') AS obs_step,
                  l.latency_ms, l.error AS llm_error,
                  e.turn IS NOT NULL AS has_env_step, e.reward, e.done, e.truncated, e.step_idx,
                  e.achievements_unlocked, e.actions, e.env_ms """
        + TURNS_JOINED
        + " WHERE t.session_id = ? ORDER BY t.turn",
        (session_id,),
    )
    out = []
    for r in rows:
        vitals = _json(r["vitals"])
        out.append(
            {
                "turn": r["turn"],
                "episode": r["episode"],
                "error": r["decision_error"] or r["llm_error"],
                "vitals": vitals if isinstance(vitals, dict) else None,
                "obs_step": r["obs_step"],
                "llm_ms": r["latency_ms"],
                "env": _env_step(r),
            }
        )
    return out


def _messages(conn: sqlite3.Connection, session_id: str, indices: set[int]) -> dict[int, dict[str, Any]]:
    if not indices:
        return {}
    marks = ",".join("?" * len(indices))
    rows = conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_id = ? AND idx IN ({marks})",
        (session_id, *sorted(indices)),
    )
    return {r["idx"]: message_from_row(r) for r in rows}


def turns(conn: sqlite3.Connection, session_id: str, start: int, count: int) -> list[dict[str, Any]]:
    """Turns ``start`` .. ``start + count - 1`` in full: the observation, the prompt's last user
    message (what the model was shown), the reply, tool calls, LLM call and env step."""
    rows = conn.execute(
        """SELECT t.turn, t.episode, t.observation, t.tool_calls, t.decision_error,
                  t.decision_error_detail, t.prompt_messages, t.completion_message,
                  l.turn IS NOT NULL AS has_llm, l.model, l.finish_reason, l.usage, l.latency_ms,
                  l.attempts, l.error AS llm_error,
                  e.turn IS NOT NULL AS has_env_step, e.actions, e.reward, e.done,
                  e.truncated, e.step_idx, e.achievements_unlocked, e.env_ms """
        + TURNS_JOINED
        + " WHERE t.session_id = ? AND t.turn >= ? AND t.turn < ? ORDER BY t.turn",
        (session_id, start, start + min(count, MAX_TURN_CHUNK)),
    ).fetchall()
    prompts = {r["turn"]: _json(r["prompt_messages"]) or [] for r in rows}
    wanted: set[int] = set()
    last_user: dict[int, int] = {}
    for r in rows:
        ids = prompts[r["turn"]]
        if isinstance(ids, list) and ids:
            last_user[r["turn"]] = ids[-1]
            wanted.add(ids[-1])
        if r["completion_message"] is not None:
            wanted.add(r["completion_message"])
    messages = _messages(conn, session_id, wanted)
    out = []
    for r in rows:
        ids = prompts[r["turn"]]
        shown = messages.get(last_user.get(r["turn"], -1))
        out.append(
            {
                "turn": r["turn"],
                "episode": r["episode"],
                "observation": _json(r["observation"]),
                "prompt_last": shown,
                "prompt_messages": len(ids) if isinstance(ids, list) else 0,
                "reply": messages.get(r["completion_message"])
                if r["completion_message"] is not None
                else None,
                "tool_calls": _json(r["tool_calls"]) or [],
                "error": r["decision_error"],
                "error_detail": r["decision_error_detail"],
                "llm": None
                if not r["has_llm"]
                else {
                    "model": r["model"],
                    "finish_reason": r["finish_reason"],
                    "usage": _json(r["usage"]),
                    "latency_ms": r["latency_ms"],
                    "attempts": r["attempts"],
                    "error": r["llm_error"],
                },
                "env": _env_step(r),
            }
        )
    return out


def prompt(conn: sqlite3.Connection, session_id: str, turn: int) -> list[dict[str, Any]]:
    """Every message of the prompt of one turn, in order."""
    row = conn.execute(
        "SELECT prompt_messages FROM turns WHERE session_id = ? AND turn = ?", (session_id, turn)
    ).fetchone()
    if row is None:
        raise NotFound(f"rollout {session_id!r} has no turn {turn}", code="unknown_turn")
    ids = _json(row[0])
    if not isinstance(ids, list):
        return []
    messages = _messages(conn, session_id, set(ids))
    return [messages[i] for i in ids if i in messages]


def replay_steps(conn: sqlite3.Connection, session_id: str) -> list[dict[str, Any]]:
    """What a replay needs per turn: the recorded observation, tool calls and env outcome."""
    rows = conn.execute(
        """SELECT t.turn, t.observation, t.tool_calls,
                  e.turn IS NOT NULL AS has_env_step, e.reward, e.done, e.step_idx
           FROM turns t LEFT JOIN env_steps e ON e.session_id = t.session_id AND e.turn = t.turn
           WHERE t.session_id = ? ORDER BY t.turn""",
        (session_id,),
    )
    return [
        {
            "turn": r["turn"],
            "observation": _json(r["observation"]),
            "tool_calls": _json(r["tool_calls"]) or [],
            "env": None
            if not r["has_env_step"]
            else {"reward": r["reward"], "done": bool(r["done"]), "step_idx": r["step_idx"]},
        }
        for r in rows
    ]


def replay_prefix(conn: sqlite3.Connection, session_id: str) -> list[dict[str, Any]]:
    """A fork's continuation starts mid-episode from a copy of its parent: the `replay_steps` its
    parent played before the fork turn (after the parent's own prefix), which a replay plays first
    to reach that state. Empty for a rollout that is no continuation."""
    if "fork_turn" not in _columns(conn, "sessions"):
        return []
    row = conn.execute(
        "SELECT group_id, parent_index, fork_turn FROM sessions WHERE session_id = ?", (session_id,)
    ).fetchone()
    if row is None or row["parent_index"] is None:
        return []
    parent = conn.execute(
        "SELECT session_id FROM sessions WHERE group_id = ? AND group_index = ?",
        (row["group_id"], row["parent_index"]),
    ).fetchone()
    if parent is None:
        raise NotFound(
            f"rollout {session_id} continues member {row['parent_index']} of group {row['group_id']}, "
            "which is not in this trace DB",
            code="unknown_parent",
        )
    own = [s for s in replay_steps(conn, parent["session_id"]) if s["turn"] < row["fork_turn"]]
    return replay_prefix(conn, parent["session_id"]) + own


# ------------------------------------------------------------------------------------ groups


def group(conn: sqlite3.Connection, group_id: str) -> dict[str, Any]:
    """The members of a GRPO group side by side: returns, advantages and where they fork.

    The advantage is GRPO's: ``(R_i - mean(R)) / (std(R) + 1e-6)`` over the returns of the group's
    roots. Roots start from one state (a seed or a snapshot); ``fork_turn`` is the first turn at
    which their actions differ (before it, every root played the same moves). In a forking group
    (``tree``), a continuation starts at its ``fork_turn`` from a copy of its parent there; its
    advantage is its return from that turn minus the fork's value (the mean return from that turn
    over the parent and its continuations).
    """
    forked = "fork_turn" in _columns(conn, "sessions")
    tree_sql = "s.parent_index, s.fork_turn" if forked else "NULL AS parent_index, NULL AS fork_turn"
    rows = conn.execute(
        f"SELECT {LIST_COLUMNS}, {tree_sql}, {_weights_sql(conn)} AS weights_version FROM sessions s "
        "WHERE s.group_id = ? ORDER BY s.group_index, s.started_at",
        (group_id,),
    ).fetchall()
    if not rows:
        raise NotFound(f"no group {group_id!r} in this trace DB", code="unknown_group")
    members = [_run_row(r) for r in rows]
    for m in members:
        steps = conn.execute(
            "SELECT turn, actions, reward FROM env_steps WHERE session_id = ? ORDER BY turn",
            (m["session_id"],),
        ).fetchall()
        m["first_turn"] = m["fork_turn"] or 0
        m["actions"] = [r[1] for r in steps]
        m["rewards"] = [r[2] for r in steps]
        m["turn_rewards"] = {r[0]: r[2] for r in steps}
        first = conn.execute(
            "SELECT json_extract(observation, '$.step_idx') FROM turns WHERE session_id = ? "
            "ORDER BY turn LIMIT 1",
            (m["session_id"],),
        ).fetchone()
        m["start_step"] = first[0] if first else None
    roots = [m for m in members if m["parent_index"] is None]
    returns = [m["total_reward"] for m in roots]
    mean = statistics.fmean(returns)
    std = statistics.pstdev(returns) if len(returns) > 1 else 0.0
    for m in roots:
        m["advantage"] = (m["total_reward"] - mean) / (std + 1e-6)
        m["same_as_first_until"] = _common_prefix(m["actions"], roots[0]["actions"])
    forks = _forks(members)
    prefix = _common_prefix(*(m["actions"] for m in roots)) if len(roots) > 1 else None
    for m in members:
        del m["actions"], m["turn_rewards"]
    return {
        "group_id": group_id,
        "size": len(members),
        "mean_return": mean,
        "std_return": std,
        "fork_turn": prefix,
        "start_step": roots[0]["start_step"] if roots else None,
        "members": members,
        "tree": {"forks": forks} if forks else None,
    }


def _forks(members: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A forking group's forks: parent, turn, children and the value there (the mean return from
    that turn over the parent and its continuations); sets each continuation's advantage."""
    by_index = {m["group_index"]: m for m in members}
    found: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for m in members:
        if m["parent_index"] is not None:
            found.setdefault((m["parent_index"], m["fork_turn"]), []).append(m)
    forks = []
    for (parent_index, turn), children in sorted(found.items()):
        parent = by_index.get(parent_index)
        samples = [c["total_reward"] for c in children]
        if parent is not None:
            samples.append(sum(r for t, r in parent["turn_rewards"].items() if t >= turn))
        value = statistics.fmean(samples)
        for c in children:
            c["advantage"] = c["total_reward"] - value
        forks.append(
            {
                "parent_index": parent_index,
                "turn": turn,
                "children": [c["group_index"] for c in children],
                "value": value,
            }
        )
    return forks


def _common_prefix(*sequences: list[str]) -> int:
    """How many leading items all sequences share."""
    n = 0
    for items in zip(*sequences, strict=False):
        if any(item != items[0] for item in items):
            break
        n += 1
    return n
