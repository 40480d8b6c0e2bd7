"""Serving an app with uvicorn (used by `python main.py`, `grpo-service serve` and `serve-model`).

Beyond uvicorn's defaults, every server here gives a request's headers a deadline
(`HEADER_TIMEOUT_S`: a client that trickles them, or sends nothing, gets a 408 and the
connection is closed; uvicorn itself only times out idle keep-alive connections), and a keyless
server bound to loopback answers only requests whose ``Host`` is a loopback name
(`LoopbackHostGuard`: DNS rebinding cannot reach it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import h11
import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # uvicorn without httptools parses with h11
    HttpToolsProtocol = None  # type: ignore[assignment, misc]

from grpo_service.api.auth import LoopbackHostGuard, check_bind_safety, is_loopback
from grpo_service.config import Settings
from grpo_service.errors import error_body

# Every WebSocket frame deflated and inflated (permessage-deflate, on by default) costs more CPU
# than the frame itself on 127.0.0.1 or a cluster's network: OpenEnv replies are a few KB at most.
UVICORN_OPTIONS: dict[str, object] = {"ws_per_message_deflate": False}

RAY_MISSING = (
    "serving through Ray needs Ray: pip install 'grpo-service[ray]' (or pip install 'ray==2.60.0'); "
    "without it, serve one process (no --ray, no --workers)"
)
HEADER_TIMEOUT_S = 10.0
"""The default deadline of a request's headers (a WebSocket handshake's too): from the connection,
or from their first byte on a kept-alive connection."""


class _HeaderDeadline:
    """Mixed into uvicorn's HTTP protocol: a 408 and a close for headers that are too slow."""

    config: uvicorn.Config
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_arrived()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm_header_deadline(self) -> None:
        if self._header_timer is None:
            timeout = getattr(self.config, "header_timeout_s", HEADER_TIMEOUT_S)
            self._header_timer = self.loop.call_later(timeout, self._headers_too_slow)

    def _headers_arrived(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.transport.get_protocol() is not self:
            return
        if self.cycle is None or self.cycle.response_complete:  # not amid another answer
            timeout = getattr(self.config, "header_timeout_s", HEADER_TIMEOUT_S)
            detail = f"the request's headers did not arrive within {timeout:g} s"
            body = json.dumps(error_body("request_timeout", detail)).encode()
            head = (
                "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
            )
            self.transport.write(head.encode() + body)
        self.transport.close()


class H11WithDeadline(_HeaderDeadline, H11Protocol):
    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:  # a request's headers begin
            self._arm_header_deadline()
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._headers_arrived()


if HttpToolsProtocol is not None:

    class HttpToolsWithDeadline(_HeaderDeadline, HttpToolsProtocol):
        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm_header_deadline()

        def on_headers_complete(self) -> None:
            self._headers_arrived()
            super().on_headers_complete()


def http_protocol() -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools if installed, as uvicorn picks) with the header deadline."""
    return H11WithDeadline if HttpToolsProtocol is None else HttpToolsWithDeadline


def guarded(app: Any, host: str, *, keyed: bool) -> Any:
    """``app`` behind `LoopbackHostGuard` when it is keyless and bound to loopback."""
    return app if keyed or not is_loopback(host) else LoopbackHostGuard(app, host)


def uvicorn_config(
    app: Any, host: str, port: int, *, keyed: bool, header_timeout_s: float = HEADER_TIMEOUT_S, **options: Any
) -> uvicorn.Config:
    """The uvicorn config every server here runs with (see the module's docstring)."""
    options = {"http": http_protocol(), **UVICORN_OPTIONS, **options}
    config = uvicorn.Config(guarded(app, host, keyed=keyed), host=host, port=port, **options)
    config.header_timeout_s = header_timeout_s  # type: ignore[attr-defined]  # read by _HeaderDeadline
    return config


def check_ray_installed(settings: Settings) -> None:
    if settings.ray_address is None:
        return
    try:
        import ray  # noqa: F401
    except ImportError:
        raise SystemExit(RAY_MISSING) from None


def serve(settings: Settings, *, reload: bool = False, app_path: str = "main:app") -> None:
    keyed = settings.environment_api_key is not None
    check_bind_safety(settings.host, keyed, settings.allow_insecure)
    check_ray_installed(settings)
    if reload:
        if settings.ray_address is not None:
            raise SystemExit("--reload serves one process: it cannot be combined with --ray or --workers")
        # Reload needs an import string; the child process rebuilds Settings from the environment.
        options = {"reload": True, "http": http_protocol(), **UVICORN_OPTIONS}
        uvicorn.run(app_path, host=settings.host, port=settings.port, **options)
        return
    from grpo_service.app import create_app

    app = create_app(settings)
    config = uvicorn_config(
        app,
        settings.host,
        settings.port,
        keyed=keyed,
        header_timeout_s=settings.header_timeout_s,
        log_level="info",
    )
    # Bind before the app's lifespan runs: through Ray, the lifespan starts Ray's processes, which
    # take ports of their own and could otherwise take ours first. A taken port now fails at once.
    try:
        sock = config.bind_socket()  # logs the OS's reason and exits when it cannot bind
    except SystemExit:
        raise SystemExit(f"cannot listen on {settings.host}:{settings.port}: pick another --port") from None
    sock.set_inheritable(False)  # no child (a Ray process) may hold the port after we exit
    server = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl+C (SIGINT) after a graceful shutdown
        server.run(sockets=[sock])
    if not server.started:  # the lifespan failed (e.g. Ray did not start): uvicorn.run's exit code
        raise SystemExit(STARTUP_FAILURE)
