"""Typed service errors and the one handler that turns every caller mistake into a clear 4xx."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import Send

from envs.errors import (
    EnvBusy,
    EpisodeOver,
    InvalidAction,
    InvalidConfig,
    InvalidState,
    PluginError,
    UnknownPlugin,
)
from grpo_service.models import ErrorBody


class ServiceError(Exception):
    """An error with an HTTP status and a stable machine-readable code. A subclass names both:
    ``class NotFound(ServiceError, status=404, code="not_found")``."""

    status_code = 400
    code = "bad_request"

    def __init_subclass__(cls, *, status: int | None = None, code: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.status_code = status or cls.status_code
        cls.code = code or cls.code

    def __init__(self, message: str, *, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.headers = headers
        if code:
            self.code = code


class NotFound(ServiceError, status=404, code="not_found"):
    """An unknown id."""


class Conflict(ServiceError, status=409, code="conflict"):
    """In use, or in a state that does not allow the request."""


class Unprocessable(ServiceError, status=422, code="invalid_request"):
    """A request that is well-formed JSON but asks for something invalid."""


class Unauthorized(ServiceError, status=401, code="unauthorized"):
    """A missing or wrong API key."""


class CapacityExceeded(ServiceError, status=429, code="capacity_exceeded"):
    """At capacity: retry after the ``Retry-After`` header's seconds."""


class PayloadTooLarge(ServiceError, status=413, code="payload_too_large"):
    """A request body over MAX_REQUEST_BYTES."""


class WrongInstance(ServiceError, status=421, code="wrong_instance"):
    """An id issued by another replica of the service (421 Misdirected Request; see decisions.md)."""


class HostLost(ServiceError, status=410, code="host_lost"):
    """The Ray host that held the id is gone (its node or process died): its live objects are lost."""


class HostUnavailable(ServiceError, status=503, code="host_unavailable"):
    """The Ray host that holds the id does not answer now (or no host is left to place work on)."""


_PLUGIN_STATUS: list[tuple[type[PluginError], int, str]] = [
    (InvalidAction, 400, "invalid_action"),
    (InvalidConfig, 422, "invalid_config"),
    (InvalidState, 422, "invalid_snapshot"),
    (EpisodeOver, 409, "episode_over"),
    (UnknownPlugin, 400, "unknown_plugin"),
    (EnvBusy, 429, "env_busy"),
]


# What each status means here; a route documents only those it can return (`error_responses`).
ERROR_MEANINGS: dict[int, str] = {
    400: "Invalid action, unknown environment or policy plug-in, or a body that is not UTF-8 text",
    401: "Missing or wrong API key (only when ENVIRONMENT_API_KEY is set)",
    404: "Unknown id: never issued, terminated, or expired after the idle TTL",
    409: "The episode is over, or the env/policy/run is in use by a running rollout",
    410: "The Ray host that held the id is lost, and its live envs, policies and runs with it",
    413: "Request body larger than MAX_REQUEST_BYTES",
    421: "The id belongs to another replica of the service",
    422: "Malformed request, invalid config or snapshot",
    429: "At capacity: retry after the Retry-After header's seconds",
    503: "Unavailable here (training without the train extra installed; a Ray host not answering)",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the given error statuses, each with the `ErrorBody` shape.

    401 is not listed here: `auth.document_security` adds it to every operation that requires
    the key, when a key is configured."""
    return {s: {"model": ErrorBody, "description": ERROR_MEANINGS[s]} for s in sorted(statuses)}


# Every status at once, for a router that has not listed its own yet.
ERROR_RESPONSES = error_responses(*ERROR_MEANINGS)


def error_body(code: str, message: str) -> dict[str, str]:
    return {"code": code, "detail": message}


async def send_error(
    send: Send,
    status: int,
    code: str,
    detail: str,
    headers: dict[str, str] | None = None,
    *,
    websocket: bool = False,
) -> None:
    """Answer an error from ASGI middleware (before any route runs), in the usual shape
    (``websocket``: as the denial response of a WebSocket handshake)."""
    body = json.dumps(error_body(code, detail)).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    prefix = "websocket.http.response" if websocket else "http.response"
    await send({"type": f"{prefix}.start", "status": status, "headers": raw})
    await send({"type": f"{prefix}.body", "body": body})


def _validation_detail(exc: RequestValidationError) -> list[dict[str, Any]]:
    try:
        return jsonable_encoder(exc.errors())
    except (UnicodeDecodeError, ValueError, TypeError):  # an input that cannot be shown as JSON
        return jsonable_encoder(
            [{k: v for k, v in e.items() if k in ("type", "loc", "msg")} for e in exc.errors()]
        )


def _service_error(exc: ServiceError) -> JSONResponse:
    return JSONResponse(error_body(exc.code, exc.message), exc.status_code, headers=exc.headers)


def _http_error(exc: HTTPException) -> JSONResponse:
    code = getattr(exc, "code", None)
    if code is None:
        try:
            code = HTTPStatus(exc.status_code).name.lower()
        except ValueError:
            code = "http_error"
    return JSONResponse(error_body(code, str(exc.detail)), exc.status_code, headers=exc.headers)


def _plugin_error(exc: PluginError) -> JSONResponse:
    for cls, status, code in _PLUGIN_STATUS:
        if isinstance(exc, cls):
            headers = {"Retry-After": "1"} if status == 429 else None
            return JSONResponse(error_body(code, str(exc)), status, headers=headers)
    return JSONResponse(error_body("bad_request", str(exc)), 400)


def error_response(exc: Exception) -> JSONResponse | None:
    """What the app's error handlers answer to ``exc`` raised by a route; None: not a caller's
    mistake (the server's 500). For code that answers ahead of the routes (`FastPaths`)."""
    if isinstance(exc, ServiceError):
        return _service_error(exc)
    if isinstance(exc, PluginError):
        return _plugin_error(exc)
    if isinstance(exc, HTTPException):
        return _http_error(exc)
    return None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _on_service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return _service_error(exc)

    @app.exception_handler(RequestValidationError)
    async def _on_invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"code": "invalid_request", "detail": _validation_detail(exc)}, 422)

    @app.exception_handler(HTTPException)
    async def _on_http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return _http_error(exc)

    @app.exception_handler(PluginError)
    async def _on_plugin_error(_: Request, exc: PluginError) -> JSONResponse:
        return _plugin_error(exc)
