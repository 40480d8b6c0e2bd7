"""OpenEnv's routes on a service with an API key (the WebSocket and /mcp need it, as OpenEnv's
clients send it through ``headers=``; the documents stay open) and a short idle TTL (an idle
session's env is reaped and its socket told so)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from grpo_service import create_app
from tests.conftest import make_settings
from tests.openenv_venv import OpenEnvDriver, shared_driver
from tests.test_openenv import ask, play
from tools.server_thread import ServerThread

KEY = "openenv-test-key-0123456789"
IDLE_TTL_S = 1.0


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("openenv-auth")
    settings = make_settings(tmp, environment_api_key=KEY, idle_ttl_s=IDLE_TTL_S, reaper_interval_s=0.2)
    with ServerThread(create_app(settings), name="openenv-auth") as server:
        yield server.base_url


def ws_url(base: str, env: str = "textcraft") -> str:
    return base.replace("http", "ws", 1) + f"/openenv/{env}/ws"


@pytest.mark.parametrize(
    "headers",
    [{}, {"X-API-Key": "wrong"}, {"Authorization": "Bearer wrong"}],
    ids=["none", "wrong", "bearer"],
)
def test_a_socket_without_the_key_is_refused_with_401(base: str, headers: dict[str, str]) -> None:
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url(base), additional_headers=headers, open_timeout=30)
    assert refused.value.response.status_code == 401
    body = json.loads(refused.value.response.body or b"{}")
    assert body["code"] in ("missing_api_key", "invalid_api_key")
    assert KEY not in (refused.value.response.body or b"").decode()


@pytest.mark.parametrize("headers", [{"X-API-Key": KEY}, {"Authorization": f"Bearer {KEY}"}])
def test_the_key_in_either_header_opens_a_session(base: str, headers: dict[str, str]) -> None:
    with connect(ws_url(base), additional_headers=headers, open_timeout=30) as ws:
        assert ask(ws, {"type": "reset", "data": {"seed": 1}})["type"] == "observation"


def test_mcp_needs_the_key_and_the_documents_do_not(base: str) -> None:
    with httpx.Client(base_url=f"{base}/openenv/crafter", timeout=30) as http:
        listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        refused = http.post("/mcp", json=listing)
        assert refused.status_code == 401 and refused.json()["code"] == "missing_api_key"
        assert http.post("/mcp", json=listing, headers={"X-API-Key": KEY}).json()["result"]["tools"]
        for path in ("/health", "/metadata", "/schema", "/openapi.json"):
            assert http.get(path).status_code == 200, path


@pytest.fixture(scope="module")
def driver(pytestconfig: pytest.Config) -> OpenEnvDriver:
    return shared_driver(pytestconfig)


@pytest.mark.slow
def test_openenv_client_sends_the_key_through_headers(driver: OpenEnvDriver, base: str) -> None:
    result = play(driver, base, "auth", headers={"X-API-Key": KEY})
    assert result["with_key"].startswith("Inventory")
    assert "401" in result["without_key"]


@pytest.mark.slow
def test_openenv_clients_reach_a_keyed_server_as_documented(driver: OpenEnvDriver, base: str) -> None:
    """docs/openenv.md's recipe for a keyed server, run as written (its URL and key replaced):
    GenericEnvClient's socket and MCPToolClient's /mcp and socket carry the key; without the
    headers the same code is refused."""
    docs = (Path(__file__).parents[1] / "docs" / "openenv.md").read_text(encoding="utf-8")
    section = docs.split("## The API key", 1)[1].split("\n## ", 1)[0]
    (recipe,) = re.findall(r"```python\n(.*?)```", section, re.S)
    code = recipe.replace("http://localhost:8000", base).replace("your-key", KEY)
    printed = play(driver, base, "code", code=code)["stdout"].splitlines()
    assert len(printed) == 2 and all(line.startswith("Inventory") for line in printed), printed
    keyless = re.sub(r"(?m)^headers = .*$", "headers = {}", code)
    assert keyless != code
    with pytest.raises(AssertionError, match="401"):
        play(driver, base, "code", code=keyless)


def test_an_idle_session_is_reaped_and_told(base: str) -> None:
    with connect(ws_url(base), additional_headers={"X-API-Key": KEY}, open_timeout=30) as ws:
        env_id = ask(ws, {"type": "reset", "data": {"seed": 1}})["data"]["metadata"]["env_id"]
        started = time.monotonic()
        error = json.loads(ws.recv(timeout=30))  # nothing sent: the server speaks first
        assert time.monotonic() - started >= IDLE_TTL_S
        assert error["data"]["code"] == "SESSION_ERROR" and env_id in error["data"]["message"]
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=30)
    with httpx.Client(base_url=base, timeout=30, headers={"X-API-Key": KEY}) as http:
        assert env_id not in {e["env_id"] for e in http.get("/env/list").json()["envs"]}


def test_a_silent_socket_is_closed_after_the_idle_ttl(base: str) -> None:
    """A socket that never resets or steps holds no env, and is not kept: after the idle TTL it is
    told so and closed."""
    with connect(ws_url(base), additional_headers={"X-API-Key": KEY}, open_timeout=30) as ws:
        assert ask(ws, {"type": "state"})["data"]["env_id"] is None
        error = json.loads(ws.recv(timeout=30))
        assert error["data"]["code"] == "SESSION_ERROR" and "no reset or step" in error["data"]["message"]
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=30)
