"""A model server in vLLM's shape for small models on the CPU (``grpo-service serve-model PATH``).

Routes: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/load_weights`` and
``GET /health``. A chat request is rendered with the checkpoint's chat template and sampled
with `Sampler`; concurrent requests are batched (the requests waiting when a batch starts are
decoded together). Answers have vLLM's shape: ``choices[].message`` with a leading
``<think>...</think>`` block split off as ``reasoning_content`` (as vLLM's ``qwen3`` reasoning
parser), tool calls parsed from the rest (Hermes ``<tool_call>{json}</tool_call>``, as vLLM's
``hermes`` parser; without ``tools`` the text comes back as content, e.g. for a ReAct agent that
parses ``Action:`` lines),
``choices[].logprobs.content``, and with ``return_token_ids`` the top-level
``prompt_token_ids`` and ``choices[].token_ids``. Every answer carries ``weights_version``,
which ``POST /v1/load_weights`` increments when it swaps in new weights (between batches).

Unlike vLLM, a named ``tool_choice`` is not enforced by guided decoding: the model samples
freely, and a reply without a parsable call comes back as content (the policy records it).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from inference.completions import chat_choice, error_body
from inference.reasoning import split_reasoning
from training.llm.chat import parse_tool_calls
from training.llm.model import load, stop_token_ids
from training.llm.sampling import Sample, Sampler, SampleRequest

DEFAULT_MAX_TOKENS = 512


class ServeError(Exception):
    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.message, self.status, self.kind = message, status, kind


def _error(message: str, kind: str, status: int) -> JSONResponse:
    return JSONResponse(error_body(message, kind, status), status_code=status)


# ------------------------------------------------------------------------------------ request


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class ChatRequest(BaseModel):
    """The fields of OpenAI's/vLLM's chat request this server honours (others are accepted)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    n: int = Field(default=1, ge=1, le=64)
    seed: int | None = Field(default=None, ge=0, le=2**62)
    temperature: float = Field(default=1.0, ge=0, le=10)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    return_token_ids: bool = False
    stream: bool = False
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> ChatRequest:
        if self.stream:
            raise ValueError("stream: streaming is not supported by this server")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]


# ------------------------------------------------------------------------------------- engine


@dataclass
class _Job:
    request: SampleRequest
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[tuple[list[Sample], int]]


class ModelEngine:
    """Owns the model: one worker thread decodes batches of waiting requests; new weights are
    swapped in between batches and bump ``weights_version``."""

    def __init__(self, path: str | Path, *, max_batch_rows: int = 32, served_name: str | None = None):
        self.path = Path(path)
        self.model, self.tokenizer = load(self.path)
        self.served_name = served_name or self.path.name
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = self.tokenizer.eos_token_id or 0
        self.sampler = Sampler(self.model, self.tokenizer, stop_token_ids(self.tokenizer, self.model), pad)
        self.max_batch_rows = max_batch_rows
        self.weights_version = 0
        self.weights_path = str(self.path)
        self.batches = 0
        self.batched_rows = 0
        self._lock = threading.Lock()  # held while decoding and while swapping weights
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="model-engine", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=30)

    # ---- prompts ----------------------------------------------------------------------------

    def prompt_ids(self, req: ChatRequest) -> list[int]:
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=req.tools or None,
                add_generation_prompt=True,
                tokenize=False,
                **req.chat_template_kwargs,
            )
        except Exception as exc:  # a template error is the request's fault
            raise ServeError(f"cannot render the chat template: {exc}") from None
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    # ---- sampling ---------------------------------------------------------------------------

    async def sample(self, request: SampleRequest) -> tuple[list[Sample], int]:
        loop = asyncio.get_running_loop()
        job = _Job(request, loop, loop.create_future())
        self._jobs.put(job)
        return await job.future

    def _run(self) -> None:
        while True:
            first = self._jobs.get()
            if first is None:
                return
            jobs, rows = [first], first.request.n
            while rows < self.max_batch_rows:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    self._jobs.put(None)
                    break
                jobs.append(job)
                rows += job.request.n
            with self._lock:
                version = self.weights_version
                try:
                    results: list[Any] = self.sampler.generate([j.request for j in jobs])
                except Exception as exc:
                    results = [exc] * len(jobs)
                self.batches += 1
                self.batched_rows += rows
            for job, result in zip(jobs, results, strict=True):
                job.loop.call_soon_threadsafe(_settle, job.future, result, version)

    # ---- weights ----------------------------------------------------------------------------

    def load_weights(self, path: str | Path) -> int:
        """Copy the weights of the checkpoint at ``path`` into the served model; the new version."""
        new_model, _ = load(path)
        state = new_model.state_dict()
        with self._lock:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            if missing or unexpected:
                raise ServeError(
                    f"checkpoint {path} does not fit the served model "
                    f"(missing {missing[:3]}, unexpected {unexpected[:3]})",
                    status=422,
                    kind="UnprocessableEntityError",
                )
            self.weights_version += 1
            self.weights_path = str(path)
            return self.weights_version


