"""What a rollout records: per-step records, trajectories and metrics, built from its decisions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envs.base import StepResult
from grpo_service.core.registry import EnvHandle, PolicyHandle, RunHandle
from grpo_service.models import (
    LLMCallRecord,
    LLMTokens,
    RolloutMetrics,
    RolloutRecordConfig,
    RolloutRequest,
    RolloutStep,
    TokenStream,
    Trajectory,
)
from grpo_service.rollout.streams import token_streams
from grpo_service.tracing.traces import DecisionTrace, strip_images
from inference import LLMCall


@dataclass
class EpisodeInPlay:
    """One episode of a rollout, as it is played (a rollout with ``on_done="reset"`` has several)."""

    index: int
    seed: int | None
    steps: list[RolloutStep] = field(default_factory=list)
    total_reward: float = 0.0
    achievements: list[str] = field(default_factory=list)
    done: bool = False
    truncated: bool = False
    stop_reason: str = "running"
    final: dict[str, Any] | None = None
    segment_starts: dict[int, str] = field(default_factory=dict)  # turn -> why a stream restarts
    template_differs: int = 0
    streamed: bool = False  # a decision of it was played as a token stream
    _streams: list[TokenStream] | None = None

    def streams(self) -> list[TokenStream]:
        """The episode's token streams (built once, when its play is over); none when no decision
        was played as a stream (per-decision chats: their per-step records are the data)."""
        if self._streams is None:
            self._streams = (
                token_streams(self.steps, self.segment_starts, self.stop_reason) if self.streamed else []
            )
        return self._streams


def records_tokens(req: RolloutRequest) -> bool:
    """Whether a rollout requests and keeps token ids and logprobs: as asked, else in mode "rl"."""
    return req.record.logprobs if req.record.logprobs is not None else req.mode == "rl"


# What a record without tokens leaves out: the server's token ids and logprobs.
TOKEN_FIELDS = tuple(LLMTokens.model_fields)


LLM_RECORD_FIELDS = tuple(LLMCallRecord.model_fields)


def llm_record(call: LLMCall | None, with_tokens: bool) -> LLMCallRecord | None:
    """The call's record, built without validation: the client checked every field's type
    already (validating would walk the thousands of token ids again, once per decision)."""
    if call is None:
        return None
    fields = {name: getattr(call, name) for name in LLM_RECORD_FIELDS}
    if not with_tokens:
        fields.update(dict.fromkeys(TOKEN_FIELDS))
    return LLMCallRecord.model_construct(**fields)


def step_record(d: DecisionTrace, record: RolloutRecordConfig, with_tokens: bool) -> RolloutStep:
    result = d.result
    observation = None
    if record.observations:
        observation = d.observation if record.images else strip_images(d.observation)
    return RolloutStep(
        turn=d.turn,
        observation=observation,
        tool_calls=d.decision.tool_calls,
        actions=list(result.info.get("actions", [])) if result else [],
        reward=result.reward if result else 0.0,
        done=result.done if result else False,
        truncated=result.truncated if result else False,
        info=result.info if result else {},
        step_idx=result.step_idx if result else 0,
        decision_error=d.decision.error,
        decision_error_detail=d.decision.error_detail,
        feedback=d.feedback,
        llm=llm_record(d.decision.llm_call, with_tokens),
        timing={
            "llm_ms": d.decision.llm_call.latency_ms if d.decision.llm_call else 0.0,
            "env_ms": round(d.env_ms, 3),
        },
    )


def final_record(result: StepResult, record: RolloutRecordConfig) -> dict[str, Any]:
    observation = result.observation if record.images else strip_images(result.observation)
    return {"observation": observation, "step_idx": result.step_idx, "done": result.done}


def trajectory(ep: EpisodeInPlay, env: EnvHandle, policy: PolicyHandle | None) -> Trajectory:
    return Trajectory(
        env_id=env.id,
        policy_id=policy.id if policy else "",
        episode=ep.index,
        seed=ep.seed,
        steps=ep.steps,
        final=ep.final,
        length=len(ep.steps),
        total_reward=round(ep.total_reward, 6),
        achievements=ep.achievements,
        done=ep.done,
        truncated=ep.truncated,
        stop_reason=ep.stop_reason,
        streams=ep.streams(),
    )


def _untrainable(call: LLMCall) -> bool:
    """An answered call that came back without the token ids or logprobs a trainer needs."""
    return call.response is not None and (
        call.prompt_token_ids is None or call.completion_token_ids is None or call.completion_logprobs is None
    )


def metrics(
    episodes: list[EpisodeInPlay],
    decisions: list[DecisionTrace],
    run: RunHandle,
    wall_s: float,
    with_tokens: bool,
) -> RolloutMetrics:
    returns = [round(ep.total_reward, 6) for ep in episodes]
    achievements = sorted({a for ep in episodes for a in ep.achievements})
    calls = [d.decision.llm_call for d in decisions if d.decision.llm_call is not None]
    usage = [c.usage or {} for c in calls]
    versions = [c.weights_version for c in calls if c.weights_version is not None]
    return RolloutMetrics(
        episode_returns=returns,
        mean_return=(sum(returns) / len(returns)) if returns else 0.0,
        num_steps=sum(d.result.info.get("actions_executed", 1) for d in decisions if d.result),
        num_decisions=len(decisions),
        invalid_decisions=sum(1 for d in decisions if d.decision.error),
        num_episodes=len(episodes),
        achievements=achievements,
        achievements_count=len(achievements),
        llm_calls=len(calls),
        llm_time_s=round(run.llm_s, 6),
        env_time_s=round(run.env_s, 6),
        wall_time_s=round(wall_s, 6),
        prompt_tokens=sum(int(u.get("prompt_tokens") or 0) for u in usage),
        completion_tokens=sum(int(u.get("completion_tokens") or 0) for u in usage),
        llm_calls_without_tokens=sum(1 for c in calls if _untrainable(c)) if with_tokens else 0,
        weights_version=min(versions, default=None),
        weights_version_max=max(versions, default=None),
        stream_segments=sum(len(ep.streams()) for ep in episodes) if with_tokens else 0,
        template_differs=sum(ep.template_differs for ep in episodes),
    )


def untrainable_warning(metrics: RolloutMetrics) -> str:
    return (
        f"no_token_ids: the inference server returned no token ids or logprobs for "
        f"{metrics.llm_calls_without_tokens} of {metrics.llm_calls} LLM calls, so these steps cannot be "
        "trained on (vLLM >= 0.10.2 returns them with return_token_ids; OpenAI and Groq do not)"
    )
