"""A model server in vLLM's shape for small models on the CPU (``grpo-service serve-model PATH``).

It answers what the task app and the trainer use of vLLM, the same way vLLM 0.32 does
(tests/test_vllm_parity.py sends the same requests to both): ``GET /v1/models``,
``POST /v1/chat/completions``, ``POST /v1/completions`` (a text or token-id prompt: what a
token-in/token-out rollout sends) and ``GET /health``, and vLLM's RL weight-sync routes (served by
vLLM with ``VLLM_SERVER_DEV_MODE=1``): ``POST /pause``, ``POST /resume``, ``GET /is_paused``,
``POST /collective_rpc`` (method ``reload_weights`` with ``kwargs.weights_path``),
``POST /update_weight_version`` and ``GET /weight_info``. So a GRPO trainer drives either
server with one code path (`training.llm.weight_sync`).

A chat request is rendered with the checkpoint's chat template and sampled with `Sampler`;
concurrent requests are batched (the requests waiting when a batch starts are decoded
together). Answers have vLLM's shape: ``choices[].message`` with a leading
``<think>...</think>`` block split off as ``reasoning_content`` (as vLLM's ``qwen3`` reasoning
parser), tool calls parsed from the rest (Hermes ``<tool_call>{json}</tool_call>``, as vLLM's
``hermes`` parser; without ``tools`` the text comes back as content, e.g. for a ReAct agent
that parses ``Action:`` lines), ``choices[].logprobs.content``, and with ``return_token_ids`` the top-level
``prompt_token_ids`` and ``choices[].token_ids``. Like vLLM, a completion does not say which
weights made it: the trainer that set the version knows (it pauses generation across a switch).

Unlike vLLM, a named ``tool_choice`` is not enforced by guided decoding: the model samples
freely, and a reply without a parsable call comes back as content (the policy records it).
A pause lets the batch being decoded finish under every mode (vLLM's ``keep`` freezes it); a
chat waits at most ``pause_wait_s`` of a pause, then is answered 503 with ``Retry-After``.
``/pause`` and ``/resume`` need a JSON content type (a web page cannot send one cross-origin
without a preflight). A request's own ``chat_template`` is refused unless the app trusts them
(vLLM's ``--trust-request-chat-template``); templates render off the event loop. A weight reload
checks the whole checkpoint before any served weight changes (`ModelEngine.reload_weights`).
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from inference.completions import (
    chat_choice,
    check_token_prompt,
    completion_budget,
    context_error,
    error_body,
    text_choice,
    usage,
)
from inference.reasoning import split_reasoning
from inference.tool_calls import parse_tool_calls
from training.llm.model import load, stop_token_ids
from training.llm.sampling import Sample, Sampler, SampleRequest


class ServeError(Exception):
    def __init__(
        self,
        message: str,
        status: int = 400,
        kind: str = "BadRequestError",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.kind, self.headers = message, status, kind, headers


def _error(message: str, kind: str, status: int, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, kind, status), status_code=status, headers=headers)


TRUST_TEMPLATE_FLAG = "--trust-request-chat-template"


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
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> ChatRequest:
        if self.stream:
            raise ValueError("stream: streaming is not supported by this server")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def supplies_template(self) -> bool:
        """Whether the request brings its own chat template (vLLM's two places for one)."""
        return self.chat_template is not None or self.chat_template_kwargs.get("chat_template") is not None

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]


