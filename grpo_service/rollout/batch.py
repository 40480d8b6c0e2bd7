"""The batch API (``POST /rollouts``): one LLM rollout per task id, run concurrently under a bound.

Each id is an ordinary rollout of the coordinator (so it is traced like any other) with the
environment's LLM agent, created from the request's ``model`` and ``base_url``; its result is
reshaped the way AgentGym-style trainers read it: the score on the environment's own scale,
success, the rounds used, the conversation as chat messages, and the token ids and logprobs of
each model call. A reply the environment cannot use is answered and the episode goes on (the
agent's ``on_invalid_reply``, in ``policy_config``). One id that fails becomes an error entry;
the batch always answers every id, in order.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx

from envs.base import POLICIES, environment_class, policy_class
from envs.errors import PluginError
from grpo_service.config import Settings
from grpo_service.errors import ServiceError, Unprocessable
from grpo_service.models import (
    BatchRolloutResult,
    BatchRolloutsRequest,
    BatchRolloutsResponse,
    RolloutEnvSpec,
    RolloutPolicySpec,
    RolloutRecordConfig,
    RolloutRequest,
    RolloutResponse,
    RolloutSafetyConfig,
    TurnTokens,
)
from grpo_service.rollout.coordinator import RolloutCoordinator, check_turns
from inference.openai_client import normalize_base_url


def agent_policies() -> dict[str, str]:
    """Environment name → the LLM agent policy that plays it (the first registered)."""
    agents: dict[str, str] = {}
    for name, cls in POLICIES.items():
        if cls.uses_inference and cls.env_name and cls.env_name not in agents:
            agents[cls.env_name] = name
    return agents


def check(req: BatchRolloutsRequest, coordinator: RolloutCoordinator) -> str:
    """Validate what pydantic cannot (the env, the id range, the turns, the agent config); return
    the policy."""
    check_batch_turns(req, coordinator.settings)
    agents = agent_policies()
    if req.env not in agents:
        raise Unprocessable(
            f"unknown env {req.env!r} for /rollouts; valid: {', '.join(sorted(agents))}", code="unknown_env"
        )
    env_cls = environment_class(req.env)
    count = env_cls.num_tasks() if hasattr(env_cls, "num_tasks") else None
    for i, idx in enumerate(req.ids):
        if count is not None and idx >= count:
            raise Unprocessable(
                f"ids[{i}]={idx} is out of range: {req.env} has tasks 0..{count - 1}", code="id_out_of_range"
            )
    policy = agents[req.env]
    try:
        policy_class(policy).create(policy_config(req), coordinator.policies.context)
    except PluginError as exc:
        raise Unprocessable(str(exc), code="invalid_config") from None
    return policy


def check_batch_turns(req: BatchRolloutsRequest, settings: Settings) -> None:
    """The batch answers every id's rollout at once: its turns are bounded like a group's."""
    asked = f"the batch ({len(req.ids)} ids × max_round {req.max_round})"
    check_turns(len(req.ids) * req.max_round, asked, settings)


def policy_config(req: BatchRolloutsRequest) -> dict[str, Any]:
    config = {**req.policy_config, "model": req.model, "inference_url": req.base_url}
    for key in ("prompt_format", "temperature", "max_tokens"):
        if getattr(req, key) is not None:
            config[key] = getattr(req, key)
    return config


PREFLIGHT_TIMEOUT_S = 5.0


async def check_model_server(req: BatchRolloutsRequest) -> None:
    """One ``GET {base_url}/v1/models`` before the batch: an unreachable server, or one that
    serves other models, is a 422 now rather than an inference error in every result later.
    A server without the listing route is taken at its word."""
    try:
        url = normalize_base_url(req.base_url)
    except ValueError as exc:
        raise Unprocessable(str(exc), code="invalid_base_url") from None
    try:
        async with httpx.AsyncClient(timeout=PREFLIGHT_TIMEOUT_S) as client:
            response = await client.get(url + "/models")
    except httpx.HTTPError as exc:
        raise Unprocessable(
            f"the model server at {url} is not reachable ({type(exc).__name__})",
            code="inference_unreachable",
        ) from None
    if response.status_code != 200:
        return
    try:
        served = [m.get("id") for m in response.json().get("data", []) if isinstance(m, dict)]
    except (ValueError, AttributeError):
        return
    if served and req.model not in served:
        raise Unprocessable(
            f"model {req.model!r} is not served at {url}; it serves: {', '.join(map(str, served))}",
            code="unknown_model",
        )


async def run_batch(req: BatchRolloutsRequest, coordinator: RolloutCoordinator) -> BatchRolloutsResponse:
    started = time.monotonic()
    policy = check(req, coordinator)
    await check_model_server(req)
    config = policy_config(req)
    bound = asyncio.Semaphore(req.concurrency)
    # The slots of every rollout in flight are held for the whole batch (each rollout reuses the
    # one its predecessor gave back), so that no id fails for want of room: else a 429 now.
    at_once = min(req.concurrency, len(req.ids))
    what = f"the batch ({at_once} rollouts at once)"
    claim = coordinator.registry.claim(what, envs=at_once, policies=at_once, runs=at_once)

    async def one(idx: int) -> BatchRolloutResult:
        async with bound:
            rollout = RolloutRequest(
                env=RolloutEnvSpec(env_name=req.env, seed=idx, config=req.env_config),
                policy=RolloutPolicySpec(policy_name=policy, config=config),
                max_turns=req.max_round,
                on_done="terminate",
                record=RolloutRecordConfig(logprobs=True, observations=True, return_trace=True),
                safety=RolloutSafetyConfig(max_time_s=req.max_time_s),
                rl_run_id=req.rl_run_id,
            )
            try:
                return result_of(idx, await coordinator.rollout(rollout, claim))
            except ServiceError as exc:
                return BatchRolloutResult(id=idx, error=exc.message)
            except Exception as exc:  # one id never sinks the batch
                return BatchRolloutResult(id=idx, error=f"{type(exc).__name__}: {exc}")

    try:
        results = list(await asyncio.gather(*(one(idx) for idx in req.ids)))
    finally:
        claim.release()
    return batch_response(req, results, time.monotonic() - started)


def batch_response(
    req: BatchRolloutsRequest, results: list[BatchRolloutResult], wall_s: float
) -> BatchRolloutsResponse:
    """The batch's answer from its results (in the order of ``req.ids``)."""
    scores = [r.score for r in results if r.error is None and r.score is not None]
    finished = [r for r in results if r.error is None]
    return BatchRolloutsResponse(
        env=req.env,
        model=req.model,
        results=results,
        completed=len(finished),
        failed=len(results) - len(finished),
        mean_score=statistics.fmean(scores) if scores else None,
        success_rate=(sum(r.success for r in finished) / len(finished)) if finished else None,
        wall_time_s=round(wall_s, 6),
    )


