"""``crafter-react``: an LLM policy that plays Crafter through one tool, ``interact_many``.

Each decision sends the system prompt, a bounded window of recent turns (observation, the
tool call, the tool's result) and the current observation; the model must call the tool
with 1..N actions. Failures of the model or the server are returned as
``PolicyDecision.error`` (``no_tool_call``, ``invalid_action``, ``invalid_tool_call``,
``inference_<kind>``), never raised and never turned into a silent noop.
"""

from __future__ import annotations

import copy
import functools
import json
import time
import urllib.parse
from collections import deque
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from envs.base import (
    InvalidConfig,
    InvalidState,
    LLMCall,
    PluginConfig,
    Policy,
    PolicyContext,
    PolicyDecision,
    StepResult,
    register_policy,
)
from envs.crafter.actions import (
    ACHIEVEMENTS,
    ACTION_INDEX,
    MAX_ACTIONS_PER_CALL,
    TOOL_NAME,
    TOOL_SCHEMA,
)
from inference import openai_client  # a module import: `inference` may import us mid-way (cycle)
from inference.errors import InferenceError
from inference.nesting import too_deep

STATE_VERSION = 1

# --------------------------------------------------------------------------------------------
# Prompt
# --------------------------------------------------------------------------------------------

# Stated in the prompt exactly as Crafter 1.8.3's data.yaml has them (a test compares).
PLACE_COSTS: dict[str, dict[str, int]] = {
    "table": {"wood": 2},
    "furnace": {"stone": 4},
    "stone": {"stone": 1},
    "plant": {"sapling": 1},
}
MAKE_COSTS: dict[str, dict[str, int]] = {
    "wood_pickaxe": {"wood": 1},
    "wood_sword": {"wood": 1},
    "stone_pickaxe": {"wood": 1, "stone": 1},
    "stone_sword": {"wood": 1, "stone": 1},
    "iron_pickaxe": {"wood": 1, "coal": 1, "iron": 1},
    "iron_sword": {"wood": 1, "coal": 1, "iron": 1},
}


def _cost(name: str, table: dict[str, dict[str, int]]) -> str:
    return " + ".join(f"{n} {item}" for item, n in table[name].items())


_SYSTEM_PROMPT = f"""\
You play Crafter, a 2D survival game. Goal: unlock as many of the 22 achievements as you can \
and stay alive.

World: each turn shows your status, inventory, achievements and the tiles around you. You face \
one neighbouring tile. Moving toward a blocked tile only turns you to face it. Grass, sand and \
path are walkable; tree, stone, coal, iron, diamond, water, table and furnace block. Lava is \
walkable and kills you: never step on it.

do acts on the faced tile: tree gives wood; grass gives a sapling (10% chance); water gives \
drink; stone and coal need a wood_pickaxe; iron needs a stone_pickaxe; diamond needs an \
iron_pickaxe. do also hits creatures (a killed cow gives food) and eats ripe plants.

Place on the faced tile: table {_cost("table", PLACE_COSTS)} and furnace \
{_cost("furnace", PLACE_COSTS)} (on grass, sand or path); stone {_cost("stone", PLACE_COSTS)} \
(grass, sand, path, water or lava); plant {_cost("plant", PLACE_COSTS)} (grass).
Crafting needs a table within 1 tile (diagonals count); iron tools also need a furnace within \
1 tile. Wood pickaxe or sword: {_cost("wood_pickaxe", MAKE_COSTS)}. Stone pickaxe or sword: \
{_cost("stone_pickaxe", MAKE_COSTS)}. Iron pickaxe or sword: {_cost("iron_pickaxe", MAKE_COSTS)}.

Survival: health, food, drink and energy range 0-9. Food, drink and energy drop over time; \
at 0 you lose health, which recovers while all three are above 0. Eat cows or ripe plants, \
drink water, sleep when energy is low (you wake when it is full, or when hurt). Zombies roam \
grass, more at night; skeletons shoot in dark tunnels. Fight with do; swords hit harder.

Achievements: {", ".join(ACHIEVEMENTS)}.

Actions:
- noop: wait one tick
- move_left, move_right, move_up, move_down: step to x-1, x+1, y-1, y+1 (turn only, if blocked)
- do: use the faced tile (collect, drink, attack, eat)
- sleep: sleep until energy is full
- place_stone, place_table, place_furnace, place_plant: place on the faced tile
- make_wood_pickaxe, make_stone_pickaxe, make_iron_pickaxe, make_wood_sword, make_stone_sword, \
make_iron_sword: craft

Reply only by calling {TOOL_NAME} with 1 to <N> actions; they run in order, one tick each. \
Plan a few steps, then look again."""


