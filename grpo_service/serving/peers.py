"""Forwarding a request to the worker that owns the ids it names (``serve --workers N``).

Each worker process owns the envs, policies and runs it created, and their ids start with its
instance tag (`grpo_service.registry`). All workers accept connections on one port, so a
request can land on a worker that does not own the ids it names. `PeerRouter` looks for
instance-tagged ids in the request (exact JSON strings in the body, segments of the path); when
they all belong to one sibling worker it sends the request to that sibling over loopback and
relays the answer. Requests that name this worker's ids, or no ids, go to the app untouched, as
does a request naming ids of two different workers (the app answers 421 for the foreign one).

Cost: a client that keeps one connection per env (any keep-alive client) always reaches the
owner and pays only the body scan (microseconds); a forwarded request pays one more loopback
round trip on both workers.

Rollouts that name no live ids (``POST /rollout/group`` and ``POST /rollout`` from an env name or
a snapshot) can run on any worker, and a burst of new connections often lands on one worker, so
these are *placed*: `WorkerLoads` counts the rollouts each worker is running for these requests,
and the request goes to the least loaded worker (this one on a tie). Their answers take seconds,
so the extra hop costs little.
"""

from __future__ import annotations

import json
import mmap
import re
from collections.abc import Mapping
from pathlib import Path

import httpx
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from grpo_service.errors import send_error
from grpo_service.registry import TAGGED_ID_PATTERN

FORWARDED_BY = b"x-grpo-forwarded-by"
_ID_IN_BODY = re.compile(f'"{TAGGED_ID_PATTERN}"'.encode())  # a whole JSON string
_ID_IN_PATH = re.compile(f"/{TAGGED_ID_PATTERN}(?=/|$)")  # a whole path segment
# Not passed on: they describe one hop, not the request (an answer keeps its content-length).
_HOP_HEADERS = frozenset(
    {b"host", b"content-length", b"connection", b"keep-alive", b"transfer-encoding", b"upgrade", b"te"}
)
_ANSWER_HOP_HEADERS = _HOP_HEADERS - {b"content-length"}


# The largest group_size placement counts (the request model allows 1,024).
MAX_PLACED_GROUP = 1 << 16

# Synchronous rollouts that create what they play: any worker can run them.
PLACEABLE_PATHS = frozenset({"/rollout", "/rollout/group"})


class WorkerLoads:
    """Rollouts each worker runs for placed requests, in a small file every worker maps.

    Row ``p`` holds what worker ``p`` placed on each worker; only worker ``p`` writes it, so
    no lock is needed (8-byte aligned stores), and a worker's load is its column's sum.
    """

    def __init__(self, path: str | Path, index: int, workers: int):
        self.index = index
        self.workers = workers
        self._file = open(path, "r+b")  # noqa: SIM115 - mapped for the life of the worker
        self._map = mmap.mmap(self._file.fileno(), 8 * workers * workers)
        self._cells = memoryview(self._map).cast("q")
        for worker in range(workers):  # a restarted worker's old placements ended with it
            self._cells[index * workers + worker] = 0

    @staticmethod
    def create(path: str | Path, workers: int) -> None:
        Path(path).write_bytes(bytes(8 * workers * workers))

    def load(self, worker: int) -> int:
        return sum(self._cells[p * self.workers + worker] for p in range(self.workers))

    def least_loaded(self) -> int:
        """The worker with the fewest rollouts; this one on a tie (no hop)."""
        loads = [self.load(w) for w in range(self.workers)]
        best = min(loads)
        return self.index if loads[self.index] == best else loads.index(best)

    def add(self, worker: int, count: int) -> None:
        self._cells[self.index * self.workers + worker] += count

    def close(self) -> None:
        self._cells.release()
        self._map.close()
        self._file.close()


