"""A bounded pool of ScienceWorld simulators (one JVM each), shared by every SciWorld env.

A JVM costs seconds to start and hundreds of MB to keep, so an env does not own one. An env
is its history, (task, variation, gold path?, actions since the load); to act, it leases a
simulator and brings it to that history first:

- the simulator already stands there (the usual case while envs ≤ JVMs): nothing to do;
- it stands on an earlier point of the same history: replay the missing actions;
- otherwise: reset or load the task and replay the whole history (the cost of a miss,
  measured in docs/environments.md).

The lease prefers the idle simulator with the longest shared history, then the least
recently used one, and starts a new JVM only while fewer than ``size`` run. Waiting for a
simulator has a deadline (`EnvBusy`). Every call here blocks: the service makes them from
worker threads, never on its event loop.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from envs.errors import EnvBusy

log = logging.getLogger(__name__)

DEFAULT_JVMS = 2
DEFAULT_LEASE_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class Load:
    task_name: str
    variation: int
    gold: bool


@dataclass(slots=True)
class Simulator:
    """One ScienceWorld JVM and the history it currently stands at."""

    env: Any  # scienceworld.ScienceWorldEnv
    load: Load | None = None
    history: list[str] = field(default_factory=list)
    last_used: float = 0.0
    replayed_steps: int = 0
    loads: int = 0

    def step(self, action: str) -> str:
        observation = str(self.env.server.step(action))
        self.history.append(action)
        return observation

    def go_to(self, load: Load, history: list[str]) -> None:
        """Stand at ``history`` of ``load`` (reload or reset and replay as needed)."""
        shared = _shared_prefix(self.history, history) if self.load == load else -1
        if shared < len(self.history):  # diverged or another task: start over
            if self.load == load:
                self.env.server.reset()
            else:
                self.env.load(load.task_name, load.variation, "", generateGoldPath=load.gold)
                self.loads += 1
            self.load, self.history, shared = load, [], 0
        for action in history[shared:]:
            self.step(action)
            self.replayed_steps += 1

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.env.close()


def _shared_prefix(have: list[str], want: list[str]) -> int:
    """Length of the common prefix, or -1 when ``have`` is not a prefix of ``want``."""
    if len(have) > len(want) or want[: len(have)] != have:
        return -1
    return len(have)


class SimulatorPool:
    def __init__(self, size: int, lease_timeout_s: float) -> None:
        self.size = size
        self.lease_timeout_s = lease_timeout_s
        self._idle: list[Simulator] = []
        self._count = 0
        self._cond = threading.Condition()
        self.started = 0

    @contextlib.contextmanager
    def lease(self, load: Load, history: list[str]) -> Iterator[Simulator]:
        """A simulator standing at ``history`` of ``load``, exclusively, for the ``with`` block."""
        sim = self._acquire(load, history)
        try:
            sim.go_to(load, history)
            yield sim
        except BaseException:
            sim.load, sim.history = None, []  # state unknown after a failure: reload next time
            raise
        finally:
            sim.last_used = time.monotonic()
            with self._cond:
                self._idle.append(sim)
                self._cond.notify()

    def _acquire(self, load: Load, history: list[str]) -> Simulator:
        deadline = time.monotonic() + self.lease_timeout_s
        with self._cond:
            while True:
                if self._idle:
                    best = max(self._idle, key=lambda s: self._affinity(s, load, history))
                    if self._affinity(best, load, history)[0] >= 0 or self._count >= self.size:
                        self._idle.remove(best)
                        return best
                if self._count < self.size:
                    self._count += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EnvBusy(
                        f"all {self.size} ScienceWorld simulators stayed busy for "
                        f"{self.lease_timeout_s:.0f} s; retry later or raise SCIWORLD_JVMS"
                    )
                self._cond.wait(left)
        try:
            return self._start()
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    @staticmethod
    def _affinity(sim: Simulator, load: Load, history: list[str]) -> tuple[int, float]:
        shared = _shared_prefix(sim.history, history) if sim.load == load else -1
        return shared, sim.last_used

    def _start(self) -> Simulator:
        from scienceworld import ScienceWorldEnv

        started = time.monotonic()
        sim = Simulator(env=ScienceWorldEnv())
        self.started += 1
        log.info(
            "started ScienceWorld JVM %d/%d in %.1f s", self.started, self.size, time.monotonic() - started
        )
        return sim

    def close(self) -> None:
        with self._cond:
            idle, self._idle = self._idle, []
            self._count -= len(idle)
        for sim in idle:
            sim.close()


_pool: SimulatorPool | None = None
_pool_lock = threading.Lock()


def pool() -> SimulatorPool:
    """The process-wide pool (``SCIWORLD_JVMS`` simulators, ``SCIWORLD_LEASE_TIMEOUT_S`` wait)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = SimulatorPool(
                size=max(1, int(os.environ.get("SCIWORLD_JVMS", DEFAULT_JVMS))),
                lease_timeout_s=float(os.environ.get("SCIWORLD_LEASE_TIMEOUT_S", DEFAULT_LEASE_TIMEOUT_S)),
            )
            atexit.register(_pool.close)
        return _pool
