"""The served processes' own defences, over raw sockets: `grpo-service serve` (embedded) and
`serve-model` give a request's headers a deadline (a client trickling them byte by byte, an HTTP
request or a WebSocket upgrade, or sending nothing, gets a 408 and is closed within it), and a
keyless server on loopback answers only a loopback ``Host`` (DNS rebinding gets a 421 naming it)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO, Served, free_port

DEADLINE_S = 1.0


def trickle(port: int, request: bytes, *, every_s: float = 0.1) -> tuple[bytes, float]:
    """Send ``request`` one byte at a time until the server answers or closes; what it sent,
    and when (seconds after connecting) the connection was closed."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.setblocking(False)
        answer = b""
        for byte in [request[i : i + 1] for i in range(len(request))] + [b""] * 200:
            try:
                if byte:
                    sock.send(byte)
            except OSError:  # closed by the server
                break
            time.sleep(every_s)
            try:
                chunk = sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                break
            if not chunk:
                break
            answer += chunk
        return answer, time.monotonic() - started


def raw_request(port: int, request: bytes) -> bytes:
    """``request`` sent whole; what the server answers in 3 s or until it closes."""
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
        sock.sendall(request)
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except TimeoutError:
            pass
    return answer


UPGRADE = (
    b"GET /openenv/crafter/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
)  # no final blank line: the headers never end
SLOW_HTTP = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 200


def check_header_deadline(port: int) -> None:
    requests = (SLOW_HTTP, UPGRADE, b"")
    with ThreadPoolExecutor(len(requests)) as pool:  # each on its own connection, at once
        trickled = list(pool.map(lambda request: trickle(port, request), requests))
    for request, (answer, closed_after) in zip(requests, trickled, strict=True):
        assert answer.startswith(b"HTTP/1.1 408"), (request[:30], answer[:200])
        assert b"request_timeout" in answer
        assert DEADLINE_S * 0.8 <= closed_after < DEADLINE_S + 2.5, closed_after


def check_host(port: int, *, allowed: bool = False) -> None:
    base = f"http://127.0.0.1:{port}"
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}", "127.0.0.2"):
        assert httpx.get(base + "/health", headers={"Host": host}, timeout=10).status_code == 200, host
    for host in (
        f"rebind.attacker.example:{port}",
        "attacker.example",
        "10.0.0.1",
        "localhost.attacker.example",
    ):
        r = httpx.get(base + "/health", headers={"Host": host}, timeout=10)
        if allowed:
            assert r.status_code == 200, host
            continue
        assert r.status_code == 421, (host, r.text)
        assert r.json()["code"] == "misdirected_host" and host in r.json()["detail"]
    websocket = UPGRADE.replace(b"Host: 127.0.0.1", b"Host: rebind.attacker.example") + b"\r\n"
    answer = raw_request(port, websocket)
    assert answer.startswith(b"HTTP/1.1 421") and b"rebind.attacker.example" in answer, answer[:300]


def test_serve_bounds_header_reads_and_refuses_foreign_hosts(
    serve: Callable[..., Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEADER_TIMEOUT_S", str(DEADLINE_S))
    served = serve()
    port = int(served.base_url.rsplit(":", 1)[1])
    check_header_deadline(port)
    check_host(port)
    # A kept-alive connection idle between requests is not cut by the header deadline.
    with httpx.Client(base_url=served.base_url, timeout=10) as client:
        assert client.get("/health").status_code == 200
        time.sleep(DEADLINE_S * 1.5)
        assert client.get("/health").status_code == 200


def test_only_keyless_loopback_servers_check_the_host() -> None:
    from grpo_service.api.auth import LoopbackHostGuard
    from grpo_service.serving import guarded

    app = object()
    assert isinstance(guarded(app, "127.0.0.1", keyed=False), LoopbackHostGuard)
    assert guarded(app, "127.0.0.1", keyed=True) is app  # a web page has no key
    assert guarded(app, "0.0.0.0", keyed=False) is app  # --insecure: documented as open
    guard = LoopbackHostGuard(app, "::1")
    assert guard.allows("[::1]:8000") and guard.allows("localhost.") and not guard.allows("example.com")


def test_the_header_deadline_holds_over_h11_too() -> None:
    """Without httptools, uvicorn parses with h11: the same deadline, in-process here."""
    import threading

    import uvicorn

    from grpo_service.serving import H11WithDeadline, uvicorn_config

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    port = free_port()
    config = uvicorn_config(app, "127.0.0.1", port, keyed=True, header_timeout_s=DEADLINE_S, lifespan="off")
    config.http = H11WithDeadline
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        check_header_deadline(port)
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def serve_model(tmp_path: Path) -> Iterator[int]:
    from tests.llm_helpers import make_tiny_model

    model = make_tiny_model(tmp_path / "model")
    port = free_port()
    cmd = [sys.executable, "-m", "grpo_service.cli", "serve-model", str(model), "--port", str(port)]
    cmd += ["--header-timeout-s", str(DEADLINE_S)]
    log = tmp_path / "serve-model.log"
    with log.open("wb") as out:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.mark.slow
def test_serve_model_bounds_header_reads_and_refuses_foreign_hosts(serve_model: int) -> None:
    check_header_deadline(serve_model)
    base = f"http://127.0.0.1:{serve_model}"
    assert (
        httpx.get(base + "/health", headers={"Host": f"localhost:{serve_model}"}, timeout=10).status_code
        == 200
    )
    r = httpx.post(base + "/pause", json={}, headers={"Host": "rebind.attacker.example"}, timeout=10)
    assert r.status_code == 421 and "rebind.attacker.example" in r.text
    assert httpx.get(base + "/is_paused", timeout=10).json() == {"is_paused": False}
