"""Paging for the listing routes (``GET /env/list``, ``/policy/list``, ``/run/list``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Query

from grpo_service.registry import Handle

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
