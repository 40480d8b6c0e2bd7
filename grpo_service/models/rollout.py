"""``/rollout``: one rollout's request (env, policy, plan, recording, safety) and its answer."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from grpo_service.models.common import (
    DEFAULT_RUN,
    ENV_SNAPSHOT_ID,
    MAX_TURNS,
    SYNTH_COMPAT_HELP,
    ConfigDict_,
    Id,
    Name,
    Request,
    RunId,
    RunOwner,
    Seed,
    check_ops,
    request_config,
)
from grpo_service.models.policy import LLMCallRecord
from grpo_service.models.stream import TokenStream

Op = Literal["agent", "env"]


class RolloutEnvSpec(Request):
    """An existing ``env_id``, an ``env_name`` (+ ``config``, ``seed``), or a ``snapshot_id``."""

    model_config = request_config({"env_name": "crafter", "seed": 42}, {"snapshot_id": ENV_SNAPSHOT_ID})

    env_id: Id | None = Field(default=None, description="Play this live env (not for groups).")
    env_name: Name | None = Field(default=None, description="Create an env of this plug-in.")
    config: ConfigDict_
    seed: Seed | None = Field(default=None, description="With `env_name`: the world seed.")
    snapshot_id: Id | None = Field(default=None, description="Start from this env snapshot (mid-episode).")

    @model_validator(mode="after")
    def _one_source(self) -> RolloutEnvSpec:
        given = [n for n in ("env_id", "env_name", "snapshot_id") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError("env: give exactly one of 'env_id', 'env_name' or 'snapshot_id'")
        return self


class RolloutPolicySpec(Request):
    """An existing ``policy_id``, or a ``policy_name`` (+ ``config``)."""

    model_config = request_config({"policy_name": "crafter-react", "config": {"temperature": 1.0}})

    policy_id: Id | None = Field(default=None, description="Use this live policy (not for groups).")
    policy_name: Name | None = Field(default=None, description="Create a policy of this plug-in.")
    config: ConfigDict_

    @model_validator(mode="after")
    def _one_source(self) -> RolloutPolicySpec:
        if (self.policy_id is None) == (self.policy_name is None):
            raise ValueError("policy: give exactly one of 'policy_id' or 'policy_name'")
        return self


class RolloutRecordConfig(Request):
    """What the response (and the trace) keeps of each step."""

    model_config = request_config({"logprobs": True})

    trajectories: bool = Field(default=True, description="Return the per-step trajectories.")
    logprobs: bool | None = Field(
        default=None,
        description=(
            "Request and keep prompt/completion token ids and logprobs. Default: on in mode 'rl' "
            "(a trainer needs them), off in mode 'eval'."
        ),
    )
    images: bool = Field(default=False, description="Keep image fields in recorded observations.")
    observations: bool = Field(default=True, description="Keep each step's observation.")
    return_trace: bool = Field(
        default=False, description="Include the full trace (messages) in the response."
    )


class RolloutSafetyConfig(Request):
    """Bounds on a rollout: it stops (keeping what it played) when one is reached."""

    model_config = request_config({"max_time_s": 600})

    max_ops: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Stop after this many ops (agent and env each count one). Default: no cap "
        "beyond the request's own ops (max_turns × 2, or the length of 'ops').",
    )
    max_time_s: float = Field(default=3_600.0, gt=0, le=86_400, description="Wall-clock seconds at most.")
    llm_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="One decision's LLM budget, its retries and backoffs included; default the service's.",
    )


class RolloutPlan(Request):
    """What a rollout plays and keeps: the fields /rollout and /rollout/group share (a group passes
    them on to each of its members)."""

    ops: list[Op] | None = Field(default=None, description="'agent'/'env' sequence; or use max_turns.")
    max_turns: int | None = Field(
        default=None, ge=1, le=MAX_TURNS, description="Shorthand: ops = [agent, env] × N (per member)."
    )
    on_done: Literal["reset", "terminate"] = Field(
        default="reset", description="At the end of an episode: start the next one, or stop."
    )
    record: RolloutRecordConfig = Field(default_factory=RolloutRecordConfig, description="What to keep.")
    safety: RolloutSafetyConfig = Field(
        default_factory=RolloutSafetyConfig, description="Bounds (a group: of each member)."
    )
    rl_run_id: RunOwner = DEFAULT_RUN
    mode: Literal["rl", "eval"] = Field(
        default="rl", description="Recorded in the trace; `grpo-service export-sft` leaves `eval` out."
    )
    weights_version: int | None = Field(
        default=None,
        ge=0,
        description="The version of the weights the policy's inference server serves, recorded on every "
        "LLM call whose reply names none (vLLM's do not): a GRPO trainer sets it after each weight update.",
    )

    @model_validator(mode="after")
    def _ops(self) -> RolloutPlan:
        # Checked here, not when a rollout starts: a bad sequence is the caller's 422, not a 500.
        check_ops(self.ops, self.max_turns, self.safety.max_ops)
        return self

    def plan(self) -> dict[str, Any]:
        """This request's `RolloutPlan` fields, to pass on to the rollouts it starts."""
        return {name: getattr(self, name) for name in RolloutPlan.model_fields}

    def turns_per_rollout(self) -> int:
        """Decisions one rollout of this plan may make: its ``agent`` ops within ``safety.max_ops``."""
        cap = self.safety.max_ops
        if self.ops is not None:
            return self.ops[:cap].count("agent")
        turns = self.max_turns or 0
        return turns if cap is None else min(turns, (cap + 1) // 2)


class RolloutRequest(RolloutPlan):
    """Play a policy in an environment: ``ops`` of ``agent`` (decide) and ``env`` (execute), or
    ``max_turns`` decisions."""

    model_config = request_config(
        {
            "env": {"env_name": "crafter", "seed": 42},
            "policy": {"policy_name": "crafter-heuristic"},
            "max_turns": 20,
            "rl_run_id": "test-run-1",
        },
        {
            "env": {"env_name": "crafter", "seed": 42},
            "policy": {"policy_name": "crafter-react", "config": {"temperature": 0.7}},
            "max_turns": 10,
            "on_done": "terminate",
            "record": {"logprobs": True},
            "safety": {"max_time_s": 600},
        },
    )

    run_id: RunId | None = Field(default=None, description="Generated when omitted; must be unique.")
    env: RolloutEnvSpec = Field(description="Where to play.")
    policy: RolloutPolicySpec = Field(description="Who plays.")
    training_session_id: str | None = Field(
        default=None,
        max_length=256,
        description=SYNTH_COMPAT_HELP,
    )
    synth_base_url: str | None = Field(
        default=None,
        max_length=2048,
        description=SYNTH_COMPAT_HELP,
    )

    def op_list(self) -> list[str]:
        return list(self.ops) if self.ops is not None else ["agent", "env"] * (self.max_turns or 0)


class RolloutStep(BaseModel):
    """One decision and its execution. ``observation`` is what the policy saw."""

    turn: int = Field(description="Decision index in the rollout.")
    observation: dict[str, Any] | None = Field(default=None, description="What the policy saw.")
    tool_calls: list[dict[str, Any]] = Field(description="The policy's decision.")
    actions: list[str | int] = Field(
        default_factory=list, description="The actions the env executed (names, text, or primitive indices)."
    )
    reward: float = Field(default=0.0, description="Reward of this step.")
    done: bool = Field(default=False, description="The episode ended here.")
    truncated: bool = Field(default=False, description="It ended at the step cap.")
    info: dict[str, Any] = Field(default_factory=dict, description="The env's info of this step.")
    step_idx: int = Field(default=0, description="Steps taken in the episode after this one.")
    decision_error: str | None = Field(
        default=None, description="Why the decision failed, e.g. `no_tool_call`."
    )
    decision_error_detail: str | None = Field(default=None, description="The failure in words.")
    feedback: str | None = Field(
        default=None,
        description="An invalid turn the policy answered (no env step was taken): what its model is "
        "told in the next prompt.",
    )
    llm: LLMCallRecord | None = Field(default=None, description="The LLM call behind the decision.")
    timing: dict[str, float] = Field(default_factory=dict, description="`llm_ms`, `env_ms`.")


class Trajectory(BaseModel):
    """One episode (or the part of it this rollout played)."""

    env_id: str = Field(description="The env played.")
    policy_id: str = Field(description="The policy that played.")
    episode: int = Field(description="Episode index within the rollout.")
    seed: int | None = Field(default=None, description="The episode's world seed.")
    steps: list[RolloutStep] = Field(description="Every decision, in order.")
    final: dict[str, Any] | None = Field(default=None, description="The last observation and step index.")
    length: int = Field(description="Decisions in this episode.")
    total_reward: float = Field(description="Sum of the step rewards.")
    achievements: list[str] = Field(default_factory=list, description="Unlocked in this episode.")
    done: bool = Field(description="The episode ended.")
    truncated: bool = Field(description="It ended at the step cap.")
    stop_reason: str = Field(description="Why this episode's play stopped.")
    streams: list[TokenStream] = Field(
        default_factory=list,
        description="A policy that played the episode as token streams (mode 'rl', `token_stream`), with "
        "token ids recorded: the episode as token streams, one per segment. Empty otherwise (the "
        "per-step `llm` records are then the data).",
    )


class RolloutMetrics(BaseModel):
    episode_returns: list[float] = Field(description="Total reward of each episode.")
    mean_return: float = Field(description="Mean of `episode_returns`.")
    num_steps: int = Field(description="Env ticks executed.")
    num_decisions: int = Field(description="Policy decisions (LLM calls for an LLM policy).")
    invalid_decisions: int = Field(
        default=0, description="Decisions that could not be played (answered or ending the rollout)."
    )
    num_episodes: int = Field(description="Episodes played (in part or whole).")
    achievements: list[str] = Field(description="Union over episodes.")
    achievements_count: int = Field(description="Distinct achievements.")
    llm_calls: int = Field(description="LLM calls made.")
    llm_time_s: float = Field(description="Seconds spent waiting on the LLM.")
    env_time_s: float = Field(description="Seconds spent stepping the env.")
    wall_time_s: float = Field(description="Seconds from start to end.")
    prompt_tokens: int = Field(default=0, description="Prompt tokens over all calls.")
    completion_tokens: int = Field(default=0, description="Completion tokens over all calls.")
    llm_calls_without_tokens: int = Field(
        default=0,
        description="Recorded LLM calls whose server returned no token ids or logprobs (untrainable).",
    )
    weights_version: int | None = Field(
        default=None,
        description="The oldest weights version the inference server reported for this rollout's calls "
        "(serve-model reports one; vLLM does not): a trainer drops rollouts sampled from stale weights.",
    )
    weights_version_max: int | None = Field(
        default=None, description="The newest version (differs when weights changed mid-rollout)."
    )
    stream_segments: int = Field(
        default=0, description="Token streams over all trajectories (1 per episode when nothing broke one)."
    )
    template_differs: int = Field(
        default=0,
        description="Turns whose prompt, rendered by the chat template from messages, differs from the "
        "exact stream (a per-decision chat would have re-tokenized there).",
    )


class RolloutResponse(BaseModel):
    run_id: str = Field(description="The rollout's id.")
    status: Literal["completed", "failed", "aborted"] = Field(
        description="`completed` when it ran to a stop (see `stop_reason`: a policy error stops it too)."
    )
    trajectories: list[Trajectory] = Field(description="One per episode (empty if not recorded).")
    branches: dict[str, list[str]] = Field(default_factory=dict, description="Unused; always empty.")
    metrics: RolloutMetrics = Field(description="Totals.")
    aborted: bool = Field(description="Stopped by /run/abort or the time limit.")
    ops_executed: int = Field(description="Ops done.")
    stop_reason: str = Field(
        description="completed | episode_done | aborted | time_limit | max_ops | policy_error:* | "
        "env_terminated | policy_terminated (terminated by a caller mid-rollout) | error"
    )
    error: str | None = Field(
        default=None, description="An unexpected fault's message (stop_reason `error`)."
    )
    env_id: str | None = Field(default=None, description="The caller's env (null when the rollout made one).")
    policy_id: str | None = Field(default=None, description="The caller's policy (null when made here).")
    group_id: str | None = Field(default=None, description="The group it belongs to.")
    group_index: int | None = Field(default=None, description="Its index in the group.")
    parent_index: int | None = Field(
        default=None,
        description="In a forking group, a continuation's parent member (null: a root). Its turns "
        "before `fork_turn` are the parent's, stored once there; its own steps start at `fork_turn`.",
    )
    fork_turn: int | None = Field(
        default=None, description="The turn at which it forked from its parent (null: a root)."
    )
    trace: dict[str, Any] | None = Field(default=None, description="With `record.return_trace`: the trace.")
    warnings: list[str] = Field(
        default_factory=list,
        description="Problems that leave the result usable but not as asked (e.g. no token ids).",
    )
