"""Deriving the detail tables of a trace DB from the rollout records its writers stored.

The trace writer stores each rollout as its `sessions` row, its prompt token ids and one
compressed record of its detail (`tracing.record`): the detail tables (`turns`, `messages`,
`llm_calls`, `env_steps`, `rewards`, `streams`) are filled from the records when the DB is read,
so a service spends its cores on rollouts rather than on rows nobody has read yet. Every reader
of this package derives first (`TraceReader`, the viewer, the exporters); `grpo-service traces
derive` does it ahead of time.

Records are derived in short transactions (`BATCH` rollouts each), so a service writing the same
DB waits at most one of them. A derived record is deleted: its rollout is then in the tables
exactly as it was written. A record that cannot be derived (corrupt, or a codec this version does
not read) is kept, with the reason in its ``error`` column, and skipped by later readers.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from grpo_service.tracing.record import unpack_record
from grpo_service.tracing.rows import DERIVED_TABLES, detail_rows, insert_sql
from grpo_service.tracing.schema import CONNECTION_PRAGMAS, SCHEMA_VERSION, schema_version

log = logging.getLogger(__name__)

BATCH = 16  # rollouts per transaction: about 0.1 s of a writer's wait at 30 turns each

_HAS_RECORDS = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'rollout_records'"
_PENDING = "SELECT session_id, codec, data FROM rollout_records WHERE error IS NULL LIMIT ?"
_ANY_PENDING = "SELECT 1 FROM rollout_records WHERE error IS NULL LIMIT 1"
_PENDING_ONE = "SELECT session_id, codec, data FROM rollout_records WHERE error IS NULL AND session_id = ?"


@dataclass(frozen=True)
class DeriveReport:
    derived: int = 0  # records turned into rows (and deleted)
    failed: int = 0  # records that could not be, now marked with their error
    kept: int = 0  # records marked with an error, left in the DB (this call's and earlier ones)


def derive_pending(
    conn: sqlite3.Connection,
    *,
    batch: int = BATCH,
    budget_s: float | None = None,
    first: str | None = None,
) -> DeriveReport:
    """Derive the pending records of ``conn`` (opened with ``isolation_level=None``): all of
    them, or those the batches begun within ``budget_s`` seconds reach (the rest stay pending);
    session ``first``'s before any other.

    Raises `sqlite3.OperationalError` when the DB cannot be written (read-only, or locked past
    the busy timeout); what was derived before stays derived.
    """
    if conn.execute(_HAS_RECORDS).fetchone() is None:  # a DB from before the records
        return DeriveReport()
    if schema_version(conn) > SCHEMA_VERSION:  # its records are for the newer code to derive
        return DeriveReport()
    if conn.execute(_ANY_PENDING).fetchone() is None:  # nothing to do: no write lock taken
        return DeriveReport(kept=_kept(conn))
    deadline = None if budget_s is None else time.monotonic() + budget_s
    derived = failed = 0
    if first is not None:
        derived, failed, _ = _derive_batch(conn, _PENDING_ONE, (first,))
    while True:
        done, bad, seen = _derive_batch(conn, _PENDING, (batch,))
        derived, failed = derived + done, failed + bad
        if seen < batch or (deadline is not None and time.monotonic() > deadline):
            break
    kept = _kept(conn)
    if failed:
        log.warning("%d rollout records could not be derived (%d kept in rollout_records)", failed, kept)
    return DeriveReport(derived, failed, kept)


def _kept(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT COUNT(*) FROM rollout_records WHERE error IS NOT NULL").fetchone()[0])


def _derive_batch(conn: sqlite3.Connection, query: str, params: tuple[object, ...]) -> tuple[int, int, int]:
    """The records ``query`` selects derived in one transaction: (derived, failed, selected)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        pending = conn.execute(query, params).fetchall()
        derived = sum(_derive_one(conn, *row) for row in pending)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return derived, len(pending) - derived, len(pending)


def _derive_one(conn: sqlite3.Connection, session_id: str, codec: str, data: bytes) -> bool:
    conn.execute("SAVEPOINT record")
    try:
        rows = detail_rows(unpack_record(codec, data), session_id)
        for table in DERIVED_TABLES:
            if rows.tables[table]:
                conn.executemany(insert_sql(table), rows.tables[table])
        conn.execute("DELETE FROM rollout_records WHERE session_id = ?", (session_id,))
    except (ValueError, TypeError, KeyError, IndexError, sqlite3.IntegrityError) as exc:
        conn.execute("ROLLBACK TO record")
        error = f"{type(exc).__name__}: {exc}"[:500]
        conn.execute("UPDATE rollout_records SET error = ? WHERE session_id = ?", (error, session_id))
        log.warning("cannot derive the rollout record of session %s: %s", session_id, error)
        return False
    finally:
        conn.execute("RELEASE record")
    return True


def derive_file(
    path: str | Path, *, budget_s: float | None = None, first: str | None = None
) -> DeriveReport | None:
    """`derive_pending` on a connection of its own; None (and a warning) when the file cannot be
    written now: a reader then reads the tables as they are."""
    if not Path(path).is_file():  # connecting would create it
        return None
    try:
        conn = sqlite3.connect(path, isolation_level=None)
    except sqlite3.Error as exc:
        log.warning("cannot open %s to derive its rollout records: %s", path, exc)
        return None
    try:
        for pragma in CONNECTION_PRAGMAS:
            conn.execute(pragma)
        return derive_pending(conn, budget_s=budget_s, first=first)
    except sqlite3.DatabaseError as exc:  # read-only, locked, or not a DB (its reader says so)
        log.warning("cannot derive the rollout records of %s now (%s); reading it as it is", path, exc)
        return None
    finally:
        conn.close()
