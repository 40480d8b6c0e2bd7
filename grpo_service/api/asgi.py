"""One HTTP request run through an ASGI app in the caller's event loop, its whole answer collected.

The cluster's hosts answer the front's requests this way, and OpenEnv's socket links reach a
host's app through it: no socket, no server, the app's own middleware and routes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from grpo_service.errors import ServiceError, error_body

Answer = tuple[int, list[tuple[bytes, bytes]], bytes]  # status, headers, body
RequestArgs = tuple[str, str, bytes, list[tuple[bytes, bytes]], bytes]  # method, path, query, headers, body
INTERNAL_SCOPE_KEY = "grpo_service.internal"
"""Set in the scope of every request `call_asgi` runs: the service calling itself (a Ray host
answering its front, a front's socket link), which alone reaches internal routes
(`grpo_service.api.auth.internal_only`). A client's request, from a socket, never has it."""


async def call_asgi(
    app: Any,
    method: str,
    path: str,
    query: bytes,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    scope_extra: dict[str, Any] | None = None,
) -> Answer:
    """Run one request through an ASGI app in this event loop and collect its whole answer."""
    status, out_headers, chunks = 500, [], []
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the front's client never disconnects from here
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, out_headers
        if message["type"] == "http.response.start":
            status, out_headers = message["status"], list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
        "state": {},
        INTERNAL_SCOPE_KEY: True,
        **(scope_extra or {}),
    }
    try:
        await app(scope, receive, send)
    except ServiceError as exc:  # raised by middleware outside the error handlers
        return exc.status_code, [(b"content-type", b"application/json")], _error_json(exc.code, exc.message)
    return status, out_headers, b"".join(chunks)


def _error_json(code: str, detail: str) -> bytes:
    return json.dumps(error_body(code, detail)).encode()
