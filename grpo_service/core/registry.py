"""In-memory registries of live envs, policies, runs and snapshot metadata.

One small generic `Table` (capacity, idle expiry, lookup) serves all four, so a later change
can shard or persist them behind the same interface. Handles carry an `asyncio.Lock`: every
operation on one env or policy is serialized, while different ones run concurrently.

A request admitted for work it will do later (a group's members, a fork tree's continuations, a
batch's rollouts) holds the slots it needs (`Registry.claim`): what it registers takes a held
slot, what it removes gives the slot back to it, so that nothing it was admitted for can be
refused for want of room while it runs; concurrent requests see those slots as taken.
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
# a Ray cluster finds the host of an id by its tag (`grpo_service.cluster`), which gives each
# host its tag (`adopt_instance_id`).
INSTANCE_ENV_VAR = "GRPO_INSTANCE_ID"
INSTANCE_TAG = re.compile(r"^[0-9a-f]{8}$")
# An issued id, its instance tag captured; a group member's run id is its group's id + ".{index}".
TAGGED_ID_PATTERN = r"([0-9a-f]{8})-[0-9a-f]{32}(?:\.\d{1,6})?"
TAGGED_ID = re.compile(f"^{TAGGED_ID_PATTERN}$")


def _checked_tag(tag: str, what: str) -> str:
    if not INSTANCE_TAG.match(tag):
        raise ValueError(f"{what} must be 8 lowercase hex digits, got {tag!r}")
    return tag


def _instance_id() -> str:
    given = os.environ.get(INSTANCE_ENV_VAR)
    return secrets.token_hex(4) if given is None else _checked_tag(given, INSTANCE_ENV_VAR)


_instance = _instance_id()


def instance_id() -> str:
    """The tag of this process's ids: ``GRPO_INSTANCE_ID``, the one a Ray host was given, or random."""
    return _instance


def adopt_instance_id(tag: str) -> None:
    """Tag this process's ids with ``tag`` from now on: a Ray host takes its front's, before it
    builds its app (`grpo_service.cluster.host.Host`)."""
    global _instance
    _instance = _checked_tag(tag, "an instance tag")


def new_id() -> str:
    return uuid.uuid4().hex


def new_instance_id() -> str:
    """An id for a live object of this process: ``{instance}-{uuid hex}``."""
    return f"{_instance}-{uuid.uuid4().hex}"


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
    result: Any = None  # a background run's response, as JSON bytes, once finished
    result_evicted: bool = False  # its result was dropped to keep finished results within their budget
    error: str | None = None
    task: asyncio.Task[Any] | None = None
    member_ids: list[str] = field(default_factory=list)  # a group's member runs
    member_runs: list[RunHandle] = field(default_factory=list)
    claim: Claim | None = None  # the slots held for what it creates (a group's: shared by its members)
    hold: Hold | None = None  # the run slot it was registered under (a batch's rollouts)
    share_of: int = 0  # a share of a group spread over Ray hosts: the whole group's size
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


class Pool:
    """A capacity some of whose slots admitted requests hold (`Hold`) before they use them."""

    def __init__(self, what: str, capacity: int, setting: str) -> None:
        self.what, self.capacity, self.setting = what, capacity, setting
        self.held = 0

    def in_use(self) -> int:
        raise NotImplementedError

    def free(self) -> int:
        return self.capacity - self.in_use() - self.held


class Hold:
    """Slots of one pool held for an admitted request: each entry it registers takes one, each it
    removes gives it back (a batch's next rollout reuses it), and `release` returns the rest to
    the pool when the request ends."""

    def __init__(self, pool: Pool, count: int) -> None:
        self.pool, self.free = pool, count
        self.taken: set[str] = set()
        pool.held += count

    def take(self, key: str) -> bool:
        if self.free <= 0:
            return False
        self.free -= 1
        self.pool.held -= 1
        self.taken.add(key)
        return True

    def give_back(self, key: str) -> None:
        if key in self.taken:
            self.taken.discard(key)
            self.free += 1
            self.pool.held += 1

    def drop(self, count: int) -> None:
        """Return ``count`` slots the request will not use after all (at most its free ones)."""
        count = min(count, self.free)
        self.free -= count
        self.pool.held -= count

    def release(self) -> None:
        self.drop(self.free)
        self.taken.clear()  # what it registered and still holds goes back to the pool, not to it


