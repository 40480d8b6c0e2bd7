"""`/rollout`, `/rollout/group` (and their start-then-poll forms), `/branch`, `/run/*`."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from grpo_service.auth import require_api_key
from grpo_service.branching import branch as branch_envs
from grpo_service.deps import ServicesDep
from grpo_service.limits import StrictJSONRoute
from grpo_service.models import (
    BranchRequest,
    BranchResponse,
    RolloutGroupRequest,
    RolloutGroupResponse,
    RolloutRequest,
    RolloutResponse,
    RunAbortRequest,
    RunAbortResponse,
    RunStarted,
    RunStatusResponse,
)
from grpo_service.registry import RunHandle

router = APIRouter(tags=["rollout"], dependencies=[Depends(require_api_key)], route_class=StrictJSONRoute)


def _started(run: RunHandle) -> RunStarted:
    return RunStarted(run_id=run.id, status="running", status_url=f"/run/status/{run.id}")


@router.post("/rollout", response_model=RolloutResponse)
async def rollout(req: RolloutRequest, services: ServicesDep) -> RolloutResponse:
    """Run a coordinated rollout (``ops`` of ``agent``/``env``) and return its trajectories."""
    return await services.coordinator.rollout(req)


@router.post("/rollout/start", response_model=RunStarted, status_code=202)
async def rollout_start(req: RolloutRequest, services: ServicesDep) -> RunStarted:
    """Start a rollout in the background; poll ``/run/status/{run_id}`` for its result."""
    return _started(services.coordinator.start_rollout(req))


@router.post("/rollout/group", response_model=RolloutGroupResponse)
async def rollout_group(req: RolloutGroupRequest, services: ServicesDep) -> RolloutGroupResponse:
    """G concurrent rollouts from one start state (a seed or a snapshot), for a GRPO group."""
    return await services.coordinator.group(req)


@router.post("/rollout/group/start", response_model=RunStarted, status_code=202)
async def rollout_group_start(req: RolloutGroupRequest, services: ServicesDep) -> RunStarted:
    """Start a group in the background; poll ``/run/status/{group_id}``."""
    return _started(services.coordinator.start_group(req))


@router.post("/branch", response_model=BranchResponse)
async def branch(req: BranchRequest, services: ServicesDep) -> BranchResponse:
    """Fork live envs/policies into ``num_children`` exact copies each, with lineage."""
    return await branch_envs(req, services.envs, services.policies)


@router.post("/run/abort", response_model=RunAbortResponse)
async def run_abort(req: RunAbortRequest, services: ServicesDep) -> RunAbortResponse:
    """Stop a running rollout or group promptly; partial trajectories are kept."""
    run = services.coordinator.abort(req.run_id)
    return RunAbortResponse(ok=True, run_id=run.id, status=run.status)


@router.get("/run/status/{run_id}", response_model=RunStatusResponse)
async def run_status(run_id: str, services: ServicesDep) -> RunStatusResponse:
    """Status, progress and timings of a run; the full result once it has finished."""
    run = services.registry.runs.get(run_id)
    return RunStatusResponse(
        run_id=run.id,
        kind=run.kind,
        status=run.status,
        started_at=run.started_at,
        finished_at=run.finished_at,
        ops_executed=run.ops_executed,
        ops_total=run.ops_total,
        timings={"llm_s": round(run.llm_s, 6), "env_s": round(run.env_s, 6)},
        error=run.error,
        result=run.result,
    )
