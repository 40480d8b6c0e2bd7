"""In-memory registries of live envs, policies, runs and snapshot metadata.

One small generic `Table` (capacity, idle expiry, lookup) serves all four, so a later change
can shard or persist them behind the same interface. Handles carry an `asyncio.Lock`: every
operation on one env or policy is serialized, while different ones run concurrently.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from envs.base import Environment, Policy, StepResult
from grpo_service.errors import CapacityExceeded, NotFound, WrongInstance
from grpo_service.models import RunStatus

# Every process tags the env, policy and run ids it issues with its instance, so that a request
# reaching another replica gets a clear 421 instead of a misleading 404, and so that the front of
# a Ray cluster finds the host of an id by its tag (`grpo_service.cluster`), which sets each
# host's tag (GRPO_INSTANCE_ID).
INSTANCE_ENV_VAR = "GRPO_INSTANCE_ID"
INSTANCE_TAG = re.compile(r"^[0-9a-f]{8}$")
# An issued id, its instance tag captured; a group member's run id is its group's id + ".{index}".
TAGGED_ID_PATTERN = r"([0-9a-f]{8})-[0-9a-f]{32}(?:\.\d{1,6})?"
TAGGED_ID = re.compile(f"^{TAGGED_ID_PATTERN}$")


def _instance_id() -> str:
    given = os.environ.get(INSTANCE_ENV_VAR)
    if given is None:
        return secrets.token_hex(4)
    if not INSTANCE_TAG.match(given):
        raise ValueError(f"{INSTANCE_ENV_VAR} must be 8 lowercase hex digits, got {given!r}")
    return given


INSTANCE_ID = _instance_id()


def new_id() -> str:
    return uuid.uuid4().hex


def new_instance_id() -> str:
    """An id for a live object of this process: ``{instance}-{uuid hex}``."""
    return f"{INSTANCE_ID}-{uuid.uuid4().hex}"


@dataclass(eq=False)
class Handle:
    id: str
    rl_run_id: str
    created_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Running rollouts using this handle: it is in use while they wait on the LLM, lock or not.
    pins: int = 0

    def touch(self) -> None:
        self.last_used = time.monotonic()

    @property
    def busy(self) -> bool:
        return self.lock.locked() or self.pins > 0


@dataclass(eq=False)
class PluginHandle(Handle):
    """A live env or policy: the snapshot it was restored from, and whether it was terminated."""

    parent_snapshot_id: str | None = None
    closed: bool = False


@dataclass(eq=False)
class EnvHandle(PluginHandle):
    env: Environment = None  # type: ignore[assignment]
    env_name: str = ""
    last: StepResult | None = None
    parent_env_id: str | None = None


@dataclass(eq=False)
class PolicyHandle(PluginHandle):
    policy: Policy = None  # type: ignore[assignment]
    policy_name: str = ""
    bound_env_id: str | None = None
    parent_policy_id: str | None = None


@dataclass(eq=False)
class RunHandle(Handle):
    kind: Literal["rollout", "group"] = "rollout"
    status: RunStatus = "running"
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    ops_executed: int = 0
    ops_total: int = 0
    llm_s: float = 0.0
    env_s: float = 0.0
    abort: asyncio.Event = field(default_factory=asyncio.Event)
    result: Any = None  # the response model once finished
    error: str | None = None
    task: asyncio.Task[Any] | None = None
    member_ids: list[str] = field(default_factory=list)  # a group's member runs
    member_runs: list[RunHandle] = field(default_factory=list)
    # Set by a stream of groups: called when an LLM call returns, the weights version to tag it
    # with (the stream's version then); None: the request's own ``weights_version``.
    weights_version: Callable[[], int | None] | None = None

    @property
    def finished(self) -> bool:
        return self.status != "running"


@dataclass(eq=False)
class SnapshotMeta:
    snapshot_id: str
    kind: Literal["env", "policy"]
    rl_run_id: str
    path: str
    size: int
    created_at: float
    source_id: str
    parent_snapshot_id: str | None = None


H = TypeVar("H")


class Table(Generic[H]):
    """A bounded id → handle map. ``what`` names the entries in error messages."""

    def __init__(self, what: str, capacity: int):
        self.what = what
        self.capacity = capacity
        self._items: OrderedDict[str, H] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[H]:
        return iter(list(self._items.values()))

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def reserve(self, count: int = 1) -> None:
        """Raise `CapacityExceeded` (429) if ``count`` more entries would not fit."""
        if len(self._items) + count > self.capacity:
            raise CapacityExceeded(
                f"{self.what} capacity reached ({self.capacity} live); terminate some or retry later",
                headers={"Retry-After": "1"},
            )

    def add(self, key: str, item: H) -> H:
        self.reserve()
        self._items[key] = item
        return item

    def put_evicting(self, key: str, item: H) -> H | None:
        """Add, evicting the oldest entry when full (for bounded history such as finished runs)."""
        evicted = None
        if key not in self._items and len(self._items) >= self.capacity:
            _, evicted = self._items.popitem(last=False)
        self._items[key] = item
        return evicted

    def get(self, key: str) -> H:
        try:
            item = self._items[key]
        except (KeyError, TypeError):
            raise self._missing(key) from None
        if isinstance(item, Handle):
            item.touch()
        return item

    def _missing(self, key: str) -> Exception:
        code = f"{self.what}_not_found"
        tagged = TAGGED_ID.match(key) if isinstance(key, str) else None
        if tagged and tagged.group(1) != INSTANCE_ID:
            return WrongInstance(
                f"{self.what} {key} lives in another replica of this service (instance {tagged.group(1)}; "
                f"this is {INSTANCE_ID}). Live {self.what}s stay in the process that created them: use "
                "sticky routing, restore from a snapshot here, or a one-shot /rollout",
                code="wrong_instance",
            )
        if tagged:
            return NotFound(
                f"unknown {self.what} {key}: terminated, or expired after the idle TTL", code=code
            )
        return NotFound(f"unknown {self.what} {key!r:.80}", code=code)

    def find(self, key: str) -> H | None:
        return self._items.get(key)

    def pop(self, key: str) -> H | None:
        return self._items.pop(key, None)


class Registry:
    """All live state of one service process."""

    def __init__(self, *, max_envs: int, max_policies: int, max_active_runs: int, max_finished_runs: int):
        self.envs: Table[EnvHandle] = Table("env", max_envs)
        self.policies: Table[PolicyHandle] = Table("policy", max_policies)
        self.runs: Table[RunHandle] = Table("run", max_active_runs + max_finished_runs)
        self.max_active_runs = max_active_runs
        self.snapshots: Table[SnapshotMeta] = Table("snapshot", 100_000)

    def active_runs(self) -> int:
        return sum(1 for run in self.runs if not run.finished)

    def idle(self, table: Table[Any], ttl_s: float, now: float | None = None) -> list[Any]:
        """Handles idle for longer than ``ttl_s`` and not in use."""
        now = time.monotonic() if now is None else now
        return [h for h in table if not h.busy and now - h.last_used > ttl_s]

    def counts(self) -> dict[str, int]:
        return {
            "envs": len(self.envs),
            "policies": len(self.policies),
            "runs_active": self.active_runs(),
            "snapshots": len(self.snapshots),
        }
