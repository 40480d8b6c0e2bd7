"""`/env/*`: environment lifecycle."""

from __future__ import annotations

from typing import Any

from fastapi import Response

from grpo_service.api.fast_paths import FastRoute
from grpo_service.api.limits import strict_json
from grpo_service.api.listing import PageDep, env_summary, paginate
from grpo_service.api.routes import json_answer, service_router
from grpo_service.api.services import Services, ServicesDep
from grpo_service.core.registry import EnvHandle
from grpo_service.errors import error_responses
from grpo_service.models import (
    EnvCreateRequest,
    EnvCreateResponse,
    EnvList,
    EnvResetRequest,
    EnvResetResponse,
    EnvRestoreRequest,
    EnvRestoreResponse,
    EnvSnapshotRequest,
    EnvStepRequest,
    EnvStepResponse,
    EnvTerminateRequest,
    SnapshotResponse,
    TerminateResponse,
)

router = service_router("env", prefix="/env")


def env_state(handle: EnvHandle) -> dict[str, Any]:
    """The `EnvState` fields of a live env: its id and where its episode stands."""
    last = handle.last
    assert last is not None  # an env has an observation from its creation on
    return {
        "env_id": handle.id,
        "observation": last.observation,
        "info": last.info,
        "step_idx": last.step_idx,
        "done": last.done,
    }


@router.post("/create", response_model=EnvCreateResponse, responses=error_responses(400, 413, 422, 429))
async def create(req: EnvCreateRequest, services: ServicesDep) -> EnvCreateResponse:
    """Create an environment and start its first episode."""
    handle = await services.envs.create(req.env_name, req.config, req.seed, req.rl_run_id)
    handle.parent_env_id = req.parent_env_id
    return EnvCreateResponse(**env_state(handle))


@router.post(
    "/reset", response_model=EnvResetResponse, responses=error_responses(400, 404, 409, 413, 421, 422)
)
async def reset(req: EnvResetRequest, services: ServicesDep) -> EnvResetResponse:
    """Start a new episode (of ``seed`` if given, else the next episode of the env's seed)."""
    result = await services.envs.reset(req.env_id, req.seed)
    return EnvResetResponse(
        env_id=req.env_id, observation=result.observation, info=result.info, step_idx=result.step_idx
    )


@router.post("/step", response_model=EnvStepResponse, responses=error_responses(400, 404, 409, 413, 421, 422))
async def step(req: EnvStepRequest, services: ServicesDep) -> Response:
    """Execute one action, a list of actions, or the tool calls a policy emitted."""
    return await play_step(services, req)


async def play_step(services: Services, req: EnvStepRequest) -> Response:
    r = await services.envs.step(req.env_id, **req.step_args())
    answer = EnvStepResponse(
        env_id=req.env_id,
        observation=r.observation,
        reward=r.reward,
        done=r.done,
        truncated=r.truncated,
        info=r.info,
        step_idx=r.step_idx,
    )
    return json_answer(answer)


def fast_step(services: Services) -> FastRoute:
    """``POST /env/step`` ahead of FastAPI's routing (`FastPaths`): a client stepping an env over
    HTTP makes nearly all its calls here, and the routing, dependency solving and validation
    cost about as much as a Crafter step. A body that is not an `EnvStepRequest` goes on to the
    route (its 422)."""

    async def fast(body: bytes) -> Response | None:
        try:
            req = EnvStepRequest.model_validate(strict_json(body))
        except ValueError:
            return None
        return await play_step(services, req)

    return fast


@router.post(
    "/snapshot", response_model=SnapshotResponse, responses=error_responses(400, 404, 409, 413, 421, 422)
)
async def snapshot(req: EnvSnapshotRequest, services: ServicesDep) -> SnapshotResponse:
    """Save the env's full live state; restore it with the returned ``snapshot_id``."""
    meta = await services.envs.snapshot(req.env_id, req.rl_run_id)
    return SnapshotResponse.model_validate(meta, from_attributes=True)


@router.post(
    "/restore", response_model=EnvRestoreResponse, responses=error_responses(400, 404, 413, 422, 429)
)
async def restore(req: EnvRestoreRequest, services: ServicesDep) -> EnvRestoreResponse:
    """A new env that continues exactly where the snapshot was taken."""
    handle = await services.envs.restore(req.snapshot_id, req.rl_run_id)
    return EnvRestoreResponse(
        **env_state(handle), parent_snapshot_id=req.snapshot_id, parent_env_id=handle.parent_env_id
    )


@router.post("/terminate", response_model=TerminateResponse, responses=error_responses(400, 413, 422))
async def terminate(req: EnvTerminateRequest, services: ServicesDep) -> TerminateResponse:
    """Release an env. Idempotent: an unknown or already terminated id answers ``existed: false``."""
    return TerminateResponse(existed=await services.envs.terminate(req.env_id))


@router.get("/list", response_model=EnvList, responses=error_responses(422))
async def list_envs(page: PageDep, services: ServicesDep) -> EnvList:
    """The live envs of this process, oldest first, a page at a time (filter by ``rl_run_id``)."""
    listed = paginate(services.registry.envs, page, lambda h: h.rl_run_id, env_summary)
    return EnvList(envs=listed.pop("items"), **listed)
