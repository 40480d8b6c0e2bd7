"""API-key dependency: `X-API-Key` or `Authorization: Bearer`, compared in constant time."""

from __future__ import annotations

import hmac
import ipaddress
import logging
import re
from collections.abc import Iterator, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from pydantic import SecretStr
from starlette.requests import HTTPConnection
from starlette.routing import BaseRoute, Mount
from starlette.types import ASGIApp, Receive, Scope, Send

from grpo_service.api.asgi import INTERNAL_SCOPE_KEY
from grpo_service.errors import ERROR_MEANINGS, NotFound, Unauthorized, send_error
from grpo_service.models import ErrorBody


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


async def internal_only(request: Request) -> None:
    """Route dependency of the service's internal routes (a Ray front's socket links): they answer
    only the service itself (`call_asgi`), never a client, whatever key it holds. Its 404 is the
    one an unknown path gets."""
    if not request.scope.get(INTERNAL_SCOPE_KEY):
        raise NotFound("Not Found")


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


class LoopbackHostGuard:
    """ASGI middleware for a keyless server bound to loopback: a request (or WebSocket handshake)
    whose ``Host`` names anything but a loopback name or address, or the bound host, is refused
    with 421 naming it. A web page cannot reach such a server cross-origin (no CORS), but by DNS
    rebinding its own name can come to resolve to 127.0.0.1, and its requests then carry that
    name as ``Host``: they are refused here. A keyed server needs no such check (the page has no
    key), and a non-loopback bind cannot know the names its clients use."""

    def __init__(self, app: ASGIApp, bound_host: str) -> None:
        self.app = app
        self.bound_host = _host_name(bound_host)

    def allows(self, host: str) -> bool:
        name = _host_name(host)
        return name == self.bound_host or is_loopback(name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
            if host is not None and not self.allows(host):  # HTTP/1.1 always sends one
                detail = (
                    f"Host {host[:200]!r} is not this server's: a keyless server on loopback answers "
                    "only localhost, loopback addresses and its bound host (set ENVIRONMENT_API_KEY "
                    "to serve other names)"
                )
                if scope["type"] == "http":
                    await send_error(send, 421, "misdirected_host", detail)
                elif "websocket.http.response" in scope.get("extensions", {}):
                    await send_error(send, 421, "misdirected_host", detail, websocket=True)
                else:  # a server without ASGI's denial response: the handshake fails with a 403
                    await send({"type": "websocket.close", "code": 1008, "reason": detail[:120]})
                return
        await self.app(scope, receive, send)


def _host_name(host: str) -> str:
    """``[::1]:8000`` → ``::1``, ``LocalHost.:80`` → ``localhost``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


class APIKeyGate:
    """ASGI middleware: a request for a protected route without the right key is answered 401
    from its headers alone, before its body is read, so an unauthenticated client cannot make the
    server read 8 MB, parse a malformed body into a 422, or reach the worker router; a client's
    request for an internal route is answered 404.

    Which routes are which is one property of the app, whatever the mount: a route is protected
    when it depends on `require_api_key`, internal when it depends on `internal_only`, in the app
    or in a sub-app mounted in it (AgentGym's and OpenEnv's servers). The gate applies that rule
    before any route runs, which is what makes it hold through Ray, where the hosts that run the
    routes have no key. Pages without the dependency (`/health`, the docs, the viewer with its own
    login) and unknown paths (404) pass through to their routes."""

    def __init__(self, app: ASGIApp, fastapi_app: FastAPI) -> None:
        self.app = app
        self.fastapi_app = fastapi_app
        self._rules: tuple[PathSet, PathSet] | None = None

    def rules(self) -> tuple[PathSet, PathSet]:
        """The paths of the protected routes and of the internal ones."""
        if self._rules is None:  # every route is registered by the first request
            protected, internal = [], []
            for path, route, inherited in _api_routes(self.fastapi_app.routes):
                if _depends_on(route, inherited, require_api_key):
                    protected.append(path)
                if _depends_on(route, inherited, internal_only):
                    internal.append(path)
            self._rules = (PathSet(protected), PathSet(internal))
        return self._rules

    def protects(self, path: str) -> bool:
        return self.rules()[0].matches(path)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get(INTERNAL_SCOPE_KEY):
            protected, internal = self.rules()
            if internal.matches(scope["path"]):
                await send_error(send, 404, "not_found", "Not Found")
                return
            expected = self.fastapi_app.state.settings.environment_api_key
            if expected is not None and protected.matches(scope["path"]):
                try:
                    check_key(Request(scope), expected)
                except Unauthorized as exc:
                    await send_error(send, exc.status_code, exc.code, exc.message)
                    return
        await self.app(scope, receive, send)


class PathSet:
    """Route paths (``/run/status/{run_id}``), matched against concrete request paths."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.exact = frozenset(p for p in paths if "{" not in p)
        patterns = [_path_pattern(p).pattern for p in dict.fromkeys(p for p in paths if "{" in p)]
        # One alternation, not one pattern per route: the gate matches every request's path.
        self.templated = re.compile("|".join(f"(?:{p})" for p in patterns) or r"(?!)")

    def matches(self, path: str) -> bool:
        return path in self.exact or self.templated.match(path) is not None


def _api_routes(
    routes: Sequence[BaseRoute], prefix: str = "", inherited: Sequence[Any] = ()
) -> Iterator[tuple[str, APIRoute, list[Any]]]:
    """Every API route with its full path and the dependencies it inherits, through included
    routers (FastAPI keeps them as their own route objects) and mounted sub-apps."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield prefix + route.path_format, route, list(inherited)
        elif isinstance(route, Mount):
            yield from _api_routes(route.routes, prefix + route.path)
        elif (router := getattr(route, "original_router", None)) is not None:
            include = getattr(route, "include_context", None)
            yield from _api_routes(
                router.routes,
                prefix + getattr(include, "prefix", ""),
                [*inherited, *getattr(include, "dependencies", [])],
            )


def _depends_on(route: APIRoute, inherited: Sequence[Any], call: object) -> bool:
    """Whether ``route`` depends on ``call``: itself, through its router's, app's or include's
    dependencies, or through a dependency's own."""

    def among(dependant: Dependant) -> bool:
        return any(d.call is call or among(d) for d in dependant.dependencies)

    declared = [*inherited, *route.dependencies]
    return any(getattr(d, "dependency", None) is call for d in declared) or among(route.dependant)


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
