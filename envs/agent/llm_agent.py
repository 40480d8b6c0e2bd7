"""`LLMAgent`: the one LLM policy loop every environment reuses.

An environment supplies only what is its own, by subclassing `LLMAgent` and overriding
small hooks (the way verifiers' ``MultiTurnEnv`` does):

- ``system_prompt()``: the rules of the game (the task instruction of the agentgym format);
- ``tools()``: its action space as OpenAI tool schemas (for the ``tool_calls`` format), and
  ``check_tool_call(call)``: whether one canonical call names valid actions;
- ``clean_text_action(text)``: how an ``Action: ...`` line reads as an action (agentgym format);
- ``observation_text(observation)``: how an observation reads as text;
- ``outcome_text(tool_calls, result)``: how the environment's answer to a tool call reads.

A reply the environment cannot use (no action line, no tool call, an invalid action) is answered,
not fatal, by default (``on_invalid_reply: "answer"``): the turn stays in the conversation, the
next prompt tells the model what was wrong, and the rollout goes on; ``"end"`` ends the episode
with ``policy_error:<kind>`` instead.

The agent owns the rest: the bounded history of turns, the messages in the selected prompt
format, the inference call (client pool, model discovery, retries, deadlines), token ids
and logprobs (exactly as the server returned them), failures as ``PolicyDecision.error``
(never raised, never a silent noop), and its JSON state for snapshots.
"""

from __future__ import annotations

import copy
import json
import time
import urllib.parse
from collections import deque
from typing import Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from envs.agent.formats import (
    REPLY_ERRORS,
    TEXT_ACTION_TOOL,
    AgentGymFormat,
    ParsedReply,
    PromptFormatName,
    ToolCallFormat,
    Turn,
    invalid_reply_feedback,
)
from envs.base import PluginConfig, Policy, PolicyContext, PolicyDecision, StepOptions, StepResult
from envs.errors import InvalidConfig, InvalidState
from inference import openai_client
from inference.calls import LLMCall
from inference.completions import chat_choice
from inference.errors import InferenceError
from inference.reasoning import reply_reasoning
from inference.tool_calls import wire_tool_call

STATE_VERSION = 1
ORACLE_MODEL = "oracle"  # the model name of a ``teacher: oracle`` agent's replies in traces
_IMAGE_KEYS = ("image_png_base64", "image")


