"""Input limits: request bodies over a size limit get a 413 before parsing (`BodySizeLimit`), and
JSON bodies must be standard JSON, without ``NaN``/``Infinity``, nested at most
`MAX_JSON_DEPTH` levels (`StrictJSONRoute`)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from grpo_service.errors import send_error
from inference.nesting import MAX_JSON_DEPTH, too_deep


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._reject(send)
            return
        seen = 0
        response_started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal response_started
            response_started = response_started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not response_started:
                await self._reject(send)

    async def _reject(self, send: Send) -> None:
        await send_error(send, 413, "payload_too_large", f"request body exceeds {self.max_bytes} bytes")


class _TooLarge(HTTPException):
    # An HTTPException, because FastAPI turns any other error raised while it reads the body
    # into a 400; the app's handler renders this one as a 413 (a streamed body over the limit).
    code = "payload_too_large"

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"request body exceeds {max_bytes} bytes")


def _refuse_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not valid JSON (RFC 8259 has no NaN or Infinity)", name, 0)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise json.JSONDecodeError(f"number {text[:40]} is out of range for a float", text, 0)
    return value


def _nested_too_deep() -> json.JSONDecodeError:
    return json.JSONDecodeError(f"nested more than {MAX_JSON_DEPTH} levels deep", "", 0)


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
# Where orjson would answer otherwise than `json`: an integer of 19 digits or more (orjson reads
# one past 64 bits as a float) and surrogate escapes (`json`'s rules above decide those). A run of
# 19 digits is found by mapping every digit to "0" and everything else to " ", then a substring
# search: a seventh of what the regex \d{19} costs on a body full of short numbers (a chat request).
_DIGITS_ONLY = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_NUMBER = b"0" * 19


def orjson_reads_differently(raw: bytes) -> bool:
    """Whether ``orjson.loads(raw)`` could parse to another value than Python's `json` (an integer
    past 64 bits becomes a float; a lone surrogate escape is refused)."""
    if len(raw) >= 19 and _LONG_NUMBER in raw.translate(_DIGITS_ONLY):
        return True
    return b"\\u" in raw and _SURROGATE_ESCAPE.search(raw) is not None


# One decoder for every call (json.loads with these hooks builds one per call; the bytes are
# decoded as json.loads decodes them).
_STRICT_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)


def strict_json(body: bytes | str) -> Any:
    """Parse standard JSON only (`json.JSONDecodeError` otherwise): Python's `json` accepts ``NaN``,
    ``Infinity``, ``1e400`` (→ inf) and lone UTF-16 surrogate escapes (``"\\ud800"``): none is valid
    JSON text, and once parsed each crashes a strict encoder downstream (the response, the OpenAI
    client). Bytes that are not UTF-8 (nor UTF-16/32) text are a decode error too. Nesting deeper
    than `MAX_JSON_DEPTH` is refused too, as a decode error: nesting past what the parser can
    recurse (about 1,000 levels: a few KB of ``[``) included, which Python's `json` answers with
    a `RecursionError` (a 500, or a traceback per WebSocket frame).

    orjson parses first (an eighth of `json`'s CPU on a small body, which is every step request
    and frame); whatever it refuses is parsed again by `json`, whose answer (a value, or the error's
    wording) is the rule."""
    raw = body.encode() if isinstance(body, str) else body
    try:
        if orjson_reads_differently(raw):
            raise ValueError
        value = orjson.loads(raw)
    except ValueError:  # orjson.JSONDecodeError is one
        value = _stdlib_strict_json(raw)
    return _within_depth(raw, value)


def _within_depth(raw: bytes, value: Any) -> Any:
    # Only a body with more brackets than the limit can nest that deep: count at C speed.
    if raw.count(b"{") + raw.count(b"[") > MAX_JSON_DEPTH and too_deep(value):
        raise _nested_too_deep()
    return value


def _stdlib_strict_json(raw: bytes) -> Any:
    try:
        value = _STRICT_DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except RecursionError:
        raise _nested_too_deep() from None
    except UnicodeDecodeError as exc:  # FastAPI would answer it with a bare 400
        raise json.JSONDecodeError(f"the body is not UTF-8 text ({exc.reason})", "", exc.start) from None
    if _SURROGATE_ESCAPE.search(raw):  # rare: only then pay for the check
        try:
            json.dumps(value, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise json.JSONDecodeError("lone UTF-16 surrogate in a string", "", 0) from None
    return value


class StrictJSONRequest(Request):
    """A request whose JSON body is parsed by `strict_json` (a 500 downstream otherwise)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = strict_json(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    """Routes whose JSON bodies are parsed strictly (FastAPI answers a decode error with a 422)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_handler
