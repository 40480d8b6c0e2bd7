"""An OpenAI-compatible fake inference server that answers in vLLM's response shape.

Used by tests, demos and the benchmark. It decides Crafter-style tool calls by sampling
actions from the first tool's ``actions`` enum, returns per-token logprobs and token ids
(``return_token_ids``) from a deterministic toy tokenizer, and can inject faults (HTTP
errors, timeouts, malformed bodies, cut connections, bad tool calls, token ids that do not
match the logprobs) by probability or by a deterministic script.

    python -m tools.fake_server --port 8001 --latency 0.2

From the command line, unseeded requests at temperature > 0 get a different answer each time
(``--deterministic`` turns that off), so a GRPO group's members play different trajectories.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Self, get_args

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.types import ASGIApp, Receive, Scope, Send

from grpo_service.api.limits import orjson_reads_differently
from inference.completions import (
    chat_choice,
    check_token_prompt,
    completion_budget,
    context_error,
    error_body,
    text_choice,
    usage,
)
from inference.toy_tokenizer import (
    TURN_END,
    VOCAB_SIZE,
    decode_tokens,
    encode,
    encode_chat,
    stable_hash,
    token_id,
    tokenize,
    tools_in,
)
from tools.server_thread import ServerThread

FaultKind = Literal[
    "timeout",
    "http_429",
    "http_500",
    "http_503",
    "malformed_json",
    "no_tool_call",
    "invalid_action",
    "cut_stream",
    "token_mismatch",
]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
INVALID_ACTION_NAME = "fly"

_TEXT_REPLIES = (
    "I should look around before acting.",
    "Let me think about the best next move.",
    "Exploring seems wise here.",
)


class FakeConfig(BaseModel):
    """Behaviour of the fake server; replaceable at run time via ``POST /fake/config``."""

    model_config = ConfigDict(extra="forbid")

    model: str = "fake-model"
    strict_model: bool = Field(default=False, description="404 for any model other than `model`.")
    api_key: str | None = Field(default=None, description="When set, require this bearer token.")
    seed: int = 0
    vary_unseeded: bool = Field(
        default=False,
        description="Requests without a `seed` and with temperature > 0 differ on each call.",
    )
    latency_s: float = Field(
        default=0.0, ge=0, description="Time from a request's arrival to its answer (parsing included)."
    )
    latency_jitter_s: float = Field(default=0.0, ge=0)
    actions_per_call: tuple[int, int] = (1, 4)
    text_actions: list[str] = Field(
        default_factory=list,
        description="Without tools, reply in AgentGym's ReAct form: 'Thought: ...' and 'Action: <one of "
        "these>' (the no_tool_call fault leaves the Action line out). Empty: a plain sentence.",
    )
    fault_probs: dict[FaultKind, float] = Field(default_factory=dict)
    fault_script: list[FaultKind | Literal["ok"]] = Field(
        default_factory=list, description="Faults for successive requests, then `fault_probs`."
    )
    supports_token_ids: bool = Field(
        default=True, description="False: ignore `return_token_ids`, like OpenAI or Groq."
    )
    max_model_len: int = Field(
        default=32_768,
        ge=16,
        description="Context length: prompt + max_tokens beyond it is a 400, as vLLM's.",
    )
    timeout_fault_s: float = Field(default=30.0, gt=0, le=60)
    retry_after_s: float = Field(default=0.05, ge=0)

    @model_validator(mode="after")
    def _check(self) -> FakeConfig:
        lo, hi = self.actions_per_call
        if not 1 <= lo <= hi:
            raise ValueError("actions_per_call must be (lo, hi) with 1 <= lo <= hi")
        if any(not 0 <= p <= 1 for p in self.fault_probs.values()) or sum(self.fault_probs.values()) > 1:
            raise ValueError("fault_probs must each be in [0, 1] and sum to at most 1")
        return self


class FakeState:
    """Mutable server state, shared between the server thread and its owner (hence the lock)."""

    def __init__(self, config: FakeConfig) -> None:
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        self.set_config(config)
        self.reset_stats()

    def set_config(self, config: FakeConfig) -> None:
        with self._lock:
            self.config = config
            self._script_pos = 0
            self._fault_rng = random.Random(stable_hash("faults", config.seed))

    def reset_stats(self) -> None:
        with self._lock:
            self.requests = 0
            self.by_fault: Counter[str] = Counter()
            self.by_route: Counter[str] = Counter()

    def next_fault(self) -> str:
        """The fault for the next valid chat request (``"ok"`` for none)."""
        with self._lock:
            cfg = self.config
            if self._script_pos < len(cfg.fault_script):
                fault = cfg.fault_script[self._script_pos]
                self._script_pos += 1
            else:
                fault, draw, acc = "ok", self._fault_rng.random(), 0.0
                for kind, prob in cfg.fault_probs.items():
                    acc += prob
                    if draw < acc:
                        fault = kind
                        break
            self.by_fault[fault] += 1
            return fault

    def count_route(self, route: str) -> int:
        """Count a request; returns the number of chat and completions requests so far (invalid
        ones included)."""
        with self._lock:
            self.by_route[route] += 1
            if route in ("chat", "completions"):
                self.requests += 1
            return self.requests

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": self.requests,
                "by_fault": dict(self.by_fault),
                "by_route": dict(self.by_route),
            }


# --------------------------------------------------------------------------------------------
# Building a vLLM-shaped completion
# --------------------------------------------------------------------------------------------


def _actions_schema(tool: dict[str, Any]) -> tuple[list[str], int | None]:
    params = tool.get("function", {}).get("parameters", {})
    actions = params.get("properties", {}).get("actions", {}) if isinstance(params, dict) else {}
    enum = actions.get("items", {}).get("enum", []) if isinstance(actions, dict) else []
    return [a for a in enum if isinstance(a, str)], actions.get("maxItems") if isinstance(
        actions, dict
    ) else None


def _pick_tool(tools: list[dict[str, Any]], tool_choice: Any) -> dict[str, Any]:
    if isinstance(tool_choice, dict):
        wanted = tool_choice.get("function", {}).get("name")
        for tool in tools:
            if tool.get("function", {}).get("name") == wanted:
                return tool
    return tools[0]


def _tool_arguments(tool: dict[str, Any], cfg: FakeConfig, rng: random.Random, invalid: bool) -> dict:
    enum, max_items = _actions_schema(tool)
    if not enum:
        return {}
    lo, hi = cfg.actions_per_call
    if isinstance(max_items, int) and max_items >= 1:
        hi = min(hi, max_items)
        lo = min(lo, hi)
    actions = [rng.choice(enum) for _ in range(rng.randint(lo, hi))]
    if invalid:
        actions[rng.randrange(len(actions))] = INVALID_ACTION_NAME
    return {"actions": actions}


def _logprob_entries(tokens: list[str], logprobs: list[float], top_k: int) -> list[dict[str, Any]]:
    """vLLM's ``logprobs.content``: each sampled token, and its ``top_k`` alternatives (the token
    itself first, then made-up ones a nat apart)."""
    entries = []
    for tok, lp in zip(tokens, logprobs, strict=True):
        encoded = list(tok.encode())
        top = [{"token": tok, "logprob": lp, "bytes": encoded}] if top_k > 0 else []
        top += [
            {"token": f"<alt{j}>", "logprob": round(lp - 1.0 - j, 6), "bytes": list(f"<alt{j}>".encode())}
            for j in range(max(0, top_k - 1))
        ]
        entries.append({"token": tok, "logprob": lp, "bytes": encoded, "top_logprobs": top})
    return entries


def _reply(
    body: dict[str, Any], cfg: FakeConfig, fault: str, rng: random.Random
) -> tuple[str, str | None, list[dict[str, Any]]]:
    """``(text, content, tool_calls)`` of one reply: a Hermes tool call of the first (or the
    chosen) tool when the request has tools, else a sentence (AgentGym's ReAct form with
    ``text_actions``)."""
    tools = body.get("tools") or []
    if tools and body.get("tool_choice") != "none" and fault != "no_tool_call":
        tool = _pick_tool(tools, body.get("tool_choice"))
        name = tool.get("function", {}).get("name", "tool")
        arguments = json.dumps(_tool_arguments(tool, cfg, rng, invalid=fault == "invalid_action"))
        text = f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'
        call_id = f"chatcmpl-tool-{rng.getrandbits(64):016x}"
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        return text, None, [call]
    text = rng.choice(_TEXT_REPLIES)
    if cfg.text_actions:
        text = f"Thought: {text}"
        if fault != "no_tool_call":
            text = f"{text}\nAction: {rng.choice(cfg.text_actions)}"
    return text, text, []


def _choice(
    index: int, body: dict[str, Any], cfg: FakeConfig, fault: str, base_seed: int, max_tokens: int
) -> tuple[dict[str, Any], int]:
    rng = random.Random(stable_hash(base_seed, index))
    text, content, tool_calls = _reply(body, cfg, fault, rng)
    finish = "stop"
    tokens = tokenize(text)
    if len(tokens) > max_tokens:
        tokens = tokens[:max_tokens]
        content, tool_calls, finish = " ".join(tokens), [], "length"
    ids = [token_id(t) for t in tokens]
    logprobs = [-round(rng.expovariate(3.0) + 1e-4, 6) for _ in tokens]

    choice = chat_choice(index, content, tool_calls, finish, body.get("tool_choice"))
    if body.get("logprobs"):
        top_k = int(body.get("top_logprobs") or 0)
        choice["logprobs"] = {"content": _logprob_entries(tokens, logprobs, top_k)}
    if body.get("return_token_ids") and cfg.supports_token_ids:
        choice["token_ids"] = ids + [token_id("<extra>")] if fault == "token_mismatch" else ids
    return choice, len(ids)


def build_text_completion(
    body: dict[str, Any], prompt_ids: list[int], cfg: FakeConfig, fault: str, request_number: int
) -> dict[str, Any]:
    """The vLLM-shaped answer to a ``/v1/completions`` request whose prompt is ``prompt_ids``.

    The prompt is read back through the toy vocabulary (`decode_tokens`): a prompt rendered with
    tools (the toy chat rendering's ``tools`` part) is answered with a Hermes ``<tool_call>``
    block of the first tool, as a model that was shown them writes one; a completion that stops
    ends with the toy end of turn (``<|im_end|>``'s tokens, in ``token_ids`` but not the text, as
    vLLM keeps the stop token)."""
    temperature = body.get("temperature")
    varies = cfg.vary_unseeded and body.get("seed") is None and (temperature is None or temperature > 0)
    base_seed = stable_hash(cfg.seed, prompt_ids, body.get("seed"), request_number if varies else 0)
    reply_body = {"tools": tools_in(decode_tokens(prompt_ids))}
    asked = body.get("max_tokens", 16)
    budget = completion_budget(len(prompt_ids), asked, cfg.max_model_len)
    want_ids = bool(body.get("return_token_ids")) and cfg.supports_token_ids
    choices, completion_tokens = [], 0
    for i in range(int(body.get("n") or 1)):
        rng = random.Random(stable_hash(base_seed, i))
        text, _, _ = _reply(reply_body, cfg, fault, rng)
        tokens, finish = tokenize(text) + TURN_END, "stop"
        if len(tokens) > budget:
            tokens, finish = tokens[:budget], "length"
            text = " ".join(tokens)
        ids = [token_id(t) for t in tokens]
        if fault == "token_mismatch":
            ids.append(token_id("<extra>"))
        logprobs = [-round(rng.expovariate(3.0) + 1e-4, 6) for _ in tokens]
        choices.append(
            text_choice(
                i,
                text,
                finish,
                ids,
                logprobs,
                tokens,
                prompt_ids=prompt_ids,
                with_logprobs=body.get("logprobs") is not None,
                with_token_ids=want_ids,
            )
        )
        completion_tokens += len(tokens)
    return {
        "id": f"cmpl-{stable_hash(base_seed, 'id', request_number):016x}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": body.get("model") or cfg.model,
        "choices": choices,
        "usage": usage(len(prompt_ids), completion_tokens),
    }


def build_completion(
    body: dict[str, Any], cfg: FakeConfig, fault: str, request_number: int
) -> dict[str, Any]:
    """The vLLM-shaped response to a chat request (``fault`` may alter the decision)."""
    messages = body["messages"]
    tools = body.get("tools") or None
    prompt_ids = encode_chat(messages, tools)
    temperature = body.get("temperature")
    varies = cfg.vary_unseeded and body.get("seed") is None and (temperature is None or temperature > 0)
    base_seed = stable_hash(
        cfg.seed, messages, tools, body.get("tool_choice"), body.get("seed"), request_number if varies else 0
    )
    n = int(body.get("n") or 1)
    asked = body.get("max_completion_tokens") or body.get("max_tokens")
    budget = completion_budget(len(prompt_ids), asked, cfg.max_model_len)
    choices, completion_tokens = [], 0
    for i in range(n):
        choice, used = _choice(i, body, cfg, fault, base_seed, budget)
        choices.append(choice)
        completion_tokens += used
    response: dict[str, Any] = {
        "id": f"chatcmpl-{stable_hash(base_seed, 'id', request_number):016x}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or cfg.model,
        "choices": choices,
        "usage": usage(len(prompt_ids), completion_tokens),
        "prompt_logprobs": None,
    }
    if body.get("return_token_ids") and cfg.supports_token_ids:
        response["prompt_token_ids"] = prompt_ids
    return response


def _validate_body(body: Any, cfg: FakeConfig) -> JSONResponse | None:
    if not isinstance(body, dict):
        return JSONResponse(error_body("body must be a JSON object", "BadRequestError", 400), 400)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        return JSONResponse(error_body("messages must be a non-empty list", "BadRequestError", 400), 400)
    n = body.get("n", 1)
    if n is not None and (not isinstance(n, int) or not 1 <= n <= 128):
        return JSONResponse(error_body("n must be an integer in 1..128", "BadRequestError", 400), 400)
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is not None and (not isinstance(value, int) or value < 1):
            return JSONResponse(error_body(f"{key} must be a positive integer", "BadRequestError", 400), 400)
    temperature = body.get("temperature")
    if isinstance(temperature, int | float) and temperature < 0:
        msg = f"temperature must be non-negative, got {temperature}."
        return JSONResponse(error_body(msg, "BadRequestError", 400), 400)
    if cfg.strict_model and body.get("model") != cfg.model:
        msg = f"The model `{body.get('model')}` does not exist."
        return JSONResponse(error_body(msg, "NotFoundError", 404), 404)
    return None


def _validate_completion(body: Any, cfg: FakeConfig) -> JSONResponse | None:
    if not isinstance(body, dict):
        return JSONResponse(error_body("body must be a JSON object", "BadRequestError", 400), 400)
    try:
        ids = check_token_prompt(body.get("prompt"), VOCAB_SIZE)
    except ValueError as exc:
        return JSONResponse(error_body(f"prompt: {exc}", "BadRequestError", 400), 400)
    if ids is None and not (body["prompt"] if isinstance(body["prompt"], str) else body["prompt"][0]):
        return JSONResponse(error_body("prompt: the prompt is empty", "BadRequestError", 400), 400)
    chat_like = {k: v for k, v in body.items() if k != "prompt"}
    return _validate_body({**chat_like, "messages": [{"role": "user", "content": "-"}]}, cfg)


def _answer(body: dict[str, Any], cfg: FakeConfig, fault: str, number: int) -> Response:
    """The response to a valid chat request, with ``fault`` applied."""
    if fault == "timeout":
        return JSONResponse(error_body("gave up", "Timeout", 504), 504)
    if fault == "http_429":
        headers = {"Retry-After": f"{cfg.retry_after_s:g}"}
        return JSONResponse(error_body("rate limited", "RateLimitError", 429), 429, headers=headers)
    if fault in ("http_500", "http_503"):
        code = int(fault[-3:])
        return JSONResponse(error_body(f"injected {code}", "InternalServerError", code), code)
    completion = build_completion(body, cfg, fault, number)
    asked = body.get("max_completion_tokens") or body.get("max_tokens")
    if refused := context_error(completion["usage"]["prompt_tokens"], asked, cfg.max_model_len):
        return JSONResponse(error_body(refused, "BadRequestError", 400), 400)
    if fault == "malformed_json":
        return Response(json.dumps(completion)[:-7], media_type="application/json")
    if fault == "cut_stream":
        return _CutStreamResponse(json.dumps(completion).encode()[:64])
    return _completion_response(completion)


def _completion_response(completion: dict[str, Any]) -> Response:
    """A completion as `JSONResponse` writes it (compact, UTF-8), by orjson: the stdlib encoder
    was over a third of the fake's CPU per call (the prompt's token ids, the logprob entries),
    and in the benchmark the fake shares the CPUs of the service it measures."""
    return Response(orjson.dumps(completion), media_type="application/json")


def _json_body(raw: bytes) -> Any:
    """``json.loads(raw)``, as Starlette's ``Request.json`` (and so vLLM) reads a body, by orjson
    where it reads the same value (a fifth of the stdlib's cost, on every call of the benchmark)."""
    if orjson_reads_differently(raw):
        return json.loads(raw)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:  # NaN, Infinity and the like, which Python's json reads
        return json.loads(raw)


class _CutStreamResponse(Response):
    """Promises a longer body than it sends, then returns: uvicorn closes the connection mid-body."""

    def __init__(self, body: bytes) -> None:
        super().__init__()
        self._partial = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self._partial) * 4).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": self._partial, "more_body": True})


