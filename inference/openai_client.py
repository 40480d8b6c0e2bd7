"""One async chat-completion client over the ``openai`` package, with our own bounded retries.

The ``openai`` client's retries are off (``max_retries=0``): we retry only 429 (honouring
``Retry-After``), 5xx, connection errors and timeouts, with exponential backoff and jitter,
and every call has an overall deadline. Token ids and logprobs are taken from the response
exactly as the server returned them (vLLM: ``prompt_token_ids`` top-level,
``choices[i].token_ids``), never re-tokenized.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import importlib.util
import json
import math
import os
import random
import sys
import time
import urllib.parse
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import httpx2
import orjson
import pydantic
import yarl
from pydantic import SecretStr

from inference.calls import LLMCall
from inference.errors import InferenceError, TokenMismatchError
from inference.nesting import MAX_JSON_DEPTH, too_deep
from inference.transport import (
    KEEPALIVE_S,
    MAX_CONNECTIONS,
    MAX_DETAIL_CHARS,
    TRANSPORTS,
    LeanTransport,
    TransportName,
    classify_lean,
    status_error,
    too_large,
)

if TYPE_CHECKING:
    import openai

# Generous: a hidden per-client connection cap silently serializes concurrent rollouts. Idle
# connections are dropped before the server's own idle timeout (uvicorn's and so vLLM's: 5 s), or
# a request sent on a connection the server is closing fails with a connection error.
HTTP_LIMITS = httpx2.Limits(
    max_connections=MAX_CONNECTIONS, max_keepalive_connections=512, keepalive_expiry=KEEPALIVE_S
)
# The largest reply accepted. A vLLM reply to max_tokens=32768 with per-token logprobs is about
# 3 MB; a bigger one is refused while it streams in (it would be held in memory, then traced).
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
# Keys of a request that are call options, not body fields (as `chat.completions.create` takes them).
_OPTION_KEYS = ("extra_body", "extra_headers", "extra_query")


def _sdk() -> Any:
    """The openai package, imported on first use: only ``transport="sdk"`` needs it, and importing
    it costs about half a second (every Ray host, CLI and subprocess would pay it at start)."""
    import openai

    return openai


@functools.cache
def _auth_option() -> dict[str, Any]:
    """Newer openai releases name the auth scheme per call in the request options (`create`
    passes the same); without it they send no Authorization header."""
    if "security" in getattr(_sdk(), "RequestOptions", dict).__annotations__:
        return {"security": {"bearer_auth": True}}
    return {}


def normalize_base_url(url: str) -> str:
    """``http://vllm:8001`` → ``http://vllm:8001/v1``; a full endpoint URL is cut back to ``/v1``."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"inference URL must start with http:// or https://, got {url!r:.100}")
    if "@" in url.split("/", 3)[2]:
        # Not usable (the key goes in `Authorization: Bearer`, which URL credentials would
        # clash with: aiohttp raises), and not shown back (it would print the password).
        raise ValueError(
            "an inference URL must not carry credentials (user:password@); give the key as api_key"
        )
    for suffix in ("/chat/completions", "/completions"):
        if url.endswith(suffix):
            url = url[: -len(suffix)]
    return url if url.endswith("/v1") else url + "/v1"


def same_endpoint(a: str, b: str) -> bool:
    """Whether two inference URLs name the same endpoint (scheme, host, port and path)."""
    return _endpoint(a) == _endpoint(b) is not None


def _endpoint(url: str) -> tuple[Any, ...] | None:
    try:
        split = urllib.parse.urlsplit(normalize_base_url(url))
        port = split.port or {"http": 80, "https": 443}.get(split.scheme.lower())
    except ValueError:
        return None
    return (split.scheme.lower(), split.hostname, port, split.path, split.username, split.password)


def resolve_api_key(explicit: str | SecretStr | None = None) -> str:
    """Explicit key, else ``INFERENCE_API_KEY``, else ``OPENAI_API_KEY``, else ``"EMPTY"`` (vLLM)."""
    if isinstance(explicit, SecretStr):
        explicit = explicit.get_secret_value()
    return explicit or os.environ.get("INFERENCE_API_KEY") or os.environ.get("OPENAI_API_KEY") or "EMPTY"


