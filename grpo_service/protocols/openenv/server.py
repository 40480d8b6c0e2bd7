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
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from envs.base import ENVIRONMENTS, environment_class
from grpo_service.api.auth import check_key, require_api_key
from grpo_service.api.limits import strict_json
from grpo_service.api.services import Services
from grpo_service.errors import ServiceError, Unauthorized, error_body
from grpo_service.protocols.openenv import mcp
from grpo_service.protocols.openenv.frames import (
    ErrorCode,
    FrameError,
    HealthStatus,
    Metadata,
    Schemas,
    env_schemas,
)
from grpo_service.protocols.openenv.links import CAPACITY_CLOSE, ClusterLink, LinkRequest, LocalLink, Outcome
from grpo_service.protocols.openenv.sessions import Sessions
from grpo_service.version import __version__

log = logging.getLogger(__name__)

PREFIX = "/openenv"
SEND_TIMEOUT_S = 30.0  # a client that stops reading its socket loses the session after this
DOCS_URL = "https://github.com/meta-pytorch/OpenEnv"


class Connection:
    """One WebSocket: frames in, exactly one reply per frame out (``close`` excepted), each
    answered through ``link`` (the session here, or on its Ray host)."""

    def __init__(self, websocket: WebSocket, link: LocalLink | ClusterLink, idle_s: float) -> None:
        self.websocket = websocket
        self.link = link
        self.idle_s = idle_s

    async def serve(self, attach_to: str | None) -> None:
        outcome = await self.link.open(attach_to)
        if outcome.session_id is None:  # refused: at capacity, or no such session to attach to
            await self._finish(outcome)
            return
        reason = "disconnected"
        try:
            while outcome.close is None:
                raw = await self._receive()
                if raw is False:
                    return
                outcome = await (self.link.check() if raw is None else self.link.frame(raw))
                if not await self._finish(outcome):
                    return
            reason = outcome.reason
        finally:
            await asyncio.shield(self.link.end(reason))

    async def _finish(self, outcome: Outcome) -> bool:
        """Send the outcome's reply and close if it says so; False if the socket is gone."""
        if outcome.reply is not None and not await self._send(outcome.reply):
            return False
        if outcome.close is not None and self.websocket.client_state == WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.websocket.close(outcome.close), timeout=SEND_TIMEOUT_S)
        return True

    async def _receive(self) -> str | None | Literal[False]:
        """The next frame's text; ``None`` after an idle spell (time to check on the env);
        ``False`` once the client is gone."""
        try:
            message = await asyncio.wait_for(self.websocket.receive(), timeout=self.idle_s)
        except TimeoutError:
            return None
        except (WebSocketDisconnect, RuntimeError):
            return False
        if message["type"] == "websocket.disconnect":
            return False
        if message.get("text") is not None:
            return message["text"]
        try:
            return (message.get("bytes") or b"").decode("utf-8")
        except UnicodeDecodeError:
            return "\x00"  # not UTF-8: answered INVALID_JSON like any other unreadable frame

    async def _send(self, reply: dict[str, Any]) -> bool:
        try:
            text = json.dumps(reply, ensure_ascii=False, allow_nan=False)
        except ValueError as exc:  # an env observation with a NaN: the client gets the error instead
            text = json.dumps(FrameError(ErrorCode.EXECUTION_ERROR, f"unencodable reply: {exc}").frame())
        try:
            await asyncio.wait_for(self.websocket.send_text(text), timeout=SEND_TIMEOUT_S)
        except (TimeoutError, WebSocketDisconnect, RuntimeError, OSError):
            return False
        return True


KEY_HEADERS = (b"x-api-key", b"authorization")


async def websocket_session(websocket: WebSocket, sessions: Sessions, app: FastAPI) -> None:
    """``/ws``: check the key, accept, open (or attach to) a session, serve it, release it."""
    settings = sessions.services.settings
    if settings.environment_api_key is not None:
        try:
            check_key(websocket, settings.environment_api_key)
        except Unauthorized as exc:
            if "websocket.http.response" in websocket.scope.get("extensions", {}):
                await websocket.send_denial_response(JSONResponse(error_body(exc.code, exc.message), 401))
            else:  # a server without ASGI's denial response: the handshake fails with a 403
                await websocket.close(1008, exc.message)
            return
    await websocket.accept()
    link: LocalLink | ClusterLink
    if settings.ray_address is None:
        link = LocalLink(sessions)
    else:  # the envs live on the Ray hosts: each operation goes to the session's host
        headers = [(k, v) for k, v in websocket.scope["headers"] if k in KEY_HEADERS]
        link = ClusterLink(app, f"{PREFIX}/{sessions.env_name}/link", headers)
    idle_s = max(settings.idle_ttl_s, 1.0)
    await Connection(websocket, link, idle_s).serve(websocket.query_params.get("session_id"))


def openenv_server(env_name: str, services: Services, app: FastAPI) -> FastAPI:
    """The OpenEnv server of environment ``env_name``, sharing the service's envs and settings
    (``app``: the service's app, through which a Ray front reaches its hosts)."""
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

    schemas = env_schemas(cls)

    @server.get("/schema", response_model=Schemas, tags=["openenv"])
    async def schema() -> Schemas:
        """JSON schemas of this env's action (a step frame's data), observation and state."""
        return schemas

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
        await websocket_session(websocket, sessions, app)

    @server.post("/link", include_in_schema=False, dependencies=[Depends(require_api_key)])
    async def link(request: LinkRequest) -> JSONResponse:
        """A Ray front's socket, operating its session on this host (internal)."""
        outcome = await LocalLink(sessions).serve(request)
        full = outcome.reply is not None and outcome.close == CAPACITY_CLOSE
        return JSONResponse(outcome.model_dump(mode="json"), 429 if full else 200)

    return server


def mount(app: FastAPI, services: Services) -> None:
    """Mount one OpenEnv server per registered environment at ``/openenv/<env_name>``."""
    for name in sorted(ENVIRONMENTS):
        app.mount(f"{PREFIX}/{name}", openenv_server(name, services, app))