def _settle(future: asyncio.Future[Any], result: Any, version: int) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result((result, version))


# ----------------------------------------------------------------------------------- response


def _logprob_entry(tokenizer: Any, token: int, logprob: float, top: list[tuple[int, float]] | None) -> dict:
    text = tokenizer.decode([token])
    entry: dict[str, Any] = {"token": text, "logprob": logprob, "bytes": list(text.encode())}
    entry["top_logprobs"] = [
        {"token": (t := tokenizer.decode([i])), "logprob": lp, "bytes": list(t.encode())}
        for i, lp in top or []
    ]
    return entry


def _choice(index: int, sample: Sample, req: ChatRequest, tokenizer: Any) -> dict[str, Any]:
    reasoning, text = split_reasoning(sample.text)
    content: str | None = text
    tool_calls: list[dict[str, Any]] = []
    finish = sample.finish_reason
    if req.tools and req.tool_choice != "none":
        content, tool_calls = parse_tool_calls(text)
        if tool_calls and finish == "stop":
            finish = "tool_calls"
    choice = chat_choice(index, content, tool_calls, finish, reasoning)
    if req.logprobs:
        tops = sample.top_logprobs or [None] * len(sample.token_ids)
        choice["logprobs"] = {
            "content": [
                _logprob_entry(tokenizer, t, lp, top)
                for t, lp, top in zip(sample.token_ids, sample.logprobs, tops, strict=True)
            ]
        }
    if req.return_token_ids:
        choice["token_ids"] = sample.token_ids
    return choice


# ------------------------------------------------------------------------------------------ app


class LoadWeightsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, description="A local checkpoint directory of the same architecture.")


def create_model_app(engine: ModelEngine) -> FastAPI:
    app = FastAPI(title="grpo-service model server (vLLM-shaped)")
    app.state.engine = engine

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'] if p != 'body')}: {e['msg']}" for e in exc.errors()
        )
        return _error(problems or "invalid request", "BadRequestError", 400)

    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, exc: ServeError) -> JSONResponse:
        return _error(exc.message, exc.kind, exc.status)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": engine.served_name,
            "weights_version": engine.weights_version,
            "weights_path": engine.weights_path,
            "batches": engine.batches,
            "batched_rows": engine.batched_rows,
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": engine.served_name,
            "object": "model",
            "created": 0,
            "owned_by": "grpo-service",
            "root": str(engine.path),
            "max_model_len": engine.sampler.max_positions,
            "weights_version": engine.weights_version,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest) -> JSONResponse:
        if req.model and req.model not in (engine.served_name, str(engine.path)):
            raise ServeError(f"The model `{req.model}` does not exist.", 404, "NotFoundError")
        prompt = engine.prompt_ids(req)
        limit = engine.sampler.max_positions
        room = limit - len(prompt)
        asked = req.max_completion_tokens or req.max_tokens
        if room <= 0 or (asked is not None and asked > room):
            raise ServeError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(prompt) + (asked or 0)} tokens ({len(prompt)} in the messages, {asked or 0} in "
                "the completion). Please reduce the length of the messages or completion."
            )
        sample_req = SampleRequest(
            prompt_ids=prompt,
            max_tokens=asked or min(DEFAULT_MAX_TOKENS, room),
            n=req.n,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            stop=req.stops(),
            top_logprobs=req.top_logprobs or 0,
        )
        samples, version = await engine.sample(sample_req)
        choices = [_choice(i, s, req, engine.tokenizer) for i, s in enumerate(samples)]
        completion_tokens = sum(len(s.token_ids) for s in samples)
        body: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": engine.served_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt) + completion_tokens,
            },
            "prompt_logprobs": None,
            "weights_version": version,
        }
        if req.return_token_ids:
            body["prompt_token_ids"] = prompt
        return JSONResponse(body)

    @app.post("/v1/load_weights")
    async def load_weights(req: LoadWeightsRequest) -> dict[str, Any]:
        path = Path(req.path)
        if not (path / "config.json").is_file():
            raise ServeError(
                f"{req.path} is not a checkpoint directory (no config.json)", 422, "UnprocessableEntityError"
            )
        started = time.monotonic()
        version = await asyncio.to_thread(engine.load_weights, path)
        return {"weights_version": version, "path": str(path), "load_s": round(time.monotonic() - started, 3)}

    return app
