"""`inference.http1`, the lean transport's HTTP/1.1 client, against a scripted server on loopback:
keep-alive and its pool, every body framing a server may use, and each way a response can fail."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import ssl
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import trustme
import yarl

from inference import InferenceError
from inference.http1 import Pool, ResponseTooLarge
from inference.transport import LeanTransport, classify_lean

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Scripted:
    """A loopback server: each connection is handed to ``handler``; connections are counted."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> yarl.URL:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return yarl.URL(f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1/x")

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, await reader.readexactly(length)


def answering(*responses: bytes, close_after: bool = False) -> Handler:
    """Answer each request on a connection with the next response (the last one repeats)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        i = 0
        while True:
            await read_request(reader)
            writer.write(responses[min(i, len(responses) - 1)])
            await writer.drain()
            i += 1
            if close_after:
                return

    return handler


def ok(body: bytes, *headers: str) -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode() + body


@contextlib.asynccontextmanager
async def open_pool() -> AsyncIterator[Pool]:
    """A pool made inside the running loop (as `LeanTransport` makes one), closed after."""
    pool = Pool(max_connections=8, keepalive_s=4.0, connect_timeout_s=5.0)
    try:
        yield pool
    finally:
        pool.close()


async def test_keep_alive_reuses_one_connection_and_writes_the_request_as_given() -> None:
    seen: list[tuple[bytes, bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            seen.append(await read_request(reader))
            writer.write(ok(b'{"ok": true}'))

    async with Scripted(handler) as url, open_pool() as p:
        for _ in range(5):
            response = await p.request("POST", url.with_query(a="1"), {"X-Key": "v"}, b'{"q": 1}', 1000)
            assert (response.status, response.body) == (200, b'{"ok": true}')
    assert len(seen) == 5
    head, body = seen[0]
    assert head.startswith(b"POST /v1/x?a=1 HTTP/1.1\r\nHost: 127.0.0.1:") and b"\r\nX-Key: v\r\n" in head
    assert b"\r\nContent-Length: 8\r\n" in head and body == b'{"q": 1}'


async def test_connections_per_request_concurrency_and_close() -> None:
    server = Scripted(answering(ok(b"1")))
    async with server as url, open_pool() as p:
        await asyncio.gather(*(p.request("GET", url, {}, None, 100) for _ in range(4)))
        assert server.connections == 4  # one per request in flight
        await asyncio.gather(*(p.request("GET", url, {}, None, 100) for _ in range(4)))
        assert server.connections == 4  # then reused
    closing = Scripted(answering(ok(b"1", "connection: close"), close_after=True))
    async with closing as url, open_pool() as p:
        for _ in range(3):
            assert (await p.request("GET", url, {}, None, 100)).body == b"1"
        assert closing.connections == 3  # `Connection: close` is honoured


async def test_a_reused_connection_the_server_dropped_is_sent_again_on_a_new_one() -> None:
    # Keep-alive promised, then the server closes right after answering: the next request goes out
    # on a connection that is (or is about to be) gone, and is sent once more on a new one.
    server = Scripted(answering(ok(b"fine"), close_after=True))
    async with server as url, open_pool() as p:
        for _ in range(4):
            assert (await p.request("POST", url, {}, b"{}", 100)).body == b"fine"
    assert server.connections == 4


@pytest.mark.parametrize(
    ("raw", "body"),
    [
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
            b"hello world",
        ),
        (ok(gzip.compress(b"zipped", mtime=0), "content-encoding: gzip"), b"zipped"),
        (ok(zlib.compress(b"deflated"), "content-encoding: deflate"), b"deflated"),
        (b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"after"), b"after"),
        (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
    ],
    # Named, not shown: a test id is the same in every xdist worker only if its bytes are.
    ids=["chunked", "gzip", "deflate", "after-100-continue", "no-content"],
)
async def test_body_framings(raw: bytes, body: bytes) -> None:
    async with Scripted(answering(raw)) as url, open_pool() as p:
        assert (await p.request("GET", url, {}, None, 100)).body == body


async def test_a_body_that_ends_with_the_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the end")
        await writer.drain()

    async with Scripted(handler) as url, open_pool() as p:
        assert (await p.request("GET", url, {}, None, 100)).body == b"until the end"


@pytest.mark.parametrize(
    ("raw", "error", "detail"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 5000\r\n\r\n", ResponseTooLarge, "5000 bytes declared"),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
            + b"40\r\n"
            + b"x" * 64
            + b"\r\n" * 1
            + b"0\r\n\r\n",
            ResponseTooLarge,
            "64+ bytes received",
        ),
        (
            ok(gzip.compress(b"x" * 5000, mtime=0), "content-encoding: gzip"),
            ResponseTooLarge,
            "bytes decompressed",
        ),
        (ok(b"abc", "content-encoding: br"), ConnectionError, "does not read"),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\ncut",
            ConnectionError,
            "before the response was complete",
        ),
        (b"NOT HTTP AT ALL\r\n\r\n", ConnectionError, "malformed HTTP response"),
    ],
    ids=["declared-too-large", "chunked-too-large", "gzip-bomb", "unknown-encoding", "cut", "not-http"],
)
async def test_failures(raw: bytes, error: type[Exception], detail: str) -> None:
    async with Scripted(answering(raw, close_after=True)) as url, open_pool() as p:
        with pytest.raises(error) as caught:
            await p.request("GET", url, {}, None, 50)
        assert detail in str(caught.value)


async def test_errors_reach_the_caller_classified() -> None:
    transport = LeanTransport(50)
    async with Scripted(
        answering(b"HTTP/1.1 503 Busy\r\ncontent-length: 2\r\nretry-after: 3\r\n\r\n{}")
    ) as url:
        with pytest.raises(InferenceError) as caught:
            await transport.post(url, b"{}", {}, None, 5)
        assert (caught.value.kind, caught.value.status_code) == ("server_error", 503)
        with pytest.raises(InferenceError) as caught:
            await transport.get(str(url.with_scheme("ftp")), {}, 5)
        assert caught.value.kind == "bad_request"
    async with Scripted(
        answering(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\ncut", close_after=True)
    ) as url:
        with pytest.raises(ConnectionError) as cut:
            await transport.post(url, b"{}", {}, None, 5)
        classified = classify_lean(cut.value)
        assert classified is not None and classified.kind == "connection_error"
    with pytest.raises(ValueError, match="line break"):
        await transport.post(url, b"{}", {"X-Evil": "a\r\nInjected: 1"}, None, 5)
    await transport.aclose()


async def test_a_cancelled_request_frees_its_connection_and_slot() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(30)

    p = Pool(max_connections=1, keepalive_s=4.0, connect_timeout_s=5.0)
    async with Scripted(silent) as url:
        for _ in range(3):  # one slot: a slot held after a timeout would block the next forever
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await p.request("GET", url, {}, None, 100)
        assert not p._busy and not any(p._idle.values())
    p.close()


async def test_https_verifies_the_server_and_keeps_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Modal path (an https vLLM URL): a real TLS handshake on loopback, the server's
    certificate checked against the CAs the environment names (`SSL_CERT_FILE`)."""
    authority = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server_context)
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                await read_request(reader)
                writer.write(ok(b"secure"))
        writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_context)
    url = yarl.URL(f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/x")
    try:
        async with open_pool() as p:  # a CA it was not told of: refused
            with pytest.raises(ssl.SSLCertVerificationError):
                await p.request("GET", url, {}, None, 100)
        with authority.cert_pem.tempfile() as ca_file:
            monkeypatch.setenv("SSL_CERT_FILE", ca_file)
            async with open_pool() as p:
                for _ in range(3):
                    assert (await p.request("POST", url, {}, b"{}", 100)).body == b"secure"
    finally:
        server.close()
        await server.wait_closed()
    assert connections == 1  # one kept-alive connection (the refused handshake never became one)
    assert classify_lean(ssl.SSLCertVerificationError("x")).kind == "connection_error"  # type: ignore[union-attr]
