"""`CrafterEnv`: the "crafter" environment plug-in (Crafter 1.8.3, deterministic, render-free).

Seeding follows stock Crafter: episode k of seed s plays the world ``hash((s, k)) % (2**31 - 1)``,
so the first ``reset(seed=s)`` matches ``crafter.Env(seed=s).reset()``. Rewards, deaths and the
step cap are exactly Crafter's; frames are rendered only when ``config.image`` asks for them,
and the RNG is consumed as if they always were (see `envs.crafter.sim`).
"""

from __future__ import annotations

import base64
import importlib.metadata
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from pydantic import Field, ValidationError

from envs.base import Environment, EpisodeOutcome, Frame, PluginConfig, StepResult, register_environment
from envs.crafter import state
from envs.crafter.actions import ACHIEVEMENTS, ACTIONS, TOOL_SCHEMA, action_index, actions_from_tool_calls
from envs.crafter.observation import CrafterObservation, build_observation
from envs.crafter.sim import DeterministicCrafter
from envs.crafter.worlds import WorldCache, default_world_cache
from envs.errors import EpisodeOver, InvalidAction, InvalidConfig, InvalidState

CRAFTER_VERSION = importlib.metadata.version("crafter")
MAX_STEPS = 10_000
FRAME_SIZE = 144  # pixels per side of `render_frame`: 9 tiles at the textures' own 16 px (stock: 64)
_SEED_RANGE = (-(2**63), 2**63 - 1)


class CrafterConfig(PluginConfig):
    max_steps: int = Field(MAX_STEPS, ge=1, le=MAX_STEPS, description="Episode cap (Crafter's `length`).")
    image: bool = Field(False, description="Add the 64x64 frame as a base64 PNG (`image_png_base64`).")


def _check_seed(seed: Any) -> int:
    if seed is None:
        return 0
    if type(seed) is not int or not _SEED_RANGE[0] <= seed <= _SEED_RANGE[1]:
        raise InvalidConfig(f"seed must be a 64-bit integer, got {seed!r:.40}")
    return seed


def crafter_score(success_rates_percent: list[float]) -> float:
    """The Crafter paper's score (Hafner 2021): ``exp(mean_i ln(1 + s_i)) - 1`` over the
    per-achievement success rates ``s_i`` in percent."""
    if not success_rates_percent:
        return 0.0
    return math.exp(sum(math.log1p(s) for s in success_rates_percent) / len(success_rates_percent)) - 1


