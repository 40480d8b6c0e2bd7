"""Frames for a recorded rollout, by replaying it through its (deterministic) environment.

Traces hold no images: a rollout's seed, env config and each turn's tool calls are enough to
play it again exactly as the service did (``create(config, seed)``, ``reset()``, then per turn
``step(actions_from_tool_calls(...))``, and ``reset()`` after an episode ends). The first
pass checks every recorded observation, reward and end flag against the replay and names the
first turn that differs; frames (`Environment.render_frame`) are drawn on demand afterwards.

A fork's continuation replays its parent's turns before the fork first (``prefix``), then its own.

Positions: position ``i`` is the state the policy saw at turn ``i``; one more position after
the last executed step shows the final state. A replay keeps a live env at its cursor and a
checkpoint (``get_state()``) every `CHECKPOINT_EVERY` positions, so stepping forward costs one
turn and a jump back costs at most that many.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from envs.base import Environment, Frame, StepResult, environment_class
from envs.errors import PluginError
from grpo_service.tracing.traces import IMAGE_KEYS

CHECKPOINT_EVERY = 16
VERIFY_BUDGET_S = 60.0


@dataclass
class Divergence:
    turn: int
    what: str  # "observation", "reward", "done", "step"
    fields: list[str]
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"turn": self.turn, "what": self.what, "fields": self.fields, "detail": self.detail}


@dataclass
class ReplayStatus:
    available: bool
    reason: str | None = None
    positions: int = 0
    checked: int = 0
    divergence: Divergence | None = None
    frame_png: bool = False
    frame_text: bool = False
    reachable: int = 0  # positions the replay can show (fewer if the env refused a step)
    replay_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "reason": self.reason,
            "positions": self.positions,
            "checked": self.checked,
            "divergence": self.divergence.to_dict() if self.divergence else None,
            "frame_png": self.frame_png,
            "frame_text": self.frame_text,
            "reachable": self.reachable,
            "replay_s": round(self.replay_s, 4),
        }


def _comparable(observation: Any) -> Any:
    """An observation as the trace stores it: no images, JSON types."""
    if isinstance(observation, dict):
        observation = {k: v for k, v in observation.items() if k not in IMAGE_KEYS}
    return json.loads(json.dumps(observation, default=str))


def _differing_fields(recorded: Any, replayed: Any) -> list[str]:
    if isinstance(recorded, dict) and isinstance(replayed, dict):
        keys = sorted(set(recorded) | set(replayed))
        return [k for k in keys if recorded.get(k) != replayed.get(k)]
    return ["observation"]


@dataclass
class Replay:
    """One rollout's replay: the verdict of the checking pass and frames on demand."""

    env_name: str
    env_config: dict[str, Any]
    seed: int | None
    steps: list[dict[str, Any]]  # `runs.replay_steps` rows
    prefix: list[dict[str, Any]] = field(default_factory=list)
    """A fork's continuation: its parent's turns before the fork (`runs.replay_prefix`), played
    first to reach the state it was copied from."""
    status: ReplayStatus = field(init=False)
    _env: Environment | None = field(default=None, init=False)
    _cursor: int = field(default=-1, init=False)
    _checkpoints: dict[int, bytes] = field(default_factory=dict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        executed = bool(self.steps) and self.steps[-1]["env"] is not None
        self.positions = len(self.steps) + (1 if executed else 0)
        self.status = ReplayStatus(available=False, positions=self.positions)

    # ------------------------------------------------------------------------- checking pass

    def verify(self, budget_s: float = VERIFY_BUDGET_S) -> ReplayStatus:
        """Replay every turn, comparing with the record; frames stay undrawn. Never raises."""
        started = time.monotonic()
        with self._lock:
            try:
                self._verify(started + budget_s)
            except PluginError as exc:
                self.status = ReplayStatus(
                    available=False,
                    reason=f"the environment refused the replay: {exc}",
                    positions=self.positions,
                )
            except Exception as exc:  # an env bug must not take the viewer down
                self.status = ReplayStatus(
                    available=False,
                    reason=f"the replay failed: {type(exc).__name__}: {exc}",
                    positions=self.positions,
                )
            self.status.replay_s = time.monotonic() - started
        return self.status

    def _verify(self, deadline: float) -> None:
        try:
            cls = environment_class(self.env_name)
        except PluginError:
            self.status.reason = f"this server has no environment {self.env_name!r} to replay it with"
            return
        if self.seed is None:
            self.status.reason = "the trace records no seed"
            return
        env, started = self._fresh(cls)
        first = env.render_frame()
        self.status.frame_png = first is not None and first.png is not None
        self.status.frame_text = first is not None and first.text is not None
        self.status.available = True
        observation = started.observation  # what the service's rollout saw first
        stepped = 0  # the env is now at position `stepped`
        for i, step in enumerate(self.steps):
            if time.monotonic() > deadline:
                self.status.reason = f"checked the first {i} turns within the {VERIFY_BUDGET_S:.0f} s budget"
                break
            self._checkpoint(i, env)
            recorded = step["observation"]
            if recorded is not None and self.status.divergence is None:
                replayed = _comparable(observation)
                if replayed != recorded:
                    fields = _differing_fields(recorded, replayed)
                    detail = (
                        "the first recorded observation is not the one a reset of this seed gives: the "
                        "rollout started from a snapshot or from an env that had already played"
                        if i == 0
                        else f"recorded and replayed observations differ in {', '.join(fields)}"
                    )
                    self.status.divergence = Divergence(i, "observation", fields, detail)
            self.status.checked = i + 1
            if step["env"] is None:
                if step.get("decision_error") and i + 1 < len(self.steps):
                    stepped = i + 1  # an invalid reply the policy answered: no env step, play went on
                    continue
                break
            try:
                result = self._step(env, step)
            except PluginError as exc:
                self.status.divergence = self.status.divergence or Divergence(
                    i, "step", [], f"the environment refused turn {i}'s actions on replay: {exc}"
                )
                break
            stepped = i + 1
            recorded_env = step["env"]
            if self.status.divergence is None:
                if abs(result.reward - recorded_env["reward"]) > 1e-6:
                    self.status.divergence = Divergence(
                        i,
                        "reward",
                        ["reward"],
                        f"recorded {recorded_env['reward']:g}, replayed {result.reward:g}",
                    )
                elif result.done != recorded_env["done"]:
                    self.status.divergence = Divergence(
                        i,
                        "done",
                        ["done"],
                        f"recorded done={recorded_env['done']}, replayed done={result.done}",
                    )
            observation = result.observation
            if result.done and i + 1 < len(self.steps):
                observation = env.reset().observation
        self.status.reachable = stepped + 1
        self._env, self._cursor = env, stepped

    # ------------------------------------------------------------------------- frames

    def frame(self, position: int) -> Frame | None:
        """The frame at ``position`` (0 .. positions-1), replaying from the nearest checkpoint."""
        if not 0 <= position < self.status.reachable:
            raise IndexError(position)
        with self._lock:
            env = self._env_at(position)
            return env.render_frame()

    def _env_at(self, position: int) -> Environment:
        cls = environment_class(self.env_name)
        if self._env is None or position < self._cursor:
            start = max((c for c in self._checkpoints if c < position), default=None)
            if self._env is not None:
                self._env.close()
            if start is None:
                self._env, self._cursor = self._fresh(cls)[0], 0
            else:
                self._env, self._cursor = cls.from_state(self._checkpoints[start]), start
        env = self._env
        while self._cursor < position:
            step = self.steps[self._cursor]
            if step["env"] is not None:  # an answered invalid turn took no env step
                result = self._step(env, step)
                if result.done and self._cursor + 1 < len(self.steps):
                    env.reset()
            self._cursor += 1
        return env

    # ------------------------------------------------------------------------- helpers

    def _fresh(self, cls: type[Environment]) -> tuple[Environment, StepResult]:
        env = cls.create(self.env_config, self.seed)
        result = env.reset(None)
        for step in self.prefix:
            if step["env"] is not None:  # an answered invalid turn took no env step
                result = self._step(env, step)
        return env, result

    @staticmethod
    def _step(env: Environment, step: dict[str, Any]) -> Any:
        return env.step(env.actions_from_tool_calls(step["tool_calls"]))

    def _checkpoint(self, position: int, env: Environment) -> None:
        if position % CHECKPOINT_EVERY or position in self._checkpoints or position == 0:
            return
        try:
            self._checkpoints[position] = env.get_state()
        except Exception:  # an env without snapshots replays from the start instead
            return

    def close(self) -> None:
        with self._lock:
            if self._env is not None:
                self._env.close()
                self._env = None


class ReplayCache:
    """The last few replays (each holds a live env and its checkpoints) and their drawn frames."""

    def __init__(self, max_replays: int = 8, max_frame_bytes: int = 64 << 20) -> None:
        self._replays: OrderedDict[tuple[str, str], Replay] = OrderedDict()
        self._frames: OrderedDict[tuple[str, str, int], Frame | None] = OrderedDict()
        self._frame_bytes = 0
        self.max_replays, self.max_frame_bytes = max_replays, max_frame_bytes
        self._lock = threading.Lock()
        self._building: dict[tuple[str, str], threading.Lock] = {}

    def replay(self, key: tuple[str, str], build: Any) -> Replay:
        """The verified replay for ``key`` (db, session); ``build()`` makes one when missing.
        Concurrent requests for the same rollout wait for one replay instead of running many."""
        with self._lock:
            found = self._replays.get(key)
            if found is not None:
                self._replays.move_to_end(key)
                return found
            gate = self._building.setdefault(key, threading.Lock())
        with gate:
            with self._lock:
                found = self._replays.get(key)
            if found is not None:
                return found
            try:
                replay: Replay = build()
                replay.verify()
            finally:
                with self._lock:
                    self._building.pop(key, None)
            with self._lock:
                self._replays[key] = replay
                while len(self._replays) > self.max_replays:
                    _, old = self._replays.popitem(last=False)
                    old.close()
            return replay

    def frame(self, key: tuple[str, str], replay: Replay, position: int) -> Frame | None:
        fkey = (*key, position)
        with self._lock:
            if fkey in self._frames:
                self._frames.move_to_end(fkey)
                return self._frames[fkey]
        frame = replay.frame(position)
        size = len(frame.png or b"") + len(frame.text or "") if frame else 0
        with self._lock:
            if fkey not in self._frames:
                self._frames[fkey] = frame
                self._frame_bytes += size
            while self._frame_bytes > self.max_frame_bytes and self._frames:
                _, old = self._frames.popitem(last=False)
                self._frame_bytes -= len(old.png or b"") + len(old.text or "") if old else 0
        return frame
