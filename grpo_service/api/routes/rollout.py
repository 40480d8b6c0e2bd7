"""`/rollout`, `/rollout/group` (and their start-then-poll forms), `/branch`, `/run/*`."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import Path, Response

from grpo_service.api.listing import PageDep, listed_run, paginate, run_progress, run_progress_fields
from grpo_service.api.routes import json_answer, service_router
from grpo_service.api.services import ServicesDep
from grpo_service.core.branching import branch as branch_envs
from grpo_service.core.registry import RunHandle
from grpo_service.errors import error_responses
from grpo_service.models import (
    BranchRequest,
    BranchResponse,
    RolloutGroupRequest,
    RolloutGroupResponse,
    RolloutRequest,
    RolloutResponse,
    RunAbortRequest,
    RunAbortResponse,
    RunList,
    RunMemberStatus,
    RunStarted,
    RunStatusResponse,
)
from grpo_service.rollout.coordinator import member_index

router = service_router("rollout")


# A start-then-poll route answers at once: 202 and where to poll.
STARTED: dict[str, Any] = {"response_model": RunStarted, "status_code": 202}


def _started(run: RunHandle) -> RunStarted:
    return RunStarted(run_id=run.id, status="running", status_url=f"/run/status/{run.id}")


@router.post(
    "/rollout", response_model=RolloutResponse, responses=error_responses(400, 404, 409, 413, 421, 422, 429)
)
async def rollout(req: RolloutRequest, services: ServicesDep) -> Response:
    """Run a coordinated rollout (``ops`` of ``agent``/``env``) and return its trajectories."""
    return json_answer(await services.coordinator.rollout(req))


@router.post("/rollout/start", **STARTED, responses=error_responses(400, 404, 409, 413, 421, 422, 429))
async def rollout_start(req: RolloutRequest, services: ServicesDep) -> RunStarted:
    """Start a rollout in the background; poll ``/run/status/{run_id}`` for its result."""
    return _started(services.coordinator.start_rollout(req))


@router.post(
    "/rollout/group",
    response_model=RolloutGroupResponse,
    responses=error_responses(400, 404, 409, 413, 422, 429),
)
async def rollout_group(req: RolloutGroupRequest, services: ServicesDep) -> Response:
    """G concurrent rollouts from one start state (a seed or a snapshot), for a GRPO group."""
    return json_answer(await services.coordinator.group(req))


@router.post("/rollout/group/start", **STARTED, responses=error_responses(400, 404, 409, 413, 422, 429))
async def rollout_group_start(req: RolloutGroupRequest, services: ServicesDep) -> RunStarted:
    """Start a group in the background; poll ``/run/status/{group_id}``."""
    return _started(services.coordinator.start_group(req))


@router.post(
    "/branch", response_model=BranchResponse, responses=error_responses(400, 404, 409, 413, 421, 422, 429)
)
async def branch(req: BranchRequest, services: ServicesDep) -> BranchResponse:
    """Fork live envs/policies into ``num_children`` exact copies each, with lineage."""
    return await branch_envs(req, services.envs, services.policies)


@router.post(
    "/run/abort", response_model=RunAbortResponse, responses=error_responses(400, 404, 413, 421, 422)
)
async def run_abort(req: RunAbortRequest, services: ServicesDep) -> RunAbortResponse:
    """Stop a running rollout or group promptly; partial trajectories are kept."""
    run = services.coordinator.abort(req.run_id)
    return RunAbortResponse(ok=True, run_id=run.id, status=run.status)


@router.get(
    "/run/status/{run_id}", response_model=RunStatusResponse, responses=error_responses(404, 421, 422)
)
async def run_status(
    run_id: Annotated[str, Path(description="A rollout's, group's or group member's run id.")],
    services: ServicesDep,
) -> Response:
    """Status, progress and timings of a run; the full result once it has finished."""
    run = services.registry.runs.get(run_id)
    members = run.member_runs
    ops, llm_s, env_s = run_progress(run, members)
    status = RunStatusResponse(
        **run_progress_fields(run, ops),
        timings={"llm_s": round(llm_s, 6), "env_s": round(env_s, 6)},
        error=run.error,
        members=None
        if run.kind != "group"
        else [
            RunMemberStatus(
                group_index=member_index(m.id),
                run_id=m.id,
                status=m.status,
                ops_executed=m.ops_executed,
                ops_total=m.ops_total,
            )
            for m in members
        ],
        result_evicted=run.result_evicted,
        members_total=None if run.kind != "group" else run.share_of or len(members),
    )
    # The result is kept as JSON: spliced in as it is, neither parsed nor serialized again.
    body = status.model_dump(mode="json") | {"result": orjson.Fragment(run.result or b"null")}
    return Response(orjson.dumps(body), media_type="application/json")


@router.get("/run/list", response_model=RunList, responses=error_responses(422))
async def run_list(page: PageDep, services: ServicesDep) -> RunList:
    """Running and recently finished rollouts and groups of this process (filter by ``rl_run_id``).
    A group's members are listed as runs of their own (``{group_id}.{index}``)."""

    listed = paginate(services.registry.runs, page, lambda r: r.rl_run_id, listed_run)
    return RunList(runs=listed.pop("items"), **listed)
