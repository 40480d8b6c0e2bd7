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
(never raised, never a silent noop), and its JSON state for snapshots. In mode ``rl`` with a
known tokenizer it plays the episode as one token stream (`envs.agent.streams`).
"""

from __future__ import annotations

import asyncio
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
from envs.agent.streams import StreamMode, StreamState, tail_after_assistant
from envs.base import PluginConfig, Policy, PolicyContext, PolicyDecision, StepOptions, StepResult
from envs.errors import InvalidConfig, InvalidState
from inference import openai_client
from inference.calls import LLMCall
from inference.chat_tokens import TOY, ChatTokens, between_text, chat_tokens, reply_text
from inference.completions import chat_choice
from inference.errors import InferenceError
from inference.reasoning import reply_reasoning, split_reasoning
from inference.tool_calls import parse_tool_calls, wire_tool_call

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
        "--model oracle` turns them into SFT data that distils the solver into a model. With a "
        "`tokenizer` in mode 'rl' it plays token streams too, its replies the tokens a model would write "
        "(logprobs 0): `export-sft --streams` then gives SFT data in stream form.",
    )

    token_stream: StreamMode = Field(
        default="exact",
        description="Mode 'rl' with a `tokenizer`: 'exact' plays the episode as one token stream (each "
        "prompt extends the last prompt + completion token for token, sent as token ids to "
        "/v1/completions); 'segment' starts a new stream where the chat template would render the "
        "history differently (Qwen3 drops earlier reasoning); 'off': one chat completion per decision.",
    )
    tokenizer: str | None = Field(
        default=None,
        max_length=4096,
        description="The served model's tokenizer, to render the tokens between two completions: a local "
        "checkpoint directory (the one vLLM or serve-model serves; `grpo-service train` sets the model it "
        "trains), or 'toy' (the fake server's). Never loaded from a hub. Unset: no token stream.",
    )

    @field_validator("tokenizer")
    @classmethod
    def _check_tokenizer(cls, value: str | None) -> str | None:
        if value is not None and value != TOY:
            from pathlib import Path

            if not Path(value).expanduser().is_dir():
                raise ValueError(f"tokenizer: {value!r:.200} is neither 'toy' nor a local directory")
        return value

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
    stream: StreamState | None = None


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
        self.stream = StreamState()

    # ---- request ---------------------------------------------------------------------------

    @property
    def model(self) -> str | None:
        return self.config.model or self.context.model or self._discovered_model

    @property
    def inference_url(self) -> str:
        return openai_client.normalize_base_url(self.config.inference_url or self.context.inference_url)

    def build_messages(self, observation: dict[str, Any], history: Any = None) -> list[dict[str, Any]]:
        system = self.config.system_prompt or self.system_prompt()
        text = self.observation_text(observation)
        turns = self.history if history is None else history
        if self.prompt_format == "agentgym":
            return AgentGymFormat.messages(system, turns, text)
        return ToolCallFormat.messages(system, turns, text)

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
            return await self._oracle_step(observation, request, meta, options)
        if not self.model:
            try:
                await self._discover_model()
            except InferenceError as exc:
                return PolicyDecision(
                    [], meta, error=f"inference_{exc.kind}", error_detail=f"listing models: {exc}"
                )
            request["model"] = meta["model"] = self.model

        if options.record_logprobs and self.streams:
            return await self._stream_step(observation, request, meta, options)
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

    # ---- token streams (envs/agent/streams.py) ----------------------------------------------

    @property
    def streams(self) -> bool:
        """Whether mode ``rl`` plays this policy's episodes as token streams."""
        return self.config.token_stream != "off" and self.config.tokenizer is not None

    def _template_kwargs(self, request: dict[str, Any]) -> dict[str, Any]:
        return dict((request.get("extra_body") or {}).get("chat_template_kwargs") or {})

    def _render_ids(self, tokens: ChatTokens, request: dict[str, Any]) -> list[int]:
        """The prompt the chat template renders for the request's messages (what a chat
        completion would have sent)."""
        text = tokens.render(
            request["messages"],
            request.get("tools"),
            add_generation_prompt=True,
            template_kwargs=self._template_kwargs(request),
        )
        return tokens.encode(text)

    def _stream_prompt(
        self, tokens: ChatTokens, observation: dict[str, Any], request: dict[str, Any]
    ) -> tuple[list[int], str | None, bool]:
        """``(prompt ids, why a segment starts here or None, the template renders it differently)``."""
        stream = self.stream
        rendered = self._render_ids(tokens, request)
        if not stream.ids or stream.last_turn is None:
            return rendered, stream.restart or "start", False
        if stream.restart is not None:
            return rendered, stream.restart, False
        tail = tail_after_assistant(self.build_messages(observation, [stream.last_turn]))
        between = between_text(tokens, tail, self._template_kwargs(request), stream.closed)
        extended = stream.ids + tokens.encode(between)
        differs = extended != rendered
        if differs and self.config.token_stream == "segment":
            return rendered, "template_differs", True
        return extended, None, differs

    async def _render_turn(
        self, observation: dict[str, Any], request: dict[str, Any], reply: dict[str, Any] | None = None
    ) -> tuple[ChatTokens, list[int], str | None, bool, list[int]]:
        """The stream's next prompt (`_stream_prompt`) and, given the ``reply`` message, its tokens
        as a model writes them (`reply_text`), in one trip off the event loop: loading a tokenizer,
        rendering and encoding a long conversation."""

        def render() -> tuple[ChatTokens, list[int], str | None, bool, list[int]]:
            tokens = chat_tokens(self.config.tokenizer or TOY)
            prompt, segment_start, differs = self._stream_prompt(tokens, observation, request)
            completion: list[int] = []
            if reply is not None:
                kwargs = self._template_kwargs(request)
                completion = tokens.encode(reply_text(tokens, reply, request.get("tools"), kwargs))
            return tokens, prompt, segment_start, differs, completion

        return await asyncio.to_thread(render)

    @staticmethod
    def _unrenderable(meta: dict[str, Any], exc: Exception) -> PolicyDecision:
        detail = f"cannot render the token stream: {type(exc).__name__}: {exc}"
        return PolicyDecision([], meta, error="inference_bad_request", error_detail=detail[:500])

    async def _stream_step(
        self,
        observation: dict[str, Any],
        request: dict[str, Any],
        meta: dict[str, Any],
        options: StepOptions,
    ) -> PolicyDecision:
        """One decision of a token stream: the stream extended by the tokens between, sent as
        token ids; the reply parsed here as a server's tool and reasoning parsers would."""
        try:
            tokens, prompt, segment_start, differs, _ = await self._render_turn(observation, request)
        except Exception as exc:  # a template the tokenizer cannot render: the decision fails
            return self._unrenderable(meta, exc)
        self.turn_index += 1
        self._pending = None
        fields = ("model", "temperature", "top_p", "max_tokens", "seed")
        sampling = {k: request[k] for k in fields if k in request}
        extra = {k: v for k, v in (request.get("extra_body") or {}).items() if k != "chat_template_kwargs"}
        if extra:
            sampling["extra_body"] = extra
        started = time.monotonic()
        client = self._client()
        try:
            try:
                call = await client.complete_tokens(prompt, sampling, deadline_s=options.timeout_s)
            except InferenceError as exc:
                if segment_start is not None or exc.kind != "bad_request" or "context" not in exc.detail:
                    raise
                # The extended stream no longer fits: a new segment from the conversation as the
                # template renders it (the history window bounds it).
                prompt = await asyncio.to_thread(self._render_ids, tokens, request)
                segment_start = "context_limit"
                left = None if options.timeout_s is None else options.timeout_s - (time.monotonic() - started)
                call = await client.complete_tokens(prompt, sampling, deadline_s=left)
        except InferenceError as exc:
            latency_ms = (time.monotonic() - started) * 1000.0
            failed = LLMCall(
                request={**request, "prompt_token_ids": prompt},
                response=None,
                latency_ms=latency_ms,
                attempts=exc.attempts,
                error=str(exc),
            )
            meta.update(latency_ms=latency_ms, attempts=exc.attempts)
            return PolicyDecision(
                [], meta, llm_call=failed, error=f"inference_{exc.kind}", error_detail=str(exc)
            )
        self._extend_stream(tokens, prompt, call.completion_token_ids or [], segment_start, differs, meta)
        # The text the humans read (trace, viewer, export) stays a chat: the request's messages and
        # the reply as a chat completion, its tool calls parsed from the text.
        call.request = request
        call.response = self._chat_response(call.response or {}, call.finish_reason)
        return self._decide(observation, call, meta)

    def _extend_stream(
        self,
        tokens: ChatTokens,
        prompt: list[int],
        completion: list[int],
        segment_start: str | None,
        differs: bool,
        meta: dict[str, Any],
    ) -> None:
        """The stream is now ``prompt`` + ``completion``; the decision's meta says so."""
        stream = self.stream
        if segment_start is not None:
            stream.segments += 1
        stream.template_differs += differs
        stream.ids = prompt + completion
        stream.closed = tokens.closes_turn(completion)
        stream.restart = None
        meta["stream"] = {
            "segment": stream.segments,
            "segment_start": segment_start,
            "template_differs": differs,
            "prompt_tokens": len(prompt),
        }

    def _chat_response(self, completion: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        """A text completion as the chat completion a server's parsers would have made of it:
        the ``<think>`` block as ``reasoning``, Hermes ``<tool_call>`` blocks as tool calls (format
        ``tool_calls``), the rest as content."""
        choice = (completion.get("choices") or [{}])[0]
        reasoning, text = split_reasoning(str(choice.get("text") or ""))
        calls: list[dict[str, Any]] = []
        content: str | None = text
        if self.prompt_format == "tool_calls":
            content, calls = parse_tool_calls(text)
        finish = finish_reason or "stop"
        return {
            "id": completion.get("id"),
            "object": "chat.completion",
            "model": completion.get("model"),
            "choices": [chat_choice(0, content, calls, finish, None, reasoning)],
            "usage": completion.get("usage"),
        }

    async def _oracle_step(
        self, observation: dict[str, Any], request: dict[str, Any], meta: dict[str, Any], options: StepOptions
    ) -> PolicyDecision:
        """The ``teacher: oracle`` reply: the env's scripted action as this format's answer. Where a
        model would play a token stream, so does the oracle: its reply is a span of the stream, the
        tokens a model would have to write (`reply_text`: through the end-of-turn token), logprobs
        0, so `export-sft --streams` distils the solver in the form the model is sampled in."""
        action = observation.get("oracle_action")
        meta["model"] = ORACLE_MODEL
        if action is None:
            return PolicyDecision.no_oracle_action(meta)
        if self.prompt_format == "agentgym":
            content, tool_calls = f"Action: {action}", []
        else:
            call = {
                "id": f"call_{self.turn_index + 1}",
                "tool": TEXT_ACTION_TOOL,
                "args": {"action": str(action)},
            }
            content, tool_calls = None, [wire_tool_call(call)]
        call = LLMCall(
            request={**request, "model": ORACLE_MODEL},
            response=None,
            latency_ms=0.0,
            attempts=0,
            model=ORACLE_MODEL,
            finish_reason="stop",
        )
        if options.record_logprobs and self.streams:
            message = {"role": "assistant", "content": content, "tool_calls": tool_calls}
            try:
                tokens, prompt, segment_start, differs, completion = await self._render_turn(
                    observation, request, message
                )
            except Exception as exc:  # a template the tokenizer cannot render: the decision fails
                return self._unrenderable(meta, exc)
            call.prompt_token_ids, call.completion_token_ids = prompt, completion
            call.completion_logprobs = [0.0] * len(completion)
            self._extend_stream(tokens, prompt, completion, segment_start, differs, meta)
        self.turn_index += 1
        self._pending = None
        call.response = {
            "id": f"oracle-{self.turn_index}",
            "object": "chat.completion",
            "model": ORACLE_MODEL,
            "choices": [chat_choice(0, content, tool_calls, "stop")],
        }
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
        prompt = call.request.get("messages")
        if isinstance(prompt, list) and prompt:
            self._pending.adopt_user_message(prompt[-1])
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
        self._remember(pending.model_copy(update={"error": error, "result": feedback}))
        return feedback

    def _remember(self, turn: Turn) -> None:
        self.history.append(turn)
        self.stream.last_turn = turn

    def observe_outcome(self, result: StepResult) -> None:
        pending, self._pending = self._pending, None
        if pending is not None and pending.error is None:
            outcome = (
                self.outcome_text(pending.tool_calls, result) if self.prompt_format == "tool_calls" else ""
            )
            self._remember(pending.model_copy(update={"result": outcome}))

    def reset(self) -> None:
        self.history.clear()
        self.turn_index = 0
        self._pending = None
        self.stream = StreamState()

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
            "stream": self.stream.model_dump(mode="json", exclude_defaults=True) if self.stream.ids else None,
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
        if parsed.stream is not None:
            policy.stream = parsed.stream
        return policy