def system_prompt(max_actions: int) -> str:
    return _SYSTEM_PROMPT.replace("<N>", str(max_actions))


@functools.cache  # one per max_actions (1..8); a deepcopy per decision cost ~2%
def tool_schema(max_actions: int) -> dict[str, Any]:
    """TOOL_SCHEMA with ``maxItems`` (and its description) set to ``max_actions``. Shared: do
    not mutate the returned dict."""
    schema = copy.deepcopy(TOOL_SCHEMA)
    function = schema["function"]
    function["description"] = (
        f"Execute a short sequence of Crafter actions in order (1-{max_actions}). "
        "Each action advances the world one tick."
    )
    function["parameters"]["properties"]["actions"]["maxItems"] = max_actions
    return schema


def observation_text(observation: dict[str, Any]) -> str:
    text = observation.get("text")
    if isinstance(text, str):
        return text
    # No LLM view from the env: fall back to the compact structured fields.
    fields = {
        k: v for k, v in observation.items() if k in ("status", "inventory", "achievements", "local_view")
    }
    return json.dumps(fields, sort_keys=True)


def tool_result_text(actions: list[str], result: StepResult) -> str:
    executed = result.info.get("actions_executed", len(actions))
    if not isinstance(executed, int):
        executed = len(actions)
    ran = ", ".join(actions[:executed]) or "none"
    text = f"Executed {executed}/{len(actions)} actions: {ran}. Reward {result.reward:+.2f}."
    unlocked = result.info.get("achievements_unlocked") or []
    if unlocked:
        text += f" Unlocked: {', '.join(map(str, unlocked))}."
    if result.done:
        text += " The episode ended."
    return text


# --------------------------------------------------------------------------------------------
# Config and state
# --------------------------------------------------------------------------------------------


