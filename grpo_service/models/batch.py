"""``POST /rollouts``: a batch of rollouts over AgentGym env ids, one policy each."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from grpo_service.models.common import DEFAULT_RUN, ConfigDict_, Name, Request, RunOwner, Seed, request_config
from grpo_service.models.policy import LLMTokens
from grpo_service.models.stream import TokenStream


class BatchRolloutsRequest(Request):
    """The batch API: one rollout per task id, each played by the env's LLM agent."""

    model_config = request_config(  # strict: `true` is not a temperature, "5" no count
        {
            "env": "textcraft",
            "model": "<a model your server serves, e.g. Qwen/Qwen3-1.7B>",
            "base_url": "<base_url of your OpenAI-compatible server, e.g. http://127.0.0.1:8001>",
            "ids": [0, 1],
            "max_round": 5,
        },
        strict=True,
    )

    env: Name = Field(examples=["textcraft"], description="An environment with an LLM agent (see /info).")
    model: Name = Field(max_length=256, examples=["Qwen/Qwen3-1.7B"], description="The model to ask.")
    base_url: str = Field(
        max_length=2048, examples=["http://127.0.0.1:8001"], description="The OpenAI-compatible server."
    )
    ids: list[Seed] = Field(min_length=1, max_length=1024, description="Task indices (AgentGym's data_idx).")
    max_round: int = Field(ge=1, le=200, description="Most agent turns per rollout.")
    prompt_format: Literal["agentgym", "tool_calls"] | None = Field(
        default=None, description="Default: the agent's first ('agentgym' for AgentGym's games)."
    )
    temperature: float | None = Field(default=None, ge=0, le=2, description="Sampling temperature.")
    max_tokens: int | None = Field(default=None, ge=1, le=32_768, description="Most tokens per reply.")
    concurrency: int = Field(default=8, ge=1, le=256, description="Rollouts in flight at once.")
    env_config: ConfigDict_
    policy_config: ConfigDict_ = Field(
        description="More config for the agent (model and URL come from above)."
    )
    rl_run_id: RunOwner = DEFAULT_RUN
    max_time_s: float = Field(default=3600.0, gt=0, le=86_400, description="Deadline of each rollout.")


class TurnTokens(LLMTokens):
    """One model call of a batch rollout: its tokens and why it stopped."""

    finish_reason: str | None = Field(default=None, description="`stop`, `length`, `tool_calls`, ...")


class BatchRolloutResult(BaseModel):
    id: int = Field(description="The task id, as requested.")
    score: float | None = Field(default=None, description="On the environment's own scale.")
    success: bool = Field(default=False, description="The task was solved.")
    rounds: int = Field(default=0, description="Agent turns used.")
    invalid_rounds: int = Field(
        default=0, description="Of them, replies the environment could not use (answered with feedback)."
    )
    conversation: list[dict[str, Any]] = Field(default_factory=list, description="Chat messages.")
    turns: list[TurnTokens] | None = Field(
        default=None, description="Per model call; null when the server returned no token ids."
    )
    streams: list[TokenStream] = Field(
        default_factory=list,
        description="The rollout as token streams, when its agent played them (`policy_config.tokenizer`).",
    )
    stop_reason: str | None = Field(default=None, description="As in /rollout, e.g. `episode_done`.")
    run_id: str | None = Field(default=None, description="The rollout's run id (its trace's `run_id`).")
    error: str | None = Field(default=None, description="Set when this id failed; the batch goes on.")


class BatchRolloutsResponse(BaseModel):
    env: str = Field(description="The environment played.")
    model: str = Field(description="The model asked.")
    results: list[BatchRolloutResult] = Field(description="One per requested id, in order.")
    completed: int = Field(description="Results without an error.")
    failed: int = Field(description="Results with an error.")
    mean_score: float | None = Field(description="Mean score of the completed ones.")
    success_rate: float | None = Field(description="Share of completed ones that succeeded.")
    wall_time_s: float = Field(description="Seconds the batch took.")