async def _hang(request: Request, state: FakeState, seconds: float) -> None:
    """Sleep like a stuck server, but give up when the client leaves or the server stops."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not state.stopping.is_set():
        if await request.is_disconnected():
            return
        await asyncio.sleep(0.05)


# --------------------------------------------------------------------------------------------
# The app
# --------------------------------------------------------------------------------------------


class _ChatFastPath:
    """``POST /v1/chat/completions`` goes straight to its handler, skipping FastAPI's routing
    and request machinery (about 0.1 ms of the fake's 0.35 ms a request): in the benchmark the
    fake shares the CPUs of the service it measures. The route stays declared for the docs."""

    def __init__(self, app: ASGIApp, handler: Callable[[Request], Awaitable[Response]]):
        self.app = app
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/v1/chat/completions":
            response = await self.handler(Request(scope, receive))
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def create_fake_app(config: FakeConfig | None = None) -> FastAPI:
    state = FakeState(config or FakeConfig())
    app = FastAPI(title="fake vLLM (OpenAI-compatible)")
    app.state.fake = state

    def _unauthorized(request: Request) -> JSONResponse | None:
        key = state.config.api_key
        given = request.headers.get("authorization", "").removeprefix("Bearer ")
        if key is None or given == key:
            return None
        # Like OpenAI, echo a prefix of the key that was sent (clients must redact it).
        message = f"Incorrect API key provided: {given[:12]}****. Check your key."
        return JSONResponse(error_body(message, "AuthenticationError", 401), 401)

    async def _authorized_json(request: Request) -> Any:
        """The request's JSON body, or the 401 / 400 answer that refuses it."""
        if denied := _unauthorized(request):
            return denied
        try:
            return _json_body(await request.body())
        except ValueError:
            return JSONResponse(error_body("body is not valid JSON", "BadRequestError", 400), 400)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        arrived = time.monotonic()
        number = state.count_route("chat")
        body = await _authorized_json(request)
        if isinstance(body, Response):
            return body
        cfg = state.config
        if invalid := _validate_body(body, cfg):
            return invalid
        fault = state.next_fault()

        delay = cfg.latency_s + (random.uniform(0, cfg.latency_jitter_s) if cfg.latency_jitter_s else 0.0)
        # The answer is built before the wait, so that many answers falling due together are
        # not delayed behind one another's JSON encoding.
        answer = _answer(body, cfg, fault, number)
        if delay > 0:  # counted from arrival: the fake's own work is part of its latency
            await asyncio.sleep(max(0.0, arrived + delay - time.monotonic()))
        if fault == "timeout":
            await _hang(request, state, cfg.timeout_fault_s)
        return answer

    app.add_middleware(_ChatFastPath, handler=chat_completions)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        """vLLM's completions API: a text or token-id prompt (what a token-in/token-out rollout
        sends), answered with the completion's text, ``token_ids`` and logprobs."""
        number = state.count_route("completions")
        body = await _authorized_json(request)
        if isinstance(body, Response):
            return body
        cfg = state.config
        if invalid := _validate_completion(body, cfg):
            return invalid
        prompt = body["prompt"]
        ids = check_token_prompt(prompt, VOCAB_SIZE)
        if ids is None:
            ids = encode(prompt if isinstance(prompt, str) else prompt[0])
        if refused := context_error(len(ids), body.get("max_tokens", 16), cfg.max_model_len):
            return JSONResponse(error_body(refused, "BadRequestError", 400), 400)
        fault = state.next_fault()
        if fault in ("timeout", "http_429", "http_500", "http_503", "malformed_json", "cut_stream"):
            return _answer({**body, "messages": [{"role": "user", "content": ""}]}, cfg, fault, number)
        answer = _completion_response(build_text_completion(body, ids, cfg, fault, number))
        if cfg.latency_s:
            await asyncio.sleep(cfg.latency_s)
        return answer

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        state.count_route("models")
        card = {"id": state.config.model, "object": "model", "created": 0, "owned_by": "fake"}
        return {"object": "list", "data": [card]}

    @app.post("/fake/config")
    async def set_config(request: Request) -> Response:
        """Merge the given fields into the config (the fault script restarts)."""
        try:
            patch = await request.json()
            new = FakeConfig.model_validate({**state.config.model_dump(), **patch})
        except (ValueError, TypeError) as exc:
            return JSONResponse({"detail": str(exc)}, 422)
        state.set_config(new)
        return JSONResponse(new.model_dump(mode="json", exclude={"api_key"}))

    @app.get("/fake/stats")
    async def stats() -> dict[str, Any]:
        return state.stats()

    @app.post("/fake/stats/reset")
    async def reset_stats() -> dict[str, Any]:
        state.reset_stats()
        return state.stats()

    return app


# --------------------------------------------------------------------------------------------
# Running it in a background thread (tests, benchmark)
# --------------------------------------------------------------------------------------------


class FakeInferenceServer(ServerThread):
    """Runs the fake on 127.0.0.1 (a free port by default) in a background thread.

    Use ``with FakeInferenceServer(cfg) as server:`` or ``async with``; ``server.base_url``
    is ``http://127.0.0.1:PORT`` and ``server.state`` gives direct access to config/stats.
    """

    def __init__(self, config: FakeConfig | None = None, *, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(create_fake_app(config), host=host, port=port, lifespan="off", name="fake-inference")
        self.state: FakeState = self.app.state.fake

    def set_config(self, config: FakeConfig) -> None:
        self.state.set_config(config)

    def stats(self) -> dict[str, Any]:
        return self.state.stats()

    def start(self, timeout_s: float = 15.0) -> Self:
        self.state.stopping.clear()
        return super().start(timeout_s)

    def on_stop(self) -> None:
        self.state.stopping.set()  # releases requests hanging in a `timeout` fault


def _parse_fault_prob(text: str) -> tuple[str, float]:
    kind, _, prob = text.partition("=")
    if kind not in FAULT_KINDS:
        raise argparse.ArgumentTypeError(f"unknown fault {kind!r}; choose from {', '.join(FAULT_KINDS)}")
    return kind, float(prob)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fake OpenAI-compatible server in vLLM's response shape.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every request")
    parser.add_argument("--jitter", type=float, default=0.0, help="extra uniform random latency, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--actions", type=int, nargs=2, default=(1, 4), metavar=("MIN", "MAX"))
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="answer the same prompt the same way even when unseeded at temperature > 0 (by default "
        "such requests vary, as a real LLM's samples do, so the members of a GRPO group differ)",
    )
    parser.add_argument(
        "--fault",
        type=_parse_fault_prob,
        action="append",
        default=[],
        metavar="KIND=PROB",
        help=f"inject a fault with a probability; kinds: {', '.join(FAULT_KINDS)}",
    )
    args = parser.parse_args(argv)
    config = FakeConfig(
        model=args.model,
        seed=args.seed,
        latency_s=args.latency,
        latency_jitter_s=args.jitter,
        actions_per_call=tuple(args.actions),
        fault_probs=dict(args.fault),
        vary_unseeded=not args.deterministic,
    )
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.run(create_fake_app(config), host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
