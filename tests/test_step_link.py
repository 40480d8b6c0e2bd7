"""The step link between a front and a host, on loopback: batches answered in order whatever order
they finish in, any bytes carried exactly, a wrong token refused, a lost connection failing what
was in flight, and a host that cannot be reached telling the front to use the actor call."""

from __future__ import annotations

import asyncio
import socket

import pytest

from grpo_service.api.asgi import Answer, RequestArgs
from grpo_service.cluster.step_link import (
    LinkBroken,
    LinkUnavailable,
    StepLink,
    StepLinkServer,
    encode_requests,
)


async def echo(batch: list[RequestArgs]) -> list[Answer]:
    """Answers each request with its own parts, the slowest first asked finishing last."""
    out = []
    for method, path, query, headers, body in batch:
        if path == "/slow":
            await asyncio.sleep(0.2)
        echoed = path.encode() + b"?" + query + b"|" + body
        out.append((200, [(b"x-method", method.encode()), *headers], echoed))
    return out


async def served(handler=echo) -> tuple[StepLinkServer, StepLink]:  # type: ignore[no-untyped-def]
    server = StepLinkServer(handler)
    info = await server.start("127.0.0.1")
    return server, StepLink.of(info, "host test", same_node=True)  # type: ignore[return-value]


async def test_batches_are_answered_in_order_and_bytes_round_trip() -> None:
    server, link = await served()
    every_byte = bytes(range(256))
    try:
        slow = asyncio.ensure_future(link.send([("POST", "/slow", b"", [], b"first")]))
        fast = await link.send(
            [
                ("POST", "/a", b"q=1", [(b"h", every_byte)], every_byte),
                ("GET", "/b", b"", [], "é".encode()),
            ]
        )
        assert not slow.done()  # the later batch came back first
        assert fast == [
            (200, [(b"x-method", b"POST"), (b"h", every_byte)], b"/a?q=1|" + every_byte),
            (200, [(b"x-method", b"GET")], "/b?|é".encode()),
        ]
        assert await slow == [(200, [(b"x-method", b"POST")], b"/slow?|first")]
    finally:
        await link.close()
        await server.close()


async def test_a_wrong_token_is_refused() -> None:
    server, link = await served()
    try:
        port = link.port
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"0" * 32 + encode_requests(0, [("GET", "/a", b"", [], b"")]))
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, nothing answered
        writer.close()
    finally:
        await server.close()


async def test_a_lost_connection_fails_the_batches_in_flight() -> None:
    started = asyncio.Event()

    async def hangs(batch: list[RequestArgs]) -> list[Answer]:
        started.set()
        await asyncio.sleep(60)
        return []

    server, link = await served(hangs)
    try:
        pending = asyncio.ensure_future(link.send([("POST", "/env/step", b"", [], b"{}")]))
        await asyncio.wait_for(started.wait(), 5)
        await server.close()  # the host's end goes away
        assert link._writer is not None
        link._writer.transport.abort()  # as when its process dies
        with pytest.raises(LinkBroken, match="host test was lost"):
            await asyncio.wait_for(pending, 5)
    finally:
        await link.close()


async def test_a_host_that_cannot_be_reached_is_link_unavailable() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    link = StepLink("127.0.0.1", port, "00" * 32, "host gone")
    with pytest.raises(LinkUnavailable, match="cannot connect to host gone"):
        await link.send([("POST", "/env/step", b"", [], b"{}")])
    server = StepLinkServer(echo)  # the host listens now, but the link waits before trying again
    link.port, link.token = (await server.start("127.0.0.1"))["local_port"], server.token
    try:
        with pytest.raises(LinkUnavailable, match="host gone is down"):  # no connect per batch
            await link.send([("POST", "/env/step", b"", [], b"{}")])
        link._down_until = 0.0  # as when RETRY_S has passed
        assert (await link.send([("GET", "/x", b"", [], b"")]))[0][0] == 200
    finally:
        await link.close()
        await server.close()


async def test_a_failing_handler_breaks_the_link_rather_than_hanging_it() -> None:
    async def fails(batch: list[RequestArgs]) -> list[Answer]:
        raise RuntimeError("a bug")

    server, link = await served(fails)
    try:
        with pytest.raises(LinkBroken):
            await asyncio.wait_for(link.send([("POST", "/env/step", b"", [], b"{}")]), 5)
        server.handler = echo  # the next batch connects again
        assert (await link.send([("GET", "/x", b"", [], b"")]))[0][0] == 200
    finally:
        await link.close()
        await server.close()
