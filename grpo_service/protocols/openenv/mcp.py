"""MCP's JSON-RPC 2.0 as OpenEnv serves it at ``/mcp`` (and in ``mcp`` frames of the WebSocket):
``tools/list``, ``tools/call``, OpenEnv's ``openenv/session/create`` and ``openenv/session/close``,
plus MCP's ``initialize`` and ``ping``. Every answer is a JSON-RPC response, errors included."""

from __future__ import annotations

from enum import IntEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grpo_service.models import Seed
from grpo_service.protocols.openenv.frames import ErrorCode, FrameError
from grpo_service.protocols.openenv.sessions import OpenEnvSession, Sessions
from grpo_service.version import __version__

PROTOCOL_VERSION = "2025-06-18"


class RpcCode(IntEnum):
    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    SERVER_ERROR = -32000


class RpcRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    jsonrpc: Literal["2.0"]
    method: str = Field(max_length=128)
    params: dict[str, Any] = Field(default_factory=dict)
    id: int | str | None = None


class CallParams(BaseModel):
    name: str = Field(max_length=128)
    arguments: dict[str, Any] = Field(default_factory=dict)
    session_id: str | None = Field(default=None, max_length=128)


class SessionParams(BaseModel):
    session_id: str = Field(max_length=128)


class CreateParams(BaseModel):
    seed: Seed | None = None


class RpcError(Exception):
    def __init__(self, code: RpcCode, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


def error_response(code: RpcCode, message: str, request_id: Any = None, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": int(code), "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


async def handle(body: Any, sessions: Sessions, bound: OpenEnvSession | None = None) -> dict[str, Any]:
    """Answer one JSON-RPC request. ``bound``: the session of the WebSocket it came over."""
    try:
        request = RpcRequest.model_validate(body)
    except ValidationError as exc:
        request_id = body.get("id") if isinstance(body, dict) else None
        if not isinstance(request_id, (int, str)):
            request_id = None
        return error_response(RpcCode.INVALID_REQUEST, f"Invalid Request: {_problems(exc)}", request_id)
    try:
        result = await _dispatch(request, sessions, bound)
    except RpcError as exc:
        return error_response(exc.code, exc.message, request.id, exc.data)
    except FrameError as exc:
        return error_response(*_rpc_error(exc), request.id, {"code": exc.code.value, **exc.extra})
    return {"jsonrpc": "2.0", "id": request.id, "result": result}


async def _dispatch(request: RpcRequest, sessions: Sessions, bound: OpenEnvSession | None) -> Any:
    method, params = request.method, request.params
    if method == "initialize":
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": f"grpo-service/{sessions.env_name}", "version": __version__},
        }
    if method == "ping" or method.startswith("notifications/"):
        return {}
    if method == "tools/list":
        return {"tools": sessions.tools()}
    if method == "tools/call":
        call = _params(CallParams, params)
        session = bound if bound is not None else _session(sessions, call.session_id)
        return await sessions.call_tool(session, call.name, call.arguments)
    if method == "openenv/session/create":
        if bound is not None:
            return {"session_id": bound.id}
        created = await sessions.open(seed=_params(CreateParams, params).seed)
        return {"session_id": created.id}
    if method == "openenv/session/close":
        target = _params(SessionParams, params).session_id
        if bound is not None and target == bound.id:
            raise RpcError(
                RpcCode.INVALID_REQUEST, "cannot close the session of this WebSocket: close the socket"
            )
        closed = await sessions.close(_session(sessions, target))
        return {"session_id": target, "closed": closed}
    raise RpcError(RpcCode.METHOD_NOT_FOUND, f"Method not found: {method:.128}")


def _session(sessions: Sessions, session_id: str | None) -> OpenEnvSession:
    if session_id is None:
        raise RpcError(
            RpcCode.INVALID_PARAMS,
            "'session_id' is required: a tool call steps a live env; open one with openenv/session/create",
        )
    return sessions.unowned(session_id)


def _params(model: type[Any], params: dict[str, Any]) -> Any:
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        raise RpcError(RpcCode.INVALID_PARAMS, f"Invalid params: {_problems(exc)}") from None


def _problems(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())


def _rpc_error(exc: FrameError) -> tuple[RpcCode, str]:
    if exc.code in (ErrorCode.VALIDATION_ERROR, ErrorCode.SESSION_ERROR):
        return RpcCode.INVALID_PARAMS, exc.message
    return RpcCode.SERVER_ERROR, exc.message
