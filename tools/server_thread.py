"""Run an ASGI app with uvicorn on loopback in a background thread (tests, benchmark, demos)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any, Self


class ServerThread:
    """``with ServerThread(app) as server:`` serves ``app`` at ``server.base_url`` until exit.

    Port 0 (the default) picks a free port. The socket is bound before the thread starts, so
    the port is known at once; ``start`` returns when uvicorn accepts connections.
    """

    def __init__(
        self, app: Any, *, host: str = "127.0.0.1", port: int = 0, lifespan: str = "on", name: str = "asgi"
    ):
        self.app = app
        self.host = host
        self.port = port
        self.lifespan = lifespan
        self.name = name
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def on_stop(self) -> None:
        """Hook for subclasses: called before shutdown (e.g. to release long-held requests)."""

    def start(self, timeout_s: float = 15.0) -> Self:
        import uvicorn

        from grpo_service.serving import UVICORN_OPTIONS

        if self._thread is not None:
            return self
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            lifespan=self.lifespan,
            timeout_graceful_shutdown=2,
            **UVICORN_OPTIONS,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name=self.name, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} server did not start within {timeout_s} s")
            time.sleep(0.005)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        self.on_stop()
        server.should_exit = True
        thread.join(timeout_s / 2)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout_s / 2)
        self._server = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)
