"""Typed service errors and the one handler that turns every caller mistake into a clear 4xx."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from envs.base import EpisodeOver, InvalidAction, InvalidConfig, InvalidState, PluginError, UnknownPlugin


class ServiceError(Exception):
    """An error with an HTTP status and a stable machine-readable code."""

    status_code = 400
    code = "bad_request"

    def __init__(self, message: str, *, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.headers = headers
        if code:
            self.code = code


class NotFound(ServiceError):
    status_code = 404
    code = "not_found"


class Conflict(ServiceError):
    status_code = 409
    code = "conflict"


class Unprocessable(ServiceError):
    status_code = 422
    code = "invalid_request"


class Unauthorized(ServiceError):
    status_code = 401
    code = "unauthorized"


class CapacityExceeded(ServiceError):
    status_code = 429
    code = "capacity_exceeded"


class PayloadTooLarge(ServiceError):
    status_code = 413
    code = "payload_too_large"


class WrongInstance(ServiceError):
    """An id issued by another replica of the service (421 Misdirected Request; see decisions.md)."""

    status_code = 421
    code = "wrong_instance"


_PLUGIN_STATUS: list[tuple[type[PluginError], int, str]] = [
    (InvalidAction, 400, "invalid_action"),
    (InvalidConfig, 422, "invalid_config"),
    (InvalidState, 422, "invalid_snapshot"),
    (EpisodeOver, 409, "episode_over"),
    (UnknownPlugin, 400, "unknown_plugin"),
]


def error_body(code: str, message: str) -> dict[str, str]:
    return {"code": code, "detail": message}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse(error_body(exc.code, exc.message), exc.status_code, headers=exc.headers)

    @app.exception_handler(PluginError)
    async def _plugin_error(_: Request, exc: PluginError) -> JSONResponse:
        for cls, status, code in _PLUGIN_STATUS:
            if isinstance(exc, cls):
                return JSONResponse(error_body(code, str(exc)), status)
        return JSONResponse(error_body("bad_request", str(exc)), 400)
