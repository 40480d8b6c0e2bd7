"""API-key dependency: `X-API-Key` or `Authorization: Bearer`, compared in constant time."""

from __future__ import annotations

import hmac
import ipaddress
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from pydantic import SecretStr
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from grpo_service.errors import ERROR_MEANINGS, Unauthorized, send_error
from grpo_service.models import ErrorBody

log = logging.getLogger(__name__)


def presented_key(request: HTTPConnection) -> str | None:
    key = request.headers.get("x-api-key")
    if key:
        return key
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token:
        return token.strip()
    return None


async def require_api_key(request: Request) -> None:
    """Route dependency. A no-op when the service has no key configured. (`APIKeyGate` already
    refused a request without the key before its body was read; this keeps each route's
    requirement declared where the route is.)"""
    expected = request.app.state.settings.environment_api_key
    if expected is not None:
        check_key(request, expected)


def check_key(request: HTTPConnection, expected: SecretStr) -> None:
    """Raise `Unauthorized` unless ``request``'s (or a WebSocket's) headers carry the ``expected`` key."""
    presented = presented_key(request)
    # Never echo any part of either key back.
    if presented is None:
        raise Unauthorized("missing API key: send X-API-Key or Authorization: Bearer", code="missing_api_key")
    if not hmac.compare_digest(presented.encode(), expected.get_secret_value().encode()):
        raise Unauthorized("invalid API key", code="invalid_api_key")


SECURITY_SCHEMES = {
    "APIKeyHeader": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
    "BearerAuth": {"type": "http", "scheme": "bearer"},
}
OPEN_PATHS = frozenset({"/health"})  # every other operation depends on `require_api_key`


def document_security(app: FastAPI) -> None:
    """When a key is configured, declare it in the OpenAPI schema on every operation but /health
    (the dependency reads the headers itself, so FastAPI cannot infer it)."""
    build_schema = app.openapi

    def openapi() -> dict[str, Any]:
        cached = app.openapi_schema is not None
        schema = build_schema()
        if cached or app.state.settings.environment_api_key is None:
            return schema
        components = schema.setdefault("components", {})
        components["securitySchemes"] = SECURITY_SCHEMES
        components.setdefault("schemas", {}).setdefault("ErrorBody", ErrorBody.model_json_schema())
        unauthorized = {
            "description": ERROR_MEANINGS[401],
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
        }
        for path, operations in schema.get("paths", {}).items():
            if path not in OPEN_PATHS:
                for operation in operations.values():
                    operation["security"] = [{name: []} for name in SECURITY_SCHEMES]
                    operation.setdefault("responses", {})["401"] = unauthorized
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind_safety(host: str, has_key: bool, allow_insecure: bool) -> None:
    """Refuse to expose an unauthenticated service beyond this machine."""
    if has_key or allow_insecure or is_loopback(host):
        return
    raise SystemExit(
        f"refusing to serve on {host} without ENVIRONMENT_API_KEY; set a key, bind to 127.0.0.1, "
        "or pass --insecure (ALLOW_INSECURE=1) if you really mean it"
    )


class APIKeyGate:
    """ASGI middleware: a request for a protected operation without the right key is answered
    401 from its headers alone, before its body is read, so an unauthenticated client cannot
    make the server read 8 MB, parse a malformed body into a 422, or reach the worker router.

    Protected are the operations of the OpenAPI schema but `OPEN_PATHS`: the same rule that
    declares the key in the schema (`document_security`), and every such route also depends on
    `require_api_key`. Pages outside the schema (the docs, the viewer with its own login) and
    unknown paths (404) pass through to their routes."""

    def __init__(self, app: ASGIApp, fastapi_app: FastAPI) -> None:
        self.app = app
        self.fastapi_app = fastapi_app
        self._protected: tuple[frozenset[str], re.Pattern[str]] | None = None

    def protects(self, path: str) -> bool:
        if self._protected is None:  # every route is registered by the first request
            try:
                schema = self.fastapi_app.openapi()
            except Exception:  # the routes' own dependency still guards them: only slower to refuse
                log.exception("no OpenAPI schema: the API key is checked by each route, after its body")
                schema = {}
            paths = [p for p in schema.get("paths", {}) if p not in OPEN_PATHS]
            templated = [_path_pattern(p).pattern for p in paths if "{" in p]
            self._protected = (
                frozenset(p for p in paths if "{" not in p),
                # One alternation: one match per request, not one per templated path.
                re.compile("|".join(f"(?:{pattern})" for pattern in templated) or "(?!)"),
            )
        exact, templated = self._protected
        return path in exact or templated.match(path) is not None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        expected = self.fastapi_app.state.settings.environment_api_key
        if scope["type"] == "http" and expected is not None and self.protects(scope["path"]):
            try:
                check_key(Request(scope), expected)
            except Unauthorized as exc:
                await send_error(send, exc.status_code, exc.code, exc.message)
                return
        await self.app(scope, receive, send)


def _path_pattern(path: str) -> re.Pattern[str]:
    """``/run/status/{run_id}`` → a regex matching its concrete paths."""
    parts = re.split(r"(\{[^}]+\})", path)
    return re.compile(
        "^"
        + "".join(
            (".+" if part.endswith(":path}") else "[^/]+") if part.startswith("{") else re.escape(part)
            for part in parts
        )
        + "$"
    )


# Query parameters whose values are secrets (`?api_key=...`, `?token=...`, an OpenEnv socket's
# `?session_id=...`, which names a live MCP session): never logged.
_SECRET_PARAM = re.compile(r"(?i)([?&][^=&#]*(?:key|token|secret|passw|auth|sig|session)[^=&#]*=)[^&#]*")


class RedactQuerySecrets(logging.Filter):
    """Cut secret query values out of uvicorn's log lines that name a request's path: the HTTP
    access lines (``uvicorn.access``) and the WebSocket handshake lines, which uvicorn writes to
    ``uvicorn.error`` (``"WebSocket /path?query" 401`` / ``[accepted]``). The service never reads a
    key from the query string (it answers 401), but the log would keep a key sent there. An OpenEnv
    socket's ``?session_id=`` is cut too: it names a live MCP session."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(isinstance(a, str) and "?" in a for a in args):
            record.args = tuple(_SECRET_PARAM.sub(r"\1***", a) if isinstance(a, str) else a for a in args)
        if not args and isinstance(record.msg, str) and "?" in record.msg:  # a line logged as is
            record.msg = _SECRET_PARAM.sub(r"\1***", record.msg)
        return True


QUERY_LOGGERS = ("uvicorn.access", "uvicorn.error")
"""uvicorn's loggers whose lines name a request's path with its query string."""


def redact_query_secrets() -> None:
    """Install `RedactQuerySecrets` on uvicorn's `QUERY_LOGGERS` (once per process)."""
    for name in QUERY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactQuerySecrets) for f in logger.filters):
            logger.addFilter(RedactQuerySecrets())