@register_environment
class CrafterEnv(Environment[CrafterConfig]):
    name = "crafter"
    version = "1"
    config_model = CrafterConfig
    description = "Crafter 1.8.3 (open-world survival/crafting, 22 achievements), deterministic."
    inline_step_max_actions = 8  # ~0.25 ms per action (tick)
    achievements = ACHIEVEMENTS
    observation_model = CrafterObservation
    action_forms = ACTIONS
    action_examples = ("move_left", "do", "place_table")

    @classmethod
    def action_schema(cls) -> dict[str, Any]:
        return {
            "type": "string",
            "enum": list(ACTIONS),
            "description": f"One Crafter action by name (or its index 0-{len(ACTIONS) - 1}); "
            "each advances the world one tick.",
            "examples": list(cls.action_examples),
        }

    @classmethod
    def eval_metrics(cls, episodes: Sequence[EpisodeOutcome]) -> dict[str, Any]:
        """Per-achievement success rates (percent) and the Crafter score."""
        n = len(episodes)
        unlocked = Counter(a for e in episodes for a in set(e.achievements))
        rates = {a: (100.0 * unlocked[a] / n if n else 0.0) for a in ACHIEVEMENTS}
        return {"success_rates": rates, "crafter_score": crafter_score(list(rates.values()))}

    def __init__(self, config: CrafterConfig, seed: int | None, *, world_cache: WorldCache | None = None):
        self.config = config
        self.seed = _check_seed(seed)
        self._cache = default_world_cache() if world_cache is None else world_cache
        self._sim: DeterministicCrafter | None = DeterministicCrafter.create(
            length=config.max_steps, seed=self.seed
        )
        self._started = False
        self._png: bytes | None = None
        self._png_b64: str | None = None

    # ---------------------------------------------------------------------------------------
    # Episode control

    def reset(self, seed: int | None = None) -> StepResult:
        sim = self._open_sim()
        if seed is not None:
            self.seed = sim._seed = _check_seed(seed)
            sim._episode = 0
        key = (sim.world_seed(sim._episode + 1), state.AREA)

        def generate() -> state.WorldState:
            sim.reset()
            return state.capture_world(sim)

        world, generated = self._cache.get_or_create(key, generate)
        if not generated:
            sim.reset_with(lambda target: state.install_world(target, world))
        self._started = True
        self._render()
        return self._result(0.0)

    def step(self, actions: Sequence[str | int]) -> StepResult:
        sim = self._running_sim()
        if isinstance(actions, (str, bytes)) or not isinstance(actions, Sequence):
            raise InvalidAction(f"actions must be a list of names or indices, got {type(actions).__name__}")
        indices = [action_index(action) for action in actions]
        if not indices:
            raise InvalidAction("no actions to execute")
        rewards: list[float] = []
        unlocked: list[str] = []
        for index in indices:
            reward, new = sim.tick(index)
            rewards.append(reward)
            unlocked.extend(new)
            if sim.over:
                break
        self._render()
        return self._result(
            sum(rewards),
            unlocked=unlocked,
            actions=[ACTIONS[i] for i in indices[: len(rewards)]],
            rewards=rewards,
        )

    def observe(self) -> StepResult:
        self._started_sim()
        return self._result(0.0)

    def actions_from_tool_calls(self, tool_calls: Sequence[dict[str, Any]]) -> list[str | int]:
        return list(actions_from_tool_calls(tool_calls))

    @classmethod
    def tools(cls) -> list[dict[str, Any]]:
        return [TOOL_SCHEMA]

    @property
    def step_idx(self) -> int:
        return int(self._sim._step) if self._started and self._sim is not None else 0

    @property
    def done(self) -> bool:
        return self._started and self._sim is not None and self._sim.over

    def render_frame(self) -> Frame:
        """The frame stock Crafter would show now, drawn at `FRAME_SIZE` pixels: the 9x7 tiles
        around the player and the inventory below, darkened at night with the last tick's noise."""
        return Frame(png=self._started_sim().render_png(FRAME_SIZE))

    def close(self) -> None:
        self._sim = None
        self._png = self._png_b64 = None

    # ---------------------------------------------------------------------------------------
    # Snapshots

    def get_state(self) -> bytes:
        sim = self._started_sim()
        return state.encode(
            sim, config=self.config.model_dump(), crafter_version=CRAFTER_VERSION, png=self._png
        )

    @classmethod
    def from_state(cls, data: bytes) -> CrafterEnv:
        snap = state.decode(data)
        if snap.crafter_version != CRAFTER_VERSION:
            raise InvalidState(
                f"invalid Crafter snapshot: taken with crafter {snap.crafter_version!r}, "
                f"this server runs {CRAFTER_VERSION}"
            )
        try:
            config = CrafterConfig.model_validate(snap.config)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "config"
            raise InvalidState(f"invalid Crafter snapshot: config.{where}: {first['msg']}") from None
        ep = snap.episode
        if ep.step > config.max_steps:
            raise InvalidState(
                f"invalid Crafter snapshot: step {ep.step} exceeds max_steps {config.max_steps}"
            )
        if config.image != (snap.png is not None):
            raise InvalidState("invalid Crafter snapshot: a frame must be present exactly when image is on")

        env = cls(config, ep.seed)
        sim = env._open_sim()
        state.install_world(sim, snap.world)
        sim._episode, sim._step, sim._last_health = ep.episode, ep.step, ep.last_health
        sim._unlocked = set(ep.unlocked)
        sim._update_time()
        if sim._world.daylight != snap.world.daylight:
            raise InvalidState(f"invalid Crafter snapshot: daylight does not match step {ep.step}")
        env._started = True
        env._set_frame(snap.png)
        return env

    def state_metadata(self) -> dict[str, Any]:
        sim = self._sim
        return {
            **super().state_metadata(),
            "crafter_version": CRAFTER_VERSION,
            "wrapper_version": self.version,
            "state_format": state.FORMAT_VERSION,
            "episode": int(sim._episode) if sim is not None else None,
            "step": self.step_idx,
            "config": self.config.model_dump(),
        }

    # ---------------------------------------------------------------------------------------

    def _open_sim(self) -> DeterministicCrafter:
        if self._sim is None:
            raise EpisodeOver("this environment is closed")
        return self._sim

    def _started_sim(self) -> DeterministicCrafter:
        sim = self._open_sim()
        if not self._started:
            raise EpisodeOver("no episode in progress: call reset() first")
        return sim

    def _running_sim(self) -> DeterministicCrafter:
        sim = self._started_sim()
        if sim.over:
            why = "the player died" if sim.dead else f"it reached max_steps={self.config.max_steps}"
            raise EpisodeOver(f"the episode is over ({why}) at step {sim._step}: call reset()")
        return sim

    def _render(self) -> None:
        if self.config.image:
            self._set_frame(self._open_sim().render_png())

    def _set_frame(self, png: bytes | None) -> None:
        self._png = png
        self._png_b64 = base64.b64encode(png).decode("ascii") if png is not None else None

    def _result(
        self,
        reward: float,
        *,
        unlocked: list[str] | None = None,
        actions: list[str] | None = None,
        rewards: list[float] | None = None,
    ) -> StepResult:
        sim = self._started_sim()
        observation = build_observation(sim)
        if self._png_b64 is not None:
            observation["image_png_base64"] = self._png_b64
        dead, done = sim.dead, sim.over
        info = {
            "achievements_unlocked": unlocked or [],
            "actions_executed": len(actions or ()),
            "actions": actions or [],
            "rewards": rewards or [],
            "dead": dead,
            "seed": self.seed,
            "episode": int(sim._episode),
        }
        return StepResult(
            observation=observation,
            reward=reward,
            done=done,
            truncated=done and not dead,
            info=info,
            step_idx=int(sim._step),
        )
