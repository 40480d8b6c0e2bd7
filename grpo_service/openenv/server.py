"""One OpenEnv server per environment plug-in, mounted at ``/openenv/<env_name>``.

Each is what OpenEnv 0.10's clients and ``openenv validate --url`` expect of an environment
server: the WebSocket ``/ws`` (one connection, one session, one env; frames ``reset``, ``step``,
``state``, ``close``, ``list_tools``, ``call_tool`` and ``mcp``), ``GET /health``,
``GET /metadata``, ``GET /schema``, ``POST /mcp`` (JSON-RPC) and this OpenAPI document. It has no
stateless ``/reset``, ``/step`` or ``/state`` routes (an episode cannot be played over them), so
``openenv validate`` reads it as a server in OpenEnv's production mode.

With an API key set, ``/ws`` and ``/mcp`` need it (``X-API-Key`` or ``Authorization: Bearer``,
which OpenEnv's clients send through their ``headers=``); a WebSocket without it is refused
with a 401 before it opens. ``/health``, ``/metadata``, ``/schema`` and the OpenAPI document
describe the plug-in only and stay open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from pydantic import ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from envs.base import ENVIRONMENTS, environment_class
from grpo_service import __version__
from grpo_service.auth import check_key, require_api_key
from grpo_service.deps import Services
from grpo_service.errors import ServiceError, Unauthorized, error_body
from grpo_service.limits import strict_json
from grpo_service.models import EnvAction
from grpo_service.openenv import mcp
from grpo_service.openenv.frames import (
    ErrorCode,
    Frame,
    FrameError,
    HealthStatus,
    Metadata,
    Observation,
    Schemas,
    State,
    validation_failed,
)
from grpo_service.openenv.sessions import Session, Sessions

log = logging.getLogger(__name__)

PREFIX = "/openenv"
SEND_TIMEOUT_S = 30.0  # a client that stops reading its socket loses the session after this
DOCS_URL = "https://github.com/meta-pytorch/OpenEnv"
FRAME_TYPES = frozenset({"reset", "step", "state", "close", "list_tools", "call_tool", "mcp"})


class Closing(Exception):
    """Ends the socket's session (the client's ``close`` frame, a fatal error, a dead socket)."""

    def __init__(self, reason: str, code: int = 1000) -> None:
        super().__init__(reason)
        self.reason, self.code = reason, code


class Connection:
    """One WebSocket's session: frames in, exactly one reply per frame out (``close`` excepted)."""

    def __init__(self, websocket: WebSocket, sessions: Sessions, session: Session | None) -> None:
        self.websocket = websocket
        self.sessions = sessions
        self.session = session
        self.settings = sessions.services.settings

    async def serve(self) -> str:
        """Answer frames until the session ends; return why it ended."""
        while True:
            try:
                try:
                    raw = await self._receive()
                except FrameError as exc:  # the env went away while the socket was idle
                    raise await self._fatal(exc) from None
                reply = await self.answer(raw)
            except Closing as stop:
                if stop.reason != "disconnected":
                    await self.close(stop.code)
                return stop.reason
            if reply is not None:
                await self.send(reply)

    async def answer(self, raw: str | None) -> dict[str, Any] | None:
        """The reply to one frame (``None`` when ``raw`` was a timeout that changed nothing)."""
        if raw is None:
            return None
        try:
            return await self._dispatch(self._parse(raw))
        except FrameError as exc:
            if exc.fatal:
                raise await self._fatal(exc) from None
            return exc.frame()
        except Closing:
            raise
        except Exception as exc:  # a fault here must not cost the client its session
            log.exception("OpenEnv frame failed on %s", self.sessions.env_name)
            return FrameError(ErrorCode.EXECUTION_ERROR, f"{type(exc).__name__}: {exc}").frame()

    async def _fatal(self, exc: FrameError) -> Closing:
        """Send the error that ends the session; the `Closing` to raise."""
        await self.send(exc.frame())
        return Closing(exc.code.lower(), 1013 if exc.code == ErrorCode.CAPACITY_REACHED else 1000)

    def _parse(self, raw: str) -> Frame:
        if len(raw) > self.settings.max_request_bytes:
            raise FrameError(
                ErrorCode.VALIDATION_ERROR,
                f"frame of {len(raw)} characters exceeds the {self.settings.max_request_bytes} byte limit",
            )
        try:
            message = strict_json(raw)
        except (json.JSONDecodeError, UnicodeError) as exc:
            raise FrameError(ErrorCode.INVALID_JSON, f"Invalid JSON: {exc}") from None
        if not isinstance(message, dict):
            raise FrameError(ErrorCode.VALIDATION_ERROR, "a frame is a JSON object with a 'type'")
        kind = message.get("type")
        if kind not in FRAME_TYPES:
            raise FrameError(
                ErrorCode.UNKNOWN_TYPE,
                f"Unknown message type: {str(kind)[:64]!r}; expected one of {', '.join(sorted(FRAME_TYPES))}",
            )
        try:
            return Frame.model_validate(message)
        except ValidationError as exc:
            raise validation_failed(exc, f"{kind} frame") from None

    async def _dispatch(self, frame: Frame) -> dict[str, Any]:
        sessions, session = self.sessions, self.session
        assert session is not None  # a connection without a session only sends its refusal
        match frame.type:
            case "reset":
                return {"type": "observation", "data": await sessions.reset(session, frame.data)}
            case "step":
                return {"type": "observation", "data": await sessions.step(session, frame.data)}
            case "state":
                return {"type": "state", "data": sessions.state(session)}
            case "list_tools":
                tools = sessions.tools()
                return {
                    "type": "observation",
                    "data": {"observation": {"tools": tools}, "reward": None, "done": False},
                }
            case "call_tool":
                if frame.tool_name is None:
                    raise FrameError(ErrorCode.VALIDATION_ERROR, "a call_tool frame needs 'tool_name'")
                result = await sessions.call_tool(session, frame.tool_name, frame.arguments or {})
                data = result["data"]
                observation = {"tool_name": frame.tool_name, "result": result, "error": None}
                return {
                    "type": "observation",
                    "data": {"observation": observation, "reward": data["reward"], "done": data["done"]},
                }
            case "mcp":
                return {"type": "mcp", "data": await mcp.handle(frame.data or {}, sessions, bound=session)}
            case _:  # "close"
                raise Closing("closed")

    async def _receive(self) -> str | None:
        """The next text frame; ``None`` after an idle TTL during which the env stayed alive."""
        ttl = max(self.settings.idle_ttl_s, 1.0)
        try:
            message = await asyncio.wait_for(self.websocket.receive(), timeout=ttl)
        except TimeoutError:
            assert self.session is not None
            self.sessions.check_alive(self.session)  # SESSION_ERROR (fatal) if the reaper took the env
            return None
        except (WebSocketDisconnect, RuntimeError):
            raise Closing("disconnected") from None
        if message["type"] == "websocket.disconnect":
            raise Closing("disconnected")
        if message.get("text") is not None:
            return message["text"]
        try:
            return (message.get("bytes") or b"").decode("utf-8")
        except UnicodeDecodeError:
            return "\x00"  # not UTF-8: answered INVALID_JSON like any other unreadable frame

    async def send(self, reply: dict[str, Any]) -> None:
        try:
            text = json.dumps(reply, ensure_ascii=False, allow_nan=False)
        except ValueError as exc:  # an env observation with a NaN: the client gets the error instead
            text = json.dumps(FrameError(ErrorCode.EXECUTION_ERROR, f"unencodable reply: {exc}").frame())
        try:
            await asyncio.wait_for(self.websocket.send_text(text), timeout=SEND_TIMEOUT_S)
        except (TimeoutError, WebSocketDisconnect, RuntimeError, OSError):
            raise Closing("disconnected") from None

    async def close(self, code: int) -> None:
        if self.websocket.client_state == WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.websocket.close(code), timeout=SEND_TIMEOUT_S)


