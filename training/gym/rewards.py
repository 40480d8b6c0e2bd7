"""Reward functions for gymnasium training, by name (``reward_function_type``).

A reward function scores a whole episode at once: ``fn(states, actions, next_states)`` with
``states``/``next_states`` ``[T, obs_dim]`` and ``actions`` ``[T]`` (numpy) returns ``[T]`` per-step
rewards; the episode's GRPO reward is their sum. ``"env"`` is the environment's own reward.
Register your own with `register_reward` (by name; optionally restricted to some env ids).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

RewardFn = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]

CARTPOLE = ("CartPole-v0", "CartPole-v1")


@dataclass(frozen=True)
class RewardFunction:
    name: str
    description: str
    fn: RewardFn | None
    """None: the environment's own reward."""
    env_ids: tuple[str, ...] | None = None
    """Environments it is defined for (None: any)."""

    def supports(self, env_id: str) -> bool:
        return self.env_ids is None or env_id in self.env_ids


REWARD_FUNCTIONS: dict[str, RewardFunction] = {}


def register_reward(
    name: str, fn: RewardFn | None, *, description: str = "", env_ids: tuple[str, ...] | None = None
) -> RewardFunction:
    """Make ``fn`` available as ``reward_function_type=name`` (replaces a previous one of that name)."""
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"reward function name {name!r}: letters, digits, '_' and '-' only")
    entry = RewardFunction(name, description or (fn.__doc__ or "").strip(), fn, env_ids)
    REWARD_FUNCTIONS[name] = entry
    return entry


def get_reward(name: str) -> RewardFunction:
    try:
        return REWARD_FUNCTIONS[name]
    except KeyError:
        known = ", ".join(sorted(REWARD_FUNCTIONS))
        raise KeyError(f"unknown reward function {name!r}; known: {known}") from None


def optimized_cartpole(states: np.ndarray, actions: np.ndarray, next_states: np.ndarray) -> np.ndarray:
    """Shaped CartPole reward: survival bonus 1.5 + 3 exp(-8 |angle|) + exp(-1.5 x^2), minus
    2 (|x| - 2) beyond |x| > 2, clipped to [0.1, 6] (sb3-grpo's "optimized" reward)."""
    x, angle = next_states[:, 0], next_states[:, 2]
    reward = 1.5 + 3.0 * np.exp(-8.0 * np.abs(angle)) + np.exp(-1.5 * x * x)
    reward -= np.where(np.abs(x) > 2.0, 2.0 * (np.abs(x) - 2.0), 0.0)
    return np.clip(reward, 0.1, 6.0)


def simple_cartpole(states: np.ndarray, actions: np.ndarray, next_states: np.ndarray) -> np.ndarray:
    """Angle-based CartPole reward: 1 - |angle| / 0.2095 (the termination angle), clipped to [0.1, 1]."""
    return np.clip(1.0 - np.abs(next_states[:, 2]) / 0.2095, 0.1, 1.0)


register_reward("env", None, description="The environment's own reward (CartPole: +1 per step).")
register_reward("optimized_cartpole", optimized_cartpole, env_ids=CARTPOLE)
register_reward("simple_cartpole", simple_cartpole, env_ids=CARTPOLE)
