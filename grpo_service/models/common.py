"""Shared pieces of every request and response: bounded ids and names, seeds, actions, the
error body, run statuses, op limits, and the config every request model uses."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

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