class CrafterReActConfig(PluginConfig):
    # Errors name the field, not its value: the config carries an API key (and URLs).
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    inference_url: str | None = Field(default=None, description="Default: the service's inference URL.")
    model: str | None = Field(
        default=None, description="Default: the service's default model, else the first the server lists."
    )
    api_key: SecretStr | None = Field(default=None, description="Never stored in state or shown.")
    temperature: float = Field(default=0.7, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_tokens: int = Field(default=512, ge=1, le=32_768)
    history_window: int = Field(default=4, ge=0, le=64, description="Recent turns sent to the model.")
    max_actions_per_call: int = Field(default=MAX_ACTIONS_PER_CALL, ge=1, le=MAX_ACTIONS_PER_CALL)
    enable_thinking: bool | None = Field(default=None, description="Qwen3 chat_template_kwargs.")
    seed: int | None = None
    timeout_s: float | None = Field(default=None, gt=0, description="Per attempt; default: service's.")
    system_prompt: str | None = Field(default=None, max_length=20_000)
    extra_body: dict[str, Any] = Field(default_factory=dict)

    @field_validator("inference_url")
    @classmethod
    def _check_url(cls, url: str | None) -> str | None:
        # A bad URL is a 422 when the policy is created, not a 500 at its first step.
        if url is not None:
            split = urllib.parse.urlsplit(openai_client.normalize_base_url(url))
            if not url.isprintable() or not split.hostname or split.port == 0:  # .port raises if invalid
                raise ValueError(f"invalid inference URL {url!r:.100}")
        return url


class Turn(BaseModel):
    """One completed decision, as replayed to the model."""

    model_config = ConfigDict(extra="forbid")

    observation: str
    tool_call: dict[str, Any]
    result: str


class _State(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1]
    policy: Literal["crafter-react"]
    config: dict[str, Any]
    history: list[Turn]
    turn_index: int = Field(ge=0)
    pending: Turn | None = None


# --------------------------------------------------------------------------------------------
# The policy
# --------------------------------------------------------------------------------------------


def _error(kind: str, detail: str, **fields: Any) -> PolicyDecision:
    return PolicyDecision(error=kind, error_detail=detail, **fields)


def parse_tool_calls(
    message: dict[str, Any], max_actions: int
) -> tuple[list[dict[str, Any]], str | None, str | None]:
    """Canonical tool calls of an assistant message, plus an error kind and detail if any.

    The calls are returned even when invalid, so a trace shows what the model said.
    """
    raw_calls = message.get("tool_calls") or []
    if not raw_calls:
        return [], "no_tool_call", None
    calls: list[dict[str, Any]] = []
    problems: list[tuple[str, str]] = []
    for i, raw in enumerate(raw_calls):
        function = raw.get("function") or {}
        name = function.get("name")
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
                if too_deep(arguments):
                    raise ValueError
            except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
                arguments = {"raw": arguments if isinstance(arguments, str) else "(nested too deep)"}
                problems.append(
                    ("invalid_tool_call", "the tool call's arguments are not valid JSON (or nest too deep)")
                )
        if not isinstance(arguments, dict):
            arguments = {"raw": arguments}
            problems.append(("invalid_tool_call", "the tool call's arguments are not a JSON object"))
        calls.append({"id": raw.get("id") or f"call_{i}", "tool": name, "args": arguments})
        if name != TOOL_NAME:
            problems.append(("invalid_tool_call", f"unknown tool {name!r}; expected {TOOL_NAME!r}"))
            continue
        actions = arguments.get("actions")
        if isinstance(actions, str):
            actions = [actions]
        if "raw" in arguments:
            continue
        if not isinstance(actions, list) or not actions:
            problems.append(("invalid_tool_call", "the tool call needs a non-empty 'actions' list"))
            continue
        bad = [a for a in actions if not isinstance(a, str) or a.strip() not in ACTION_INDEX]
        if bad:
            shown = ", ".join(repr(a)[:40] for a in bad)
            problems.append(
                ("invalid_action", f"invalid action(s) {shown}; valid: {', '.join(ACTION_INDEX)}")
            )
        elif len(actions) > max_actions:
            problems.append(("invalid_tool_call", f"{len(actions)} actions; at most {max_actions} allowed"))
    if problems:
        kind = "invalid_action" if any(k == "invalid_action" for k, _ in problems) else problems[0][0]
        return calls, kind, "; ".join(d for _, d in problems)
    return calls, None, None


def _tool_call_actions(call: dict[str, Any]) -> list[str]:
    actions = call.get("args", {}).get("actions", [])
    return [actions] if isinstance(actions, str) else [str(a) for a in actions]


@register_policy
class CrafterReActPolicy(Policy[CrafterReActConfig]):
    name: ClassVar[str] = "crafter-react"
    version: ClassVar[str] = "1"
    config_model: ClassVar[type[PluginConfig]] = CrafterReActConfig
    env_name: ClassVar[str | None] = "crafter"
    description: ClassVar[str] = "ReAct LLM policy: one interact_many tool call of 1-8 actions per turn."
    uses_inference: ClassVar[bool] = True

    def __init__(self, config: CrafterReActConfig, context: PolicyContext) -> None:
        self.config = config
        self.context = context
        self.client: openai_client.InferenceClient | None = None  # injected, or from the shared pool
        self.history: deque[Turn] = deque(maxlen=config.history_window)
        self.turn_index = 0
        self._pending: Turn | None = None
        self._discovered_model: str | None = None

    # ---- request -------------------------------------------------------------------------

    @property
    def model(self) -> str | None:
        return self.config.model or self.context.model or self._discovered_model

    async def _discover_model(self) -> None:
        """No model configured: use the first one the server lists (a vLLM serves one)."""
        models = [m for m in await self._client().list_models() if m]
        if not models:
            raise InvalidConfig(
                "crafter-react needs a model: set config.model or the service's default model "
                "(the inference server lists none)"
            )
        self._discovered_model = models[0]

    @property
    def inference_url(self) -> str:
        return openai_client.normalize_base_url(self.config.inference_url or self.context.inference_url)

    def build_messages(self, observation: dict[str, Any]) -> list[dict[str, Any]]:
        cfg = self.config
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": cfg.system_prompt or system_prompt(cfg.max_actions_per_call)}
        ]
        for turn in self.history:
            call = turn.tool_call
            wire_call = {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["tool"], "arguments": json.dumps(call["args"])},
            }
            messages.append({"role": "user", "content": turn.observation})
            messages.append({"role": "assistant", "content": None, "tool_calls": [wire_call]})
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": turn.result})
        messages.append({"role": "user", "content": observation_text(observation)})
        return messages

    def build_request(self, observation: dict[str, Any]) -> dict[str, Any]:
        cfg = self.config
        request: dict[str, Any] = {
            "model": self.model,
            "messages": self.build_messages(observation),
            "tools": [tool_schema(cfg.max_actions_per_call)],
            "tool_choice": {"type": "function", "function": {"name": TOOL_NAME}},
            "parallel_tool_calls": False,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "max_tokens": cfg.max_tokens,
        }
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
            own_key = self.config.api_key.get_secret_value() if self.config.api_key else None
            api_key = self.context.api_key_for(self.inference_url, own_key)
            # The service's pool (closed at shutdown), else the running loop's shared one.
            pool = self.context.client_pool
            if pool is None:
                pool = openai_client.shared_pool()
            self.client = pool.get(
                self.inference_url,
                api_key,
                timeout_s=self.config.timeout_s or self.context.request_timeout_s,
                max_retries=self.context.max_retries,
            )
        return self.client

    # ---- step ----------------------------------------------------------------------------

    async def step(
        self,
        observation: dict[str, Any],
        *,
        dry_run: bool = False,
        record_logprobs: bool = False,
        timeout_s: float | None = None,
    ) -> PolicyDecision:
        request = self.build_request(observation)
        meta: dict[str, Any] = {
            "model": self.model,
            "inference_url": self.inference_url,
            "turn_index": self.turn_index,
        }
        if dry_run:
            return PolicyDecision(tool_calls=[], meta={**meta, "inference_request": request, "dry_run": True})
        if not self.model:
            try:
                await self._discover_model()
            except InferenceError as exc:
                return _error(f"inference_{exc.kind}", f"listing models: {exc}", tool_calls=[], meta=meta)
            request["model"] = meta["model"] = self.model

        self.turn_index += 1
        self._pending = None
        started = time.monotonic()
        client = self._client()
        try:
            call = await client.chat(request, return_token_ids=record_logprobs, deadline_s=timeout_s)
        except InferenceError as exc:
            latency_ms = (time.monotonic() - started) * 1000.0
            sent = client.prepare_request(request, return_token_ids=record_logprobs)
            failed = LLMCall(
                request=sent, response=None, latency_ms=latency_ms, attempts=exc.attempts, error=str(exc)
            )
            meta.update(latency_ms=latency_ms, attempts=exc.attempts)
            return _error(f"inference_{exc.kind}", str(exc), tool_calls=[], meta=meta, llm_call=failed)

        assert call.response is not None
        message = call.response["choices"][0].get("message") or {}
        meta.update(
            latency_ms=call.latency_ms,
            attempts=call.attempts,
            usage=call.usage,
            finish_reason=call.finish_reason,
            model=call.model or self.model,
        )
        if message.get("content"):
            meta["assistant_content"] = message["content"]
        if message.get("reasoning_content"):
            meta["reasoning_content"] = message["reasoning_content"]

        tool_calls, error, detail = parse_tool_calls(message, self.config.max_actions_per_call)
        if error == "no_tool_call":
            content = (message.get("content") or "").strip()
            detail = f"the model called no tool (finish_reason={call.finish_reason!r})"
            if content:
                detail += f"; it wrote: {content[:200]!r}"
        decision = PolicyDecision(
            tool_calls=tool_calls, meta=meta, llm_call=call, error=error, error_detail=detail
        )
        if error is None:
            obs_text = observation_text(observation)
            self._pending = Turn(observation=obs_text, tool_call=tool_calls[0], result="")
        return decision

    # ---- history -------------------------------------------------------------------------

    def observe_outcome(self, result: StepResult) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        actions = _tool_call_actions(pending.tool_call)
        self.history.append(pending.model_copy(update={"result": tool_result_text(actions, result)}))

    def reset(self) -> None:
        self.history.clear()
        self.turn_index = 0
        self._pending = None

    # ---- state ---------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "policy": self.name,
            "config": self.config.model_dump(mode="json", exclude={"api_key"}),
            "history": [t.model_dump(mode="json") for t in self.history],
            "turn_index": self.turn_index,
            "pending": self._pending.model_dump(mode="json") if self._pending else None,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], context: PolicyContext) -> CrafterReActPolicy:
        """Rebuild from ``get_state()``; API keys are never stored, so the context's key is used."""
        try:
            parsed = _State.model_validate(state)
            config = CrafterReActConfig.model_validate(parsed.config)
        except ValidationError as exc:
            # Locations and messages only: never echo input values (they could hold secrets).
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_input=False)
            )
            raise InvalidState(f"invalid crafter-react state: {problems}") from None
        policy = cls(config, context)
        policy.history.extend(parsed.history[-config.history_window :] if config.history_window else [])
        policy.turn_index = parsed.turn_index
        policy._pending = parsed.pending
        return policy
