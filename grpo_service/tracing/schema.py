"""The trace DB schema: versioned migrations, applied in order, each in its own transaction.

A DB records the version it is at in ``schema_version`` (one row per applied migration).
Opening a DB applies whatever migrations it lacks, so old files keep opening; a DB newer than
this code is refused for writing (`SchemaTooNew`) rather than written in a shape it does not
know. Migrations only ever add: never rewrite or drop a shipped one, append a new one.

Tables (all JSON columns hold JSON text):

- ``sessions``: one row per rollout (run id, group id/index, env, seed, policy, model,
  sampling params, times, status/stop reason/error, outcome: return, achievements, counts; in a
  forking group, a continuation's ``parent_index`` and ``fork_turn``, its turns numbered on from
  there).
- ``turns``: one row per agent decision: episode, observation (images stripped), the
  canonical tool calls, the decision error, and which ``messages`` formed the prompt
  (``prompt_messages``: a JSON list of message indices) and the reply (``completion_message``).
- ``messages``: the distinct chat messages of a session (system/user/assistant/tool, with the
  assistant's tool calls). A message shown again in a later prompt is stored once.
- ``llm_calls``: per decision: request parameters (without the messages), the raw response,
  usage, latency, attempts, error, and the server's completion token ids and logprobs when
  recorded (its ``prompt_token_ids`` column only in rows written before schema version 6).
- ``prompt_token_ids``: per rollout, every call's prompt token ids as one record (a JSON object
  of turn → ids, zstd-compressed: ``codec`` says so); `TraceReader` puts them back on each call.
- ``rollout_records``: a rollout written but not yet derived: its detail as one compressed record
  (``codec``). Readers (`TraceReader`, the viewer, the exporters) derive the detail tables from it
  first (`tracing.derive`) and delete it; one that cannot be derived stays, ``error`` saying why.
  The `sessions` row and the prompt token ids are written at once.
- ``env_steps``: per executed decision: actions, reward, done/truncated, achievements unlocked.
- ``rewards``: per-step (``scope='step'``), per-episode and per-session outcome rewards.
- ``trace_writers``: one row per writer lifetime (server run) with its counters, including
  rollouts dropped because the queue was full; ``dropped_rollouts`` names them.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass

# Applied on every connection (reader or writer). WAL lets readers run during writes; with
# synchronous=NORMAL a commit survives a process crash (kill -9), only not a power loss.
CONNECTION_PRAGMAS: tuple[str, ...] = (
    "PRAGMA busy_timeout = 5000",
    "PRAGMA foreign_keys = ON",
    "PRAGMA synchronous = NORMAL",
)
WAL_PRAGMA = "PRAGMA journal_mode = WAL"
# A new DB's page size (before WAL_PRAGMA; an existing DB keeps its own). A turn's LLM call with
# its token ids is several KiB: at SQLite's default 4 KiB most calls spill into overflow-page
# chains, and inserting a rollout costs about a quarter more CPU than at 16 KiB.
PAGE_SIZE_PRAGMA = "PRAGMA page_size = 16384"


class SchemaTooNew(RuntimeError):
    """The DB was written by a newer version of this code."""


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]


_V1 = (
    """CREATE TABLE schema_version (
        version INTEGER PRIMARY KEY,
        applied_at REAL NOT NULL,
        description TEXT NOT NULL
    )""",
    """CREATE TABLE trace_writers (
        id INTEGER PRIMARY KEY,
        started_at REAL NOT NULL,
        closed_at REAL,
        pid INTEGER,
        hostname TEXT,
        service_version TEXT,
        schema_version INTEGER NOT NULL,
        submitted INTEGER NOT NULL DEFAULT 0,
        written INTEGER NOT NULL DEFAULT 0,
        dropped INTEGER NOT NULL DEFAULT 0,
        failed INTEGER NOT NULL DEFAULT 0
    )""",
    """CREATE TABLE dropped_rollouts (
        id INTEGER PRIMARY KEY,
        writer_id INTEGER REFERENCES trace_writers(id),
        run_id TEXT,
        reason TEXT NOT NULL,
        dropped_at REAL NOT NULL
    )""",
    """CREATE TABLE sessions (
        session_id TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        group_id TEXT,
        group_index INTEGER,
        rl_run_id TEXT,
        mode TEXT,
        env_name TEXT NOT NULL,
        env_config TEXT,
        seed INTEGER,
        policy_name TEXT NOT NULL,
        policy_config TEXT,
        model TEXT,
        sampling TEXT,
        started_at REAL NOT NULL,
        finished_at REAL NOT NULL,
        status TEXT NOT NULL,
        stop_reason TEXT NOT NULL,
        error TEXT,
        num_turns INTEGER NOT NULL,
        num_steps INTEGER NOT NULL,
        num_episodes INTEGER NOT NULL,
        total_reward REAL NOT NULL,
        mean_return REAL NOT NULL,
        achievements TEXT NOT NULL,
        achievements_count INTEGER NOT NULL,
        llm_calls INTEGER NOT NULL,
        prompt_tokens INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL,
        metrics TEXT,
        request TEXT,
        writer_id INTEGER REFERENCES trace_writers(id),
        recorded_at REAL NOT NULL
    )""",
    """CREATE TABLE turns (
        session_id TEXT NOT NULL REFERENCES sessions(session_id) ON DELETE CASCADE,
        turn INTEGER NOT NULL,
        episode INTEGER NOT NULL,
        observation TEXT,
        tool_calls TEXT NOT NULL,
        decision_error TEXT,
        decision_error_detail TEXT,
        prompt_messages TEXT,
        completion_message INTEGER,
        PRIMARY KEY (session_id, turn)
    )""",
    """CREATE TABLE messages (
        session_id TEXT NOT NULL REFERENCES sessions(session_id) ON DELETE CASCADE,
        idx INTEGER NOT NULL,
        turn INTEGER NOT NULL,
        source TEXT NOT NULL CHECK (source IN ('prompt', 'completion')),
        role TEXT NOT NULL,
        content TEXT,
        tool_calls TEXT,
        tool_call_id TEXT,
        name TEXT,
        extra TEXT,
        PRIMARY KEY (session_id, idx)
    )""",
    """CREATE TABLE llm_calls (
        session_id TEXT NOT NULL REFERENCES sessions(session_id) ON DELETE CASCADE,
        turn INTEGER NOT NULL,
        model TEXT,
        request TEXT,
        response TEXT,
        finish_reason TEXT,
        prompt_tokens INTEGER,
        completion_tokens INTEGER,
        total_tokens INTEGER,
        usage TEXT,
        latency_ms REAL NOT NULL,
        attempts INTEGER NOT NULL,
        error TEXT,
        prompt_token_ids TEXT,
        completion_token_ids TEXT,
        completion_logprobs TEXT,
        PRIMARY KEY (session_id, turn)
    )""",
    """CREATE TABLE env_steps (
        session_id TEXT NOT NULL REFERENCES sessions(session_id) ON DELETE CASCADE,
        turn INTEGER NOT NULL,
        episode INTEGER NOT NULL,
        actions TEXT NOT NULL,
        actions_executed INTEGER,
        reward REAL NOT NULL,
        done INTEGER NOT NULL,
        truncated INTEGER NOT NULL,
        step_idx INTEGER NOT NULL,
        achievements_unlocked TEXT,
        env_ms REAL NOT NULL,
        info TEXT,
        PRIMARY KEY (session_id, turn)
    )""",
    """CREATE TABLE rewards (
        id INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions(session_id) ON DELETE CASCADE,
        scope TEXT NOT NULL CHECK (scope IN ('step', 'episode', 'session')),
        turn INTEGER,
        episode INTEGER,
        kind TEXT NOT NULL,
        value REAL NOT NULL,
        annotation TEXT
    )""",
)

_V2 = (
    "CREATE INDEX idx_sessions_run ON sessions(run_id)",
    "CREATE INDEX idx_sessions_group ON sessions(group_id, group_index)",
    "CREATE INDEX idx_sessions_model ON sessions(model)",
    "CREATE INDEX idx_sessions_started ON sessions(started_at)",
    "CREATE INDEX idx_rewards_session ON rewards(session_id, scope, kind)",
    """CREATE VIEW session_summary AS
        SELECT s.session_id, s.run_id, s.group_id, s.group_index, s.env_name, s.seed, s.policy_name,
               s.model, s.status, s.stop_reason, s.num_turns, s.num_steps, s.total_reward,
               s.achievements_count, s.achievements, s.llm_calls, s.prompt_tokens,
               s.completion_tokens, s.finished_at - s.started_at AS wall_s,
               (SELECT COUNT(*) FROM turns t WHERE t.session_id = s.session_id
                   AND t.decision_error IS NULL AND t.completion_message IS NOT NULL) AS trainable_turns
        FROM sessions s""",
)

# vLLM's replies do not name the weights that made them: the version the policy was told is
# kept beside each call (before, only serve-model's replies carried it, inside `response`).
_V3 = ("ALTER TABLE llm_calls ADD COLUMN weights_version INTEGER",)

_V4 = (
    "ALTER TABLE sessions ADD COLUMN parent_index INTEGER",
    "ALTER TABLE sessions ADD COLUMN fork_turn INTEGER",
)

# A rollout played as token streams: each episode's streams (segments), as the response carries them.
_V5 = (
    """CREATE TABLE streams (
        session_id TEXT NOT NULL REFERENCES sessions(session_id) ON DELETE CASCADE,
        episode INTEGER NOT NULL,
        idx INTEGER NOT NULL,
        start_reason TEXT NOT NULL,
        end_reason TEXT NOT NULL,
        token_ids TEXT NOT NULL,
        sampled TEXT NOT NULL,
        logprobs TEXT NOT NULL,
        spans TEXT NOT NULL,
        PRIMARY KEY (session_id, episode, idx)
    )""",
)

# A rollout's prompt token ids as one compressed record (`codec.pack_token_ids`): row by row, as
# JSON text in `llm_calls.prompt_token_ids` (still read in older rows), they were about two thirds
# of a trace's bytes, though each prompt repeats most of the one before it.
_V6 = (
    """CREATE TABLE prompt_token_ids (
        session_id TEXT PRIMARY KEY REFERENCES sessions(session_id) ON DELETE CASCADE,
        codec TEXT NOT NULL,
        data BLOB NOT NULL
    )""",
)

# A rollout's detail as one compressed record (`record.record_of`), written in place of about eight
# rows per turn; `derive.derive_pending` turns it into the detail tables' rows when the DB is read
# and deletes it. A record that cannot be derived keeps its row, with the reason in `error`.
_V7 = (
    """CREATE TABLE rollout_records (
        session_id TEXT PRIMARY KEY REFERENCES sessions(session_id) ON DELETE CASCADE,
        codec TEXT NOT NULL,
        data BLOB NOT NULL,
        error TEXT
    )""",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "sessions, turns, messages, llm_calls, env_steps, rewards, writer bookkeeping", _V1),
    Migration(2, "indexes for export filters and the session_summary view", _V2),
    Migration(3, "llm_calls.weights_version: the weights that sampled each call", _V3),
    Migration(4, "sessions.parent_index and fork_turn: a forking group's tree", _V4),
    Migration(5, "streams: an episode's token streams (token-in/token-out rollouts)", _V5),
    Migration(6, "prompt_token_ids: a rollout's prompt token ids, one compressed record", _V6),
    Migration(7, "rollout_records: a rollout's detail, one compressed record until derived", _V7),
)
SCHEMA_VERSION = MIGRATIONS[-1].version

_VERSION_TABLE_EXISTS = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
_CURRENT_VERSION = "SELECT COALESCE(MAX(version), 0) FROM schema_version"
_RECORD = "INSERT INTO schema_version (version, applied_at, description) VALUES (?, ?, ?)"


def _pending(current: int, migrations: tuple[Migration, ...]) -> list[Migration]:
    latest = migrations[-1].version if migrations else 0
    if current > latest:
        raise SchemaTooNew(
            f"trace DB is at schema version {current}; this code knows up to {latest}. "
            "Upgrade grpo-service to write to it."
        )
    return [m for m in migrations if m.version > current]


def migrate_sync(conn: sqlite3.Connection, migrations: tuple[Migration, ...] = MIGRATIONS) -> int:
    """Bring a DB (opened with ``isolation_level=None``) up to date; return its version."""
    if not _pending(_version_sync(conn), migrations):
        return _version_sync(conn)  # up to date: no write lock taken
    for migration in migrations:
        conn.execute("BEGIN IMMEDIATE")  # re-read the version under the write lock
        try:
            current = _version_sync(conn)
            if migration not in _pending(current, migrations):
                conn.execute("ROLLBACK")
                continue
            for statement in migration.statements:
                conn.execute(statement)
            conn.execute(_RECORD, (migration.version, time.time(), migration.description))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return _version_sync(conn)


def _version_sync(conn: sqlite3.Connection) -> int:
    if conn.execute(_VERSION_TABLE_EXISTS).fetchone() is None:
        return 0
    return int(conn.execute(_CURRENT_VERSION).fetchone()[0])


def schema_version(conn: sqlite3.Connection) -> int:
    return _version_sync(conn)