class CompletionRequest(BaseModel):
    """The fields of vLLM's ``/v1/completions`` request this server honours: one prompt, as text or
    token ids (a token-in/token-out rollout sends the exact stream it extends), sampled as a chat is."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: str | list[int] | list[list[int]] | list[str]
    n: int = Field(default=1, ge=1, le=64)
    seed: int | None = Field(default=None, ge=0, le=2**62)
    temperature: float = Field(default=1.0, ge=0, le=10)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_tokens: int | None = Field(default=16, ge=1)
    stop: str | list[str] | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)
    return_token_ids: bool = False
    stream: bool = False
    echo: bool = False

    @model_validator(mode="after")
    def _check(self) -> CompletionRequest:
        if self.stream:
            raise ValueError("stream: streaming is not supported by this server")
        if self.echo:
            raise ValueError("echo: not supported by this server")
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
    future: asyncio.Future[list[Sample]]
    queued_at: float = 0.0
    state: Literal["queued", "taken", "dropped"] = "queued"


class ModelEngine:
    """Owns the model: one worker thread decodes batches of waiting requests; new weights are
    swapped in between batches. While paused, no new batch starts: a request waits in the queue
    at most ``pause_wait_s`` of the pause, then is dropped and answered 503 with ``Retry-After``."""

    def __init__(
        self,
        path: str | Path,
        *,
        max_batch_rows: int = 32,
        served_name: str | None = None,
        pause_wait_s: float = 30.0,
    ):
        self.path = Path(path)
        self.model, self.tokenizer = load(self.path)
        self.served_name = served_name or self.path.name
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = self.tokenizer.eos_token_id or 0
        self.sampler = Sampler(self.model, self.tokenizer, stop_token_ids(self.tokenizer, self.model), pad)
        self.max_batch_rows = max_batch_rows
        self.weights_version = "default"  # a label the trainer sets, as vLLM's /update_weight_version
        self.weights_path = str(self.path)
        self.pause_wait_s = pause_wait_s
        self._running = threading.Event()
        self._running.set()
        self._paused_at = 0.0
        self._claim = threading.Lock()  # a queued job is taken by a batch or dropped, never both
        self.batches = 0
        self.batched_rows = 0
        self._lock = threading.Lock()  # held while decoding and while swapping weights
        self._reload_lock = threading.Lock()
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="model-engine", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._running.set()
        self._jobs.put(None)
        self._thread.join(timeout=30)

    # ---- prompts ----------------------------------------------------------------------------

    def prompt_ids(self, req: ChatRequest) -> list[int]:
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        template = {"chat_template": req.chat_template} if req.chat_template is not None else {}
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=req.tools or None,
                add_generation_prompt=True,
                tokenize=False,
                **template,
                **req.chat_template_kwargs,
            )
        except Exception as exc:  # a template error is the request's fault
            raise ServeError(f"cannot render the chat template: {exc}") from None
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def completion_prompt_ids(self, req: CompletionRequest) -> list[int]:
        """The ids of a completions prompt: as sent, or the text encoded (special tokens read as
        such, no BOS added: Qwen3's tokenizer adds none)."""
        try:
            ids = check_token_prompt(req.prompt, len(self.tokenizer))
        except ValueError as exc:
            raise ServeError(f"prompt: {exc}") from None
        if ids is not None:
            return ids
        text = req.prompt if isinstance(req.prompt, str) else req.prompt[0]
        assert isinstance(text, str)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if not ids:
            raise ServeError("prompt: the prompt is empty")
        return ids

    # ---- sampling ---------------------------------------------------------------------------

    async def sample(self, request: SampleRequest) -> list[Sample]:
        """The samples of ``request``, decoded in the next batch. While the engine is paused the
        request waits at most ``pause_wait_s`` (counted from the later of its arrival and the
        pause), then is dropped: `ServeError` 503 with ``Retry-After``."""
        loop = asyncio.get_running_loop()
        job = _Job(request, loop, loop.create_future(), queued_at=time.monotonic())
        self._jobs.put(job)
        try:
            while not job.future.done():
                wait = self.pause_wait_s
                if self.paused:
                    wait = max(job.queued_at, self._paused_at) + self.pause_wait_s - time.monotonic()
                    if wait <= 0:
                        if self._drop(job):
                            raise ServeError(
                                f"generation is paused (a weight update); waited {self.pause_wait_s:g}s",
                                503,
                                "ServiceUnavailableError",
                                headers={"Retry-After": "1"},
                            )
                        return await job.future  # a batch took it: it is being decoded
                await asyncio.wait({job.future}, timeout=min(max(wait, 0.01), 1.0))
            return job.future.result()
        except asyncio.CancelledError:  # the client went away: decode nothing for it
            self._drop(job)
            raise

    def _drop(self, job: _Job) -> bool:
        with self._claim:
            if job.state == "queued":
                job.state = "dropped"
        return job.state == "dropped"

    def _take(self, job: _Job) -> bool:
        with self._claim:
            if job.state == "queued":
                job.state = "taken"
        return job.state == "taken"

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self._running.wait()
            jobs: list[_Job] = []
            rows = 0
            while True:
                if self._take(job):
                    jobs.append(job)
                    rows += job.request.n
                if rows >= self.max_batch_rows:
                    break
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    self._jobs.put(None)
                    break
            if not jobs:
                continue
            with self._lock:
                try:
                    results: list[Any] = self.sampler.generate([j.request for j in jobs])
                except Exception as exc:
                    results = [exc] * len(jobs)
                self.batches += 1
                self.batched_rows += rows
            for job, result in zip(jobs, results, strict=True):
                job.loop.call_soon_threadsafe(_settle, job.future, result)

    # ---- weights ----------------------------------------------------------------------------

    def pause(self) -> None:
        """Start no new batch; return when the batch being decoded (if any) has finished."""
        if not self.paused:
            self._paused_at = time.monotonic()
        self._running.clear()
        with self._lock:
            pass

    def resume(self) -> None:
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def reload_weights(self, path: str | Path) -> None:
        """Replace the served model's weights with the checkpoint's at ``path`` (vLLM's worker
        method of the same name, reached through ``/collective_rpc``).

        The checkpoint is read and checked in full first (`validated_state`): every tensor the
        served model holds is there with its shape, a floating dtype and finite values. Only then
        are the weights copied in, all of them under the lock decoding holds, so no batch sees a
        half-loaded model. A refused checkpoint (`ServeError`, 400) leaves the model untouched."""
        with self._reload_lock:  # two reloads never interleave their checks and swaps
            state = self.validated_state(Path(path))
            live = self.model.state_dict()
            with self._lock, torch.no_grad():
                for name, tensor in state.items():
                    live[name].copy_(tensor)
                self.weights_path = str(path)

    def validated_state(self, path: Path) -> dict[str, Any]:
        """The checkpoint's tensors keyed as the served model's ``state_dict``, cast to the served
        dtype, one per storage (tied weights once), or `ServeError` naming what does not fit."""
        served_type = getattr(self.model.config, "model_type", None)
        config = _read_config(path)
        if served_type and config.get("model_type") not in (None, served_type):
            raise ServeError(
                f"checkpoint {path} is a {config.get('model_type')!r} model; "
                f"the served model is {served_type!r}"
            )
        checkpoint = read_checkpoint(path)
        live = self.model.state_dict()
        groups: dict[tuple[Any, ...], list[str]] = {}
        for name, tensor in live.items():  # tied weights share one storage: one group
            key = (tensor.data_ptr(), tuple(tensor.shape)) if tensor.numel() else (name,)
            groups.setdefault(key, []).append(name)
        unexpected = sorted(set(checkpoint) - set(live))
        if unexpected:
            raise ServeError(
                f"checkpoint {path} has {len(unexpected)} tensor(s) the served model does not: "
                f"{', '.join(unexpected[:5])}"
            )
        missing = [names[0] for names in groups.values() if not any(n in checkpoint for n in names)]
        if missing:
            raise ServeError(
                f"checkpoint {path} lacks {len(missing)} tensor(s) of the served model: "
                f"{', '.join(missing[:5])}"
            )
        state: dict[str, Any] = {}
        for names in groups.values():
            target = live[names[0]]
            chosen: Any = None
            for name in (n for n in names if n in checkpoint):
                tensor = checkpoint[name]
                if tuple(tensor.shape) != tuple(target.shape):
                    raise ServeError(
                        f"checkpoint {path}: {name} has shape {list(tensor.shape)}, the served model's "
                        f"is {list(target.shape)}"
                    )
                if (
                    not (tensor.is_floating_point() and target.is_floating_point())
                    and tensor.dtype != target.dtype
                ):
                    raise ServeError(
                        f"checkpoint {path}: {name} is {str(tensor.dtype).removeprefix('torch.')}, the "
                        f"served model's is {str(target.dtype).removeprefix('torch.')}"
                    )
                tensor = tensor.to(target.dtype)
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                    raise ServeError(f"checkpoint {path}: {name} has non-finite values (NaN or inf)")
                if chosen is None:
                    chosen = tensor
                elif not torch.equal(chosen, tensor):
                    raise ServeError(
                        f"checkpoint {path}: {name} differs from {names[0]}, "
                        "which the served model ties to it"
                    )
            state[names[0]] = chosen
        return state


WEIGHT_INDEX = "model.safetensors.index.json"


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ServeError(f"checkpoint {path}: config.json is not readable JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ServeError(f"checkpoint {path}: config.json is not a JSON object")
    return config


def read_checkpoint(path: Path) -> dict[str, Any]:
    """Every tensor of the checkpoint directory ``path``, as vLLM's loader finds them: the files
    ``model.safetensors.index.json`` names, else every ``*.safetensors`` file, else
    ``pytorch_model.bin`` (read with ``weights_only``). `ServeError` if none is there or one
    cannot be read; a name in two files must hold the same tensor in both."""
    from safetensors.torch import load_file

    index = path / WEIGHT_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = sorted({path / str(name) for name in weight_map.values()})
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ServeError(f"checkpoint {path}: {WEIGHT_INDEX} is malformed ({exc!r})") from None
    else:
        files = sorted(path.glob("*.safetensors"))
        if not files and (path / "pytorch_model.bin").is_file():
            files = [path / "pytorch_model.bin"]
    if not files:
        raise ServeError(f"checkpoint {path} has no weights (no *.safetensors nor pytorch_model.bin)")
    tensors: dict[str, Any] = {}
    for file in files:
        if file.resolve().parent != path.resolve():
            raise ServeError(f"checkpoint {path}: {WEIGHT_INDEX} names a file outside the checkpoint")
        try:
            if file.suffix == ".bin":
                loaded = torch.load(file, map_location="cpu", weights_only=True)
            else:
                loaded = load_file(str(file), device="cpu")
        except Exception as exc:  # a truncated or garbled file: the checkpoint's fault
            raise ServeError(
                f"checkpoint {path}: cannot read {file.name} ({type(exc).__name__}: {exc})"
            ) from None
        if not isinstance(loaded, dict) or not all(isinstance(t, torch.Tensor) for t in loaded.values()):
            raise ServeError(f"checkpoint {path}: {file.name} is not a file of named tensors")
        for name, tensor in loaded.items():
            if name in tensors and not (
                tensors[name].shape == tensor.shape
                and torch.equal(tensors[name], tensor.to(tensors[name].dtype))
            ):
                raise ServeError(f"checkpoint {path}: {name} appears in two files with different values")
            tensors.setdefault(name, tensor)
    return tensors


def _settle(future: asyncio.Future[Any], result: Any) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


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
    choice = chat_choice(index, content, tool_calls, finish, req.tool_choice, reasoning)
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


class CollectiveRPCRequest(BaseModel):
    """vLLM's ``/collective_rpc`` body; serve-model knows one method, ``reload_weights``."""

    model_config = ConfigDict(extra="forbid")

    method: str = Field(description="The worker method: `reload_weights`.")
    args: list[str] = Field(default_factory=list)
    kwargs: dict[str, str] = Field(
        default_factory=dict, description="`weights_path`: a checkpoint directory."
    )
    timeout: float | None = Field(default=None, gt=0)


class WeightVersionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    new_version: str = Field(min_length=1, max_length=200)


def _require_json(request: Request) -> None:
    """A control route answers only a request with a JSON content type: a web page cannot send
    one to another origin without a CORS preflight, which this server never grants."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise ServeError(
            f"{request.method} {request.url.path} needs Content-Type: application/json "
            "(send a JSON body, e.g. {})",
            415,
            "UnsupportedMediaTypeError",
        )


def create_model_app(engine: ModelEngine, *, trust_request_chat_template: bool = False) -> FastAPI:
    """The HTTP app over ``engine``. A request's own ``chat_template`` is refused (400) unless
    ``trust_request_chat_template`` (vLLM's ``--trust-request-chat-template``)."""
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
        return _error(exc.message, exc.kind, exc.status, exc.headers)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": engine.served_name,
            "weight_version": engine.weights_version,
            "weights_path": engine.weights_path,
            "paused": engine.paused,
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
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest) -> JSONResponse:
        if req.model and req.model not in (engine.served_name, str(engine.path)):
            raise ServeError(f"The model `{req.model}` does not exist.", 404, "NotFoundError")
        if req.supplies_template() and not trust_request_chat_template:
            raise ServeError(
                "chat_template: a chat template in the request is refused; start serve-model with "
                f"{TRUST_TEMPLATE_FLAG} to allow it"
            )
        prompt = await asyncio.to_thread(engine.prompt_ids, req)  # a template can be slow: off the loop
        limit = engine.sampler.max_positions
        asked = req.max_completion_tokens or req.max_tokens
        if refused := context_error(len(prompt), asked, limit):
            raise ServeError(refused)
        sample_req = SampleRequest(
            prompt_ids=prompt,
            max_tokens=completion_budget(len(prompt), asked, limit),
            n=req.n,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            stop=req.stops(),
            top_logprobs=req.top_logprobs or 0,
        )
        samples = await engine.sample(sample_req)
        choices = [_choice(i, s, req, engine.tokenizer) for i, s in enumerate(samples)]
        completion_tokens = sum(len(s.token_ids) for s in samples)
        body: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": engine.served_name,
            "choices": choices,
            "usage": usage(len(prompt), completion_tokens),
            "prompt_logprobs": None,
        }
        if req.return_token_ids:
            body["prompt_token_ids"] = prompt
        return JSONResponse(body)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> JSONResponse:
        """vLLM's completions API over a token-id (or text) prompt: what a token-in/token-out
        rollout sends (the stream so far), answered with the completion's text, ``token_ids`` and
        per-token logprobs as vLLM 0.32 answers them."""
        if req.model and req.model not in (engine.served_name, str(engine.path)):
            raise ServeError(f"The model `{req.model}` does not exist.", 404, "NotFoundError")
        prompt = engine.completion_prompt_ids(req)
        limit = engine.sampler.max_positions
        if refused := context_error(len(prompt), req.max_tokens, limit):
            raise ServeError(refused)
        sample_req = SampleRequest(
            prompt_ids=prompt,
            max_tokens=completion_budget(len(prompt), req.max_tokens, limit),
            n=req.n,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            stop=req.stops(),
        )
        samples = await engine.sample(sample_req)
        tokenizer = engine.tokenizer
        choices = [
            text_choice(
                i,
                s.text,
                s.finish_reason,
                s.token_ids,
                s.logprobs,
                [tokenizer.decode([t]) for t in s.token_ids] if req.logprobs is not None else [],
                prompt_ids=prompt,
                with_logprobs=req.logprobs is not None,
                with_token_ids=req.return_token_ids,
            )
            for i, s in enumerate(samples)
        ]
        completion_tokens = sum(len(s.token_ids) for s in samples)
        return JSONResponse(
            {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": engine.served_name,
                "choices": choices,
                "usage": usage(len(prompt), completion_tokens),
            }
        )

    # ---- vLLM's RL routes (VLLM_SERVER_DEV_MODE=1): bodies and answers as vLLM 0.32's -----------

    @app.post("/pause")
    async def pause(
        request: Request, mode: Literal["abort", "wait", "keep"] = "abort", clear_cache: bool = True
    ) -> dict[str, str]:
        _require_json(request)
        await asyncio.to_thread(engine.pause)
        return {"status": "paused"}

    @app.post("/resume")
    async def resume(request: Request) -> dict[str, str]:
        _require_json(request)
        engine.resume()
        return {"status": "resumed"}

    @app.get("/is_paused")
    async def is_paused() -> dict[str, bool]:
        return {"is_paused": engine.paused}

    @app.post("/collective_rpc")
    async def collective_rpc(req: CollectiveRPCRequest) -> dict[str, list[None]]:
        if req.method != "reload_weights":
            raise ServeError(f"serve-model has no worker method {req.method!r} (it knows 'reload_weights')")
        path = Path(req.kwargs.get("weights_path") or engine.weights_path)
        if not (path / "config.json").is_file():
            raise ServeError(f"{path} is not a checkpoint directory (no config.json)")
        await asyncio.to_thread(engine.reload_weights, path)
        return {"results": [None]}

    @app.post("/update_weight_version")
    async def update_weight_version(req: WeightVersionRequest) -> dict[str, Any]:
        engine.weights_version = req.new_version
        return {"success": True, "new_version": req.new_version}

    @app.get("/weight_info")
    async def weight_info() -> dict[str, str]:
        return {"weight_version": engine.weights_version}

    return app
