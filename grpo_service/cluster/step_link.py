"""A kept-open TCP connection from a front to a host that carries batches of steps.

A Ray actor call costs both processes more CPU than the steps it carries (Ray's own thread in the
host receiving the call took more than the host's event loop running the app, at 1,024 OpenEnv
sessions), so a front sends its batches of steps (`grpo_service.cluster.step_batcher`) to each
host over a connection of its own, and keeps Ray for everything else: placing and finding hosts,
rollouts, listings, and telling a host that died (410) from one that does not answer (503).

The protocol, both ways a sequence of frames: a 4-byte big-endian length, then that many bytes of
JSON. The client first sends the host's token (`TOKEN_BYTES` bytes, learnt from the host's
``start`` over Ray; a connection that sends anything else is closed). A request frame is
``[batch_id, [[method, path, query, [[name, value], ...], body], ...]]``, its answer
``[batch_id, [[status, [[name, value], ...], body], ...]]`` in the same order; every bytes value
travels as a latin-1 string (one code point per byte, so any bytes round-trip). Batches are
answered as they finish, not in the order they were sent. A frame over `MAX_FRAME_BYTES` closes
the connection.

The front falls back to the actor call when it cannot connect (a firewall between nodes, a host
from before the link), and tries to connect again `RETRY_S` later: the link is a faster path,
never the only one. A connection lost with
batches in flight fails them with 503 ``host_unavailable`` (whether the host ran them is not
known); the next batch connects again, or falls back to the actor call, which tells a dead host.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from grpo_service.api.asgi import Answer, RequestArgs

log = logging.getLogger(__name__)

TOKEN_BYTES = 32
MAX_FRAME_BYTES = 256 * 2**20
HANDSHAKE_S = 10.0
LOOPBACK = "127.0.0.1"
CONNECT_S = 5.0
RETRY_S = 30.0  # after a failed connect, batches go by actor call this long before trying again

Handler = Callable[[list[RequestArgs]], Awaitable[list[Answer]]]


class LinkUnavailable(ConnectionError):
    """The link cannot be opened now: send by the actor call instead."""


class LinkBroken(ConnectionError):
    """The connection was lost with this batch in flight: whether the host ran it is not known."""


def _text(value: bytes) -> str:
    return value.decode("latin-1")


def _bytes(value: str) -> bytes:
    return value.encode("latin-1")


def _frame(value: Any) -> bytes:
    payload = orjson.dumps(value)
    return len(payload).to_bytes(4, "big") + payload


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    size = int.from_bytes(await reader.readexactly(4), "big")
    if size > MAX_FRAME_BYTES:
        raise ConnectionError(f"a frame of {size} bytes (at most {MAX_FRAME_BYTES})")
    return orjson.loads(await reader.readexactly(size))


def encode_requests(batch_id: int, batch: list[RequestArgs]) -> bytes:
    return _frame(
        [
            batch_id,
            [
                [method, path, _text(query), [[_text(k), _text(v)] for k, v in headers], _text(body)]
                for method, path, query, headers, body in batch
            ],
        ]
    )


def decode_requests(frame: Any) -> tuple[int, list[RequestArgs]]:
    batch_id, batch = frame
    return batch_id, [
        (method, path, _bytes(query), [(_bytes(k), _bytes(v)) for k, v in headers], _bytes(body))
        for method, path, query, headers, body in batch
    ]


def encode_answers(batch_id: int, answers: list[Answer]) -> bytes:
    encoded = [
        [status, [[_text(k), _text(v)] for k, v in headers], _text(body)] for status, headers, body in answers
    ]
    return _frame([batch_id, encoded])


def decode_answers(frame: Any) -> tuple[int, list[Answer]]:
    batch_id, answers = frame
    return batch_id, [
        (status, [(_bytes(k), _bytes(v)) for k, v in headers], _bytes(body))
        for status, headers, body in answers
    ]


class StepLinkServer:
    """A host's end: answers each batch with ``handler`` (the host's `Host.requests`)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, address: str) -> dict[str, Any]:
        """Listen on loopback (for the fronts on this node) and on ``address`` (the node's address,
        for the others); what a front needs to connect."""
        local = await self._listen(LOOPBACK)
        port = local if address == LOOPBACK else await self._listen(address)
        return {"token": self.token.hex(), "address": address, "port": port, "local_port": local}

    async def _listen(self, address: str) -> int:
        server = await asyncio.start_server(self._serve, address, 0)
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        self._servers.clear()
        for task in list(self._tasks):
            task.cancel()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            token = await asyncio.wait_for(reader.readexactly(TOKEN_BYTES), HANDSHAKE_S)
            if not hmac.compare_digest(token, self.token):
                log.warning("a step link connection with a wrong token, closed")
                return
            while True:
                frame = await _read_frame(reader)
                task = asyncio.ensure_future(self._answer(frame, writer))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError, orjson.JSONDecodeError):
            pass  # the front went away, or sent what this protocol is not: the connection ends
        finally:
            writer.close()

    async def _answer(self, frame: Any, writer: asyncio.StreamWriter) -> None:
        try:
            batch_id, batch = decode_requests(frame)
        except (TypeError, ValueError):
            log.warning("a malformed step link frame, closed")
            writer.close()
            return
        try:
            answers = await self.handler(batch)
        except Exception:  # the front fails the batch as lost (503), never waits for it
            log.exception("a step link batch failed on this host")
            writer.close()
            return
        if not writer.is_closing():
            writer.write(encode_answers(batch_id, answers))


