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
# Text games take free-text actions ("move metal pot to sink", "craft 1 blue dye using 1 lapis lazuli").
Action = Annotated[str, Field(max_length=512)] | Annotated[int, Field(strict=True, ge=0, le=2**31)]
ConfigDict_ = Annotated[dict[str, Any], Field(default_factory=dict, description="Plug-in specific config.")]

DEFAULT_RUN = "default"
RunStatus = Literal["running", "completed", "failed", "aborted"]


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorBody(BaseModel):
    """Every error response: a stable machine-readable ``code`` and a ``detail`` naming the problem
    (for request validation errors, pydantic's list of errors)."""

    code: str = Field(description="Stable machine-readable code, e.g. `env_not_found`, `invalid_action`.")
    detail: str | list[dict[str, Any]] = Field(
        description="The problem in words; for a malformed request, pydantic's list of errors."
    )


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
    base_url: str = Field(description="This service's public URL (SERVICE_BASE_URL).")
    version: str = Field(description="grpo-service's version.")
    endpoints: dict[str, str] = Field(description="Route families by name, e.g. `rollout: /rollout`.")


class InferenceInfo(BaseModel):
    base_url: str = Field(description="Default OpenAI-compatible server for LLM policies (VLLM_BASE_URL).")
    endpoints: dict[str, str] = Field(description="The inference routes the policies call.")
    default_model: str | None = Field(description="DEFAULT_MODEL; null: the server's first listed model.")


class PluginInfo(BaseModel):
    name: str = Field(description="The name to pass as `env_name` or `policy_name`.")
    version: str = Field(description="The plug-in's version.")
    description: str = Field(description="What it is.")
    config_schema: dict[str, Any] = Field(description="JSON schema of its `config`.")
    env_name: str | None = Field(default=None, description="A policy's environment (null: any).")
    uses_inference: bool = Field(default=False, description="The policy calls an LLM.")


class Limits(BaseModel):
    max_envs: int = Field(description="Live envs at most (429 beyond).")
    max_policies: int = Field(description="Live policies at most (429 beyond).")
    max_active_runs: int = Field(description="Running rollouts at most, group members included.")
    max_group_size: int = Field(description="Largest `group_size` of /rollout/group.")
    idle_ttl_s: float = Field(description="Idle envs and policies are terminated after this many seconds.")
    max_request_bytes: int = Field(description="Larger request bodies get 413.")


class ServiceInfo(BaseModel):
    service: ServiceEndpoints = Field(description="Where the service is and its routes.")
    inference: InferenceInfo = Field(description="The default inference server.")
    environments: list[PluginInfo] = Field(description="Environment plug-ins with their config schemas.")
    policies: list[PluginInfo] = Field(description="Policy plug-ins with their config schemas.")
    limits: Limits = Field(description="Capacity and size limits.")
    auth_required: bool = Field(description="Every route but /health needs X-API-Key.")
    snapshot_store: str = Field(description="Where snapshots are written.")
    tracing: str | None = Field(description="The trace DB every rollout is written to (null: off).")


class Health(BaseModel):
    status: Literal["healthy"] = Field(description="Always `healthy` when the service answers.")
    version: str = Field(description="grpo-service's version.")
    instance: str = Field(
        description="This process's tag: the prefix of the env, policy and run ids it issues "
        "(through Ray, each host's tag prefixes its ids)."
    )
    workers: int = Field(description="Processes holding live objects: 1 embedded, else the live Ray hosts.")
    lost_hosts: list[str] = Field(
        default_factory=list, description="Ray hosts found dead: their envs, policies and runs are gone."
    )
    uptime_s: float = Field(description="Seconds since this process started serving.")
    envs: int = Field(description="Live envs (of every Ray host when served through Ray).")
    policies: int = Field(description="Live policies (of every Ray host).")
    runs_active: int = Field(description="Running rollouts (of every Ray host).")
    capacity: dict[str, int] = Field(description="`max_envs`, `max_policies`, `max_active_runs`.")
    tracing: dict[str, int] | None = Field(
        default=None,
        description="Trace writer counters (written, dropped, failed, queued) when tracing is on.",
    )
    timestamp: str = Field(
        default="", description="Now, ISO 8601 UTC.", examples=["2026-11-23T10:00:00+00:00"]
    )
    active_jobs: int = Field(default=0, description="Training jobs pending or running.")
    loaded_models: int = Field(default=0, description="Trained models cached in memory for /inference.")


