"""`RunBook`: the bookkeeping of runs (a rollout or a group): admission, registration, finishing
and abort. Runs live in the registry's ``runs`` table; finished ones are evicted oldest first.

A background run keeps its result for ``/run/status`` as JSON bytes (several times smaller than
the response objects, and answered without serializing again); the results kept are bounded in
bytes, and beyond the bound the oldest are dropped (the run stays listed, ``result_evicted``)."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_json

from grpo_service.core.registry import Hold, Registry, RunHandle
from grpo_service.errors import CapacityExceeded, Conflict, ServiceError
from grpo_service.models.encoding import answer_json


class RunBook:
    def __init__(self, registry: Registry, result_bytes: int) -> None:
        self.registry = registry
        self.result_bytes = result_bytes  # the most bytes of kept results
        self.kept_bytes = 0
        self._kept: OrderedDict[str, RunHandle] = OrderedDict()  # runs holding a result, oldest first

    def register(
        self, run_id: str, kind: str, ops_total: int, rl_run_id: str = "", hold: Hold | None = None
    ) -> RunHandle:
        self.admit([run_id], hold)
        return self.add(run_id, kind, ops_total, rl_run_id, hold)

    def admit(self, run_ids: list[str], hold: Hold | None = None) -> None:
        """Refuse (409/429) unless every one of ``run_ids`` can be registered now (in slots
        ``hold`` holds, or free ones). Registering them must follow with no ``await`` in between,
        so that admission is all-or-nothing."""
        for run_id in run_ids:
            existing = self.registry.runs.find(run_id)
            if existing is not None and not existing.finished:
                raise Conflict(f"run {run_id!r} is already running", code="run_exists")
        held = min(len(run_ids), hold.free) if hold is not None else 0
        if len(run_ids) - held > self.registry.run_slots.free():
            needed = f"{len(run_ids)} run slots" if len(run_ids) > 1 else "a run slot"
            raise CapacityExceeded(
                f"{self.registry.max_active_runs} runs at most may be active and {needed} are not "
                "free; retry later",
                headers={"Retry-After": "1"},
            )

    def add(
        self, run_id: str, kind: str, ops_total: int, rl_run_id: str = "", hold: Hold | None = None
    ) -> RunHandle:
        self._forget(self.registry.runs.pop(run_id))
        run = RunHandle(id=run_id, rl_run_id=rl_run_id, kind=kind, ops_total=ops_total)  # type: ignore[arg-type]
        if hold is not None and hold.take(run_id):
            run.hold = hold
        self._evict_finished()
        self.registry.runs.put_evicting(run_id, run)
        return run

    def _evict_finished(self) -> None:
        runs = self.registry.runs
        while len(runs) >= runs.capacity:
            oldest = next((r for r in runs if r.finished), None)
            if oldest is None:
                return
            self._forget(runs.pop(oldest.id))

    def finish(self, run: RunHandle, status: str, result: Any = None, error: str | None = None) -> None:
        run.status = status  # type: ignore[assignment]
        run.finished_at = time.time()
        run.error = error
        if run.hold is not None:  # its slot goes back to the request that held it
            run.hold.give_back(run.id)
        # Only background runs keep their result for /run/status: a blocking call has already
        # returned it.
        if result is not None and run.task is not None:
            self._keep(run, answer_json(result) if isinstance(result, BaseModel) else to_json(result))

    def fail(self, run: RunHandle, exc: BaseException, prefix: str = "") -> None:
        self.finish(run, "failed", error=prefix + error_message(exc))

    def _keep(self, run: RunHandle, body: bytes) -> None:
        """Keep ``run``'s result, dropping the oldest kept ones (this one too, if it alone is over
        the bound) until the kept results fit in ``result_bytes``."""
        self._forget(run)
        run.result, run.result_evicted = body, False
        self._kept[run.id] = run
        self.kept_bytes += len(body)
        while self.kept_bytes > self.result_bytes and self._kept:
            oldest = next(iter(self._kept.values()))
            self._forget(oldest)
            oldest.result_evicted = True

    def _forget(self, run: RunHandle | None) -> None:
        if run is not None and self._kept.pop(run.id, None) is not None:
            self.kept_bytes -= len(run.result)
            run.result = None

    def abort(self, run_id: str) -> RunHandle:
        run = self.registry.runs.get(run_id)
        run.abort.set()
        for member_id in run.member_ids:
            member = self.registry.runs.find(member_id)
            if member is not None:
                member.abort.set()
        return run


def error_message(exc: BaseException) -> str:
    return exc.message if isinstance(exc, ServiceError) else f"{type(exc).__name__}: {exc}"
