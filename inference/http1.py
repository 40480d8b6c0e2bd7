"""A pooled HTTP/1.1 client for one request/response at a time per connection: the lean transport's
wire. A request is written in one piece; the response is parsed by httptools (llhttp, the parser
uvicorn serves with); the connection goes back to its pool when the server keeps it alive.

The contract, as `LeanTransport` relies on it:

- ``request(method, url, headers, body, max_bytes)`` answers ``Response(status, headers, body)``
  for any status (headers lowercased; the body de-chunked and, for ``gzip``/``deflate``,
  decompressed). It raises `ResponseTooLarge` when the body would pass ``max_bytes`` (declared or
  received), `OSError` (`ConnectionError` included) when the connection fails or closes before
  the response is whole, and `TimeoutError` when connecting takes longer than ``connect_timeout_s``.
  The caller bounds the whole request (``asyncio.timeout``); a cancelled request closes its
  connection, which is never reused.
- One pool per event loop (`Pool`): up to ``max_connections`` open at once; a connection idle
  for ``keepalive_s`` is closed rather than reused (below the server's own idle timeout, 5 s for
  uvicorn and vLLM, so the server does not close one as a request is sent on it). A request on a
  reused connection that the server closed before answering (no byte of a response came back) is
  sent once more on a new connection.
- Redirects are answered as they come (a 3xx is an answer); no cookies, no proxies from the
  environment, no ``Expect: 100-continue``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import httptools
import yarl

USER_AGENT = "grpo-service"
_DEFAULT_PORTS = {"http": 80, "https": 443}


class ResponseTooLarge(Exception):
    """The response body would pass the caller's limit: ``size`` says how far it got."""

    def __init__(self, size: str) -> None:
        super().__init__(size)
        self.size = size


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass
class _Message:
    """The response being read on a connection."""

    max_bytes: int
    done: asyncio.Future[Response]
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    parts: list[bytes] = field(default_factory=list)
    size: int = 0
    until_close: bool = False  # no length, not chunked: the body ends when the connection does
    keep_alive: bool = False  # the server keeps the connection open after this response
    started: bool = False  # a byte of the response arrived


