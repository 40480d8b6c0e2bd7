"""``POST /rollouts``: the batch API: LLM rollouts, one per task id (`grpo_service.rollout.batch`)."""

from __future__ import annotations

from fastapi import Response

from grpo_service.api.routes import json_answer, service_router
from grpo_service.api.services import ServicesDep
from grpo_service.errors import error_responses
from grpo_service.models import BatchRolloutsRequest, BatchRolloutsResponse
from grpo_service.rollout.batch import run_batch

router = service_router("rollout")


@router.post("/rollouts", response_model=BatchRolloutsResponse, responses=error_responses(400, 413, 422, 429))
async def rollouts(req: BatchRolloutsRequest, services: ServicesDep) -> Response:
    """One rollout per id with the env's LLM agent against ``base_url``/``model``: per id, in order,
    the score on the env's scale, success, rounds, the conversation, and token ids and logprobs
    when the server returns them. Ids run concurrently (``concurrency``); a failing id is an
    error entry; every rollout is traced."""
    return json_answer(await run_batch(req, services.coordinator))
