"""`TraceWriter`: appends every finished rollout to a SQLite trace DB without ever making a
rollout wait on disk.

Design (see docs/workflow.md, "Tracing"):

- A rollout is written as three rows: its ``sessions`` row, its prompt token ids and its detail
  as one compressed record (`tracing.record`); readers derive the detail tables from the record
  (`tracing.derive`), so the serving process never encodes or inserts them.
- ``submit(trace)`` is synchronous and O(1): ``put_nowait`` on a bounded ``asyncio.Queue``.
- One writer task takes everything queued at that moment (up to ``max_batch`` rollouts) and
  hands it to the writer's own thread, which owns the only write connection (the standard
  library's sqlite3): it encodes the batch, writes it with ``executemany`` in one transaction
  and commits, one hand-off per batch. Group commit: a finished rollout is durable within one
  batch time (milliseconds) and batches grow by themselves under load. The thread runs the
  encoding off the event loop, and SQLite releases the GIL while it writes.
- WAL mode with ``synchronous=NORMAL``: a committed batch survives ``kill -9``; readers use
  their own connections and never block the writer.
- Queue full: the rollout is **not** written; it is counted (``stats()["dropped"]``, the
  ``trace_writers.dropped`` column), its run id is recorded in ``dropped_rollouts`` by the
  next batch, and a warning is logged. The alternative, waiting for room, would stall the
  event loop that serves every other rollout; an unbounded queue would trade the drop for an
  out-of-memory kill that loses everything queued.
- A batch that fails is retried one rollout per transaction, so one bad trace costs only
  itself (counted as ``failed``, also named in ``dropped_rollouts``).
- ``close()`` drains the queue, records the counters and closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sqlite3
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from grpo_service.tracing.rows import TABLE_COLUMNS, TraceRows, insert_sql, written_rows
from grpo_service.tracing.schema import (
    CONNECTION_PRAGMAS,
    PAGE_SIZE_PRAGMA,
    SCHEMA_VERSION,
    WAL_PRAGMA,
    migrate_sync,
)
from grpo_service.tracing.traces import RolloutTrace
from grpo_service.version import __version__

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_STOP = object()
_MAX_PENDING_DROPS = 10_000  # run ids kept for `dropped_rollouts` (the counter itself is exact)


@dataclass(frozen=True)
class EncodedTrace:
    """A finished rollout already encoded as its rows, where it ran (a Ray host): the writer only
    inserts them, and the rows (a few tuples, the detail one compressed record) cross processes
    far cheaper than the trace."""

    run_id: str | None
    rows: TraceRows


def encode_trace(trace: RolloutTrace, writer_id: int | None, recorded_at: float) -> EncodedTrace:
    """``trace`` as the rows of a new session written by ``writer_id``."""
    return EncodedTrace(trace.response.run_id, written_rows(trace, uuid.uuid4().hex, writer_id, recorded_at))


def run_id_of(item: RolloutTrace | EncodedTrace) -> str | None:
    return item.run_id if isinstance(item, EncodedTrace) else item.response.run_id


class TraceWriter:
    """A `TraceSink` that appends rollouts to a SQLite file. ``await start()`` before use."""

    def __init__(
        self,
        path: str | Path,
        *,
        queue_size: int = 1_000,
        max_batch: int = 64,
        close_timeout_s: float = 30.0,
    ) -> None:
        if queue_size < 1 or max_batch < 1:
            raise ValueError("queue_size and max_batch must be at least 1")
        self.path = Path(path)
        self.queue_size = queue_size
        self.max_batch = max_batch
        self.close_timeout_s = close_timeout_s
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=queue_size)
        # The writer's thread and its connection: the connection is used on that thread only.
        self._thread: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.writer_id: int | None = None
        self._pending_drops: deque[tuple[str | None, str, float]] = deque(maxlen=_MAX_PENDING_DROPS)
        self._counts = {"submitted": 0, "written": 0, "dropped": 0, "failed": 0, "batches": 0, "rows": 0}
        self._max_batch_seen = 0
        self._write_s = 0.0
        self._cpu_s = 0.0  # the writer's thread, encoding and writing

    # ------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._thread is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        thread = ThreadPoolExecutor(1, thread_name_prefix="trace-writer")
        try:
            self._thread = thread
            self.writer_id = await self._on_thread(self._open)
        except BaseException:
            self._thread = None
            thread.shutdown(wait=False)
            raise
        self._task = asyncio.create_task(self._run(), name="trace-writer")
        log.info("tracing rollouts to %s (writer %s)", self.path, self.writer_id)

    def _open(self) -> int:
        """On the writer's thread: the connection, the schema, this writer's row (its id)."""
        conn = sqlite3.connect(self.path, isolation_level=None)
        try:
            conn.execute(PAGE_SIZE_PRAGMA)
            conn.execute(WAL_PRAGMA)
            for pragma in CONNECTION_PRAGMAS:
                conn.execute(pragma)
            migrate_sync(conn)
            cursor = conn.execute(
                "INSERT INTO trace_writers (started_at, pid, hostname, service_version, schema_version) "
                "VALUES (?, ?, ?, ?, ?)",
                (time.time(), os.getpid(), socket.gethostname(), __version__, SCHEMA_VERSION),
            )
            writer_id = cursor.lastrowid
            assert writer_id is not None
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return writer_id

    async def _on_thread(self, fn: Callable[..., _T], *args: Any) -> _T:
        assert self._thread is not None
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def close(self) -> None:
        """Write everything queued, record the counters, close the connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        task = self._task
        if task is not None and not task.done():
            try:
                async with asyncio.timeout(self.close_timeout_s):
                    await self._queue.put(_STOP)
                    await asyncio.shield(task)
            except TimeoutError:
                log.error("trace writer did not drain within %.0fs", self.close_timeout_s)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._drop_queued("close_timeout" if task is not None else "writer_not_started")
        if self._thread is not None:
            try:
                await self._on_thread(self._close_sync, list(self._pending_drops), dict(self._counts))
                self._pending_drops.clear()
            finally:
                self._thread.shutdown(wait=False)
        c = self._counts
        log.info(
            "trace writer closed: %d written, %d dropped, %d failed (%s)",
            c["written"],
            c["dropped"],
            c["failed"],
            self.path,
        )

    async def flush(self) -> None:
        """Wait until every rollout submitted so far is written (or dropped, or failed)."""
        task = self._task
        if self._closed or task is None or task.done():
            return
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._queue.put(written)
        await asyncio.wait({written, task}, return_when=asyncio.FIRST_COMPLETED)

    # --------------------------------------------------------------------------------- submit

    def submit(self, trace: RolloutTrace | EncodedTrace) -> None:
        """Queue a finished rollout; never blocks. A full (or closed) queue drops and counts it."""
        self._counts["submitted"] += 1
        if self._closed:
            self._drop(trace, "writer_closed")
            return
        try:
            self._queue.put_nowait(trace)
        except asyncio.QueueFull:
            self._drop(trace, "queue_full")

    def _drop_queued(self, reason: str) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            if isinstance(item, asyncio.Future):
                item.cancel()
            elif item is not _STOP:
                self._drop(item, reason)

    def _drop(self, trace: RolloutTrace | EncodedTrace, reason: str) -> None:
        self._counts["dropped"] += 1
        self._pending_drops.append((run_id_of(trace), reason, time.time()))
        dropped = self._counts["dropped"]
        if dropped == 1 or dropped % 100 == 0:
            log.warning(
                "trace writer dropped rollout %s (%s); %d dropped so far (queue size %d)",
                run_id_of(trace),
                reason,
                dropped,
                self.queue_size,
            )

    def stats(self) -> dict[str, Any]:
        c = self._counts
        return {
            "path": str(self.path),
            "writer_id": self.writer_id,
            **c,
            "queued": self._queue.qsize(),
            "queue_size": self.queue_size,
            "max_batch_seen": self._max_batch_seen,
            "write_s": round(self._write_s, 6),
            "cpu_s": round(self._cpu_s, 6),
        }

    # --------------------------------------------------------------------------------- writer

    async def _run(self) -> None:
        stopping = False
        while not stopping:
            batch: list[RolloutTrace | EncodedTrace] = []
            flushes: list[asyncio.Future[None]] = []
            item = await self._queue.get()
            while True:
                if item is _STOP:
                    stopping = True
                elif isinstance(item, asyncio.Future):  # `flush`: answered once the batch is written
                    flushes.append(item)
                else:
                    batch.append(item)
                if stopping or flushes or len(batch) >= self.max_batch:
                    break
                try:
                    item = self._queue.get_nowait()
                except asyncio.QueueEmpty:
                    break
            if batch or self._pending_drops:
                try:
                    await self._write_batch(batch)
                except Exception:  # the writer must outlive any one failure
                    log.exception("trace writer: batch of %d rollouts failed", len(batch))
            for flushed in flushes:
                if not flushed.done():
                    flushed.set_result(None)

    async def _write_batch(self, batch: list[RolloutTrace | EncodedTrace]) -> None:
        started = time.monotonic()
        self._max_batch_seen = max(self._max_batch_seen, len(batch))
        drops = list(self._pending_drops)
        written = await self._on_thread(self._write_sync, batch, drops, dict(self._counts), time.time())
        c = self._counts
        c["written"] += written.rollouts
        c["batches"] += written.transactions
        c["rows"] += written.rows
        self._cpu_s += written.cpu_s
        if written.drops:
            for _ in drops:
                self._pending_drops.popleft()
        for trace, exc in written.failures:
            self._fail(trace, exc)
        self._write_s += time.monotonic() - started

    def _fail(self, trace: RolloutTrace | EncodedTrace, exc: BaseException | None) -> None:
        self._counts["failed"] += 1
        reason = f"write_error: {type(exc).__name__}: {exc}"[:500] if exc else "write_error"
        self._pending_drops.append((run_id_of(trace), reason, time.time()))

    # ------------------------------------------------------------------- on the writer's thread

    def _write_sync(
        self,
        batch: list[RolloutTrace | EncodedTrace],
        drops: list[tuple[str | None, str, float]],
        counts: dict[str, int],
        now: float,
    ) -> _Written:
        """Encode ``batch`` and write it in one transaction with ``drops`` and the counters; a
        batch that fails is written one rollout per transaction. Counts the thread's CPU time."""
        started = time.thread_time()
        out = _Written()
        built: list[tuple[RolloutTrace | EncodedTrace, TraceRows]] = []
        for trace in batch:
            if isinstance(trace, EncodedTrace):
                built.append((trace, trace.rows))
                continue
            try:
                built.append((trace, encode_trace(trace, self.writer_id, now).rows))
            except Exception as exc:
                log.exception("trace writer: cannot encode rollout %s", trace.response.run_id)
                out.failures.append((trace, exc))
        merged = TraceRows()
        for _, rows in built:
            merged.extend(rows)
        try:
            self._transaction(merged, len(built), drops, counts, out)
        except Exception as exc:
            if len(built) <= 1:
                log.exception("trace writer: cannot write %s", run_id_of(built[0][0]) if built else "")
                out.failures.extend((trace, exc) for trace, _ in built)
            else:
                log.warning("trace writer: batch failed (%s), writing its rollouts one by one", exc)
                for trace, rows in built:
                    try:
                        self._transaction(rows, 1, [] if out.drops else drops, counts, out)
                    except Exception as one_exc:
                        log.exception("trace writer: cannot write rollout %s", run_id_of(trace))
                        out.failures.append((trace, one_exc))
        out.cpu_s = time.thread_time() - started
        return out

    def _transaction(
        self,
        rows: TraceRows,
        rollouts: int,
        drops: list[tuple[str | None, str, float]],
        counts: dict[str, int],
        out: _Written,
    ) -> None:
        conn = self._conn
        assert conn is not None
        conn.execute("BEGIN IMMEDIATE")
        try:
            for table in TABLE_COLUMNS:  # parents first
                if rows.tables[table]:
                    conn.executemany(insert_sql(table), rows.tables[table])
            written = counts["written"] + out.rollouts + rollouts
            self._write_bookkeeping(conn, drops, {**counts, "written": written}, closed_at=None)
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(Exception):
                conn.execute("ROLLBACK")
            raise
        out.rollouts += rollouts
        out.transactions += 1
        out.rows += rows.count()
        out.drops = out.drops or bool(drops)

    def _close_sync(self, drops: list[tuple[str | None, str, float]], counts: dict[str, int]) -> None:
        """The counters (and what was dropped since the last batch) recorded, the connection closed."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
            self._write_bookkeeping(conn, drops, counts, closed_at=time.time())
            conn.execute("COMMIT")
        except Exception:
            log.exception("trace writer: cannot record its counters in %s", self.path)
            with contextlib.suppress(Exception):
                conn.execute("ROLLBACK")
        finally:
            conn.close()

    def _write_bookkeeping(
        self,
        conn: sqlite3.Connection,
        drops: list[tuple[str | None, str, float]],
        counts: dict[str, int],
        closed_at: float | None,
    ) -> None:
        """Counters (and run ids of dropped rollouts) into the DB, inside the caller's transaction."""
        if drops:
            conn.executemany(
                "INSERT INTO dropped_rollouts (writer_id, run_id, reason, dropped_at) VALUES (?, ?, ?, ?)",
                [(self.writer_id, run_id, reason, at) for run_id, reason, at in drops],
            )
        conn.execute(
            "UPDATE trace_writers SET submitted = ?, written = ?, dropped = ?, failed = ?, closed_at = ? "
            "WHERE id = ?",
            (
                counts["submitted"],
                counts["written"],
                counts["dropped"],
                counts["failed"],
                closed_at,
                self.writer_id,
            ),
        )


@dataclass
class _Written:
    """What one `TraceWriter._write_sync` did: counted on the event loop when it returns."""

    rollouts: int = 0
    transactions: int = 0
    rows: int = 0
    drops: bool = False  # the pending drops it was handed are in the DB
    cpu_s: float = 0.0  # the writer thread's CPU time for it
    failures: list[tuple[RolloutTrace | EncodedTrace, Exception]] = field(default_factory=list)