# ------------------------------------------------------------------------------------- env

# What a user pastes in place of these: the id an earlier call returned (tests substitute live ids).
ENV_ID = "<env_id from /env/create>"
POLICY_ID = "<policy_id from /policy/create>"
ENV_SNAPSHOT_ID = "<snapshot_id from /env/snapshot>"
POLICY_SNAPSHOT_ID = "<snapshot_id from /policy/snapshot>"
RUN_ID = "<run_id from /rollout/start>"

SYNTH_COMPAT_HELP = "Accepted and ignored, so that Synth's task-app clients (which send it) are not refused."
RunOwner = Annotated[
    RunId,
    Field(
        description="Owner of the objects this creates: groups their snapshots on disk and filters listings."
    ),
]


def request_config(*examples: dict[str, Any], strict: bool = False) -> ConfigDict:
    """A request model's config: unknown fields refused (``strict``: no type coercion either) and
    its examples, the first being the body Swagger UI's "Try it out" starts from."""
    return ConfigDict(extra="forbid", strict=strict, json_schema_extra={"examples": list(examples)})


class EnvCreateRequest(Request):
    """Create an environment; its first episode starts at once."""

    model_config = request_config(
        {"env_name": "crafter", "config": {}, "seed": 42, "rl_run_id": "test-run-1"}
    )

    env_name: Name = Field(description="An environment plug-in from GET /info, e.g. `crafter`.")
    config: ConfigDict_
    seed: Seed | None = Field(default=None, description="World seed; 0 when omitted.")
    parent_env_id: Id | None = Field(default=None, description="Lineage only: recorded, not copied.")
    rl_run_id: RunOwner = DEFAULT_RUN


class EnvState(BaseModel):
    env_id: str = Field(description="The env's id.")
    observation: dict[str, Any] = Field(description="What the env shows now (Crafter: `text` and fields).")
    info: dict[str, Any] | None = Field(default=None, description="Env-specific extra information.")
    step_idx: int = Field(description="Steps taken in the current episode.")
    done: bool = Field(default=False, description="The episode has ended.")


class EnvCreateResponse(EnvState):
    pass


class EnvResetRequest(Request):
    """Start a new episode."""

    model_config = request_config({"env_id": ENV_ID, "seed": 7})

    env_id: Id = Field(description="The env to reset.")
    seed: Seed | None = Field(default=None, description="The new episode's world seed (default: the env's).")


class EnvResetResponse(EnvState):
    pass


