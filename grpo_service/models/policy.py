"""``/policy/*``: create, step, snapshot, restore and terminate a policy; an LLM call's tokens."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from grpo_service.models.common import (
    DEFAULT_RUN,
    ENV_ID,
    POLICY_ID,
    POLICY_SNAPSHOT_ID,
    ConfigDict_,
    Id,
    Name,
    Request,
    RunOwner,
    request_config,
)
from grpo_service.models.env import RestoreRequest, SnapshotRequest


class PolicyCreateRequest(Request):
    """Create a policy: an LLM agent (``crafter-react``) or a scripted one."""

    model_config = request_config(
        {"policy_name": "crafter-react", "config": {"temperature": 0.7}, "rl_run_id": "test-run-1"},
        {"policy_name": "crafter-heuristic", "config": {}, "bound_env_id": ENV_ID},
    )

    policy_name: Name = Field(description="A policy plug-in from GET /info, e.g. `crafter-react`.")
    config: ConfigDict_
    parent_policy_id: Id | None = Field(default=None, description="Lineage only: recorded, not copied.")
    rl_run_id: RunOwner = DEFAULT_RUN
    bound_env_id: Id | None = Field(
        default=None, description="An env whose current observation /policy/step reads by default."
    )


class PolicyCreateResponse(BaseModel):
    policy_id: str = Field(description="The policy's id.")
    policy_name: str = Field(description="Its plug-in.")
    bound_env_id: str | None = Field(default=None, description="The env it reads by default.")


class PolicyStepRequest(Request):
    """Decide on tool calls for an observation."""

    model_config = request_config({"policy_id": POLICY_ID, "dry_run": True})

    policy_id: Id = Field(description="The policy to ask.")
    observation: dict[str, Any] | None = Field(
        default=None, description="Defaults to the bound env's current observation."
    )
    state: dict[str, Any] | None = Field(default=None, description="Accepted for compatibility; unused.")
    metadata: dict[str, Any] | None = Field(default=None, description="Accepted for compatibility; unused.")
    dry_run: bool = Field(default=False, description="Build the inference request without sending it.")
    record_logprobs: bool = Field(default=False, description="Request and return token ids and logprobs.")


class LLMTokens(BaseModel):
    """One model call's token ids and logprobs, exactly as the server returned them (null when it
    returns none, as OpenAI's does): what a trainer needs of it."""

    prompt_token_ids: list[int] | None = Field(
        default=None, description="The prompt as the server tokenized it."
    )
    completion_token_ids: list[int] | None = Field(default=None, description="The reply's tokens.")
    completion_logprobs: list[float] | None = Field(default=None, description="One logprob per reply token.")


class LLMCallRecord(LLMTokens):
    model: str | None = Field(default=None, description="The model that answered.")
    latency_ms: float = Field(description="Time of the call, retries included.")
    attempts: int = Field(description="HTTP attempts made (1 + retries).")
    finish_reason: str | None = Field(default=None, description="As the server returned it.")
    usage: dict[str, Any] | None = Field(
        default=None, description="Token counts as the server returned them."
    )
    error: str | None = Field(default=None, description="Why the call failed, if it did.")
    weights_version: int | None = Field(
        default=None, description="The inference server's weights version, when it reports one."
    )
    weights_version_sent: int | None = Field(
        default=None,
        description="Set only for a call that crossed a weight push: the version when it was sent "
        "(`weights_version` is the one when it returned; either may have sampled it).",
    )


class PolicyStepResponse(BaseModel):
    tool_calls: list[dict[str, Any]] = Field(description="The decision, to pass to /env/step.")
    meta: dict[str, Any] = Field(description="Model, turn; on a dry run `inference_request`.")
    error: str | None = Field(default=None, description="Decision error kind, e.g. `no_tool_call`.")
    error_detail: str | None = Field(default=None, description="The error in words.")
    llm: LLMCallRecord | None = Field(default=None, description="The LLM call behind the decision.")


class PolicySnapshotRequest(SnapshotRequest):
    """Save a policy's state (config, history window, turn index)."""

    model_config = request_config({"policy_id": POLICY_ID})

    policy_id: Id = Field(description="The policy to save.")


class PolicyRestoreRequest(RestoreRequest):
    """A new policy with the snapshot's state."""

    model_config = request_config({"snapshot_id": POLICY_SNAPSHOT_ID})

    bound_env_id: Id | None = Field(default=None, description="Bind the new policy to this env.")


class PolicyRestoreResponse(PolicyCreateResponse):
    parent_snapshot_id: str = Field(description="The snapshot it was restored from.")
    parent_policy_id: str | None = Field(default=None, description="The policy that snapshot was taken of.")


class PolicyTerminateRequest(Request):
    """Release a policy. Idempotent."""

    model_config = request_config({"policy_id": POLICY_ID})

    policy_id: Id = Field(description="The policy to release.")
