"""OpenEnv's wire format: the WebSocket frames, their error codes, and the JSON shapes that
``/schema``, ``/metadata`` and ``/health`` describe (OpenEnv 0.10's, field for field)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from fastapi.encoders import jsonable_encoder
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from envs.base import Environment
from grpo_service.models import EnvAction, RunId, Seed


class ErrorCode(StrEnum):
    """OpenEnv's `WSErrorCode`: the ``code`` of an ``error`` frame."""

    INVALID_JSON = "INVALID_JSON"
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    VALIDATION_ERROR = "VALIDATION_ERROR"
    EXECUTION_ERROR = "EXECUTION_ERROR"
    CAPACITY_REACHED = "CAPACITY_REACHED"
    FACTORY_ERROR = "FACTORY_ERROR"
    SESSION_ERROR = "SESSION_ERROR"


class FrameError(Exception):
    """Answered with an ``error`` frame; ``extra`` goes beside ``message`` and ``code``.
    ``fatal``: the session cannot go on (its env is gone), so the socket closes after it."""

    def __init__(self, code: ErrorCode, message: str, *, fatal: bool = False, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.fatal = fatal
        self.extra = extra

    def frame(self) -> dict[str, Any]:
        return {"type": "error", "data": {"message": self.message, "code": self.code.value, **self.extra}}


def validation_failed(exc: ValidationError, what: str) -> FrameError:
    """A ``VALIDATION_ERROR`` frame with pydantic's errors (without the offending input)."""
    errors = [{k: e[k] for k in ("type", "loc", "msg") if k in e} for e in exc.errors()]
    return FrameError(ErrorCode.VALIDATION_ERROR, f"invalid {what}", errors=jsonable_encoder(errors))


class Frame(BaseModel):
    """A client's frame: ``type`` and, depending on it, ``data`` (reset, step, mcp) or the
    ``tool_name`` and ``arguments`` of a ``call_tool``."""

    model_config = ConfigDict(extra="forbid")

    type: str = Field(max_length=64)
    data: dict[str, Any] | None = None
    tool_name: str | None = Field(default=None, max_length=128)
    arguments: dict[str, Any] | None = None


class ResetOptions(BaseModel):
    """A ``reset`` frame's data. Every other field is the env's config: given, the env is rebuilt
    with that config; absent, the env keeps the config it has."""

    model_config = ConfigDict(extra="allow")

    seed: Seed | None = Field(default=None, description="The episode's seed (a text game: its task index).")
    episode_id: str | None = Field(
        default=None, max_length=256, description="Your name for the episode (generated when omitted)."
    )
    rl_run_id: RunId | None = Field(
        default=None, description="Owner of the env and the trace (default: `openenv`)."
    )

    def config(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


# A step frame's action: a text action of any length (the frame's size bounds it), so that a
# model's long reply is the env's to refuse, answered as an invalid action, not an error frame.
FrameAction = str | Annotated[int, Field(strict=True, ge=0, le=2**31)]


class StepData(EnvAction):
    """A ``step`` frame's data: `EnvAction`'s fields, its text actions not capped in length."""

    action: FrameAction | None = Field(default=None, description="One action, by name, index or text.")
    actions: list[FrameAction] | None = Field(
        default=None, min_length=1, max_length=64, description="Actions run in order (stops at episode end)."
    )


class Observation(BaseModel):
    """What an ``observation`` frame's ``data.observation`` holds: the env's observation (``text``,
    the rendering an LLM reads, and the env's structured fields) and ``metadata``."""

    model_config = ConfigDict(extra="allow")

    text: str = Field(description="The observation as an LLM reads it.")
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description="`env_id`, `episode_id`, `step_idx`, `truncated` and the env's `info`.",
    )
    done: bool = Field(default=False, description="The episode has ended.")
    reward: float | None = Field(default=None, description="The step's reward (null after a reset).")


class State(BaseModel):
    """A ``state`` frame's data."""

    episode_id: str | None = Field(description="The reset's `episode_id` (or a generated one).")
    step_count: int = Field(ge=0, description="Step frames (and tool calls) since the reset.")
    env_id: str | None = Field(
        description="The service's env: /env/snapshot, /branch, /env/list and /rollout take this id "
        "(null until the socket's first reset or step builds it)."
    )
    env_name: str = Field(description="The environment plug-in.")
    session_id: str = Field(description="This session (MCP's `session_id`).")
    seed: int | None = Field(description="The seed the env was reset with.")
    step_idx: int = Field(description="The env's own step counter (a multi-action step counts each action).")
    done: bool = Field(description="The episode has ended.")


class Metadata(BaseModel):
    """``GET /metadata``: OpenEnv's `EnvironmentMetadata` and the env's tools and config."""

    name: str = Field(description="The environment plug-in.")
    description: str = Field(description="What it is.")
    readme_content: str | None = Field(default=None, description="How to play it over OpenEnv.")
    version: str | None = Field(default=None, description="The plug-in's version.")
    author: str | None = Field(default=None, description="Who serves it.")
    documentation_url: str | None = Field(default=None, description="Where the protocol is described.")
    tools: list[dict[str, Any]] = Field(description="The tools (OpenAI function schemas) it acts through.")
    config_schema: dict[str, Any] = Field(description="JSON schema of the config a reset may carry.")


class Schemas(BaseModel):
    """``GET /schema``: JSON schemas of the env's own action (a step's data), observation (and the
    reset's, which adds the env's ``vocabulary``) and state, as OpenEnv publishes an env's classes."""

    action: dict[str, Any] = Field(description="A step's data: `action`, one action as a model writes it.")
    observation: dict[str, Any] = Field(description="An observation frame's `observation`.")
    state: dict[str, Any] = Field(description="A state frame's data.")
    reset_observation: dict[str, Any] | None = Field(default=None, description="A reset's `observation`.")


class ResetObservation(Observation):
    vocabulary: str = Field(
        description="The actions this env takes, as a model is told of them; the reset's `text` ends with it."
    )


def env_schemas(cls: type[Environment]) -> Schemas:
    """The `Schemas` of environment ``cls``: its action (the field it needs required, its
    vocabulary, its examples), its observation's fields and its state."""
    title = cls.__name__.removesuffix("Env")
    action = {
        "title": f"{title}Action",
        "description": f"One step of {cls.name}: `action`, one action as a model writes it. A step "
        "frame takes `actions` (a list run in order) or `tool_calls` instead of it, too.",
        "type": "object",
        "properties": {
            "action": cls.action_schema(),
            "metadata": {
                "type": "object",
                "description": "Accepted and ignored (every OpenEnv Action has it).",
            },
        },
        "required": ["action"],
        "examples": [{"action": example} for example in cls.action_examples],
    }
    doc = f"A {cls.name} observation: `text`, the env's fields, and OpenEnv's `metadata`, `done`, `reward`."
    observation = type(f"{title}Observation", (Observation, cls.observation_model), {"__doc__": doc})
    reset = type(f"{title}ResetObservation", (ResetObservation, cls.observation_model), {"__doc__": doc})
    env_name = (Literal[cls.name], Field(description="The environment plug-in."))  # type: ignore[valid-type]
    state = create_model(
        f"{title}State", __base__=State, __doc__=f"A {cls.name} session's state.", env_name=env_name
    )
    return Schemas(
        action=action,
        observation=observation.model_json_schema(),
        state=state.model_json_schema(),
        reset_observation=reset.model_json_schema(),
    )


class HealthStatus(BaseModel):
    status: str = Field(default="healthy", description="Always `healthy` when the server answers.")
