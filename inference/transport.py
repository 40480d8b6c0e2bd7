"""The lean HTTP transport to an OpenAI-compatible server: a pooled HTTP/1.1 client of our own
(`inference.http1`: one pool per event loop, a request written in one piece, httptools' parser),
with no per-call request object, header merging or retry wrapper. The openai SDK's per-call
machinery was half of the task app's CPU per decision, and aiohttp's client cost 230 µs of CPU
per call where this one costs about 90 µs. `InferenceClient` sends through it by default;
``INFERENCE_TRANSPORT=sdk`` sends through the SDK instead.

Either way the client encodes the body once and sends the same bytes to the same URL with the
same auth; a transport answers the raw reply body or raises `InferenceError` for an HTTP error
status or an oversized reply, and its own exceptions for a broken or timed-out connection (the
client's retry loop classifies those). Error pages are worded as the SDK words them.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from collections.abc import Mapping
from typing import Any, Literal

import yarl

from inference import http1
from inference.errors import InferenceError, InferenceErrorKind

TransportName = Literal["lean", "sdk"]
TRANSPORTS: tuple[str, ...] = ("lean", "sdk")
# Generous: a hidden connection cap silently serializes concurrent rollouts. Idle connections
# are dropped before the server's own idle timeout (uvicorn's and so vLLM's: 5 s), or a request
# sent on a connection the server is closing fails with a connection error.
MAX_CONNECTIONS = 1024
KEEPALIVE_S = 4.0
CONNECT_TIMEOUT_S = 10.0
MAX_DETAIL_CHARS = 500


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    if not headers:
        return None
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) / divisor)
        except ValueError:
            parsed = email.utils.parsedate_to_datetime(value) if name == "retry-after" else None
            if parsed is not None:
                return max(0.0, parsed.timestamp() - time.time())
    return None


def status_kind(status: int) -> InferenceErrorKind:
    if status == 429:
        return "rate_limited"
    if status >= 500:
        return "server_error"
    if status in (401, 403):
        return "auth_error"
    if status == 408:
        return "timeout"
    return "bad_request"


def status_error(status: int, message: str, headers: Mapping[str, str] | None) -> InferenceError:
    """The error of an HTTP error status (``Retry-After`` honoured for a 429)."""
    retry_after = parse_retry_after(headers) if status == 429 else None
    return InferenceError(
        status_kind(status), message[:MAX_DETAIL_CHARS], status_code=status, retry_after_s=retry_after
    )


def error_message(status: int, body: bytes) -> str:
    """The message of an error page, worded as the openai SDK words it (``Error code: 400 -
    <error.message>``), so both transports report the same detail."""
    message = f"Error code: {status}"
    try:
        data = json.loads(body.decode("utf-8", "replace").strip())
    except ValueError:
        return message
    error = data.get("error", data) if isinstance(data, dict) else None
    text = error.get("message") if isinstance(error, dict) else None
    return f"{message} - {text}" if isinstance(text, str) and text else message


def too_large(size: str | int, limit: int) -> InferenceError:
    return InferenceError("malformed_response", f"the reply exceeds {limit} bytes ({size})")


class LeanTransport:
    """`inference.http1`'s pooled HTTP/1.1 client, one pool per event loop (made on first use
    inside that loop)."""

    def __init__(self, max_response_bytes: int) -> None:
        self.max_response_bytes = max_response_bytes
        self._pool: http1.Pool | None = None

    def _current(self) -> http1.Pool:
        pool = self._pool
        if pool is None or pool.loop is not asyncio.get_running_loop():
            if pool is not None:
                pool.close()
            # Whole-attempt deadlines are the caller's (`asyncio.timeout`); only connecting has
            # its own, shorter bound.
            pool = self._pool = http1.Pool(
                max_connections=MAX_CONNECTIONS, keepalive_s=KEEPALIVE_S, connect_timeout_s=CONNECT_TIMEOUT_S
            )
        return pool

    async def post(
        self,
        url: str | yarl.URL,
        content: bytes,
        headers: Mapping[str, str],
        params: Mapping[str, Any] | None,
        timeout_s: float,
    ) -> bytes:
        target = yarl.URL(url) if isinstance(url, str) else url
        if params:
            target = target.extend_query(params)
        return self._body(await self._fetch("POST", target, headers, content))

    async def get(self, url: str, headers: Mapping[str, str], timeout_s: float) -> bytes:
        async with asyncio.timeout(timeout_s):
            return self._body(await self._fetch("GET", yarl.URL(url), headers, None))

    async def _fetch(
        self, method: str, url: yarl.URL, headers: Mapping[str, str], content: bytes | None
    ) -> http1.Response:
        if url.scheme not in ("http", "https"):
            raise InferenceError("bad_request", f"the URL's scheme is {url.scheme!r}: http or https only")
        limit = self.max_response_bytes
        try:
            return await self._current().request(method, url, headers, content, limit)
        except http1.ResponseTooLarge as exc:
            raise too_large(exc.size, limit) from None

    @staticmethod
    def _body(response: http1.Response) -> bytes:
        status = response.status
        if status >= 300:
            raise status_error(status, error_message(status, response.body), response.headers)
        return response.body

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


def classify_lean(exc: BaseException) -> InferenceError | None:
    """A failure of one attempt on the lean transport as an InferenceError (None: not a
    connection's)."""
    if isinstance(exc, TimeoutError):
        return InferenceError("timeout", "request timed out")
    if isinstance(exc, OSError):  # refused, reset, closed mid-response, malformed HTTP, TLS
        return InferenceError("connection_error", f"{type(exc).__name__}: {exc}")
    return None
