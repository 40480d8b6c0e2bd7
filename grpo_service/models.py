"""Request and response models: the public HTTP contract (and the OpenAPI page at /docs).

Field names follow seed 000 and the reference service (`env_id`, `observation`, `info`,
`step_idx`, `reward`, `done`, `truncated`, `snapshot_id`, `policy_id`, `bound_env_id`,
`tool_calls`, `meta`, `dry_run`). Requests forbid unknown fields so typos fail loudly.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

# Ids and names are bounded so that no request can smuggle megabytes through a path-like field.
Id = Annotated[str, Field(min_length=1, max_length=128)]


def _no_dot_dot(value: str) -> str:
    if ".." in value:
        raise ValueError("must not contain '..'")
    return value


# The same rule as the snapshot store's (storage/base.py): no path tricks.
RunId = Annotated[
    str,
    Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$"),
    AfterValidator(_no_dot_dot),
]
Name = Annotated[str, Field(min_length=1, max_length=64)]
# Strict: `true` or `1.5` is a caller's mistake, not seed 1 or action 1.
Seed = Annotated[int, Field(strict=True, ge=0, le=2**63 - 1)]
Action = Annotated[str, Field(max_length=64)] | Annotated[int, Field(strict=True, ge=0, le=2**31)]
ConfigDict_ = Annotated[dict[str, Any], Field(default_factory=dict, description="Plug-in specific config.")]

DEFAULT_RUN = "default"


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorBody(BaseModel):
    """Every error response: a stable machine-readable ``code`` and a ``detail`` naming the problem
    (for request validation errors, pydantic's list of errors)."""

    code: str
    detail: str | list[dict[str, Any]]


MAX_TURNS = 100_000
MAX_OPS = 2 * MAX_TURNS  # a request's own ops: max_turns × (agent, env), or an `ops` list


def check_ops(ops: list[str] | None, max_turns: int | None, max_ops: int | None) -> None:
    """Validate the op sequence of a rollout or group request up front."""
    if ops is None and max_turns is None:
        raise ValueError("give 'ops' or 'max_turns'")
    if ops is not None and max_turns is not None:
        raise ValueError("give 'ops' or 'max_turns', not both")
    if ops is None:
        return
    if not ops:
        raise ValueError("'ops' is empty")
    if len(ops) > (max_ops or MAX_OPS):
        limit = f"safety.max_ops={max_ops}" if max_ops else f"the maximum of {MAX_OPS}"
        raise ValueError(f"'ops' has {len(ops)} entries, more than {limit}")
    pending = False
    for i, op in enumerate(ops):
        if op == "agent":
            pending = True
        elif not pending:
            raise ValueError(f"ops[{i}] is 'env' with no 'agent' decision before it to execute")
        else:
            pending = False


# ------------------------------------------------------------------------------------ meta


class ServiceEndpoints(BaseModel):
    base_url: str
    version: str
    endpoints: dict[str, str]


class InferenceInfo(BaseModel):
    base_url: str
    endpoints: dict[str, str]
    default_model: str | None


class PluginInfo(BaseModel):
    name: str
    version: str
    description: str
    config_schema: dict[str, Any]
    env_name: str | None = None
    uses_inference: bool = False


class Limits(BaseModel):
    max_envs: int
    max_policies: int
    max_active_runs: int
    max_group_size: int
    idle_ttl_s: float
    max_request_bytes: int


class ServiceInfo(BaseModel):
    service: ServiceEndpoints
    inference: InferenceInfo
    environments: list[PluginInfo]
    policies: list[PluginInfo]
    limits: Limits
    auth_required: bool
    snapshot_store: str
    tracing: str | None


class Health(BaseModel):
    status: Literal["healthy"]
    version: str
    instance: str = Field(
        description="This process's tag: the prefix of the env, policy and run ids it issues."
    )
    workers: int = Field(description="Server processes behind this port (`serve --workers`).")
    uptime_s: float
    envs: int
    policies: int
    runs_active: int
    capacity: dict[str, int]
    tracing: dict[str, int] | None = Field(
        default=None,
        description="Trace writer counters (written, dropped, failed, queued) when tracing is on.",
    )


# ------------------------------------------------------------------------------------- env


class EnvCreateRequest(Request):
    env_name: Name = Field(examples=["crafter"])
    config: ConfigDict_
    seed: Seed | None = Field(default=None, description="World seed; 0 when omitted.")
    parent_env_id: Id | None = Field(default=None, description="Lineage only: recorded, not copied.")
    rl_run_id: RunId = Field(default=DEFAULT_RUN, description="Groups snapshots on disk.")


class EnvState(BaseModel):
    env_id: str
    observation: dict[str, Any]
    info: dict[str, Any] | None = None
    step_idx: int
    done: bool = False


class EnvCreateResponse(EnvState):
    pass


class EnvResetRequest(Request):
    env_id: Id
    seed: Seed | None = None


class EnvResetResponse(EnvState):
    pass


class EnvStepRequest(Request):
    """Give exactly one of ``action``, ``actions`` or ``tool_calls``."""

    env_id: Id
    action: Action | None = Field(default=None, examples=["move_left", 5])
    actions: list[Action] | None = Field(default=None, min_length=1, max_length=64)
    tool_calls: list[dict[str, Any]] | None = Field(default=None, min_length=1, max_length=16)

    @model_validator(mode="after")
    def _exactly_one(self) -> EnvStepRequest:
        given = [n for n in ("action", "actions", "tool_calls") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of 'action', 'actions' or 'tool_calls'")
        return self


class EnvStepResponse(BaseModel):
    env_id: str
    observation: dict[str, Any]
    reward: float
    done: bool
    truncated: bool
    info: dict[str, Any]
    step_idx: int


class SnapshotRequest(Request):
    rl_run_id: RunId | None = Field(default=None, description="Defaults to the instance's rl_run_id.")


class EnvSnapshotRequest(SnapshotRequest):
    env_id: Id


class SnapshotResponse(BaseModel):
    snapshot_id: str
    kind: Literal["env", "policy"]
    path: str
    rl_run_id: str
    size: int
    created_at: float
    parent_snapshot_id: str | None = None


class EnvRestoreRequest(Request):
    snapshot_id: Id
    rl_run_id: RunId | None = Field(default=None, description="Optional: where to look first.")


class EnvRestoreResponse(EnvState):
    parent_snapshot_id: str
    parent_env_id: str | None = None


class EnvTerminateRequest(Request):
    env_id: Id


class TerminateResponse(BaseModel):
    ok: bool = True
    existed: bool


# ---------------------------------------------------------------------------------- policy


class PolicyCreateRequest(Request):
    policy_name: Name = Field(examples=["crafter-react"])
    config: ConfigDict_
    parent_policy_id: Id | None = None
    rl_run_id: RunId = DEFAULT_RUN
    bound_env_id: Id | None = None


class PolicyCreateResponse(BaseModel):
    policy_id: str
    policy_name: str
    bound_env_id: str | None = None


class PolicyStepRequest(Request):
    policy_id: Id
    observation: dict[str, Any] | None = Field(
        default=None, description="Defaults to the bound env's current observation."
    )
    state: dict[str, Any] | None = Field(default=None, description="Accepted for compatibility; unused.")
    metadata: dict[str, Any] | None = None
    dry_run: bool = Field(default=False, description="Build the inference request without sending it.")
    record_logprobs: bool = False


class LLMCallRecord(BaseModel):
    model: str | None = None
    latency_ms: float
    attempts: int
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    error: str | None = None


class PolicyStepResponse(BaseModel):
    tool_calls: list[dict[str, Any]]
    meta: dict[str, Any]
    error: str | None = None
    error_detail: str | None = None
    llm: LLMCallRecord | None = None


class PolicySnapshotRequest(SnapshotRequest):
    policy_id: Id


class PolicyRestoreRequest(Request):
    snapshot_id: Id
    rl_run_id: RunId | None = None
    bound_env_id: Id | None = None


class PolicyRestoreResponse(BaseModel):
    policy_id: str
    policy_name: str
    bound_env_id: str | None = None
    parent_snapshot_id: str
    parent_policy_id: str | None = None


class PolicyTerminateRequest(Request):
    policy_id: Id


# --------------------------------------------------------------------------------- rollout

Op = Literal["agent", "env"]


class RolloutEnvSpec(Request):
    """An existing ``env_id``, an ``env_name`` (+ ``config``, ``seed``), or a ``snapshot_id``."""

    env_id: Id | None = None
    env_name: Name | None = None
    config: ConfigDict_
    seed: Seed | None = None
    snapshot_id: Id | None = None

    @model_validator(mode="after")
    def _one_source(self) -> RolloutEnvSpec:
        given = [n for n in ("env_id", "env_name", "snapshot_id") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError("env: give exactly one of 'env_id', 'env_name' or 'snapshot_id'")
        return self


class RolloutPolicySpec(Request):
    """An existing ``policy_id``, or a ``policy_name`` (+ ``config``)."""

    policy_id: Id | None = None
    policy_name: Name | None = None
    config: ConfigDict_

    @model_validator(mode="after")
    def _one_source(self) -> RolloutPolicySpec:
        if (self.policy_id is None) == (self.policy_name is None):
            raise ValueError("policy: give exactly one of 'policy_id' or 'policy_name'")
        return self


class RolloutRecordConfig(Request):
    trajectories: bool = True
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
    max_ops: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Stop after this many ops (agent and env each count one). Default: no cap "
        "beyond the request's own ops (max_turns × 2, or the length of 'ops').",
    )
    max_time_s: float = Field(default=3_600.0, gt=0, le=86_400)
    llm_timeout_s: float | None = Field(default=None, gt=0, description="Per LLM call; default service's.")


class RolloutRequest(Request):
    run_id: RunId | None = Field(default=None, description="Generated when omitted; must be unique.")
    env: RolloutEnvSpec
    policy: RolloutPolicySpec
    ops: list[Op] | None = Field(default=None, description="'agent'/'env' sequence; or use max_turns.")
    max_turns: int | None = Field(
        default=None, ge=1, le=MAX_TURNS, description="Shorthand: ops = [agent, env] × N."
    )
    on_done: Literal["reset", "terminate"] = "reset"
    record: RolloutRecordConfig = Field(default_factory=RolloutRecordConfig)
    safety: RolloutSafetyConfig = Field(default_factory=RolloutSafetyConfig)
    rl_run_id: RunId = DEFAULT_RUN
    mode: Literal["rl", "eval"] = "rl"
    # Accepted for compatibility with the reference's clients; unused.
    training_session_id: str | None = Field(default=None, max_length=256)
    synth_base_url: str | None = Field(default=None, max_length=2048)

    @model_validator(mode="after")
    def _ops(self) -> RolloutRequest:
        check_ops(self.ops, self.max_turns, self.safety.max_ops)
        return self

    def op_list(self) -> list[str]:
        return list(self.ops) if self.ops is not None else ["agent", "env"] * (self.max_turns or 0)


class LLMTokens(BaseModel):
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None


class RolloutStep(BaseModel):
    """One decision and its execution. ``observation`` is what the policy saw."""

    turn: int
    observation: dict[str, Any] | None = None
    tool_calls: list[dict[str, Any]]
    actions: list[str] = Field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)
    step_idx: int = 0
    decision_error: str | None = None
    decision_error_detail: str | None = None
    llm: LLMCallRecord | None = None
    timing: dict[str, float] = Field(default_factory=dict)


class Trajectory(BaseModel):
    """One episode (or the part of it this rollout played)."""

    env_id: str
    policy_id: str
    episode: int
    seed: int | None = None
    steps: list[RolloutStep]
    final: dict[str, Any] | None = None
    length: int
    total_reward: float
    achievements: list[str] = Field(default_factory=list)
    done: bool
    truncated: bool
    stop_reason: str


class RolloutMetrics(BaseModel):
    episode_returns: list[float]
    mean_return: float
    num_steps: int = Field(description="Env ticks executed.")
    num_decisions: int
    num_episodes: int
    achievements: list[str] = Field(description="Union over episodes.")
    achievements_count: int
    llm_calls: int
    llm_time_s: float
    env_time_s: float
    wall_time_s: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    llm_calls_without_tokens: int = Field(
        default=0,
        description="Recorded LLM calls whose server returned no token ids or logprobs (untrainable).",
    )


class RolloutResponse(BaseModel):
    run_id: str
    status: Literal["completed", "failed", "aborted"]
    trajectories: list[Trajectory]
    branches: dict[str, list[str]] = Field(default_factory=dict)
    metrics: RolloutMetrics
    aborted: bool
    ops_executed: int
    stop_reason: str = Field(
        description="completed | episode_done | aborted | time_limit | max_ops | policy_error:* | "
        "env_terminated | policy_terminated (terminated by a caller mid-rollout) | error"
    )
    error: str | None = None
    env_id: str | None = None
    policy_id: str | None = None
    group_id: str | None = None
    group_index: int | None = None
    trace: dict[str, Any] | None = None
    warnings: list[str] = Field(
        default_factory=list,
        description="Problems that leave the result usable but not as asked (e.g. no token ids).",
    )


class RolloutGroupRequest(Request):
    """G rollouts from the same start, each with its own policy instance and sampling."""

    group_id: RunId | None = None
    group_size: int = Field(ge=1, le=1024, description="G: rollouts in the group.")
    env: RolloutEnvSpec
    policy: RolloutPolicySpec
    ops: list[Op] | None = None
    max_turns: int | None = Field(default=None, ge=1, le=MAX_TURNS)
    on_done: Literal["reset", "terminate"] = "terminate"
    record: RolloutRecordConfig = Field(default_factory=RolloutRecordConfig)
    safety: RolloutSafetyConfig = Field(default_factory=RolloutSafetyConfig)
    rl_run_id: RunId = DEFAULT_RUN
    mode: Literal["rl", "eval"] = "rl"
    vary_policy_seed: bool = Field(
        default=True, description="Give member i the policy config seed + i (when the policy has a seed)."
    )

    @model_validator(mode="after")
    def _sources(self) -> RolloutGroupRequest:
        # Checked here, not when the members are built: a bad sequence is the caller's 422, not a 500.
        check_ops(self.ops, self.max_turns, self.safety.max_ops)
        if self.env.env_id is not None:
            raise ValueError(
                "env: a group starts from 'env_name' (+ seed) or 'snapshot_id', not a live env_id"
            )
        if self.policy.policy_id is not None:
            raise ValueError("policy: a group needs 'policy_name' (each member gets its own instance)")
        return self


class GroupMember(BaseModel):
    group_index: int
    run_id: str
    status: Literal["completed", "failed", "aborted"]
    result: RolloutResponse | None = None
    error: str | None = None


class GroupMetrics(BaseModel):
    returns: list[float | None]
    mean_return: float | None
    std_return: float | None
    completed: int
    failed: int
    wall_time_s: float
    llm_calls_without_tokens: int = Field(
        default=0, description="Summed over members: LLM calls recorded without token ids or logprobs."
    )


class RolloutGroupResponse(BaseModel):
    group_id: str
    members: list[GroupMember]
    metrics: GroupMetrics
    warnings: list[str] = Field(default_factory=list, description="The members' warnings, each once.")


class RunStarted(BaseModel):
    run_id: str
    status: Literal["running"]
    status_url: str


# ---------------------------------------------------------------------------------- branch


class BranchRequest(Request):
    env_ids: list[Id] = Field(default_factory=list, max_length=64)
    policy_ids: list[Id] = Field(default_factory=list, max_length=64)
    num_children: int = Field(default=1, ge=1, le=256)
    max_branches: int = Field(default=256, ge=1, le=4096, description="Cap on children in total.")
    rl_run_id: RunId | None = None

    @model_validator(mode="after")
    def _bounds(self) -> BranchRequest:
        if not self.env_ids and not self.policy_ids:
            raise ValueError("give at least one of 'env_ids' or 'policy_ids'")
        total = (len(self.env_ids) + len(self.policy_ids)) * self.num_children
        if total > self.max_branches:
            raise ValueError(f"{total} children requested, more than max_branches={self.max_branches}")
        return self


class BranchChild(BaseModel):
    id: str
    parent_id: str
    parent_snapshot_id: str
    child_index: int
    bound_env_id: str | None = None


class BranchResponse(BaseModel):
    env_branches: dict[str, list[str]]
    policy_branches: dict[str, list[str]]
    children: list[BranchChild]


# ------------------------------------------------------------------------------------ runs


class RunAbortRequest(Request):
    run_id: Id


class RunAbortResponse(BaseModel):
    ok: bool
    run_id: str
    status: str


class RunStatusResponse(BaseModel):
    run_id: str
    kind: Literal["rollout", "group"]
    status: Literal["running", "completed", "failed", "aborted"]
    started_at: float
    finished_at: float | None
    ops_executed: int
    ops_total: int
    timings: dict[str, float]
    error: str | None = None
    result: RolloutResponse | RolloutGroupResponse | None = Field(
        default=None, description="The full result once finished (start-then-poll)."
    )
