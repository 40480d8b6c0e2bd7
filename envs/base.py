"""The two plug-in contracts of the task app: environments and policies.

An environment is a synchronous, CPU-bound object (the service runs it in a worker thread);
a policy is asynchronous (it usually waits on an LLM). Both are found by name in the
registries at the bottom of this module, so adding one never touches the HTTP layer:
write a class, decorate it with ``@register_environment`` / ``@register_policy``, and import
its module from ``envs/__init__.py``.

Nothing here imports FastAPI. Their errors are plain exceptions (`envs/errors.py`); the service maps
them to 4xx.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envs.errors import InvalidConfig, InvalidState, UnknownPlugin, validation_problems
from inference.calls import LLMCall

# --------------------------------------------------------------------------------------------
# Environments
# --------------------------------------------------------------------------------------------


class PluginConfig(BaseModel):
    """Base of every plug-in config: unknown keys are an error, not silently ignored."""

    model_config = ConfigDict(extra="forbid")


@dataclass(slots=True)
class StepResult:
    """What an environment returns from ``reset``/``step``/``observe`` (JSON-safe fields only).

    ``observation`` holds structured fields plus ``"text"``, the rendering shown to an LLM.
    For a multi-action step, ``reward`` is the sum over the ticks taken, ``done`` is true if
    the episode ended (the remaining actions were not executed), ``info["actions_executed"]``
    says how many ran, and ``info["achievements_unlocked"]`` lists achievements first unlocked
    during this call.
    """

    observation: dict[str, Any]
    reward: float
    done: bool
    truncated: bool
    info: dict[str, Any]
    step_idx: int

    def refusal(self, message: str) -> StepResult:
        """The answer to an action the env refused (`InvalidAction`) after this result, as
        AgentGym's servers answer an action their game does not know: this observation with the
        env's ``message`` as its text, reward 0, nothing executed; ``info["invalid_action"]``
        holds the message."""
        return StepResult(
            observation={**self.observation, "text": message},
            reward=0.0,
            done=self.done,
            truncated=self.truncated,
            info={"invalid_action": message, "actions_executed": 0},
            step_idx=self.step_idx,
        )


@dataclass(frozen=True, slots=True)
class Frame:
    """The current state drawn for people (the trace viewer), never shown to a policy.

    ``png``: an image (PNG bytes), for games with a picture (Crafter, BabyAI's grid).
    ``text``: a fixed-width text rendering, for games without one (or beside the image).
    """

    png: bytes | None = None
    text: str | None = None


class ObservationFields(BaseModel):
    """An env's observation as consumers are told of it: ``text`` (what an LLM reads) and the
    env's structured fields, which an env's subclass declares (an env may add more)."""

    model_config = ConfigDict(extra="allow")

    text: str = Field(description="The observation as an LLM reads it.")


ConfigT = TypeVar("ConfigT", bound=PluginConfig)
StateT = TypeVar("StateT", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class EpisodeOutcome:
    """One evaluated episode, as an environment's evaluation metrics see it."""

    total_return: float
    achievements: tuple[str, ...] = ()
    turns: int = 0
    steps: int = 0


def parse_config(model: type[PluginConfig], config: dict[str, Any] | None, what: str) -> PluginConfig:
    """Validate a raw config dict, or raise `InvalidConfig` naming the plug-in and the fields."""
    try:
        return model.model_validate(config or {})
    except ValidationError as exc:
        raise InvalidConfig(f"invalid config for {what}: {exc}") from exc


class Environment(abc.ABC, Generic[ConfigT]):
    """A stateful environment instance.

    Implementations must be deterministic: the same config, seed and actions give the same
    trajectory, in any process; and ``from_state(get_state())`` continues bit-identically.
    """

    name: ClassVar[str]
    version: ClassVar[str] = "1"
    config_model: ClassVar[type[PluginConfig]] = PluginConfig
    description: ClassVar[str] = ""
    # Steps of at most this many actions take a few milliseconds at most: the service runs
    # them on its event loop instead of handing each to a worker thread (the hand-off and GIL
    # contention cost more CPU than a short step). Longer steps, resets and snapshots use threads.
    inline_step_max_actions: ClassVar[int] = 0
    # Achievements an episode can unlock, in the order evaluation reports them (none: a task).
    achievements: ClassVar[tuple[str, ...]] = ()
    # Whether ``get_state`` works mid-episode, so that a forking GRPO group can copy it at any
    # turn. An env whose state lives where it cannot be read (a remote session) says False.
    snapshots_mid_episode: ClassVar[bool] = True

    # What its observations hold, for consumers (OpenEnv's `/schema`).
    observation_model: ClassVar[type[ObservationFields]] = ObservationFields
    # The actions a model may write, for consumers that show them to one (OpenEnv's `/schema` and
    # first observation): each an exact action or a form ("get N item"), and a few examples.
    action_forms: ClassVar[tuple[str, ...]] = ()
    action_examples: ClassVar[tuple[str | int, ...]] = ()

    config: ConfigT
    seed: int

    @classmethod
    def vocabulary(cls) -> str:
        """The actions as a model is told of them before its first move."""
        return "Actions: " + ", ".join(f'"{form}"' for form in cls.action_forms) + "."

    @classmethod
    def action_schema(cls) -> dict[str, Any]:
        """JSON schema of one action as a model writes it (default: a text command of one of
        ``action_forms``)."""
        return {
            "type": "string",
            "description": f"One {cls.name} action. {cls.vocabulary()}",
            "examples": list(cls.action_examples),
        }

    @classmethod
    def create(cls, config: dict[str, Any] | None, seed: int | None) -> Environment:
        """Validate a raw config dict and build an instance (not yet reset)."""
        return cls(parse_config(cls.config_model, config, f"environment {cls.name!r}"), seed)  # type: ignore[arg-type]

    @abc.abstractmethod
    def __init__(self, config: ConfigT, seed: int | None) -> None: ...

    @abc.abstractmethod
    def reset(self, seed: int | None = None) -> StepResult:
        """Start a new episode (with ``seed`` if given, else the instance's seed)."""

    @abc.abstractmethod
    def step(self, actions: Sequence[str | int]) -> StepResult:
        """Validate every action first (``InvalidAction``, nothing executed), then run them."""

    @abc.abstractmethod
    def observe(self) -> StepResult:
        """The current observation, without advancing (reward 0)."""

    @abc.abstractmethod
    def actions_from_tool_calls(self, tool_calls: Sequence[dict[str, Any]]) -> list[str | int]:
        """Turn the tool calls a policy emitted into actions (``InvalidAction`` if none valid)."""

    @classmethod
    def tools(cls) -> list[dict[str, Any]]:
        """The tools an agent acts through, as OpenAI function schemas: the calls that
        `actions_from_tool_calls` executes (an LLM policy of this env offers the same ones)."""
        return []

    @property
    @abc.abstractmethod
    def step_idx(self) -> int: ...

    @property
    @abc.abstractmethod
    def done(self) -> bool: ...

    @abc.abstractmethod
    def get_state(self) -> bytes:
        """The full live state, compact and free of constant data. Never a pickle."""

    @classmethod
    @abc.abstractmethod
    def from_state(cls, state: bytes) -> Environment:
        """Rebuild an instance from ``get_state()`` output (``InvalidState`` if unusable)."""

    def render_frame(self) -> Frame | None:
        """The current state as a `Frame` for the trace viewer, or None if the game has none.

        The viewer replays a recorded rollout (seed, then each step's actions) and calls this
        between steps, so it must neither change the state nor draw from the env's RNG.
        """
        return None

    @classmethod
    def eval_metrics(cls, episodes: Sequence[EpisodeOutcome]) -> dict[str, Any]:
        """This environment's own evaluation metrics over the scored episodes, reported beside
        the common ones (completed, total, avg_turns, ...). Default, for a task with a goal:
        ``success_rate`` (share of episodes with a positive return) and ``mean_score``."""
        n = len(episodes)
        return {
            "success_rate": sum(1 for e in episodes if e.total_return > 0) / n if n else 0.0,
            "mean_score": sum(e.total_return for e in episodes) / n if n else 0.0,
        }

    def state_metadata(self) -> dict[str, Any]:
        """Versions and facts recorded beside the state in a snapshot."""
        return {"env_name": self.name, "env_version": self.version, "seed": self.seed}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources. Idempotent."""


# --------------------------------------------------------------------------------------------
# Policies
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepOptions:
    """How one `Policy.step` runs.

    ``dry_run`` builds the inference request (returned in ``meta["inference_request"]``)
    without sending it; ``record_logprobs`` asks the server for token ids and logprobs;
    ``timeout_s`` bounds the LLM call (``None``: the policy's own timeout).
    """

    dry_run: bool = False
    record_logprobs: bool = False
    timeout_s: float | None = None


DRY_RUN = StepOptions(dry_run=True)


@dataclass(slots=True)
class PolicyDecision:
    """The result of one policy step.

    ``tool_calls`` are in the service's canonical shape ``{"id", "tool", "args"}``.
    ``error`` is set (and ``tool_calls`` may be empty) when the decision failed in a way
    the rollout should record rather than crash on: ``"no_tool_call"``, ``"invalid_action"``,
    ``"inference_error"``, ``"inference_timeout"``, ...
    """

    tool_calls: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)
    llm_call: LLMCall | None = None
    error: str | None = None
    error_detail: str | None = None

    @classmethod
    def no_oracle_action(cls, meta: dict[str, Any] | None = None) -> PolicyDecision:
        """The failed decision of a policy that plays the env's scripted solver (the ``oracle``
        policy, an agent with ``teacher: oracle``) when the observation carries no ``oracle_action``."""
        return cls(
            tool_calls=[],
            meta=meta or {},
            error="no_oracle_action",
            error_detail="the observation has no oracle_action: create the env with config "
            "{'oracle': true} (the solver may also have given up on this task)",
        )


@dataclass(slots=True)
class PolicyContext:
    """Service-wide defaults a policy may use (filled from the service settings)."""

    inference_url: str = "http://localhost:8001"
    model: str | None = None
    # The service's inference key: sent to `inference_url` and `key_urls` only, never to a URL
    # a caller names (that caller brings its own key in the policy config).
    api_key: str | None = None
    key_urls: tuple[str, ...] = ()
    request_timeout_s: float = 120.0
    max_retries: int = 3
    # The service's shared `inference.ClientPool` (connection reuse across policies); a policy
    # built without one (tests, scripts) makes its own client.
    client_pool: Any = None

    def api_key_for(self, url: str, own_key: str | None = None) -> str | None:
        """The key to send to ``url``: the policy's own if it has one; else the service's key
        (``None`` lets the client fall back to ``INFERENCE_API_KEY``/``OPENAI_API_KEY``) when
        ``url`` is the service's endpoint or in ``key_urls``; else ``"EMPTY"`` (no credentials)."""
        from inference.openai_client import same_endpoint  # inference imports this module

        if own_key:
            return own_key
        if any(same_endpoint(url, trusted) for trusted in (self.inference_url, *self.key_urls)):
            return self.api_key
        return "EMPTY"


class Policy(abc.ABC, Generic[ConfigT]):
    """A thin policy client: turns an observation into tool calls (usually via an LLM)."""

    name: ClassVar[str]
    version: ClassVar[str] = "1"
    config_model: ClassVar[type[PluginConfig]] = PluginConfig
    env_name: ClassVar[str | None] = None  # the environment it plays, if specific
    description: ClassVar[str] = ""
    uses_inference: ClassVar[bool] = False

    config: ConfigT

    @classmethod
    def create(cls, config: dict[str, Any] | None, context: PolicyContext) -> Policy:
        return cls(parse_config(cls.config_model, config, f"policy {cls.name!r}"), context)  # type: ignore[arg-type]

    @abc.abstractmethod
    def __init__(self, config: ConfigT, context: PolicyContext) -> None: ...

    @abc.abstractmethod
    async def step(self, observation: dict[str, Any], options: StepOptions = StepOptions()) -> PolicyDecision:
        """Decide on tool calls for ``observation`` (``options``: dry run, logprobs, timeout).

        Failures of the LLM are returned as ``PolicyDecision.error``, never raised; only caller
        mistakes raise ``PluginError``.
        """

    def observe_outcome(self, result: StepResult) -> None:  # noqa: B027 - optional hook
        """Called after the env executed this policy's tool calls (e.g. to keep history)."""

    def answer_invalid(self, error: str, detail: str | None) -> str | None:
        """The last decision could not be played (``error``: its kind, e.g. ``no_action``, or
        ``invalid_action`` when the env refused it). Return the feedback the policy shows its model
        in the next turn to go on (the turn is recorded as invalid and counts as a round), or None
        to end the episode with ``policy_error:<error>`` (the default)."""
        return None

    def reset(self) -> None:  # noqa: B027 - optional hook
        """Forget the episode's history (called when the bound env resets)."""

    @abc.abstractmethod
    def get_state(self) -> dict[str, Any]:
        """JSON-safe state: config, history window, turn index."""

    @classmethod
    @abc.abstractmethod
    def from_state(cls, state: dict[str, Any], context: PolicyContext) -> Policy: ...

    @classmethod
    def validated_state(cls, state_model: type[StateT], state: dict[str, Any]) -> tuple[StateT, Any]:
        """``state`` as ``state_model`` (which has ``policy`` and ``config`` fields) and the config
        in it, checked to be this policy's; `InvalidState` naming the problem otherwise."""
        try:
            parsed = state_model.model_validate(state)
            config = cls.config_model.model_validate(parsed.config)  # type: ignore[attr-defined]
        except ValidationError as exc:
            raise InvalidState(f"invalid {cls.name} state: {validation_problems(exc)}") from None
        if parsed.policy != cls.name:  # type: ignore[attr-defined]
            raise InvalidState(f"a {parsed.policy!r} state cannot restore a {cls.name!r} policy")  # type: ignore[attr-defined]
        return parsed, config

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release resources. Idempotent."""


# --------------------------------------------------------------------------------------------
# Registries of plug-ins, by name
# --------------------------------------------------------------------------------------------

ENVIRONMENTS: dict[str, type[Environment]] = {}
POLICIES: dict[str, type[Policy]] = {}

E = TypeVar("E", bound=type[Environment])
P = TypeVar("P", bound=type[Policy])
T = TypeVar("T")


def register_environment(cls: E) -> E:
    ENVIRONMENTS[cls.name] = cls
    return cls


def register_policy(cls: P) -> P:
    POLICIES[cls.name] = cls
    return cls


def _plugin(registry: dict[str, T], kind: str, name: str) -> T:
    if name not in registry:
        known = ", ".join(sorted(registry)) or "none"
        raise UnknownPlugin(f"unknown {kind} {name!r}; available: {known}")
    return registry[name]


def environment_class(name: str) -> type[Environment]:
    return _plugin(ENVIRONMENTS, "environment", name)


def policy_class(name: str) -> type[Policy]:
    return _plugin(POLICIES, "policy", name)