class EnvAction(Request):
    """What one step executes: exactly one of ``action``, ``actions`` or ``tool_calls``."""

    model_config = request_config(
        {"actions": ["move_left", "do"]},
        {"action": "do"},
        {"tool_calls": [{"tool": "interact_many", "args": {"actions": ["move_up", "do"]}}]},
    )

    action: Action | None = Field(default=None, description="One action, by name or index.")
    actions: list[Action] | None = Field(
        default=None, min_length=1, max_length=64, description="Actions run in order (stops at episode end)."
    )
    tool_calls: list[dict[str, Any]] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        description="A policy's tool calls, as /policy/step returns.",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> EnvAction:
        given = [n for n in ("action", "actions", "tool_calls") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of 'action', 'actions' or 'tool_calls'")
        return self

    def step_args(self) -> dict[str, Any]:
        """The keyword arguments of `EnvManager.step` that execute it."""
        if self.tool_calls is not None:
            return {"tool_calls": self.tool_calls}
        return {"actions": self.actions if self.actions is not None else [self.action]}


class EnvStepRequest(EnvAction):
    """Give exactly one of ``action``, ``actions`` or ``tool_calls``."""

    model_config = request_config(
        {"env_id": ENV_ID, "actions": ["move_left", "do"]},
        {"env_id": ENV_ID, "action": "do"},
        {
            "env_id": ENV_ID,
            "tool_calls": [{"tool": "interact_many", "args": {"actions": ["move_up", "do"]}}],
        },
    )

    env_id: Id = Field(description="The env to step.")


class EnvStepResponse(BaseModel):
    env_id: str = Field(description="The env that was stepped.")
    observation: dict[str, Any] = Field(description="What the env shows after the step.")
    reward: float = Field(description="Reward of this step (all its actions).")
    done: bool = Field(description="The episode has ended (death, or the step cap).")
    truncated: bool = Field(description="It ended at the step cap rather than by the game.")
    info: dict[str, Any] = Field(description="e.g. `achievements_unlocked`, `actions`, `actions_executed`.")
    step_idx: int = Field(description="Steps taken in the episode.")


class SnapshotRequest(Request):
    rl_run_id: RunId | None = Field(default=None, description="Defaults to the instance's rl_run_id.")


class EnvSnapshotRequest(SnapshotRequest):
    """Save an env's full live state as a signed tarball."""

    model_config = request_config({"env_id": ENV_ID})

    env_id: Id = Field(description="The env to save.")


class SnapshotResponse(BaseModel):
    snapshot_id: str = Field(description="Pass it to /env/restore or /policy/restore (or /rollout).")
    kind: Literal["env", "policy"] = Field(description="What was saved.")
    path: str = Field(description="Where the tarball is in the snapshot store.")
    rl_run_id: str = Field(description="The owner it was filed under.")
    size: int = Field(description="Bytes.")
    created_at: float = Field(description="Unix time.")
    parent_snapshot_id: str | None = Field(default=None, description="The snapshot it descends from.")


class RestoreRequest(Request):
    snapshot_id: Id = Field(description="The snapshot to restore (its kind must match the route's).")
    rl_run_id: RunId | None = Field(default=None, description="Optional: where to look first.")


class EnvRestoreRequest(RestoreRequest):
    """A new env that continues exactly where the snapshot was taken."""

    model_config = request_config({"snapshot_id": ENV_SNAPSHOT_ID})


class EnvRestoreResponse(EnvState):
    parent_snapshot_id: str = Field(description="The snapshot it was restored from.")
    parent_env_id: str | None = Field(default=None, description="The env that snapshot was taken of.")


class EnvTerminateRequest(Request):
    """Release an env. Idempotent."""

    model_config = request_config({"env_id": ENV_ID})

    env_id: Id = Field(description="The env to release.")


class TerminateResponse(BaseModel):
    ok: bool = Field(default=True, description="Always true: terminating is idempotent.")
    existed: bool = Field(description="It was live (false: already gone).")


# ---------------------------------------------------------------------------------- policy


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


# --------------------------------------------------------------------------------- rollout

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
    llm_timeout_s: float | None = Field(default=None, gt=0, description="Per LLM call; default service's.")


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


class ForkPlan(Request):
    """Where a group's root rollouts fork, and into how many continuations each.

    A fork at turn ``t`` copies the root's env and policy exactly as they are before its decision
    ``t`` (the branch machinery, not a replay) into ``continuations`` new members, which play on
    from there. Give exactly one of ``at_turns``, ``every`` or ``rule``."""

    model_config = request_config(
        {"every": 2, "continuations": 2},
        {"at_turns": [2, 4], "continuations": 3},
        {"rule": "max_entropy", "count": 2, "continuations": 2},
    )

    at_turns: list[Annotated[int, Field(strict=True, ge=1, le=MAX_TURNS)]] | None = Field(
        default=None, max_length=64, description="Fork at these turns (decision indices, 1 or more)."
    )
    every: int | None = Field(
        default=None, strict=True, ge=1, le=MAX_TURNS, description="Fork at turns k, 2k, 3k, ..."
    )
    rule: Literal["max_entropy"] | None = Field(
        default=None,
        description="Choose the turns after each root has played: `max_entropy` forks at the `count` "
        "turns (after the first) whose sampled tokens were least likely (highest mean -logprob, the "
        "policy's entropy estimated from its own samples; needs recorded logprobs).",
    )
    count: int = Field(default=1, strict=True, ge=1, le=64, description="With `rule`: fork turns per root.")
    continuations: int = Field(
        default=2, strict=True, ge=1, le=64, description="K: new members started at each fork."
    )

    @model_validator(mode="after")
    def _one_way(self) -> ForkPlan:
        given = [n for n in ("at_turns", "every", "rule") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError("fork: give exactly one of 'at_turns', 'every' or 'rule'")
        if self.at_turns is not None:
            if not self.at_turns:
                raise ValueError("fork.at_turns: give at least one turn")
            self.at_turns = sorted(set(self.at_turns))
        return self

    def fixed_turns(self, max_turns: int) -> list[int] | None:
        """The fork turns known before playing (those a root of ``max_turns`` can reach), or None
        when a rule chooses them after each root has played."""
        if self.at_turns is not None:
            return [t for t in self.at_turns if t < max_turns]
        if self.every is not None:
            return list(range(self.every, max_turns, self.every))
        return None

    def forks_per_root(self, max_turns: int) -> int:
        fixed = self.fixed_turns(max_turns)
        return len(fixed) if fixed is not None else min(self.count, max(0, max_turns - 1))


class RolloutGroupRequest(RolloutPlan):
    """G rollouts from the same start, each with its own policy instance and sampling."""

    model_config = request_config(
        {
            "group_size": 4,
            "env": {"env_name": "crafter", "seed": 123},
            "policy": {"policy_name": "crafter-random", "config": {"seed": 0}},
            "max_turns": 20,
        },
        {
            "group_size": 8,
            "env": {"env_name": "crafter", "seed": 123},
            "policy": {"policy_name": "crafter-react", "config": {"temperature": 1.0}},
            "max_turns": 20,
            "record": {"logprobs": True},
            "safety": {"max_time_s": 600},
        },
        {
            "group_size": 4,
            "env": {"env_name": "crafter", "seed": 123},
            "policy": {"policy_name": "crafter-random", "config": {"seed": 0}},
            "max_turns": 20,
            "fork": {"every": 5, "continuations": 2},
        },
    )

    group_id: RunId | None = Field(
        default=None, description="Generated when omitted; members are `{id}.{i}`."
    )
    group_size: int = Field(ge=1, le=1024, description="G: rollouts in the group.")
    env: RolloutEnvSpec = Field(description="The common start: `env_name` + `seed`, or `snapshot_id`.")
    policy: RolloutPolicySpec = Field(description="`policy_name` + `config`: each member gets its own.")
    on_done: Literal["reset", "terminate"] = Field(
        default="terminate", description="At the end of an episode: start the next one, or stop."
    )
    vary_policy_seed: bool = Field(
        default=True, description="Give member i the policy config seed + i (when the policy has a seed)."
    )
    fork: ForkPlan | None = Field(
        default=None,
        description="Fork each of the G roots mid-episode into continuations (a tree of rollouts; needs "
        "`max_turns` and `on_done: terminate`). Members G and up are the continuations.",
    )

    @model_validator(mode="after")
    def _sources(self) -> RolloutGroupRequest:
        if self.env.env_id is not None:
            raise ValueError(
                "env: a group starts from 'env_name' (+ seed) or 'snapshot_id', not a live env_id"
            )
        if self.policy.policy_id is not None:
            raise ValueError("policy: a group needs 'policy_name' (each member gets its own instance)")
        if self.fork is not None:
            if self.max_turns is None or self.ops is not None:
                raise ValueError("fork: a forking group takes 'max_turns', not 'ops'")
            if self.on_done != "terminate":
                raise ValueError("fork: a forking group plays one episode per member (on_done 'terminate')")
            if self.fork.rule is not None and self.record.logprobs is False:
                raise ValueError("fork.rule: max_entropy reads the sampled logprobs; keep record.logprobs on")
        return self

    def tree_size(self) -> int:
        """Members at most: the G roots and every continuation their forks may start."""
        if self.fork is None or self.max_turns is None:
            return self.group_size
        per_root = self.fork.forks_per_root(self.max_turns) * self.fork.continuations
        return self.group_size * (1 + per_root)


class GroupMember(BaseModel):
    group_index: int = Field(description="Index in the group.")
    run_id: str = Field(description="The member's run id (`{group_id}.{index}`).")
    status: Literal["completed", "failed", "aborted"] = Field(description="How the member ended.")
    result: RolloutResponse | None = Field(
        default=None, description="Its rollout (null if it failed outright)."
    )
    error: str | None = Field(default=None, description="Why it failed outright.")


class ForkNode(BaseModel):
    """One fork of a tree: a state of a root before its decision `turn`, and the members that
    continued from it (the parent's own continuation is one more sample of that state)."""

    parent_index: int = Field(description="The member whose state was copied.")
    turn: int = Field(description="The decision index at which it was copied.")
    children: list[int] = Field(description="The continuations' member indices.")
    surprisal: float | None = Field(
        default=None,
        description="The parent's mean -logprob over the tokens it sampled at this turn (what the "
        "`max_entropy` rule ranks by; null without recorded logprobs).",
    )


class GroupTree(BaseModel):
    """The tree a forking group played: G roots from one start, forks and their continuations."""

    roots: list[int] = Field(description="The root members' indices (0..G-1).")
    forks: list[ForkNode] = Field(description="Every fork made, by parent and turn.")
    turns_played: int = Field(description="Decisions played over all members (shared prefixes once).")
    turns_shared: int = Field(
        description="Decisions the continuations did not replay because they started from a copy."
    )
    continuations_not_started: int = Field(
        description="Admitted continuations that never ran (their root ended before the fork turn)."
    )
    fork_s: float = Field(
        description="Seconds during which the group was reading or copying env and policy states for "
        "forks (forks that overlapped counted once)."
    )


class GroupMetrics(BaseModel):
    returns: list[float | None] = Field(
        description="Each member's mean return, in index order (a continuation's: from its fork turn on)."
    )
    mean_return: float | None = Field(description="Mean over members (with `fork`: over the roots).")
    std_return: float | None = Field(
        description="Population standard deviation over members (with `fork`: over the roots)."
    )
    completed: int = Field(description="Members with status `completed`.")
    failed: int = Field(description="Members with status `failed`.")
    wall_time_s: float = Field(description="Seconds for the whole group.")
    llm_calls_without_tokens: int = Field(
        default=0, description="Summed over members: LLM calls recorded without token ids or logprobs."
    )


class RolloutGroupResponse(BaseModel):
    group_id: str = Field(description="The group's id.")
    members: list[GroupMember] = Field(
        description="Always G members in index order; with `fork`, then the continuations that ran."
    )
    metrics: GroupMetrics = Field(description="Returns across the group.")
    warnings: list[str] = Field(default_factory=list, description="The members' warnings, each once.")
    tree: GroupTree | None = Field(default=None, description="With `fork`: the tree's shape.")


class RunStarted(BaseModel):
    run_id: str = Field(description="The run's (or group's) id.")
    status: Literal["running"] = Field(description="Always `running`.")
    status_url: str = Field(description="Poll it for progress and, once finished, the result.")


# ---------------------------------------------------------------------------------- branch


class BranchRequest(Request):
    """Fork live envs and policies into exact copies."""

    model_config = request_config({"env_ids": [ENV_ID], "num_children": 2})

    env_ids: list[Id] = Field(default_factory=list, max_length=64, description="Envs to fork.")
    policy_ids: list[Id] = Field(default_factory=list, max_length=64, description="Policies to fork.")
    num_children: int = Field(default=1, ge=1, le=256, description="Copies of each.")
    max_branches: int = Field(default=256, ge=1, le=4096, description="Cap on children in total.")
    rl_run_id: RunId | None = Field(
        default=None, description="Owner of the children (default: the parent's)."
    )

    @model_validator(mode="after")
    def _bounds(self) -> BranchRequest:
        if not self.env_ids and not self.policy_ids:
            raise ValueError("give at least one of 'env_ids' or 'policy_ids'")
        total = (len(self.env_ids) + len(self.policy_ids)) * self.num_children
        if total > self.max_branches:
            raise ValueError(f"{total} children requested, more than max_branches={self.max_branches}")
        return self


class BranchChild(BaseModel):
    id: str = Field(description="The child's env or policy id.")
    parent_id: str = Field(description="The env or policy it copies.")
    parent_snapshot_id: str = Field(description="The snapshot it was made from.")
    child_index: int = Field(description="Index among the parent's children.")
    bound_env_id: str | None = Field(default=None, description="A policy child's env.")


class BranchResponse(BaseModel):
    env_branches: dict[str, list[str]] = Field(description="Parent env id → child env ids.")
    policy_branches: dict[str, list[str]] = Field(description="Parent policy id → child policy ids.")
    children: list[BranchChild] = Field(description="Every child with its lineage.")


# ------------------------------------------------------------------------------------ runs


class RunAbortRequest(Request):
    """Stop a running rollout or group now; partial trajectories are kept."""

    model_config = request_config({"run_id": RUN_ID})

    run_id: Id = Field(description="A rollout's or a group's id.")


class RunAbortResponse(BaseModel):
    ok: bool = Field(description="The abort was signalled.")
    run_id: str = Field(description="The run.")
    status: str = Field(description="Its status at the time (it stops promptly after).")


class RunMemberStatus(BaseModel):
    group_index: int = Field(description="The member's index in the group.")
    run_id: str = Field(description="The member's own run id (`{group_id}.{index}`).")
    status: RunStatus = Field(description="Where it stands.")
    ops_executed: int = Field(description="Ops the member has done.")
    ops_total: int = Field(description="Ops the member was asked for.")


class RunProgress(BaseModel):
    """Where a run stands: what /run/status and /run/list both show."""

    run_id: str = Field(description="The id for /run/status/{run_id} and /run/abort.")
    kind: Literal["rollout", "group"] = Field(description="A single rollout or a GRPO group.")
    status: RunStatus = Field(description="Where it stands.")
    started_at: float = Field(description="Unix time it started.")
    finished_at: float | None = Field(description="Unix time it finished; null while running.")
    ops_executed: int = Field(description="Ops done so far (a group: summed over its members).")
    ops_total: int = Field(description="Ops requested (a group: summed over its members).")


class RunStatusResponse(RunProgress):
    timings: dict[str, float] = Field(description="`llm_s`, `env_s` so far (a group: summed).")
    error: str | None = Field(default=None, description="Why it failed, if it did.")
    members: list[RunMemberStatus] | None = Field(
        default=None, description="A group's members and their progress (null for a single rollout)."
    )
    result: RolloutResponse | RolloutGroupResponse | None = Field(
        default=None, description="The full result once finished (start-then-poll)."
    )


# --------------------------------------------------------------------------------- listing


class PageInfo(BaseModel):
    total: int = Field(description="Entries matching the filter in this process.")
    offset: int = Field(description="Index of the first entry of this page.")
    limit: int = Field(description="Largest page size asked for.")
    next_offset: int | None = Field(description="`offset` of the next page; null on the last page.")


class LiveObjectSummary(BaseModel):
    """What every listed env and policy shows: its owner, age and use."""

    rl_run_id: str = Field(description="The owner: the `rl_run_id` given at creation.")
    created_at: float = Field(description="Unix time of creation.")
    age_s: float = Field(description="Seconds since creation.")
    idle_s: float = Field(description="Seconds since last use; idle objects are reaped after IDLE_TTL_S.")
    in_use: bool = Field(description="A running rollout or request is using it.")


class EnvSummary(LiveObjectSummary):
    env_id: str = Field(description="The id to pass to /env/step, /env/snapshot, ...")
    env_name: str = Field(description="The environment plug-in, e.g. `crafter`.")
    step_idx: int | None = Field(description="Steps taken in the current episode.")
    done: bool = Field(description="The current episode has ended (reset it to play on).")
    parent_env_id: str | None = Field(default=None, description="The env it was branched from.")


class EnvList(PageInfo):
    envs: list[EnvSummary] = Field(description="Oldest first.")


class PolicySummary(LiveObjectSummary):
    policy_id: str = Field(description="The id to pass to /policy/step, /rollout, ...")
    policy_name: str = Field(description="The policy plug-in, e.g. `crafter-react`.")
    bound_env_id: str | None = Field(description="The env whose observations it reads by default.")


class PolicyList(PageInfo):
    policies: list[PolicySummary] = Field(description="Oldest first.")


class RunSummary(RunProgress):
    rl_run_id: str = Field(description="The owner: the request's `rl_run_id`.")
    age_s: float = Field(description="Seconds since it started.")


class RunList(PageInfo):
    runs: list[RunSummary] = Field(description="Oldest first; finished runs are kept for a while.")


# ------------------------------------------------------------------------ batch rollouts


class BatchRolloutsRequest(Request):
    """Seed 003's batch: one rollout per task id, each played by the env's LLM agent."""

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
