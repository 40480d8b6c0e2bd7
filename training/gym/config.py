"""A gymnasium GRPO job's configuration: the job API's fields, what they mean here, and our additions.

The job API names PPO's knobs (as its users know them from PPO); episode-level GRPO maps them
as follows (docs/training.md):

- ``total_timesteps``: the budget of environment steps (training ends after the update that
  reaches it).
- ``n_steps``: episodes collected per update, as ``n_steps / group_size`` groups of
  ``group_size`` episodes that share one reset seed.
- ``batch_size``: episodes per minibatch; each minibatch is one Adam step over all their actions.
- ``n_epochs``: passes over one update's episodes (the importance ratio is clipped after the first).
- ``learning_rate``: Adam's step size.

Importing this module does not import torch: the service validates configs without it.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from training.gym.policy import MLPPolicy
from training.gym.rewards import REWARD_FUNCTIONS, get_reward

MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
"""A file name without directories: letters, digits, '_', '-', '.', not starting with '.'."""


@functools.lru_cache(maxsize=64)
def env_spaces(env_name: str) -> tuple[int, int]:
    """(observation size, number of actions) of a gymnasium env that GRPO here can train;
    ValueError naming what is wrong otherwise."""
    import gymnasium
    from gymnasium import spaces

    try:
        gymnasium.spec(env_name)
    except Exception:
        raise ValueError(f"unknown gymnasium environment {env_name!r}") from None
    try:
        env = gymnasium.make(env_name, disable_env_checker=True)
    except Exception as exc:
        raise ValueError(f"environment {env_name!r} cannot be created here: {exc}") from None
    try:
        obs, act = env.observation_space, env.action_space
    finally:
        env.close()
    if not isinstance(act, spaces.Discrete):
        raise ValueError(f"environment {env_name!r}: discrete actions only, it has {act}")
    if not isinstance(obs, spaces.Box) or len(obs.shape) != 1:
        raise ValueError(f"environment {env_name!r}: flat Box observations only, it has {obs}")
    return int(obs.shape[0]), int(act.n)


class GymTrainConfig(BaseModel):
    """Train an MLP policy on a gymnasium environment with episode-level GRPO."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,  # `"5"` or `true` for a number is a caller's mistake, not 5 or 1
        json_schema_extra={
            "examples": [
                {"env_name": "CartPole-v1", "total_timesteps": 5000, "model_name": "test_model"},
            ]
        },
    )

    type: Literal["gymnasium"] = Field(
        default="gymnasium",
        description="Job type: `gymnasium` trains an MLP policy on a gymnasium environment.",
    )
    env_name: str = Field(
        default="CartPole-v1",
        description="Gymnasium environment id (discrete actions, flat observations).",
        examples=["CartPole-v1"],
    )
    total_timesteps: int = Field(
        default=10_000,
        gt=0,
        le=100_000_000,
        description="Budget of environment steps; training ends after the update that reaches it.",
        examples=[200_000],
    )
    learning_rate: float = Field(default=3e-4, gt=0, le=1.0, description="Adam's step size.", examples=[3e-3])
    n_steps: int = Field(
        default=32,
        gt=0,
        le=1024,
        description="Episodes collected per update: n_steps / group_size groups, each of group_size "
        "episodes from one reset seed. A multiple of group_size.",
        examples=[32],
    )
    batch_size: int = Field(
        default=64,
        gt=0,
        le=65_536,
        description="Episodes per minibatch (one Adam step over all their actions). At least n_steps: "
        "one full-batch step per epoch.",
        examples=[64],
    )
    n_epochs: int = Field(default=10, gt=0, le=1000, description="Passes over each update's episodes.")
    reward_function_type: str = Field(
        default="optimized_cartpole",
        description="Reward function by name: `optimized_cartpole` (shaped: pole angle, cart centring, "
        "survival), `simple_cartpole` (angle only), `env` (the environment's reward), or one you registered.",
        examples=["optimized_cartpole"],
    )
    model_name: str | None = Field(
        default=None,
        pattern=MODEL_NAME_PATTERN,
        description="Saved as models/<model_name>.zip; generated from the job id when absent.",
        examples=["my_model"],
    )
    group_size: int = Field(
        default=8, ge=2, le=1024, description="G: episodes per group, all started from the same reset seed."
    )
    clip_range: float = Field(default=0.2, gt=0, le=10, description="PPO/GRPO ratio clip epsilon.")
    kl_coef: float = Field(
        default=0.0, ge=0, le=100, description="Weight of the KL penalty to the initial (reference) policy."
    )
    ent_coef: float = Field(
        default=0.0,
        ge=0,
        le=10,
        description="Entropy bonus: keeps the policy exploring, so that a group's episodes still differ.",
    )
    hidden_sizes: list[int] = Field(
        default=[64, 64],
        min_length=1,
        max_length=4,
        description="Hidden layer widths of the MLP (1 to 1024).",
    )
    value_head: bool = Field(
        default=False,
        description="Also fit a value head (discounted return-to-go of the training reward) so that "
        "/inference answers a `value`. GRPO itself needs no critic.",
    )
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seeds the weights, sampling and resets.")
    max_episode_steps: int | None = Field(
        default=None, gt=0, le=1_000_000, description="Truncate episodes here (default: the env's limit)."
    )
    target_return: float | None = Field(
        default=None,
        description="Stop early once the mean environment return of the last 20 episodes reaches this.",
        examples=[475.0],
    )
    max_wall_time_s: float | None = Field(
        default=None, gt=0, description="Stop after this many seconds (the service caps it)."
    )
    overwrite: bool = Field(default=False, description="Replace an existing model of the same name.")

    @field_validator("hidden_sizes")
    @classmethod
    def _widths(cls, v: list[int]) -> list[int]:
        if any(w < 1 or w > 1024 for w in v):
            raise ValueError("hidden layer widths must be between 1 and 1024")
        return v

    @field_validator("env_name")
    @classmethod
    def _env(cls, v: str) -> str:
        env_spaces(v)
        return v

    @field_validator("reward_function_type")
    @classmethod
    def _reward(cls, v: str) -> str:
        try:
            get_reward(v)
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
        return v

    @model_validator(mode="after")
    def _consistent(self) -> GymTrainConfig:
        if self.n_steps % self.group_size:
            raise ValueError(
                f"n_steps ({self.n_steps} episodes per update) must be a multiple of group_size "
                f"({self.group_size})"
            )
        reward = REWARD_FUNCTIONS[self.reward_function_type]
        if not reward.supports(self.env_name):
            raise ValueError(
                f"reward_function_type {reward.name!r} is defined for {', '.join(reward.env_ids or ())}, "
                f"not {self.env_name!r} (use 'env' for the environment's own reward)"
            )
        return self

    @property
    def groups_per_update(self) -> int:
        return self.n_steps // self.group_size


def policy_meta(config: GymTrainConfig) -> dict[str, Any]:
    return {
        "job_type": "gymnasium",
        "env_name": config.env_name,
        "reward_function_type": config.reward_function_type,
        "config": config.model_dump(mode="json"),
        "status": "training",
    }


def initial_policy(config: GymTrainConfig) -> MLPPolicy:
    obs_dim, n_actions = env_spaces(config.env_name)
    return MLPPolicy.initial(
        obs_dim, n_actions, config.hidden_sizes, config.value_head, config.seed, policy_meta(config)
    )


def write_initial_model(config: GymTrainConfig, models_dir: Path, model_name: str) -> None:
    """Save the job's initial policy before its process starts (numpy, milliseconds): the model
    answers /inference from the moment POST /train returns."""
    initial_policy(config).save(models_dir / f"{model_name}.zip")