def result_of(idx: int, response: RolloutResponse) -> BatchRolloutResult:
    """One rollout as a batch's caller reads it."""
    trajectory = response.trajectories[0] if response.trajectories else None
    steps = trajectory.steps if trajectory else []
    played = [s for s in steps if s.decision_error is None]
    last_info = played[-1].info if played else {}
    score = last_info.get("score", trajectory.total_reward if trajectory else 0.0)
    final = (trajectory.final or {}).get("observation") if trajectory else None
    turns = [TurnTokens.model_validate(s.llm, from_attributes=True) for s in steps if s.llm is not None]
    has_tokens = any(t.completion_token_ids is not None for t in turns)
    return BatchRolloutResult(
        id=idx,
        score=float(score),
        success=bool(last_info.get("success", False)),
        rounds=len(steps),
        invalid_rounds=sum(1 for s in steps if s.decision_error is not None),
        conversation=conversation(
            response.trace or {}, final, {s.turn: s.feedback for s in steps if s.feedback is not None}
        ),
        turns=turns if has_tokens else None,
        streams=trajectory.streams if trajectory else [],
        stop_reason=response.stop_reason,
        run_id=response.run_id,
        error=response.error,
    )


def conversation(
    trace: dict[str, Any], final: dict[str, Any] | None, feedback: dict[int, str]
) -> list[dict[str, Any]]:
    """The chat as the model saw it: the first request's messages, then each reply and the
    environment's answer (a user turn; ``tool`` messages after a reply that called tools), or
    for an invalid reply the ``feedback`` (by turn) the model was given."""
    turns = trace.get("turns") or []
    if not turns or not turns[0].get("messages"):
        return []
    messages = [dict(m) for m in turns[0]["messages"]]
    for i, turn in enumerate(turns):
        choices = (turn.get("response") or {}).get("choices") or [{}]
        reply = choices[0].get("message") or {}
        assistant: dict[str, Any] = {"role": "assistant", "content": reply.get("content")}
        if reply.get("tool_calls"):
            assistant["tool_calls"] = reply["tool_calls"]
        messages.append(assistant)
        if turn.get("turn") in feedback:  # an invalid reply, answered by the service
            answer = feedback[turn["turn"]]
        elif i + 1 < len(turns):
            answer = (turns[i + 1].get("messages") or [{}])[-1].get("content")
        elif turn.get("reward") is not None and final is not None:
            answer = final.get("text")
        else:
            break  # the reply could not be played (a policy error): no answer from the env
        if reply.get("tool_calls"):
            messages += [
                {"role": "tool", "tool_call_id": c.get("id"), "content": answer} for c in reply["tool_calls"]
            ]
        else:
            messages.append({"role": "user", "content": answer})
    return messages
