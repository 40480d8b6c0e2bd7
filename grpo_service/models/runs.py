"""``/run/*``: abort a run and read its status."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from grpo_service.models.common import RUN_ID, Id, Request, RunStatus, request_config
from grpo_service.models.group import RolloutGroupResponse
from grpo_service.models.rollout import RolloutResponse


class RunAbortRequest(Request):
    """Stop a running rollout or group now; partial trajectories are kept."""

    model_config = request_config({"run_id": RUN_ID})

    run_id: Id = Field(description="A rollout's or a group's id.")


class RunAbortResponse(BaseModel):
    ok: bool = Field(description="The abort was signalled.")
    run_id: str = Field(description="The run.")
    status: str = Field(description="Its status at the time (it stops promptly after).")


class RunMemberStatus(BaseModel):
    group_index: int = Field(description="The member's index in the group.")
    run_id: str = Field(description="The member's own run id (`{group_id}.{index}`).")
    status: RunStatus = Field(description="Where it stands.")
    ops_executed: int = Field(description="Ops the member has done.")
    ops_total: int = Field(description="Ops the member was asked for.")


class RunProgress(BaseModel):
    """Where a run stands: what /run/status and /run/list both show."""

    run_id: str = Field(description="The id for /run/status/{run_id} and /run/abort.")
    kind: Literal["rollout", "group"] = Field(description="A single rollout or a GRPO group.")
    status: RunStatus = Field(description="Where it stands.")
    started_at: float = Field(description="Unix time it started.")
    finished_at: float | None = Field(description="Unix time it finished; null while running.")
    ops_executed: int = Field(description="Ops done so far (a group: summed over its members).")
    ops_total: int = Field(description="Ops requested (a group: summed over its members).")


class RunStatusResponse(RunProgress):
    timings: dict[str, float] = Field(description="`llm_s`, `env_s` so far (a group: summed).")
    error: str | None = Field(default=None, description="Why it failed, if it did.")
    members: list[RunMemberStatus] | None = Field(
        default=None, description="A group's members and their progress (null for a single rollout)."
    )
    result: RolloutResponse | RolloutGroupResponse | None = Field(
        default=None, description="The full result once finished (start-then-poll)."
    )
    result_evicted: bool = Field(
        default=False,
        description="The result was dropped (oldest first) to keep the finished results this server "
        "holds within MAX_FINISHED_RESULT_BYTES; with tracing on, its rollouts are in the trace DB.",
    )