def proxy_auth_headers() -> dict[str, str]:
    """Modal's proxy-auth headers (``Modal-Key``, ``Modal-Secret``) from ``MODAL_PROXY_TOKEN_ID``
    and ``MODAL_PROXY_TOKEN_SECRET``, for an inference server deployed with
    ``requires_proxy_auth`` (``modal_vllm.py`` with its weight-sync routes on); none when unset."""
    token_id = os.environ.get("MODAL_PROXY_TOKEN_ID", "")
    secret = os.environ.get("MODAL_PROXY_TOKEN_SECRET", "")
    if bool(token_id) != bool(secret):
        raise ValueError("set both MODAL_PROXY_TOKEN_ID and MODAL_PROXY_TOKEN_SECRET, or neither")
    return {"Modal-Key": token_id, "Modal-Secret": secret} if token_id else {}


def redact(text: str, secret: str | None) -> str:
    """Remove ``secret`` and any 8+ character piece of it (servers echo key prefixes)."""
    if not secret or secret == "EMPTY" or len(secret) < 4:
        return text
    text = text.replace(secret, "***")
    window = 8
    for i in range(max(0, len(secret) - window + 1)):
        piece = secret[i : i + window]
        start = text.find(piece)
        while start != -1:
            # Cut the whole echoed run, not only this window: cutting 8 characters out of a
            # 12-character echo would leave 4 characters of the key.
            end, j = start + window, i + window
            while end < len(text) and j < len(secret) and text[end] == secret[j]:
                end, j = end + 1, j + 1
            text = text[:start] + "***" + text[end:]
            start = text.find(piece)
    return text


def transport_name(name: str | None = None) -> TransportName:
    """``name``, else ``INFERENCE_TRANSPORT``, else ``"lean"``."""
    name = name or os.environ.get("INFERENCE_TRANSPORT") or "lean"
    if name not in TRANSPORTS:
        raise ValueError(f"INFERENCE_TRANSPORT must be one of {', '.join(TRANSPORTS)}, got {name!r:.40}")
    return name  # type: ignore[return-value]


def _refused(exc: BaseException) -> OSError | None:
    """The connect failure (not a timeout) behind ``exc``, if any.

    openai's aiohttp transport reports a refused connection as ``ConnectTimeout``, so an
    ``APITimeoutError`` may really be a refused or unreachable server.
    """
    seen = 0
    cause: BaseException | None = exc.__cause__ or exc.__context__
    while cause is not None and seen < 8:
        if isinstance(cause, OSError) and not isinstance(cause, TimeoutError):
            return cause
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return None


def _classify(exc: BaseException) -> InferenceError | None:
    """Map an exception from one attempt to an InferenceError (None: not ours to handle)."""
    openai = sys.modules.get("openai")  # not imported: no exception of the SDK's to map
    if openai is not None:
        if isinstance(exc, openai.APITimeoutError):
            refused = _refused(exc)
            if refused is not None:
                return InferenceError("connection_error", f"{type(refused).__name__}: {refused}")
            return InferenceError("timeout", "request timed out")
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__
            detail = f"{type(cause).__name__}: {cause}" if cause else str(exc)
            return InferenceError("connection_error", detail)
        if isinstance(exc, openai.APIStatusError):
            return status_error(exc.status_code, exc.message, exc.response.headers)
        if isinstance(exc, openai.APIResponseValidationError):
            return InferenceError("malformed_response", f"{type(exc).__name__}: {exc}")
    return _classify_plain(exc)


def _classify_plain(exc: BaseException) -> InferenceError | None:
    """`_classify` for the exceptions that are not the openai SDK's own."""
    if isinstance(exc, TimeoutError):
        return InferenceError("timeout", "request timed out")
    if isinstance(exc, httpx2.TimeoutException):  # reading an error page's body
        return InferenceError("timeout", "request timed out")
    if isinstance(exc, httpx2.TransportError):
        return InferenceError("connection_error", f"{type(exc).__name__}: {exc}")
    if isinstance(exc, (json.JSONDecodeError, pydantic.ValidationError)):
        return InferenceError("malformed_response", f"{type(exc).__name__}: {exc}")
    return classify_lean(exc)