class PeerForwarder:
    """The sibling workers' loopback addresses, and one HTTP client to reach them."""

    def __init__(
        self, instance: str, peers: Mapping[str, str], timeout_s: float, loads_file: str | None = None
    ):
        self.instance = instance
        self.order = sorted(peers)  # worker index = position of its tag (the supervisor's order)
        self.peers = {tag: url.rstrip("/") for tag, url in peers.items() if tag != instance}
        self.timeout_s = timeout_s
        self.loads = (
            WorkerLoads(loads_file, self.order.index(instance), len(self.order))
            if loads_file and instance in self.order
            else None
        )
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_s, connect=5.0),
                limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
            )
        return self._client

    def owner(self, path: str, body: bytes) -> str | None:
        """The sibling that owns every tagged id in the request, or None (handle it here)."""
        tags = set(_ID_IN_PATH.findall(path))
        if body:
            tags.update(tag.decode() for tag in _ID_IN_BODY.findall(body))
        if len(tags) != 1:
            return None
        (tag,) = tags
        return tag if tag in self.peers else None

    async def forward(
        self, tag: str, scope: Scope, body: bytes, send: Send, *, optional: bool = False
    ) -> bool:
        """Relay the request to worker ``tag`` and its answer back. With ``optional``, a worker
        that refuses the connection (so nothing was sent) is reported by returning False."""
        url = self.peers[tag] + scope["path"]
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        headers = [(k, v) for k, v in scope["headers"] if k not in _HOP_HEADERS]
        headers.append((FORWARDED_BY, self.instance.encode()))
        request = self.client.build_request(scope["method"], url, content=body, headers=headers)
        try:
            response = await self.client.send(request, stream=True)
        except httpx.ConnectError:
            if optional:
                return False
            await send_error(send, 503, "worker_unavailable", _unreachable(tag, "ConnectError"))
            return True
        except httpx.TimeoutException:
            detail = f"worker {tag}, which owns this id, did not answer in time"
            await send_error(send, 504, "worker_timeout", detail)
            return True
        except httpx.TransportError as exc:
            await send_error(send, 503, "worker_unavailable", _unreachable(tag, type(exc).__name__))
            return True
        # Relayed as it arrives (a group's answer is megabytes): no second copy, no added wait.
        try:
            out = [(k, v) for k, v in response.headers.raw if k.lower() not in _ANSWER_HOP_HEADERS]
            await send({"type": "http.response.start", "status": response.status_code, "headers": out})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        except httpx.TransportError:
            pass  # the owner went away mid-answer: the client sees a cut response, as from the owner
        finally:
            await response.aclose()
        return True

    def placement(self, scope: Scope, body: bytes) -> tuple[int, int] | None:
        """(worker index, rollouts) for a placeable request, else None."""
        if self.loads is None or scope["method"] != "POST" or scope["path"] not in PLACEABLE_PATHS:
            return None
        if _ID_IN_BODY.search(body):  # it names live ids: it runs where they live
            return None
        rollouts = 1
        if scope["path"] == "/rollout/group":
            rollouts = _group_size(body)
            if rollouts is None:
                return None  # the app answers the bad body
        return self.loads.least_loaded(), rollouts

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self.loads is not None:
            self.loads.close()
            self.loads = None


# Served alike by every worker (the viewer reads the trace DB they share): never forwarded, even
# when a path names an id (a group id) that a worker issued.
LOCAL_PATHS = ("/viewer",)


class PeerRouter:
    """ASGI middleware: requests for a sibling's ids go to that sibling (see the module doc)."""

    def __init__(self, app: ASGIApp, forwarder: PeerForwarder):
        self.app = app
        self.forwarder = forwarder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or any(k == FORWARDED_BY for k, _ in scope["headers"])
            or scope["path"].startswith(LOCAL_PATHS)
        ):
            await self.app(scope, receive, send)  # a forwarded request is never forwarded again
            return
        forwarder = self.forwarder
        body, more = await _read_body(receive)
        if more:  # the client left: let the app see the disconnect
            await self.app(scope, _replay(body, more, receive), send)
            return
        tag = forwarder.owner(scope["path"], body)
        if tag is not None:
            await forwarder.forward(tag, scope, body, send)
            return
        placed = forwarder.placement(scope, body)
        if placed is None:
            await self.app(scope, _replay(body, more, receive), send)
            return
        worker, rollouts = placed
        assert forwarder.loads is not None
        forwarder.loads.add(worker, rollouts)
        try:
            tag = forwarder.order[worker]
            here = worker == forwarder.loads.index
            if here or not await forwarder.forward(tag, scope, body, send, optional=True):
                await self.app(scope, _replay(body, more, receive), send)  # here, or the peer is down
        finally:
            if forwarder.loads is not None:
                forwarder.loads.add(worker, -rollouts)


def _group_size(body: bytes) -> int | None:
    """The ``group_size`` of a group request, if it is a plausible one (1..MAX_PLACED_GROUP).
    Anything else (``Infinity``, ``1e300``, a 20-digit number, a body nested 50,000 deep) is
    left to the app, which answers it with a 4xx: the counts are 64-bit cells."""
    try:
        size = json.loads(body).get("group_size", 1)
    except (ValueError, TypeError, AttributeError, RecursionError):
        return None
    return size if type(size) is int and 1 <= size <= MAX_PLACED_GROUP else None


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    """The request body, and whether the client disconnected before sending all of it."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks), True
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), False


def _replay(body: bytes, disconnected: bool, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            if disconnected:
                return {"type": "http.disconnect"}
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def _unreachable(tag: str, error: str) -> str:
    return (
        f"worker {tag}, which owns this id, is not reachable ({error}); if it restarted, its "
        "live envs and policies are gone: restore them from snapshots"
    )