@dataclass(eq=False)
class Claim:
    """The env, policy and run slots held for one admitted request (`Registry.claim`)."""

    envs: Hold
    policies: Hold
    runs: Hold

    def release(self) -> None:
        for hold in (self.envs, self.policies, self.runs):
            hold.release()


class Table(Pool, Generic[H]):
    """A bounded id → handle map. ``what`` names the entries in error messages."""

    def __init__(self, what: str, capacity: int, setting: str = ""):
        super().__init__(what, capacity, setting)
        self._items: OrderedDict[str, H] = OrderedDict()
        self._holds: dict[str, Hold] = {}  # entries registered under a hold

    def in_use(self) -> int:
        return len(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[H]:
        return iter(list(self._items.values()))

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def reserve(self, count: int = 1, hold: Hold | None = None) -> None:
        """Raise `CapacityExceeded` (429) if ``count`` more entries would not fit (those ``hold``
        holds for them fit)."""
        if hold is not None and hold.pool is self:
            count -= min(count, hold.free)
        if count and len(self._items) + self.held + count > self.capacity:
            raise CapacityExceeded(
                f"{self.what} capacity reached ({self.capacity} live or held); terminate some or retry later",
                headers={"Retry-After": "1"},
            )

    def add(self, key: str, item: H, hold: Hold | None = None) -> H:
        if hold is not None and hold.pool is self and hold.take(key):
            self._holds[key] = hold
        else:
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
        if tagged and tagged.group(1) != _instance:
            return WrongInstance(
                f"{self.what} {key} lives in another replica of this service (instance {tagged.group(1)}; "
                f"this is {_instance}). Live {self.what}s stay in the process that created them: use "
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
        hold = self._holds.pop(key, None)
        if hold is not None:
            hold.give_back(key)
        return self._items.pop(key, None)


class RunSlots(Pool):
    """The runs that may be active at once: running ones are in use, finished ones history."""

    def __init__(self, runs: Table[RunHandle], capacity: int) -> None:
        super().__init__("run", capacity, "MAX_ACTIVE_RUNS")
        self.runs = runs

    def in_use(self) -> int:
        return sum(1 for run in self.runs if not run.finished)


class Registry:
    """All live state of one service process."""

    def __init__(self, *, max_envs: int, max_policies: int, max_active_runs: int, max_finished_runs: int):
        self.envs: Table[EnvHandle] = Table("env", max_envs, "MAX_ENVS")
        self.policies: Table[PolicyHandle] = Table("policy", max_policies, "MAX_POLICIES")
        self.runs: Table[RunHandle] = Table("run", max_active_runs + max_finished_runs)
        self.run_slots = RunSlots(self.runs, max_active_runs)
        self.max_active_runs = max_active_runs
        self.snapshots: Table[SnapshotMeta] = Table("snapshot", 100_000)

    def active_runs(self) -> int:
        return self.run_slots.in_use()

    def claim(self, what: str, *, envs: int = 0, policies: int = 0, runs: int = 0) -> Claim:
        """Hold slots for ``what`` (a request being admitted), or refuse it (429) naming each
        capacity short of them. Synchronous: nothing else is admitted between check and hold."""
        wanted = ((self.envs, envs), (self.policies, policies), (self.run_slots, runs))
        short = [
            f"{n} {pool.what} slot{'s' * (n != 1)} "
            f"({max(0, pool.free())} of {pool.setting} {pool.capacity} are free)"
            for pool, n in wanted
            if n > pool.free()
        ]
        if short:
            raise CapacityExceeded(
                f"{what} needs {' and '.join(short)}; retry later", headers={"Retry-After": "1"}
            )
        return Claim(*(Hold(pool, n) for pool, n in wanted))

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
