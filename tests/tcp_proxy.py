"""A loopback TCP forwarder in front of a real server, so a test can take the server away and
bring it back without restarting it: `cut` closes every open connection and stops listening
(new connections are refused, as by a stopped server); `restore` listens on the same port again.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Self


class TcpProxy:
    """Forwards 127.0.0.1:`port` to `target_host`:`target_port`, byte for byte, on its own loop."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0  # chosen by the first `restore`, kept after
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def connections(self) -> int:
        """Connections being forwarded now."""
        return len(self._open) // 2

    def start(self) -> Self:
        self._thread.start()
        self.restore()
        return self

    def restore(self) -> None:
        self._run(self._listen())

    def cut(self) -> None:
        self._run(self._cut())

    def close(self) -> None:
        if self._thread.is_alive():
            self.cut()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, coro: object) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)  # type: ignore[arg-type]

    async def _listen(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._forward, "127.0.0.1", self.port)
            self.port = self._server.sockets[0].getsockname()[1]

    async def _cut(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._open):
            writer.transport.abort()
        if server is not None:
            await server.wait_closed()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, up_writer)
        if self._server is None:  # cut while connecting
            _abort(pair)
            return
        self._open |= set(pair)
        try:
            await asyncio.gather(_pipe(reader, up_writer, pair), _pipe(up_reader, writer, pair))
        finally:
            self._open -= set(pair)
            _abort(pair)


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pair: tuple[asyncio.StreamWriter, ...]
) -> None:
    """One direction; an end that fails takes the whole connection down, as a dead peer would."""
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof() and not writer.is_closing():
            writer.write_eof()
    except OSError:
        _abort(pair)


def _abort(pair: tuple[asyncio.StreamWriter, ...]) -> None:
    for end in pair:
        end.transport.abort()
