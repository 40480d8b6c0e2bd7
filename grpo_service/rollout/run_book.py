"""`RunBook`: the bookkeeping of runs (a rollout or a group): admission, registration, finishing
and abort. Runs live in the registry's ``runs`` table; finished ones are evicted oldest first."""

from __future__ import annotations

import time
from typing import Any

from grpo_service.core.registry import Registry, RunHandle
from grpo_service.errors import CapacityExceeded, Conflict, ServiceError


class RunBook:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def register(self, run_id: str, kind: str, ops_total: int, rl_run_id: str = "") -> RunHandle:
        self.admit([run_id])
        return self.add(run_id, kind, ops_total, rl_run_id)

    def admit(self, run_ids: list[str]) -> None:
        """Refuse (409/429) unless every one of ``run_ids`` can be registered now. Registering
        them must follow with no ``await`` in between, so that admission is all-or-nothing."""
        for run_id in run_ids:
            existing = self.registry.runs.find(run_id)
            if existing is not None and not existing.finished:
                raise Conflict(f"run {run_id!r} is already running", code="run_exists")
        if self.registry.active_runs() + len(run_ids) > self.registry.max_active_runs:
            needed = f"{len(run_ids)} run slots" if len(run_ids) > 1 else "a run slot"
            raise CapacityExceeded(
                f"{self.registry.max_active_runs} runs at most may be active and {needed} are not "
                "free; retry later",
                headers={"Retry-After": "1"},
            )

    def add(self, run_id: str, kind: str, ops_total: int, rl_run_id: str = "") -> RunHandle:
        self.registry.runs.pop(run_id)
        run = RunHandle(id=run_id, rl_run_id=rl_run_id, kind=kind, ops_total=ops_total)  # type: ignore[arg-type]
        self._evict_finished()
        self.registry.runs.put_evicting(run_id, run)
        return run

    def _evict_finished(self) -> None:
        runs = self.registry.runs
        while len(runs) >= runs.capacity:
            oldest = next((r for r in runs if r.finished), None)
            if oldest is None:
                return
            runs.pop(oldest.id)

    @staticmethod
    def finish(run: RunHandle, status: str, result: Any = None, error: str | None = None) -> None:
        run.status = status  # type: ignore[assignment]
        run.finished_at = time.time()
        # Only background runs keep their result for /run/status: a blocking call has already
        # returned it, and 2,000 kept results of long rollouts would hold about a GiB.
        run.result = result if run.task is not None else None
        run.error = error

    @classmethod
    def fail(cls, run: RunHandle, exc: BaseException, prefix: str = "") -> None:
        cls.finish(run, "failed", error=prefix + error_message(exc))

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
