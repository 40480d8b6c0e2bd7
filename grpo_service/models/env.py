"""``/env/*``: create, reset, step, snapshot, restore and terminate an environment."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from grpo_service.models.common import (
    DEFAULT_RUN,
    ENV_ID,
    ENV_SNAPSHOT_ID,
    Action,
    ConfigDict_,
    Id,
    Name,
    Request,
    RunId,
    RunOwner,
    Seed,
    request_config,
)


class EnvCreateRequest(Request):
    """Create an environment; its first episode starts at once."""

    model_config = request_config(
        {"env_name": "crafter", "config": {}, "seed": 42, "rl_run_id": "test-run-1"}
    )

    env_name: Name = Field(description="An environment plug-in from GET /info, e.g. `crafter`.")
    config: ConfigDict_
    seed: Seed | None = Field(default=None, description="World seed; 0 when omitted.")
    parent_env_id: Id | None = Field(default=None, description="Lineage only: recorded, not copied.")
    rl_run_id: RunOwner = DEFAULT_RUN


class EnvState(BaseModel):
    env_id: str = Field(description="The env's id.")
    observation: dict[str, Any] = Field(description="What the env shows now (Crafter: `text` and fields).")
    info: dict[str, Any] | None = Field(default=None, description="Env-specific extra information.")
    step_idx: int = Field(description="Steps taken in the current episode.")
    done: bool = Field(default=False, description="The episode has ended.")


class EnvCreateResponse(EnvState):
    pass


class EnvResetRequest(Request):
    """Start a new episode."""

    model_config = request_config({"env_id": ENV_ID, "seed": 7})

    env_id: Id = Field(description="The env to reset.")
    seed: Seed | None = Field(default=None, description="The new episode's world seed (default: the env's).")


class EnvResetResponse(EnvState):
    pass


class EnvAction(Request):
    """What one step executes: exactly one of ``action``, ``actions`` or ``tool_calls``."""

    model_config = request_config(
        {"actions": ["move_left", "do"]},
        {"action": "do"},
        {"tool_calls": [{"tool": "interact_many", "args": {"actions": ["move_up", "do"]}}]},
    )

    action: Action | None = Field(default=None, description="One action, by name or index.")
    actions: list[Action] | None = Field(
        default=None, min_length=1, max_length=64, description="Actions run in order (stops at episode end)."
    )
    tool_calls: list[dict[str, Any]] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        description="A policy's tool calls, as /policy/step returns.",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> EnvAction:
        given = [n for n in ("action", "actions", "tool_calls") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of 'action', 'actions' or 'tool_calls'")
        return self

    def step_args(self) -> dict[str, Any]:
        """The keyword arguments of `EnvManager.step` that execute it."""
        if self.tool_calls is not None:
            return {"tool_calls": self.tool_calls}
        return {"actions": self.actions if self.actions is not None else [self.action]}


class EnvStepRequest(EnvAction):
    """Give exactly one of ``action``, ``actions`` or ``tool_calls``."""

    model_config = request_config(
        {"env_id": ENV_ID, "actions": ["move_left", "do"]},
        {"env_id": ENV_ID, "action": "do"},
        {
            "env_id": ENV_ID,
            "tool_calls": [{"tool": "interact_many", "args": {"actions": ["move_up", "do"]}}],
        },
    )

    env_id: Id = Field(description="The env to step.")


class EnvStepResponse(BaseModel):
    env_id: str = Field(description="The env that was stepped.")
    observation: dict[str, Any] = Field(description="What the env shows after the step.")
    reward: float = Field(description="Reward of this step (all its actions).")
    done: bool = Field(description="The episode has ended (death, or the step cap).")
    truncated: bool = Field(description="It ended at the step cap rather than by the game.")
    info: dict[str, Any] = Field(description="e.g. `achievements_unlocked`, `actions`, `actions_executed`.")
    step_idx: int = Field(description="Steps taken in the episode.")


class SnapshotRequest(Request):
    rl_run_id: RunId | None = Field(default=None, description="Defaults to the instance's rl_run_id.")


class EnvSnapshotRequest(SnapshotRequest):
    """Save an env's full live state as a signed tarball."""

    model_config = request_config({"env_id": ENV_ID})

    env_id: Id = Field(description="The env to save.")


class SnapshotResponse(BaseModel):
    snapshot_id: str = Field(description="Pass it to /env/restore or /policy/restore (or /rollout).")
    kind: Literal["env", "policy"] = Field(description="What was saved.")
    path: str = Field(description="Where the tarball is in the snapshot store.")
    rl_run_id: str = Field(description="The owner it was filed under.")
    size: int = Field(description="Bytes.")
    created_at: float = Field(description="Unix time.")
    parent_snapshot_id: str | None = Field(default=None, description="The snapshot it descends from.")


class RestoreRequest(Request):
    snapshot_id: Id = Field(description="The snapshot to restore (its kind must match the route's).")
    rl_run_id: RunId | None = Field(default=None, description="Optional: where to look first.")


class EnvRestoreRequest(RestoreRequest):
    """A new env that continues exactly where the snapshot was taken."""

    model_config = request_config({"snapshot_id": ENV_SNAPSHOT_ID})


class EnvRestoreResponse(EnvState):
    parent_snapshot_id: str = Field(description="The snapshot it was restored from.")
    parent_env_id: str | None = Field(default=None, description="The env that snapshot was taken of.")


class EnvTerminateRequest(Request):
    """Release an env. Idempotent."""

    model_config = request_config({"env_id": ENV_ID})

    env_id: Id = Field(description="The env to release.")


class TerminateResponse(BaseModel):
    ok: bool = Field(default=True, description="Always true: terminating is idempotent.")
    existed: bool = Field(description="It was live (false: already gone).")