class StepLink:
    """A front's end of one host's link: `send` a batch, get its answers."""

    def __init__(self, address: str, port: int, token: str, describe: str) -> None:
        self.address, self.port, self.token = address, port, bytes.fromhex(token)
        self.describe = describe
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None
        # Batches in flight, with the connection each was sent on (only its loss fails them).
        self._pending: dict[int, tuple[asyncio.StreamWriter, asyncio.Future[list[Answer]]]] = {}
        self._ids = itertools.count()
        self._connecting = asyncio.Lock()
        self._down_until = 0.0

    @classmethod
    def of(cls, info: dict[str, Any] | None, describe: str, *, same_node: bool) -> StepLink | None:
        """The link a host's ``start`` described (None: it has none), over loopback when the
        front runs on the host's node."""
        if not info:
            return None
        if same_node:
            return cls(LOOPBACK, int(info["local_port"]), info["token"], describe)
        return cls(info["address"], int(info["port"]), info["token"], describe)

    async def send(self, batch: list[RequestArgs]) -> list[Answer]:
        """``batch`` answered in order. `LinkUnavailable` if it could not be sent (nothing ran),
        `LinkBroken` if the connection was lost after it was."""
        writer = await self._connected()
        batch_id = next(self._ids)
        answer: asyncio.Future[list[Answer]] = asyncio.get_running_loop().create_future()
        self._pending[batch_id] = (writer, answer)
        try:
            writer.write(encode_requests(batch_id, batch))
            return await answer
        finally:
            self._pending.pop(batch_id, None)

    async def _connected(self) -> asyncio.StreamWriter:
        async with self._connecting:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            if time.monotonic() < self._down_until:  # it just failed: no connect per batch meanwhile
                raise LinkUnavailable(f"the step link to {self.describe} is down")
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.address, self.port), CONNECT_S
                )
            except (OSError, TimeoutError) as exc:
                self._down_until = time.monotonic() + RETRY_S
                where = f"{self.address}:{self.port}"
                log.warning(
                    "cannot connect to %s at %s (%s): actor calls for %.0f s",
                    self.describe,
                    where,
                    exc,
                    RETRY_S,
                )
                raise LinkUnavailable(f"cannot connect to {self.describe} at {where}: {exc}") from None
            writer.write(self.token)
            self._writer = writer
            self._reading = asyncio.ensure_future(self._read(reader, writer))
            return writer

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reason = "closed by the host"
        try:
            while True:
                batch_id, answers = decode_answers(await _read_frame(reader))
                _, answer = self._pending.get(batch_id, (writer, None))
                if answer is not None and not answer.done():
                    answer.set_result(answers)
        except asyncio.IncompleteReadError:
            pass
        except (ConnectionError, TypeError, ValueError) as exc:  # ValueError: orjson's decode error too
            reason = f"{type(exc).__name__}: {exc}"
        finally:
            writer.close()
            if self._writer is writer:
                self._writer = None
            for sent_on, answer in self._pending.values():
                if sent_on is writer and not answer.done():
                    answer.set_exception(LinkBroken(f"the step link to {self.describe} was lost ({reason})"))

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reading