def _completion_dict(raw: Any) -> dict[str, Any]:
    """The response body (the raw bytes `_create` asks the client for) as a plain dict.

    Strict JSON (orjson: ``NaN``/``Infinity`` and numbers beyond a double, which Python's parser
    accepts, would reach the trainer as a null logprob and the trace DB as text that is not
    JSON), nested at most `MAX_JSON_DEPTH` deep outside the token data (ids and logprob entries
    are checked by type where they are read, and never kept as nested JSON)."""
    if not isinstance(raw, bytes | bytearray):
        raise InferenceError("malformed_response", f"expected a chat completion, got {type(raw).__name__}")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InferenceError(
            "malformed_response", f"the reply is not strict JSON (RFC 8259): {exc}"
        ) from None
    if not isinstance(data, dict):
        raise InferenceError("malformed_response", f"expected a JSON object, got {type(data).__name__}")
    if too_deep(compact_response(data)):
        raise InferenceError("malformed_response", f"the reply nests more than {MAX_JSON_DEPTH} levels")
    return data


def _malformed(what: str, expected: str) -> InferenceError:
    return InferenceError("malformed_response", f"{what} is not {expected}")


def _check_str(value: Any, what: str) -> None:
    if value is not None and not isinstance(value, str):
        raise _malformed(what, "a string or null")


def check_choice(response: dict[str, Any], index: int) -> dict[str, Any]:
    """The choice's ``message``, after checking the fields a policy reads have OpenAI's types
    (a reply that parses as JSON but has, say, ``"message": "hello"`` or ``"tool_calls": "abc"``
    is ``malformed_response``, not an AttributeError deep in a policy)."""
    where = f"choices[{index}]"
    choice = response["choices"][index]
    if not isinstance(choice, dict):
        raise _malformed(where, "an object")
    _check_str(choice.get("finish_reason"), f"{where}.finish_reason")
    message = choice.get("message")
    if not isinstance(message, dict):
        raise _malformed(f"{where}.message", "an object")
    for key in ("content", "reasoning", "reasoning_content", "refusal", "role"):
        _check_str(message.get(key), f"{where}.message.{key}")
    calls = message.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        raise _malformed(f"{where}.message.tool_calls", "a list or null")
    for i, call in enumerate(calls or []):
        what = f"{where}.message.tool_calls[{i}]"
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise _malformed(what, "an object with a 'function' object")
        _check_str(call.get("id"), f"{what}.id")
        function = call["function"]
        _check_str(function.get("name"), f"{what}.function.name")
        if not isinstance(function.get("arguments"), str | dict | None):
            raise _malformed(f"{what}.function.arguments", "a JSON string")
    return message


def check_usage(usage: Any) -> dict[str, Any] | None:
    """``usage`` with its token counts checked (non-negative integers), or ``None``."""
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise _malformed("usage", "an object")
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = usage.get(key)
        if value is not None and (type(value) is not int or value < 0):
            raise _malformed(f"usage.{key}", "a non-negative integer")
    return usage


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(self, stream: httpx2.AsyncByteStream, limit: int) -> None:
        self._stream, self._limit = stream, limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._stream:
            seen += len(chunk)
            if seen > self._limit:
                raise too_large(f"{seen}+ bytes received", self._limit)
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


