"""The lean HTTP transport to an OpenAI-compatible server: aiohttp used directly, one pooled
session per event loop, no per-call request object, header merging or retry wrapper (the openai
SDK's per-call machinery was half of the task app's CPU per decision). `InferenceClient` sends
through it by default; ``INFERENCE_TRANSPORT=sdk`` sends through the SDK instead.

Either way the client encodes the body once and sends the same bytes to the same URL with the
same auth; a transport answers the raw reply body or raises `InferenceError` for an HTTP error
status or an oversized reply, and its own exceptions for a broken or timed-out connection (the
client's retry loop classifies those). Error pages are worded as the SDK words them.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import time
from collections.abc import Mapping
from typing import Any, Literal

import aiohttp
import yarl

from inference.errors import InferenceError, InferenceErrorKind

TransportName = Literal["lean", "sdk"]
TRANSPORTS: tuple[str, ...] = ("lean", "sdk")
# Generous: a hidden connection cap silently serializes concurrent rollouts. Idle connections
# are dropped before the server's own idle timeout (uvicorn's and so vLLM's: 5 s), or a request
# sent on a connection the server is closing fails with a connection error.
MAX_CONNECTIONS = 1024
KEEPALIVE_S = 4.0
MAX_DETAIL_CHARS = 500
_CHUNK = 1 << 16


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
    """aiohttp, one pooled session per event loop (made on first use inside that loop)."""

    def __init__(self, max_response_bytes: int) -> None:
        self.max_response_bytes = max_response_bytes
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _current(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._session
        if session is None or self._loop is not loop or session.closed:
            if session is not None:
                _drop(session)
            connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, keepalive_timeout=KEEPALIVE_S)
            # Whole-attempt deadlines are the caller's (`asyncio.timeout`); only connecting has
            # its own, shorter bound.
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0)
            session = aiohttp.ClientSession(
                connector=connector, timeout=timeout, auto_decompress=True, trust_env=False
            )
            self._session, self._loop = session, loop
        return session

    async def post(
        self,
        url: str | yarl.URL,
        content: bytes,
        headers: Mapping[str, str],
        params: Mapping[str, Any] | None,
        timeout_s: float,
    ) -> bytes:
        async with self._current().post(url, data=content, headers=headers, params=params) as response:
            return await self._body(response)

    async def get(self, url: str, headers: Mapping[str, str], timeout_s: float) -> bytes:
        async with asyncio.timeout(timeout_s), self._current().get(url, headers=headers) as response:
            return await self._body(response)

    async def _body(self, response: aiohttp.ClientResponse) -> bytes:
        limit = self.max_response_bytes
        declared = response.content_length
        if declared is not None and declared > limit:
            raise too_large(f"{declared} bytes declared", limit)
        if declared is not None:
            data = await response.read()
        else:
            parts, seen = [], 0
            async for chunk in response.content.iter_chunked(_CHUNK):
                seen += len(chunk)
                if seen > limit:
                    raise too_large(f"{seen}+ bytes received", limit)
                parts.append(chunk)
            data = b"".join(parts)
        if response.status >= 300:
            raise status_error(response.status, error_message(response.status, data), response.headers)
        return data

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is self._loop:
                await session.close()
            else:
                _drop(session)


def _drop(session: aiohttp.ClientSession) -> None:
    """Close the sockets of a session whose event loop is gone or another one's. The public
    ``close`` is a coroutine of that loop; its synchronous part (``_close``, which closes every
    transport) is all that can run here."""
    connector = session.connector
    if connector is not None and not connector.closed:
        with contextlib.suppress(Exception):
            connector._close(abort_ssl=True)


def classify_lean(exc: BaseException) -> InferenceError | None:
    """An aiohttp failure of one attempt as an InferenceError (None: not aiohttp's)."""
    if isinstance(exc, TimeoutError):  # aiohttp's timeouts are TimeoutErrors too
        return InferenceError("timeout", "request timed out")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return InferenceError("connection_error", f"{type(exc.os_error).__name__}: {exc.os_error}")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return InferenceError("connection_error", f"{type(exc).__name__}: {exc}")
    return None
