"""A minimal HTTP/1.1 keep-alive client on asyncio streams: the benchmark's load generator.

httpx costs the client more CPU per request than a FastAPI server spends answering a small
request (about 1 ms versus 0.3 ms, measured here): with 16 concurrent httpx clients the load
generator, not the server, sets the rate. This client writes a request, reads the status line
and headers, and reads ``Content-Length`` bytes, costing tens of microseconds per request, so
the server stays the bottleneck. It speaks only what our servers send (no chunked bodies).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any


class HTTPError(RuntimeError):
    def __init__(self, status: int, body: bytes):
        super().__init__(f"HTTP {status}: {body[:300]!r}")
        self.status = status
        self.body = body


class RawClient:
    """One keep-alive connection; requests on it are sequential."""

    def __init__(self, host: str, port: int):
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._head = f"Host: {host}:{port}\r\nContent-Type: application/json\r\n".encode()

    async def connect(self) -> RawClient:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port, limit=1 << 24)
        return self

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self._writer.wait_closed()
            self._writer = self._reader = None

    async def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        if self._writer is None:
            await self.connect()
        assert self._reader is not None and self._writer is not None
        payload = body or b""
        self._writer.write(
            f"{method} {path} HTTP/1.1\r\n".encode()
            + self._head
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        head = await self._reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        keep_alive = True
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            lname = name.strip().lower()
            if lname == b"content-length":
                length = int(value)
            elif lname == b"connection" and value.strip().lower() == b"close":
                keep_alive = False
            elif lname == b"transfer-encoding":
                raise RuntimeError("chunked responses are not supported by the bench client")
        data = await self._reader.readexactly(length) if length else b""
        if not keep_alive:
            await self.close()
        return status, data

    async def post_json(self, path: str, obj: Any) -> Any:
        status, data = await self.request("POST", path, json.dumps(obj).encode())
        if status >= 400:
            raise HTTPError(status, data)
        return json.loads(data)

    async def get_json(self, path: str) -> Any:
        status, data = await self.request("GET", path)
        if status >= 400:
            raise HTTPError(status, data)
        return json.loads(data)

    async def __aenter__(self) -> RawClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