class LLMAgentConfig(PluginConfig):
    """What every LLM policy accepts (an environment's config may add its own fields)."""

    # Errors name the field, not its value: the config carries an API key (and URLs).
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    inference_url: str | None = Field(default=None, description="Default: the service's inference URL.")
    model: str | None = Field(
        default=None, description="Default: the service's default model, else the first the server lists."
    )
    api_key: SecretStr | None = Field(default=None, description="Never stored in state or shown.")
    prompt_format: PromptFormatName | None = Field(
        default=None,
        description="'tool_calls' (the model calls the environment's tools) or 'agentgym' (AgentGym's "
        "conversation, one 'Action: ...' line per reply). Default: the environment's first.",
    )
    temperature: float = Field(default=0.7, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_tokens: int = Field(default=512, ge=1, le=32_768)
    history_window: int = Field(default=4, ge=0, le=64, description="Recent turns sent to the model.")
    enable_thinking: bool | None = Field(default=None, description="Qwen3 chat_template_kwargs.")
    seed: int | None = None
    timeout_s: float | None = Field(default=None, gt=0, description="Per attempt; default: service's.")
    system_prompt: str | None = Field(default=None, max_length=20_000, description="Replaces the env's.")
    extra_body: dict[str, Any] = Field(default_factory=dict)
    on_invalid_reply: Literal["answer", "end"] = Field(
        default="answer",
        description="A reply the environment cannot use (no 'Action:' line, several, no tool call, an "
        "invalid tool call or action): 'answer' records the turn as invalid (no env step, reward 0), "
        "tells the model what was wrong in the next prompt and goes on, as AgentGym's environments "
        "do; 'end' ends the episode with stop_reason 'policy_error:<kind>'.",
    )
    teacher: Literal["oracle"] | None = Field(
        default=None,
        description="'oracle': call no model; each reply is the environment's `oracle_action` (env "
        "config oracle: true) written in this prompt format and traced as a call of model 'oracle'. "
        "The traces are then this agent's own prompts answered by the scripted solver: `export-sft "
        "--model oracle` turns them into SFT data that distils the solver into a model.",
    )

    @field_validator("inference_url")
    @classmethod
    def _check_url(cls, url: str | None) -> str | None:
        # A bad URL is a 422 when the policy is created, not a 500 at its first step.
        if url is not None:
            split = urllib.parse.urlsplit(openai_client.normalize_base_url(url))
            if not url.isprintable() or not split.hostname or split.port == 0:  # .port raises if invalid
                raise ValueError(f"invalid inference URL {url!r:.100}")
        return url


ConfigT = TypeVar("ConfigT", bound=LLMAgentConfig)


class _State(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1]
    policy: str
    config: dict[str, Any]
    history: list[Turn]
    turn_index: int = Field(ge=0)
    pending: Turn | None = None


class LLMAgent(Policy[ConfigT], Generic[ConfigT]):
    """An LLM policy: one chat completion per decision, in the configured prompt format."""

    config_model: ClassVar[type[PluginConfig]] = LLMAgentConfig
    uses_inference: ClassVar[bool] = True
    # The prompt formats this environment's action space supports; the first is the default.
    prompt_formats: ClassVar[tuple[PromptFormatName, ...]] = ("tool_calls",)

    # ---- hooks an environment overrides ----------------------------------------------------

    def system_prompt(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} must define system_prompt()")

    def tools(self) -> list[dict[str, Any]]:
        """The environment's tools (OpenAI function schemas) for the ``tool_calls`` format."""
        return []

    def check_tool_call(self, call: dict[str, Any]) -> tuple[str, str] | None:
        """``(error kind, detail)`` if the canonical call ``{"id", "tool", "args"}`` cannot be
        executed (kind ``invalid_action`` or ``invalid_tool_call``), else None."""
        return None

    def clean_text_action(self, text: str) -> str:
        """An ``Action: ...`` line's text as the environment's action (whitespace collapsed)."""
        return " ".join(text.split())

    def observation_text(self, observation: dict[str, Any]) -> str:
        """The observation as the model reads it: its ``"text"``, else its fields as JSON."""
        text = observation.get("text")
        if isinstance(text, str):
            return text
        return json.dumps({k: v for k, v in observation.items() if k not in _IMAGE_KEYS}, sort_keys=True)

    def outcome_text(self, tool_calls: list[dict[str, Any]], result: StepResult) -> str:
        """The environment's answer to the tool calls (the ``tool`` message of the turn)."""
        text = f"Reward {result.reward:+.2f}."
        return text + " The episode ended." if result.done else text

    # ---- lifecycle -------------------------------------------------------------------------

    def __init__(self, config: ConfigT, context: PolicyContext) -> None:
        self.config = config
        self.context = context
        self.prompt_format: PromptFormatName = config.prompt_format or self.prompt_formats[0]
        if self.prompt_format not in self.prompt_formats:
            raise InvalidConfig(
                f"policy {self.name!r} supports prompt_format {', '.join(map(repr, self.prompt_formats))}; "
                f"got {self.prompt_format!r}"
            )
        if (
            config.teacher == "oracle"
            and self.prompt_format == "tool_calls"
            and TEXT_ACTION_TOOL not in {t["function"]["name"] for t in self.tools()}
        ):
            raise InvalidConfig(
                f"teacher 'oracle' needs a text action space ({self.name!r} has no 'act' tool)"
            )
        self.client: openai_client.InferenceClient | None = None  # injected, or from the shared pool
        self.history: deque[Turn] = deque(maxlen=config.history_window)
        self.turn_index = 0
        self._pending: Turn | None = None
        self._discovered_model: str | None = None

    # ---- request ---------------------------------------------------------------------------

    @property
    def model(self) -> str | None:
        return self.config.model or self.context.model or self._discovered_model

    @property
    def inference_url(self) -> str:
        return openai_client.normalize_base_url(self.config.inference_url or self.context.inference_url)

    def build_messages(self, observation: dict[str, Any]) -> list[dict[str, Any]]:
        system = self.config.system_prompt or self.system_prompt()
        text = self.observation_text(observation)
        if self.prompt_format == "agentgym":
            return AgentGymFormat.messages(system, self.history, text)
        return ToolCallFormat.messages(system, self.history, text)

    def build_request(self, observation: dict[str, Any]) -> dict[str, Any]:
        cfg = self.config
        request: dict[str, Any] = {"model": self.model, "messages": self.build_messages(observation)}
        if self.prompt_format == "tool_calls":
            request.update(ToolCallFormat.request_fields(self.tools()))
        request.update(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_tokens)
        if cfg.seed is not None:
            request["seed"] = cfg.seed
        extra_body = copy.deepcopy(cfg.extra_body)
        if cfg.enable_thinking is not None:
            kwargs = dict(extra_body.get("chat_template_kwargs") or {})
            kwargs["enable_thinking"] = cfg.enable_thinking
            extra_body["chat_template_kwargs"] = kwargs
        if extra_body:
            request["extra_body"] = extra_body
        return request

    def _client(self) -> openai_client.InferenceClient:
        if self.client is None:
            # The service's pool (closed at shutdown), else the running loop's shared one.
            pool = self.context.client_pool
            if pool is None:  # not `or`: an empty pool is falsy
                pool = openai_client.shared_pool()
            own_key = self.config.api_key.get_secret_value() if self.config.api_key else None
            self.client = pool.get(
                self.inference_url,
                self.context.api_key_for(self.inference_url, own_key),
                timeout_s=self.config.timeout_s or self.context.request_timeout_s,
                max_retries=self.context.max_retries,
            )
        return self.client

    async def _discover_model(self) -> None:
        """No model configured: use the first one the server lists (a vLLM serves one)."""
        models = [m for m in await self._client().list_models() if m]
        if not models:
            raise InvalidConfig(
                f"{self.name} needs a model: set config.model or the service's default model "
                "(the inference server lists none)"
            )
        self._discovered_model = models[0]

    # ---- the reply -------------------------------------------------------------------------

    def parse_reply(self, message: dict[str, Any], finish_reason: str | None) -> ParsedReply:
        content = message.get("content")
        content = content if isinstance(content, str) else ""
        if self.prompt_format == "agentgym":
            return AgentGymFormat.parse(
                content, self.clean_text_action, self.check_tool_call, f"call_{self.turn_index}"
            )
        names = [t["function"]["name"] for t in self.tools()]
        parsed = ToolCallFormat.parse(message, names, self.check_tool_call)
        if parsed.error == "no_tool_call":
            parsed.detail = f"the model called no tool (finish_reason={finish_reason!r})"
            if content.strip():
                parsed.detail += f"; it wrote: {content.strip()[:200]!r}"
        return parsed

    # ---- step ------------------------------------------------------------------------------

    async def step(self, observation: dict[str, Any], options: StepOptions = StepOptions()) -> PolicyDecision:
        request = self.build_request(observation)
        meta: dict[str, Any] = {
            "model": self.model,
            "inference_url": self.inference_url,
            "turn_index": self.turn_index,
        }
        if options.dry_run:
            return PolicyDecision(tool_calls=[], meta={**meta, "inference_request": request, "dry_run": True})
        if self.config.teacher == "oracle":
            return self._oracle_step(observation, request, meta)
        if not self.model:
            try:
                await self._discover_model()
            except InferenceError as exc:
                return PolicyDecision(
                    [], meta, error=f"inference_{exc.kind}", error_detail=f"listing models: {exc}"
                )
            request["model"] = meta["model"] = self.model

        self.turn_index += 1
        self._pending = None
        started = time.monotonic()
        client = self._client()
        try:
            call = await client.chat(
                request, return_token_ids=options.record_logprobs, deadline_s=options.timeout_s
            )
        except InferenceError as exc:
            latency_ms = (time.monotonic() - started) * 1000.0
            sent = client.prepare_request(request, return_token_ids=options.record_logprobs)
            failed = LLMCall(
                request=sent, response=None, latency_ms=latency_ms, attempts=exc.attempts, error=str(exc)
            )
            meta.update(latency_ms=latency_ms, attempts=exc.attempts)
            return PolicyDecision(
                [], meta, llm_call=failed, error=f"inference_{exc.kind}", error_detail=str(exc)
            )

        return self._decide(observation, call, meta)

    def _oracle_step(
        self, observation: dict[str, Any], request: dict[str, Any], meta: dict[str, Any]
    ) -> PolicyDecision:
        """The ``teacher: oracle`` reply: the env's scripted action as this format's answer."""
        action = observation.get("oracle_action")
        meta["model"] = ORACLE_MODEL
        if action is None:
            return PolicyDecision.no_oracle_action(meta)
        self.turn_index += 1
        self._pending = None
        if self.prompt_format == "agentgym":
            content, tool_calls = f"Action: {action}", []
        else:
            call = {
                "id": f"call_{self.turn_index}",
                "tool": TEXT_ACTION_TOOL,
                "args": {"action": str(action)},
            }
            content, tool_calls = None, [wire_tool_call(call)]
        response = {
            "id": f"oracle-{self.turn_index}",
            "object": "chat.completion",
            "model": ORACLE_MODEL,
            "choices": [chat_choice(0, content, tool_calls, "stop")],
        }
        call = LLMCall(
            request={**request, "model": ORACLE_MODEL},
            response=response,
            latency_ms=0.0,
            attempts=0,
            model=ORACLE_MODEL,
            finish_reason="stop",
        )
        return self._decide(observation, call, meta)

    def _decide(self, observation: dict[str, Any], call: LLMCall, meta: dict[str, Any]) -> PolicyDecision:
        """The decision a completed chat call makes: its reply parsed, the turn kept for history."""
        assert call.response is not None
        message = call.response["choices"][0].get("message") or {}
        meta.update(
            latency_ms=call.latency_ms,
            attempts=call.attempts,
            usage=call.usage,
            finish_reason=call.finish_reason,
            model=call.model or self.model,
        )
        # A <think> block is reasoning wherever the server left it: the reply is parsed and
        # replayed without it (Qwen3's template drops past reasoning too).
        reasoning, content = reply_reasoning(message)
        message = {**message, "content": content}
        if content:
            meta["assistant_content"] = content
        if reasoning:
            meta["reasoning_content"] = reasoning

        reply = self.parse_reply(message, call.finish_reason)
        keep_text = self.prompt_format == "agentgym" or reply.error is not None
        self._pending = Turn(
            observation=self.observation_text(observation),
            tool_calls=reply.tool_calls,
            reply=meta.get("assistant_content") if keep_text else None,
            error=reply.error,
        )
        return PolicyDecision(
            reply.tool_calls, meta, llm_call=call, error=reply.error, error_detail=reply.detail
        )

    # ---- history ---------------------------------------------------------------------------

    def answer_invalid(self, error: str, detail: str | None) -> str | None:
        """The last reply could not be played (parsed so, or the env refused it): keep the turn
        with the feedback for the next prompt and return the feedback; None ends the episode
        (``on_invalid_reply: "end"``, or a failure that is not the model's reply)."""
        pending, self._pending = self._pending, None
        if pending is None or error not in REPLY_ERRORS or self.config.on_invalid_reply == "end":
            return None
        tools = [t["function"]["name"] for t in self.tools()]
        feedback = invalid_reply_feedback(error, detail, tools)
        self.history.append(pending.model_copy(update={"error": error, "result": feedback}))
        return feedback

    def observe_outcome(self, result: StepResult) -> None:
        pending, self._pending = self._pending, None
        if pending is not None and pending.error is None:
            outcome = (
                self.outcome_text(pending.tool_calls, result) if self.prompt_format == "tool_calls" else ""
            )
            self.history.append(pending.model_copy(update={"result": outcome}))

    def reset(self) -> None:
        self.history.clear()
        self.turn_index = 0
        self._pending = None

    # ---- state -----------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "policy": self.name,
            "config": self.config.model_dump(mode="json", exclude={"api_key"}),
            "history": [t.model_dump(mode="json", exclude_defaults=True) for t in self.history],
            "turn_index": self.turn_index,
            "pending": self._pending.model_dump(mode="json", exclude_defaults=True)
            if self._pending
            else None,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], context: PolicyContext) -> LLMAgent[Any]:
        """Rebuild from ``get_state()``; API keys are never stored, so the context's key is used."""
        parsed, config = cls.validated_state(_State, state)
        try:
            policy = cls(config, context)  # type: ignore[arg-type]
        except InvalidConfig as exc:
            raise InvalidState(f"invalid {cls.name} state: {exc}") from None
        policy.history.extend(parsed.history[-config.history_window :] if config.history_window else [])
        policy.turn_index = parsed.turn_index
        policy._pending = parsed.pending
        return policy
