"""What a WebSocket's frames are answered by: its session, here or on the Ray host that holds it.

`answer_frame` turns one frame of text into its `Outcome` (the reply frame, and whether the
session ends), never raising: every problem is one of OpenEnv's error frames. A socket reaches
its session through a link: `LocalLink` when this process holds the envs; `ClusterLink` when the
service is served through Ray (`serve --ray`), where the envs live on hosts and the front holds
the sockets. A cluster link sends each operation as one internal request, ``POST
/openenv/<env>/link``, through the app's own router, which places an ``open`` on a host with room
and sends everything else to the host whose tag the session id carries. A frame the front sees
to be a ``step`` goes as op ``step``: the router sends the steps that arrive for a host in one
event-loop turn in one actor call (`grpo_service.cluster.step_batcher`), so that thousands of
sockets stepping at once do not cost an actor call each.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from fastapi import FastAPI
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from grpo_service.api.asgi import call_asgi
from grpo_service.api.limits import strict_json
from grpo_service.protocols.openenv import mcp
from grpo_service.protocols.openenv.frames import ErrorCode, Frame, FrameError, validation_failed
from grpo_service.protocols.openenv.sessions import OpenEnvSession, Sessions

log = logging.getLogger(__name__)

FRAME_TYPES = frozenset({"reset", "step", "state", "close", "list_tools", "call_tool", "mcp"})
FAST_KEYS = frozenset({"type", "data"})  # a frame of only these is valid as it is (no model to run)
LINK_TIMEOUT_S = 900.0  # one operation on a host: a SciWorld reset may wait minutes for a JVM
CAPACITY_CLOSE = 1013  # "try again later": the close code after CAPACITY_REACHED


@dataclass(slots=True)
class Outcome:
    """What a socket does after a frame: send ``reply`` (if any), then close with ``close`` (if
    set; ``reason`` says why the session ended). ``session_id``: the session an ``open`` got.
    A dataclass, not a model: one is made per frame (`OUTCOME` reads and writes it as JSON)."""

    reply: dict[str, Any] | None = None
    close: int | None = None
    reason: str = ""
    session_id: str | None = None


OUTCOME = TypeAdapter(Outcome)  # an outcome over a cluster link (the body of POST .../link)


def ending(exc: FrameError) -> Outcome:
    """The outcome of an error frame: the session goes on unless the error is fatal."""
    if not exc.fatal:
        return Outcome(reply=exc.frame())
    code = CAPACITY_CLOSE if exc.code == ErrorCode.CAPACITY_REACHED else 1000
    return Outcome(reply=exc.frame(), close=code, reason=exc.code.lower())


async def answer_frame(sessions: Sessions, session: OpenEnvSession, raw: str) -> Outcome:
    """One frame of ``session``; every failure is an error frame, a fault included."""
    try:
        frame = _parse(raw, sessions.services.settings.max_request_bytes)
        if frame.type == "close":
            return Outcome(close=1000, reason="closed")
        return Outcome(reply=await _dispatch(sessions, session, frame))
    except FrameError as exc:
        return ending(exc)
    except Exception as exc:  # a fault here must not cost the client its session
        log.exception("OpenEnv frame failed on %s", sessions.env_name)
        return Outcome(reply=FrameError(ErrorCode.EXECUTION_ERROR, f"{type(exc).__name__}: {exc}").frame())


@dataclass(slots=True)
class Parsed:
    """A valid frame (`Frame`'s fields), without a model's cost on every frame."""

    type: str
    data: dict[str, Any] | None
    tool_name: str | None = None
    arguments: dict[str, Any] | None = None


def _parse(raw: str, max_bytes: int) -> Parsed:
    if len(raw) > max_bytes:
        raise FrameError(
            ErrorCode.VALIDATION_ERROR, f"frame of {len(raw)} characters exceeds the {max_bytes} byte limit"
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
    data = message.get("data")
    if message.keys() <= FAST_KEYS and (data is None or type(data) is dict):
        return Parsed(kind, data)  # {type, data}: nothing left to validate
    try:
        frame = Frame.model_validate(message)
    except ValidationError as exc:
        raise validation_failed(exc, f"{kind} frame") from None
    return Parsed(frame.type, frame.data, frame.tool_name, frame.arguments)


async def _dispatch(sessions: Sessions, session: OpenEnvSession, frame: Parsed) -> dict[str, Any]:
    match frame.type:
        case "reset":
            return {"type": "observation", "data": await sessions.reset(session, frame.data)}
        case "step":
            return {"type": "observation", "data": await sessions.step(session, frame.data)}
        case "state":
            return {"type": "state", "data": sessions.state(session)}
        case "list_tools":
            observation = {"tools": sessions.tools()}
            return {
                "type": "observation",
                "data": {"observation": observation, "reward": None, "done": False},
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
        case _:  # "mcp"
            return {"type": "mcp", "data": await mcp.handle(frame.data or {}, sessions, bound=session)}


# ---------------------------------------------------------------------------------- links


class LinkRequest(BaseModel):
    """One operation of a socket's session (``POST /openenv/<env>/link``, internal). ``step`` is a
    ``frame`` the front found to be a step frame (its host parses and checks it as any frame)."""

    op: Literal["open", "frame", "step", "check", "end"]  # first: a step's body starts with STEP_LINK
    session_id: str | None = Field(default=None, max_length=128, description="`open`: attach to it.")
    frame: str | None = Field(default=None, description="`frame`, `step`: the frame's text.")
    reason: str = Field(default="", max_length=64, description="`end`: why the socket ended.")


# How the body of a step's link request begins (pydantic writes `LinkRequest`'s fields in order,
# without spaces): what the Ray front's router looks for to send steps together.
STEP_LINK = b'{"op":"step"'


def is_step_frame(raw: str) -> bool:
    """Whether a frame's text is a ``step`` frame (only a look, for batching: nothing is checked)."""
    try:
        message = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return type(message) is dict and message.get("type") == "step"


class LocalLink:
    """A socket's session in this process."""

    def __init__(self, sessions: Sessions, session: OpenEnvSession | None = None) -> None:
        self.sessions = sessions
        self.session = session

    async def open(self, attach_to: str | None) -> Outcome:
        """A new session for the socket, or the MCP session ``attach_to``."""
        try:
            if attach_to:
                self.session = self.sessions.attach(attach_to)
            else:
                self.session = await self.sessions.open(socket_owned=True)
        except FrameError as exc:
            exc.fatal = True  # no session: the socket closes after the error
            return ending(exc)
        return Outcome(session_id=self.session.id)

    async def frame(self, raw: str) -> Outcome:
        assert self.session is not None
        return await answer_frame(self.sessions, self.session, raw)

    async def check(self) -> Outcome:
        """Whether the session's env is still there (the socket was idle for a TTL)."""
        assert self.session is not None
        try:
            self.sessions.check_alive(self.session)
        except FrameError as exc:
            return ending(exc)
        return Outcome()

    async def end(self, reason: str) -> None:
        """The socket is gone: its own session ends (its env released), an attached one stays."""
        if self.session is not None:
            await self.sessions.release(self.session, reason)

    async def serve(self, request: LinkRequest) -> Outcome:
        """One operation a `ClusterLink` sent from the front."""
        if request.op == "open":
            return await self.open(request.session_id)
        try:
            self.session = self.sessions.get(request.session_id or "")
        except FrameError as exc:
            return ending(exc)
        if request.op in ("frame", "step"):
            return await self.frame(request.frame or "")
        if request.op == "check":
            return await self.check()
        await self.end(request.reason or "disconnected")
        return Outcome()


class ClusterLink:
    """A socket's session on a Ray host, reached through the app's router (``app``: the
    service's app, whose middleware routes by the session id's tag)."""

    def __init__(self, app: FastAPI, path: str, headers: list[tuple[bytes, bytes]]) -> None:
        self.app = app
        self.path = path
        self.headers = [*headers, (b"content-type", b"application/json")]
        self.session_id: str | None = None

    async def _call(self, request: LinkRequest) -> Outcome:
        body = request.model_dump_json().encode()
        # The Ray front's router, straight (set when the app's middleware is built), else the app.
        direct = getattr(self.app.state, "internal_request", None)
        if direct is not None:
            call = direct("POST", self.path, b"", self.headers, body)
        else:
            call = call_asgi(self.app, "POST", self.path, b"", self.headers, body)
        try:
            status, _, content = await asyncio.wait_for(call, timeout=LINK_TIMEOUT_S)
        except TimeoutError:
            status, content = 504, b'{"detail": "no answer in time"}'
        if status in (200, 429):  # 429: every host is full (the outcome says CAPACITY_REACHED)
            return OUTCOME.validate_json(content)
        detail = _detail(content)
        message = f"the session's host could not answer ({status}: {detail})"
        return ending(FrameError(ErrorCode.SESSION_ERROR, message, fatal=True))

    async def open(self, attach_to: str | None) -> Outcome:
        outcome = await self._call(LinkRequest(op="open", session_id=attach_to))
        self.session_id = outcome.session_id
        return outcome

    async def frame(self, raw: str) -> Outcome:
        op = "step" if is_step_frame(raw) else "frame"
        return await self._call(LinkRequest(op=op, session_id=self.session_id, frame=raw))

    async def check(self) -> Outcome:
        return await self._call(LinkRequest(op="check", session_id=self.session_id))

    async def end(self, reason: str) -> None:
        if self.session_id is not None:
            await self._call(LinkRequest(op="end", session_id=self.session_id, reason=reason))


def _detail(content: bytes) -> str:
    try:
        return str(json.loads(content).get("detail"))[:200]
    except (ValueError, AttributeError):
        return content[:200].decode(errors="replace")