async def websocket_session(websocket: WebSocket, sessions: Sessions) -> None:
    """``/ws``: check the key, accept, open (or attach to) a session, serve it, release it."""
    expected = sessions.services.settings.environment_api_key
    if expected is not None:
        try:
            check_key(websocket, expected)
        except Unauthorized as exc:
            if "websocket.http.response" in websocket.scope.get("extensions", {}):
                await websocket.send_denial_response(JSONResponse(error_body(exc.code, exc.message), 401))
            else:  # a server without ASGI's denial response: the handshake fails with a 403
                await websocket.close(1008, exc.message)
            return
    await websocket.accept()
    attach_to = websocket.query_params.get("session_id")
    session: Session | None = None
    reason = "disconnected"
    try:
        try:
            session = sessions.attach(attach_to) if attach_to else await sessions.open()
        except FrameError as exc:  # at capacity, or no such session to attach to
            connection = Connection(websocket, sessions, None)
            with contextlib.suppress(Closing):
                await connection.close((await connection._fatal(exc)).code)
            return
        reason = await Connection(websocket, sessions, session).serve()
    finally:
        if session is not None:
            if attach_to:
                sessions.detach(session)
            else:
                await asyncio.shield(sessions.close(session, reason))


def openenv_server(env_name: str, services: Services) -> FastAPI:
    """The OpenEnv server of environment ``env_name``, sharing the service's envs and settings."""
    cls = environment_class(env_name)
    sessions = Sessions(env_name, services)
    server = FastAPIOffline(  # its /docs load Swagger UI from the package, as the service's do
        title=f"grpo-service: {env_name} over OpenEnv",
        version=__version__,
        description=(__doc__ or "") + f"\n\nThe WebSocket: `ws://<host>{PREFIX}/{env_name}/ws`.",
    )
    server.state.settings = services.settings
    server.state.services = services
    server.state.sessions = sessions

    @server.exception_handler(ServiceError)
    async def _service_error(_: Request, exc: ServiceError) -> JSONResponse:  # the API key check
        return JSONResponse(error_body(exc.code, exc.message), exc.status_code, headers=exc.headers)

    @server.get("/health", response_model=HealthStatus, tags=["openenv"])
    async def health() -> HealthStatus:
        """OpenEnv's health check (open without a key)."""
        return HealthStatus()

    @server.get("/metadata", response_model=Metadata, tags=["openenv"])
    async def metadata() -> Metadata:
        """The environment: name, description, version, its tools and the config a reset takes."""
        return Metadata(
            name=env_name,
            description=cls.description,
            readme_content=f"Connect OpenEnv's client with base_url=<server>{PREFIX}/{env_name}.",
            version=cls.version,
            author="grpo-service",
            documentation_url=DOCS_URL,
            tools=cls.tools(),
            config_schema=cls.config_model.model_json_schema(),
        )

    @server.get("/schema", response_model=Schemas, tags=["openenv"])
    async def schema() -> Schemas:
        """JSON schemas of a step frame's data, an observation and a state."""
        return Schemas(
            action=EnvAction.model_json_schema(),
            observation=Observation.model_json_schema(),
            state=State.model_json_schema(),
            reset_observation=Observation.model_json_schema(),
        )

    @server.post("/mcp", tags=["openenv"], dependencies=[Depends(require_api_key)])
    async def mcp_endpoint(request: Request) -> JSONResponse:
        """MCP JSON-RPC 2.0: ``tools/list``, ``tools/call`` (with ``session_id``),
        ``openenv/session/create`` and ``openenv/session/close``, ``initialize``, ``ping``."""
        try:
            body = strict_json(await request.body())
        except (json.JSONDecodeError, UnicodeError) as exc:
            return JSONResponse(mcp.error_response(mcp.RpcCode.PARSE_ERROR, f"Parse error: {exc}"))
        return JSONResponse(await mcp.handle(body, sessions))

    @server.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await websocket_session(websocket, sessions)

    return server


def mount(app: FastAPI, services: Services) -> None:
    """Mount one OpenEnv server per registered environment at ``/openenv/<env_name>``."""
    for name in sorted(ENVIRONMENTS):
        app.mount(f"{PREFIX}/{name}", openenv_server(name, services))
