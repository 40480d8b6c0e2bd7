"""``/env/list``, ``/policy/list``, ``/run/list``: one page of live objects or runs."""

from __future__ import annotations

from pydantic import BaseModel, Field

from grpo_service.models.runs import RunProgress


class PageInfo(BaseModel):
    total: int = Field(description="Entries matching the filter in this process.")
    offset: int = Field(description="Index of the first entry of this page.")
    limit: int = Field(description="Largest page size asked for.")
    next_offset: int | None = Field(description="`offset` of the next page; null on the last page.")


class LiveObjectSummary(BaseModel):
    """What every listed env and policy shows: its owner, age and use."""

    rl_run_id: str = Field(description="The owner: the `rl_run_id` given at creation.")
    created_at: float = Field(description="Unix time of creation.")
    age_s: float = Field(description="Seconds since creation.")
    idle_s: float = Field(description="Seconds since last use; idle objects are reaped after IDLE_TTL_S.")
    in_use: bool = Field(description="A running rollout or request is using it.")


class EnvSummary(LiveObjectSummary):
    env_id: str = Field(description="The id to pass to /env/step, /env/snapshot, ...")
    env_name: str = Field(description="The environment plug-in, e.g. `crafter`.")
    step_idx: int | None = Field(description="Steps taken in the current episode.")
    done: bool = Field(description="The current episode has ended (reset it to play on).")
    parent_env_id: str | None = Field(default=None, description="The env it was branched from.")


class EnvList(PageInfo):
    envs: list[EnvSummary] = Field(description="Oldest first.")


class PolicySummary(LiveObjectSummary):
    policy_id: str = Field(description="The id to pass to /policy/step, /rollout, ...")
    policy_name: str = Field(description="The policy plug-in, e.g. `crafter-react`.")
    bound_env_id: str | None = Field(description="The env whose observations it reads by default.")


class PolicyList(PageInfo):
    policies: list[PolicySummary] = Field(description="Oldest first.")


class RunSummary(RunProgress):
    rl_run_id: str = Field(description="The owner: the request's `rl_run_id`.")
    age_s: float = Field(description="Seconds since it started.")


class RunList(PageInfo):
    runs: list[RunSummary] = Field(description="Oldest first; finished runs are kept for a while.")