class CappedTransport(httpx2.AsyncBaseTransport):
    """Every response body, a reply or an error page, is cut at ``limit`` bytes as it arrives
    (raising `InferenceError` ``malformed_response``), never held whole in memory first."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, limit: int) -> None:
        self._inner, self._limit = inner, limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._limit:
            await response.aclose()
            raise too_large(f"{declared} bytes declared", self._limit)
        response.stream = _CappedStream(response.stream, self._limit)  # type: ignore[arg-type]
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


_INT_LIST_BYTES = b"0123456789,-"


def _int_list(value: Any, what: str) -> list[int] | None:
    """``value`` (parsed JSON) when it is a list of integers (bools are not token ids)."""
    checked = _int_list_json(value, what)
    return None if checked is None else checked[0]


def _int_list_json(value: Any, what: str) -> tuple[list[int], bytes] | None:
    """`_int_list`, with the list's compact JSON: the check encodes it anyway, and a trace of the
    call stores exactly that text (`LLMCall.prompt_token_ids_json`)."""
    if value is None:
        return None
    # Prompts carry thousands of ids, so the check runs in C: a JSON list whose compact encoding
    # is only digits, commas and minus signs holds integers only (a float has a '.' or an 'e',
    # true/false/null letters, a string quotes, a nested list brackets). A third of the cost of
    # `set(map(type, value))`; orjson cannot encode integers beyond 64 bits, nor does it parse them.
    if isinstance(value, list):
        try:
            text = orjson.dumps(value)
        except orjson.JSONEncodeError:
            pass
        else:
            if not text[1:-1].translate(None, _INT_LIST_BYTES):
                return value, text
    raise InferenceError("malformed_response", f"{what} is not a list of integers")


def choice_tokens(response: dict[str, Any], index: int = 0) -> tuple[list[int] | None, list[float] | None]:
    """Completion token ids and per-token logprobs of one choice, exactly as returned.

    Raises TokenMismatchError when both are present with different lengths.
    """
    choice = response["choices"][index]
    logprobs_field = choice.get("logprobs")
    if logprobs_field is not None and not isinstance(logprobs_field, dict):
        raise _malformed(f"choices[{index}].logprobs", "an object or null")
    ids = _int_list(choice.get("token_ids"), f"choices[{index}].token_ids")
    logprobs: list[float] | None = None
    content = (choice.get("logprobs") or {}).get("content")
    if content is not None:
        try:
            values = [entry["logprob"] for entry in content]
            # Finite numbers only: 1e400 parses as inf, and a null logprob would be silent.
            if not set(map(type, values)) <= {float, int} or not all(map(math.isfinite, values)):
                raise ValueError
            logprobs = [float(v) for v in values]
        except (KeyError, TypeError, ValueError):
            raise InferenceError(
                "malformed_response",
                f"choices[{index}].logprobs.content is malformed (each entry needs a finite 'logprob')",
            ) from None
    if ids is not None and logprobs is not None and len(ids) != len(logprobs):
        raise TokenMismatchError(
            f"choices[{index}]: {len(ids)} token ids but {len(logprobs)} logprobs; "
            "refusing to guess an alignment"
        )
    return ids, logprobs


def _weights_version(response: dict[str, Any]) -> int | None:
    version = response.get("weights_version")
    return version if isinstance(version, int) and not isinstance(version, bool) else None


def compact_response(response: dict[str, Any] | None) -> dict[str, Any] | None:
    """The response without the bulky token data (per-token logprob entries, token ids).

    `LLMCall` keeps the ids and logprobs in their own fields; traces store this compact form
    instead of a second copy (vLLM's logprob entries are ~100 bytes per token).
    """
    if response is None:
        return None
    slim = {k: v for k, v in response.items() if k != "prompt_token_ids"}
    slim["choices"] = [
        {k: v for k, v in choice.items() if k not in ("logprobs", "token_ids")}
        for choice in response.get("choices") or []
        if isinstance(choice, dict)
    ]
    return slim


def per_choice_calls(call: LLMCall) -> list[LLMCall]:
    """Split a call made with ``n > 1`` into one LLMCall per choice (same request and prompt ids)."""
    if call.response is None:
        return [call]
    calls = []
    for i, choice in enumerate(call.response.get("choices", [])):
        check_choice(call.response, i)
        ids, logprobs = choice_tokens(call.response, i)
        calls.append(
            dataclasses.replace(
                call,
                finish_reason=choice.get("finish_reason"),
                completion_token_ids=ids,
                completion_logprobs=logprobs,
            )
        )
    return calls


def default_http_client(timeout_s: float, max_response_bytes: int = MAX_RESPONSE_BYTES) -> httpx2.AsyncClient:
    """The openai package's aiohttp transport when aiohttp is installed, else its httpx2 one.

    Measured against the fake (client CPU per call, 128 concurrent calls): httpx2 about
    1.3 ms, growing with the number of pooled connections (httpcore checks each one for
    expiry on every request); aiohttp about 0.6 ms, flat. Same errors (the transport maps
    aiohttp's exceptions to httpx2's, which openai maps to its own).
    """
    timeout = httpx2.Timeout(timeout_s, connect=min(timeout_s, 10.0))
    openai = _sdk()
    if importlib.util.find_spec("aiohttp") is not None:
        client = openai.DefaultAioHttpClient(limits=HTTP_LIMITS, timeout=timeout)
    else:
        client = openai.DefaultAsyncHttpx2Client(limits=HTTP_LIMITS, timeout=timeout)
    # The transport both clients built from these options, wrapped (httpx has no public hook
    # that sees a body before the client reads it whole).
    client._transport = CappedTransport(client._transport, max_response_bytes)
    return client


class InferenceClient:
    """Chat completions against one OpenAI-compatible server (vLLM, OpenAI, Groq, the fake).

    Requests go through the lean aiohttp transport (`inference.transport`) unless
    ``transport="sdk"`` (or ``INFERENCE_TRANSPORT=sdk``) sends them through the openai SDK: the
    same bytes, headers that matter, timeouts, retries and errors either way.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | SecretStr | None = None,
        *,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 8.0,
        http_client: httpx2.AsyncClient | None = None,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        transport: TransportName | None = None,
        lean: LeanTransport | None = None,
    ) -> None:
        if timeout_s <= 0 or max_retries < 0 or backoff_base_s < 0 or backoff_max_s < 0:
            raise ValueError("timeout_s must be > 0; retries and backoffs must be >= 0")
        if max_response_bytes < 1:
            raise ValueError("max_response_bytes must be >= 1")
        self.max_response_bytes = max_response_bytes
        self.base_url = normalize_base_url(base_url)
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.transport: TransportName = transport_name(transport)
        self._api_key = resolve_api_key(api_key)
        # The headers of every request (the SDK sends these too, with its own telemetry ones).
        self._headers = {
            "Accept": "application/json",
            "Content-Type": "application/json",
            "Authorization": f"Bearer {self._api_key}",
            **proxy_auth_headers(),
        }
        self._owns_http = http_client is None
        self._http = http_client
        self._owns_lean = lean is None
        self._urls: dict[str, yarl.URL] = {}
        self._lean = lean
        self._openai_client: openai.AsyncOpenAI | None = None  # built on first use: see `_openai`
        self._jitter = random.Random()
        self._closed = False

    @property
    def _openai(self) -> openai.AsyncOpenAI:
        """The openai client, built lazily: with its HTTP transport it takes 20-40 ms (an SSL
        context, imports), which a fresh server otherwise paid on the event loop at its first
        decision, stalling every rollout."""
        if self._openai_client is None:
            if self._http is None:
                self._http = default_http_client(self.timeout_s, self.max_response_bytes)
            self._openai_client = _sdk().AsyncOpenAI(
                base_url=self.base_url,
                api_key=self._api_key,
                default_headers=proxy_auth_headers(),
                max_retries=0,
                timeout=self.timeout_s,
                http_client=self._http,
            )
        return self._openai_client

    @property
    def _lean_transport(self) -> LeanTransport:
        if self._lean is None:
            self._lean = LeanTransport(self.max_response_bytes)
        return self._lean

    def __repr__(self) -> str:
        return (
            f"InferenceClient(base_url={self.base_url!r}, timeout_s={self.timeout_s}, "
            f"max_retries={self.max_retries}, transport={self.transport!r})"
        )

    def backoff_s(self, failures: int, retry_after_s: float | None = None) -> float:
        """Delay before the retry that follows the ``failures``-th failed attempt."""
        if retry_after_s is not None:
            return min(retry_after_s, self.backoff_max_s) * (1.0 + 0.1 * self._jitter.random())
        ceiling = min(self.backoff_max_s, self.backoff_base_s * 2 ** (failures - 1))
        return ceiling / 2 + self._jitter.uniform(0, ceiling / 2)

    def prepare_request(self, request: dict[str, Any], *, return_token_ids: bool = False) -> dict[str, Any]:
        """The request as it will be sent (logprobs + ``return_token_ids`` merged into extra_body)."""
        body = dict(request)
        if return_token_ids:
            body["logprobs"] = True
            body["extra_body"] = {**(body.get("extra_body") or {}), "return_token_ids": True}
        return body

    async def chat(
        self,
        request: dict[str, Any],
        *,
        return_token_ids: bool = False,
        deadline_s: float | None = None,
    ) -> LLMCall:
        """Send ``chat.completions.create(**request)`` with bounded retries; raise InferenceError."""
        body = self.prepare_request(request, return_token_ids=return_token_ids)
        started = time.monotonic()
        data, attempts = await self.post_json("/chat/completions", body, deadline_s=deadline_s)
        try:
            return self._to_call(body, data, started, attempts)
        except InferenceError as exc:
            exc.attempts = attempts
            exc.detail = redact(exc.detail, self._api_key)
            raise

    async def complete_tokens(
        self,
        prompt_ids: list[int],
        request: dict[str, Any],
        *,
        deadline_s: float | None = None,
    ) -> LLMCall:
        """Token in, token out: ``POST /v1/completions`` with the prompt as token ids (vLLM's
        completions API takes one), asking for the completion's ``token_ids`` and each sampled
        token's logprob; through `post_json`, as `chat` (same transport, retries, deadline and
        errors).

        ``request`` holds the sampling fields (``model``, ``max_tokens``, ``temperature``,
        ``top_p``, ``seed``, ``stop``, ``extra_body``...). The call's ``response`` is the server's
        text completion; its ``prompt_token_ids`` are the ids sent (the server's echo checked
        against them: a server that re-tokenized them broke the stream)."""
        body = {**request, "prompt": prompt_ids, "logprobs": 1}
        body["extra_body"] = {**(body.get("extra_body") or {}), "return_token_ids": True}
        started = time.monotonic()
        data, attempts = await self.post_json("/completions", body, deadline_s=deadline_s)
        try:
            call = self._to_text_call(body, data, started, attempts)
        except InferenceError as exc:
            exc.attempts = attempts
            exc.detail = redact(exc.detail, self._api_key)
            raise
        if call.prompt_token_ids is not None and call.prompt_token_ids != prompt_ids:
            raise InferenceError(
                "malformed_response",
                f"the server answered for a different prompt ({len(call.prompt_token_ids)} token ids "
                f"echoed, {len(prompt_ids)} sent)",
                attempts,
            )
        return call

    async def post_json(
        self, path: str, body: dict[str, Any], *, deadline_s: float | None = None
    ) -> tuple[dict[str, Any], int]:
        """POST ``body`` to ``base_url + path`` and answer the reply as a dict, with the number
        of attempts it took: the one place a request reaches the server.

        ``body`` is a request as ``create`` takes it: ``extra_body`` is merged into the JSON,
        ``extra_headers`` and ``extra_query`` go to the headers and the query. The body is
        encoded once (orjson). Each attempt is bounded by ``timeout_s`` and what is left of
        ``deadline_s``; 429 (honouring ``Retry-After``), 5xx, connection errors and timeouts are
        retried up to ``max_retries`` times with backoff; the reply is parsed as strict JSON and
        cut at ``max_response_bytes``. Raises `InferenceError` (the key never in its text).
        """
        payload = {k: v for k, v in body.items() if k not in _OPTION_KEYS}
        payload.update(body.get("extra_body") or {})
        content = orjson.dumps(payload, option=orjson.OPT_NON_STR_KEYS)
        headers = self._headers
        if body.get("extra_headers"):
            headers = {**headers, **body["extra_headers"]}
        params = body.get("extra_query") or None
        send = self._send_lean if self.transport == "lean" else self._send_sdk
        deadline = time.monotonic() + deadline_s if deadline_s is not None else None
        attempts = 0
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise InferenceError("timeout", f"deadline of {deadline_s:g}s reached", max(attempts, 1))
            attempts += 1
            attempt_timeout = self.timeout_s if remaining is None else min(self.timeout_s, remaining)
            try:
                async with asyncio.timeout(attempt_timeout):
                    raw = await send(path, content, headers, params, body, attempt_timeout)
                return _completion_dict(raw), attempts
            except InferenceError as exc:
                error = exc
            except Exception as exc:
                classified = _classify(exc)
                if classified is None:
                    raise
                error = classified
                if error.kind == "timeout" and error.status_code is None:
                    error.detail = f"no response within {attempt_timeout:.3g}s"
            error.attempts = attempts
            error.detail = redact(error.detail, self._api_key)[:MAX_DETAIL_CHARS]
            if not error.retryable or attempts > self.max_retries:
                raise error
            delay = self.backoff_s(attempts, error.retry_after_s)
            if deadline is not None and time.monotonic() + delay >= deadline:
                error.detail += f" (no time left for a retry within the {deadline_s:g}s deadline)"
                raise error
            await asyncio.sleep(delay)

    async def _send_lean(
        self,
        path: str,
        content: bytes,
        headers: dict[str, str],
        params: dict[str, Any] | None,
        body: dict[str, Any],
        timeout: float,
    ) -> bytes:
        url = self._urls.get(path)
        if url is None:  # parsed once per path, not per request
            url = self._urls[path] = yarl.URL(self.base_url + path)
        return await self._lean_transport.post(url, content, headers, params, timeout)

    async def _send_sdk(
        self,
        path: str,
        content: bytes,
        headers: dict[str, str],
        params: dict[str, Any] | None,
        body: dict[str, Any],
        timeout: float,
    ) -> bytes:
        """``chat.completions.create(**body)``, through the openai client's public ``post``.

        Same endpoint, body, auth, transport and errors, minus per-call costs that buy nothing
        when the caller wants a plain dict: the type-directed request transform, an idempotency
        key, building a `ChatCompletion` only to dump it back (the body comes back as bytes for
        one strict parse), and the standard library's JSON encoder (the body is encoded once,
        by orjson, and sent as ``content``).
        """
        # A fixed idempotency key: the client makes a uuid4 per call otherwise, for a header
        # it sends only to servers that take one (OpenAI's chat route does not).
        options: dict[str, Any] = {"timeout": timeout, "idempotency_key": "unused", **_auth_option()}
        if body.get("extra_headers"):
            options["headers"] = body["extra_headers"]
        if params:
            options["params"] = params
        return await self._openai.post(path, content=content, options=options, cast_to=bytes)  # type: ignore[arg-type]

    def _to_call(self, body: dict[str, Any], response: Any, started: float, attempts: int) -> LLMCall:
        choices = response.get("choices") if isinstance(response, dict) else None
        if not isinstance(response, dict) or "choices" not in response:
            raise InferenceError(
                "malformed_response", f"expected a chat completion, got {type(response).__name__}"
            )
        if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
            raise InferenceError("malformed_response", "the response has no choices")
        prompt = _int_list_json(response.get("prompt_token_ids"), "prompt_token_ids")
        check_choice(response, 0)
        completion_ids, logprobs = choice_tokens(response, 0)
        usage = check_usage(response.get("usage"))
        _check_str(response.get("model"), "model")
        return LLMCall(
            request=body,
            response=response,
            latency_ms=(time.monotonic() - started) * 1000.0,
            attempts=attempts,
            usage=usage,
            model=response.get("model"),
            finish_reason=choices[0].get("finish_reason"),
            prompt_token_ids=prompt[0] if prompt else None,
            prompt_token_ids_json=prompt[1] if prompt else None,
            completion_token_ids=completion_ids,
            completion_logprobs=logprobs,
            weights_version=_weights_version(response),
        )

    def _to_text_call(self, body: dict[str, Any], response: Any, started: float, attempts: int) -> LLMCall:
        """A ``/v1/completions`` answer (vLLM 0.32's shape, `text_choice`) as an `LLMCall`."""
        choices = response.get("choices")
        if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
            raise InferenceError("malformed_response", "the response has no choices")
        choice = choices[0]
        _check_str(choice.get("text"), "choices[0].text")
        _check_str(choice.get("finish_reason"), "choices[0].finish_reason")
        prompt = _int_list_json(choice.get("prompt_token_ids"), "choices[0].prompt_token_ids")
        ids = _int_list(choice.get("token_ids"), "choices[0].token_ids")
        field = choice.get("logprobs")
        logprobs: list[float] | None = None
        if field is not None:
            values = field.get("token_logprobs") if isinstance(field, dict) else None
            if (
                not isinstance(values, list)
                or not set(map(type, values)) <= {float, int}
                or not all(map(math.isfinite, values))
            ):
                raise _malformed("choices[0].logprobs.token_logprobs", "a list of finite numbers")
            logprobs = [float(v) for v in values]
        if ids is not None and logprobs is not None and len(ids) != len(logprobs):
            raise TokenMismatchError(
                f"choices[0]: {len(ids)} token ids but {len(logprobs)} logprobs; "
                "refusing to guess an alignment"
            )
        _check_str(response.get("model"), "model")
        return LLMCall(
            request=body,
            response=response,
            latency_ms=(time.monotonic() - started) * 1000.0,
            attempts=attempts,
            usage=check_usage(response.get("usage")),
            model=response.get("model"),
            finish_reason=choice.get("finish_reason"),
            prompt_token_ids=prompt[0] if prompt else None,
            prompt_token_ids_json=prompt[1] if prompt else None,
            completion_token_ids=ids,
            completion_logprobs=logprobs,
            weights_version=_weights_version(response),
        )

    async def list_models(self) -> list[str]:
        """The ids the server's ``GET /models`` lists (one attempt, ``timeout_s``)."""
        try:
            if self.transport == "sdk":
                page = await self._openai.models.list()
                return [m.id for m in page.data]
            raw = await self._lean_transport.get(self.base_url + "/models", self._headers, self.timeout_s)
            data = _completion_dict(raw).get("data")
            if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
                raise InferenceError("malformed_response", "the model list has no 'data' list of objects")
            return [m["id"] for m in data if isinstance(m.get("id"), str)]
        except InferenceError as error:
            error.detail = redact(error.detail, self._api_key)[:MAX_DETAIL_CHARS]
            raise
        except Exception as exc:
            error = _classify(exc)
            if error is None:
                raise
            error.detail = redact(error.detail, self._api_key)
            raise error from None

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # `AsyncOpenAI.close()` closes its HTTP client: only ours to close when we made it.
        if self._owns_http and self._http is not None:
            await self._http.aclose()
        if self._owns_lean and self._lean is not None:
            await self._lean.aclose()


