"""Listing live objects: paging for ``GET /env/list``, ``/policy/list``, ``/run/list``, and the
summary of each env, policy and run that those routes (and a cluster's hosts) show."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Query

from grpo_service.core.registry import EnvHandle, Handle, PolicyHandle, RunHandle
from grpo_service.models import EnvSummary, PolicySummary, RunSummary

T = TypeVar("T")

MAX_PAGE = 1_000


@dataclass(frozen=True)
class Page:
    limit: int
    offset: int
    rl_run_id: str | None


def page_params(
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Entries per page.")] = 100,
    offset: Annotated[int, Query(ge=0, description="Entries to skip (the previous `next_offset`).")] = 0,
    rl_run_id: Annotated[
        str | None, Query(max_length=128, description="Only entries owned by this `rl_run_id`.")
    ] = None,
) -> Page:
    return Page(limit=limit, offset=offset, rl_run_id=rl_run_id)


PageDep = Annotated[Page, Depends(page_params)]


def paginate(items: Iterable[T], page: Page, owner: Callable[[T], str], summary: Callable[[T], Any]) -> dict:
    """The page's summaries and paging fields, of the items owned by ``page.rl_run_id`` (all if None)."""
    matching = [i for i in items if page.rl_run_id is None or owner(i) == page.rl_run_id]
    chunk = matching[page.offset : page.offset + page.limit]
    end = page.offset + len(chunk)
    return {
        "items": [summary(i) for i in chunk],
        "total": len(matching),
        "offset": page.offset,
        "limit": page.limit,
        "next_offset": end if end < len(matching) else None,
    }


def live_object_fields(handle: Handle) -> dict[str, Any]:
    """The `LiveObjectSummary` fields of an env or policy handle."""
    return {
        "rl_run_id": handle.rl_run_id,
        "created_at": handle.created_at,
        "age_s": round(time.time() - handle.created_at, 3),
        "idle_s": round(time.monotonic() - handle.last_used, 3),
        "in_use": handle.busy,
    }


def env_summary(handle: EnvHandle) -> EnvSummary:
    last = handle.last
    return EnvSummary(
        env_id=handle.id,
        env_name=handle.env_name,
        step_idx=last.step_idx if last else None,
        done=bool(last and last.done),
        parent_env_id=handle.parent_env_id,
        **live_object_fields(handle),
    )


def policy_fields(handle: PolicyHandle) -> dict[str, Any]:
    """What every policy response shows of a live policy."""
    return {"policy_id": handle.id, "policy_name": handle.policy_name, "bound_env_id": handle.bound_env_id}


def policy_summary(handle: PolicyHandle) -> PolicySummary:
    return PolicySummary(**policy_fields(handle), **live_object_fields(handle))


def run_progress(run: RunHandle, members: list[RunHandle]) -> tuple[int, float, float]:
    """Ops done and LLM/env seconds: a running group's are its members' sums."""
    if run.kind == "group" and not run.finished:
        return (
            sum(m.ops_executed for m in members),
            sum(m.llm_s for m in members),
            sum(m.env_s for m in members),
        )
    return run.ops_executed, run.llm_s, run.env_s


def run_progress_fields(run: RunHandle, ops_executed: int) -> dict[str, Any]:
    """The `RunProgress` fields of a run."""
    return {
        "run_id": run.id,
        "kind": run.kind,
        "status": run.status,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "ops_executed": ops_executed,
        "ops_total": run.ops_total,
    }


def run_summary(run: RunHandle, ops_executed: int) -> RunSummary:
    return RunSummary(
        **run_progress_fields(run, ops_executed),
        rl_run_id=run.rl_run_id,
        age_s=round(time.time() - run.started_at, 3),
    )


def listed_run(run: RunHandle) -> RunSummary:
    """A run as ``/run/list`` shows it (a running group's progress: its members' sums)."""
    return run_summary(run, run_progress(run, run.member_runs)[0])
