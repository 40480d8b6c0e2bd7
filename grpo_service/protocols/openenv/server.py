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

import orjson
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from envs.base import ENVIRONMENTS, environment_class
from grpo_service.api.auth import check_key, internal_only, require_api_key
from grpo_service.api.fast_paths import FastRoute
from grpo_service.api.limits import strict_json
from grpo_service.api.services import Services
from grpo_service.errors import ServiceError, Unauthorized, error_body
from grpo_service.protocols.openenv import mcp
from grpo_service.protocols.openenv.frames import (
    HealthStatus,
    Metadata,
    Schemas,
    encode_frame,
    env_schemas,
)
from grpo_service.protocols.openenv.links import (
    CAPACITY_CLOSE,
    OUTCOME,
    ClusterLink,
    LinkRequest,
    LocalLink,
    Outcome,
)
from grpo_service.protocols.openenv.sessions import Sessions
from grpo_service.version import __version__

log = logging.getLogger(__name__)

PREFIX = "/openenv"
SEND_TIMEOUT_S = 30.0  # a client that stops reading its socket loses the session after this
DOCS_URL = "https://github.com/meta-pytorch/OpenEnv"


class Watchdog:
    """The deadline of a socket's wait under way (a receive, a send), without a timer per frame:
    one timer per socket looks every ``period`` seconds whether the wait has run past its
    deadline and, if so, cancels the socket's task; the wait then reports a timeout (late by at
    most ``period``)."""

    def __init__(self, period_s: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self.period_s = period_s
        self.deadline: float | None = None
        self.fired = False
        self._timer = self.loop.call_later(period_s, self._look)

    def arm(self, seconds: float) -> None:
        self.deadline = self.loop.time() + seconds

    def _look(self) -> None:
        if self.deadline is not None and not self.fired and self.loop.time() >= self.deadline:
            self.fired = True
            assert self.task is not None
            self.task.cancel()
        self._timer = self.loop.call_later(self.period_s, self._look)

    def timed_out(self) -> bool:
        """In a wait's ``except CancelledError``: whether this was its deadline (then the
        cancellation is taken back) rather than the task being cancelled from outside."""
        self.deadline = None
        if not self.fired:
            return False
        self.fired = False
        assert self.task is not None
        return self.task.uncancel() == 0

    def stop(self) -> None:
        self._timer.cancel()


class Connection:
    """One WebSocket: frames in, exactly one reply per frame out (``close`` excepted), each
    answered through ``link`` (the session here, or on its Ray host)."""

    def __init__(self, websocket: WebSocket, link: LocalLink | ClusterLink, idle_s: float) -> None:
        self.websocket = websocket
        self.link = link
        self.idle_s = idle_s
        self.watchdog: Watchdog | None = None

    async def serve(self, attach_to: str | None) -> None:
        self.watchdog = Watchdog(min(self.idle_s, SEND_TIMEOUT_S) / 4)
        try:
            await self._serve(attach_to)
        finally:
            self.watchdog.stop()

    async def _serve(self, attach_to: str | None) -> None:
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
        assert self.watchdog is not None
        self.watchdog.arm(self.idle_s)
        try:
            message = await self.websocket.receive()
        except asyncio.CancelledError:
            if not self.watchdog.timed_out():
                raise
            return None
        except (WebSocketDisconnect, RuntimeError):
            return False
        finally:
            self.watchdog.deadline = None
        if message["type"] == "websocket.disconnect":
            return False
        if message.get("text") is not None:
            return message["text"]
        try:
            return (message.get("bytes") or b"").decode("utf-8")
        except UnicodeDecodeError:
            return "\x00"  # not UTF-8: answered INVALID_JSON like any other unreadable frame

    async def _send(self, reply: dict[str, Any]) -> bool:
        text = encode_frame(reply)
        assert self.watchdog is not None
        self.watchdog.arm(SEND_TIMEOUT_S)
        try:
            await self.websocket.send_text(text)
        except asyncio.CancelledError:
            if not self.watchdog.timed_out():
                raise
            return False
        except (WebSocketDisconnect, RuntimeError, OSError):
            return False
        finally:
            self.watchdog.deadline = None
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

    @server.post(
        "/link", include_in_schema=False, dependencies=[Depends(internal_only), Depends(require_api_key)]
    )
    async def link(request: LinkRequest) -> Response:
        """A Ray front's socket, operating its session on this host (internal)."""
        return await serve_link(sessions, request)

    return server


async def serve_link(sessions: Sessions, request: LinkRequest) -> Response:
    """The answer to a link request: its outcome, 429 when every host is full."""
    outcome = await LocalLink(sessions).serve(request)
    full = outcome.reply is not None and outcome.close == CAPACITY_CLOSE
    content = orjson.dumps(OUTCOME.dump_python(outcome, mode="json"))
    return Response(content, 429 if full else 200, media_type="application/json")


def fast_link(sessions: Sessions) -> FastRoute:
    """``POST /link`` ahead of FastAPI's routing (`FastPaths`, internal): on a Ray host nearly
    every request of the sockets its front holds is one, and routing, dependency solving and
    validation cost more than the step it carries. A body that is not a `LinkRequest` goes on
    to the route (its 422)."""

    async def fast(body: bytes) -> Response | None:
        try:
            request = LinkRequest.model_validate_json(body)
        except ValueError:
            return None
        return await serve_link(sessions, request)

    return fast


def mount(app: FastAPI, services: Services) -> dict[str, FastRoute]:
    """Mount one OpenEnv server per registered environment at ``/openenv/<env_name>``; their
    internal ``/link`` fast paths, by path (for `FastPaths`)."""
    links = {}
    for name in sorted(ENVIRONMENTS):
        server = openenv_server(name, services, app)
        app.mount(f"{PREFIX}/{name}", server)
        links[f"{PREFIX}/{name}/link"] = fast_link(server.state.sessions)
    return links