def _key_fingerprint(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()[:16]


class ClientPool:
    """Inference clients that share one HTTP connection pool (per event loop).

    A client is cheap (a few KB) once it does not own its transport: the transport (connections,
    for the SDK an SSL context of about 0.8 MB) is the pool's, one for every endpoint. Clients
    are cached per (URL, key, timeout, retries) in a bounded LRU, so policies with the same config
    share one and a caller varying its config on every policy cannot grow the cache: an evicted
    client needs no closing, and a policy still holding one keeps working. Use one pool per event
    loop (``shared_pool()`` does that). ``transport``: ``"lean"`` (aiohttp, the default) or
    ``"sdk"`` (the openai package); unset, ``INFERENCE_TRANSPORT`` says.
    """

    def __init__(
        self,
        *,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 8.0,
        max_clients: int = 64,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        transport: TransportName | None = None,
    ) -> None:
        self._clients: OrderedDict[tuple[str, str, float, int], InferenceClient] = OrderedDict()
        self._backoff = (backoff_base_s, backoff_max_s)
        self.max_clients = max_clients
        self.max_response_bytes = max_response_bytes
        self.transport: TransportName = transport_name(transport)
        self._http: httpx2.AsyncClient | None = None
        self._lean: LeanTransport | None = None

    def get(
        self,
        base_url: str,
        api_key: str | SecretStr | None = None,
        *,
        timeout_s: float = 120.0,
        max_retries: int = 3,
    ) -> InferenceClient:
        key_value = resolve_api_key(api_key)
        key = (normalize_base_url(base_url), _key_fingerprint(key_value), float(timeout_s), max_retries)
        client = self._clients.get(key)
        if client is not None:
            self._clients.move_to_end(key)
            return client
        if self.transport == "sdk" and self._http is None:
            # Per-attempt timeouts are passed with each request; this is only the fallback.
            self._http = default_http_client(120.0, self.max_response_bytes)
        if self.transport == "lean" and self._lean is None:
            self._lean = LeanTransport(self.max_response_bytes)
        client = InferenceClient(
            base_url,
            key_value,
            timeout_s=timeout_s,
            max_retries=max_retries,
            backoff_base_s=self._backoff[0],
            backoff_max_s=self._backoff[1],
            http_client=self._http,
            max_response_bytes=self.max_response_bytes,
            transport=self.transport,
            lean=self._lean,
        )
        # Not the pool's to close; a client built without one made its own.
        client._owns_http = client._owns_lean = False
        self._clients[key] = client
        while len(self._clients) > self.max_clients:
            self._clients.popitem(last=False)
        return client

    def __len__(self) -> int:
        return len(self._clients)

    async def aclose(self) -> None:
        self._clients.clear()
        http, self._http = self._http, None
        lean, self._lean = self._lean, None
        if http is not None:
            await http.aclose()
        if lean is not None:
            await lean.aclose()


_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ClientPool] = weakref.WeakKeyDictionary()


def shared_pool() -> ClientPool:
    """The ClientPool of the running event loop (created on first use)."""
    loop = asyncio.get_running_loop()
    pool = _POOLS.get(loop)
    if pool is None:
        pool = _POOLS[loop] = ClientPool()
    return pool
