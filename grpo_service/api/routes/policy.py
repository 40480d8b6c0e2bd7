"""`/policy/*`: policy lifecycle."""

from __future__ import annotations

from envs.base import StepOptions
from grpo_service.api.listing import PageDep, paginate, policy_fields, policy_summary
from grpo_service.api.routes import service_router
from grpo_service.api.services import ServicesDep
from grpo_service.errors import Unprocessable, error_responses
from grpo_service.models import (
    PolicyCreateRequest,
    PolicyCreateResponse,
    PolicyList,
    PolicyRestoreRequest,
    PolicyRestoreResponse,
    PolicySnapshotRequest,
    PolicyStepRequest,
    PolicyStepResponse,
    PolicyTerminateRequest,
    SnapshotResponse,
    TerminateResponse,
)
from grpo_service.rollout import llm_record

router = service_router("policy", prefix="/policy")


@router.post(
    "/create", response_model=PolicyCreateResponse, responses=error_responses(400, 404, 413, 421, 422, 429)
)
async def create(req: PolicyCreateRequest, services: ServicesDep) -> PolicyCreateResponse:
    """Create a policy, optionally bound to an env (its observations become the default input)."""
    handle = await services.policies.create(
        req.policy_name, req.config, req.rl_run_id, req.bound_env_id, req.parent_policy_id
    )
    return PolicyCreateResponse(**policy_fields(handle))


@router.post(
    "/step", response_model=PolicyStepResponse, responses=error_responses(400, 404, 409, 413, 421, 422)
)
async def step(req: PolicyStepRequest, services: ServicesDep) -> PolicyStepResponse:
    """Decide on tool calls for an observation (``dry_run``: only build the inference request)."""
    handle = services.policies.get(req.policy_id)
    observation = req.observation
    if observation is None:
        if handle.bound_env_id is None:
            raise Unprocessable(
                "give 'observation', or bind the policy to an env", code="observation_required"
            )
        env = services.envs.get(handle.bound_env_id)
        if env.last is None:
            raise Unprocessable(f"env {env.id} has no observation yet", code="observation_required")
        observation = env.last.observation
    options = StepOptions(
        dry_run=req.dry_run,
        record_logprobs=req.record_logprobs,
        timeout_s=services.settings.inference_timeout_s,
    )
    decision = await services.policies.step(handle, observation, options)
    return PolicyStepResponse(
        tool_calls=decision.tool_calls,
        meta=decision.meta,
        error=decision.error,
        error_detail=decision.error_detail,
        llm=llm_record(decision.llm_call, req.record_logprobs),
    )


@router.post(
    "/snapshot", response_model=SnapshotResponse, responses=error_responses(400, 404, 409, 413, 421, 422)
)
async def snapshot(req: PolicySnapshotRequest, services: ServicesDep) -> SnapshotResponse:
    """Save the policy's state (config, history window, turn index)."""
    meta = await services.policies.snapshot(req.policy_id, req.rl_run_id)
    return SnapshotResponse.model_validate(meta, from_attributes=True)


@router.post(
    "/restore", response_model=PolicyRestoreResponse, responses=error_responses(400, 404, 413, 421, 422, 429)
)
async def restore(req: PolicyRestoreRequest, services: ServicesDep) -> PolicyRestoreResponse:
    """A new policy with the snapshot's state, optionally bound to ``bound_env_id``."""
    handle = await services.policies.restore(req.snapshot_id, req.rl_run_id, req.bound_env_id)
    return PolicyRestoreResponse(
        **policy_fields(handle), parent_snapshot_id=req.snapshot_id, parent_policy_id=handle.parent_policy_id
    )


@router.post("/terminate", response_model=TerminateResponse, responses=error_responses(400, 413, 422))
async def terminate(req: PolicyTerminateRequest, services: ServicesDep) -> TerminateResponse:
    """Release a policy. Idempotent."""
    return TerminateResponse(existed=await services.policies.terminate(req.policy_id))


@router.get("/list", response_model=PolicyList, responses=error_responses(422))
async def list_policies(page: PageDep, services: ServicesDep) -> PolicyList:
    """The live policies of this process, oldest first, a page at a time (filter by ``rl_run_id``)."""
    listed = paginate(services.registry.policies, page, lambda h: h.rl_run_id, policy_summary)
    return PolicyList(policies=listed.pop("items"), **listed)