class _Connection(asyncio.Protocol):
    """One socket to an origin and its response parser."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.message: _Message | None = None
        self.closed = False
        self.idle_since = 0.0

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        message = self.message
        if message is None:  # nothing asked: a server that talks out of turn is not reused
            self.close()
            return
        message.started = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:  # raised by a callback below
            self._fail(exc.__context__ or exc)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"malformed HTTP response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        message = self.message
        if message is None or message.done.done():
            return
        if message.until_close and exc is None:
            self._finish(message)
            return
        self._fail(ConnectionError("the server closed the connection before the response was complete"))

    # -- httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.message is not None
        self.message.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        message = self.message
        assert message is not None
        message.status = self.parser.get_status_code()
        headers = message.headers
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > message.max_bytes:
            raise ResponseTooLarge(f"{declared} bytes declared")
        message.keep_alive = self.parser.should_keep_alive()
        message.until_close = (
            declared is None
            and "chunked" not in headers.get("transfer-encoding", "").lower()
            and message.status >= 200
            and message.status not in (204, 304)
        )

    def on_body(self, body: bytes) -> None:
        message = self.message
        assert message is not None
        message.size += len(body)
        if message.size > message.max_bytes:
            raise ResponseTooLarge(f"{message.size}+ bytes received")
        message.parts.append(body)

    def on_message_complete(self) -> None:
        message = self.message
        assert message is not None
        if message.status < 200:  # an interim answer (100 Continue): the real one follows
            message.headers.clear()
            return
        self._finish(message)

    # -- helpers

    def _finish(self, message: _Message) -> None:
        if message.done.done():
            return
        try:
            encoding = message.headers.get("content-encoding")
            body = _decoded(b"".join(message.parts), encoding, message.max_bytes)
        except (ResponseTooLarge, ConnectionError) as exc:
            self._fail(exc)
            return
        message.done.set_result(Response(message.status, message.headers, body))

    def _fail(self, exc: BaseException) -> None:
        message = self.message
        if message is not None and not message.done.done():
            message.done.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def reusable(self, now: float, keepalive_s: float) -> bool:
        return not self.closed and now - self.idle_since < keepalive_s and not self.transport.is_closing()  # type: ignore[union-attr]


def _decoded(body: bytes, encoding: str | None, max_bytes: int) -> bytes:
    if not encoding or encoding.lower() == "identity":
        return body
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}.get(
        encoding.lower()
    )
    if wbits is None:
        raise ConnectionError(f"the response is encoded as {encoding!r}, which this client does not read")
    try:
        inflater = zlib.decompressobj(wbits)
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise ConnectionError(f"the {encoding} response does not decompress: {exc}") from None
    if len(out) > max_bytes:
        raise ResponseTooLarge(f"{max_bytes}+ bytes decompressed")
    return out


def _head(method: str, url: yarl.URL, headers: Mapping[str, str], length: int | None) -> bytes:
    host = url.raw_host or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    if url.port is not None and url.port != _DEFAULT_PORTS.get(url.scheme):
        host = f"{host}:{url.port}"
    lines = [f"{method} {url.raw_path_qs or '/'} HTTP/1.1", f"Host: {host}", f"User-Agent: {USER_AGENT}"]
    for name, value in headers.items():
        if any(c in name or c in value for c in "\r\n\0"):
            raise ValueError(f"header {name[:40]!r} holds a line break")
        lines.append(f"{name}: {value}")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")


class Pool:
    """The connections of one event loop, idle ones kept per origin."""

    def __init__(self, *, max_connections: int, keepalive_s: float, connect_timeout_s: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.keepalive_s = keepalive_s
        self.connect_timeout_s = connect_timeout_s
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._busy: set[_Connection] = set()
        self._ssl: ssl.SSLContext | None = None

    async def request(
        self, method: str, url: yarl.URL, headers: Mapping[str, str], body: bytes | None, max_bytes: int
    ) -> Response:
        head = _head(method, url, headers, None if body is None and method == "GET" else len(body or b""))
        data = head + body if body else head
        origin = (url.scheme, url.raw_host or "", url.port or _DEFAULT_PORTS.get(url.scheme, 80))
        async with self._slots:
            conn, reused = self._take(origin), True
            if conn is None:
                conn, reused = await self._connect(origin), False
            try:
                return await self._exchange(conn, origin, data, max_bytes)
            except ConnectionError:
                if not reused or (conn.message is not None and conn.message.started):
                    raise
            # The server had closed the reused connection: once more on a new one.
            return await self._exchange(await self._connect(origin), origin, data, max_bytes)

    async def _exchange(
        self, conn: _Connection, origin: tuple[str, str, int], data: bytes, max_bytes: int
    ) -> Response:
        if conn.closed:  # closed by the server between connecting and now
            raise ConnectionError("the server closed the connection before the request was sent")
        message = conn.message = _Message(max_bytes, self.loop.create_future())
        self._busy.add(conn)
        try:
            conn.transport.write(data)  # type: ignore[union-attr]
            response = await message.done
        except BaseException:
            conn.close()
            raise
        finally:
            self._busy.discard(conn)
            conn.message = None
        if message.keep_alive and not conn.closed:
            conn.idle_since = time.monotonic()
            self._idle.setdefault(origin, []).append(conn)
        else:
            conn.close()
        return response

    def _take(self, origin: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.reusable(now, self.keepalive_s):
                return conn
            conn.close()
        return None

    async def _connect(self, origin: tuple[str, str, int]) -> _Connection:
        scheme, host, port = origin
        context = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        async with asyncio.timeout(self.connect_timeout_s):
            _, conn = await self.loop.create_connection(_Connection, host, port, ssl=context)
        return conn

    def close(self) -> None:
        """Close every connection (from any thread once the pool's loop has stopped)."""
        for conn in [*self._busy, *(c for idle in self._idle.values() for c in idle)]:
            with contextlib.suppress(Exception):
                conn.close()
        self._idle.clear()
        self._busy.clear()
