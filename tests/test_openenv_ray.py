"""OpenEnv's protocol served through Ray: the front holds the sockets, the sessions' envs live on
the two hosts of a local cluster (the session's `ray_local`). OpenEnv's own clients play; the
envs are listed, snapshotted and released on their hosts, and the episodes reach the cluster's
trace DB."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from grpo_service import create_app
from grpo_service.tracing import TraceReader
from tests.conftest import served_settings
from tests.openenv_venv import shared_driver
from tests.test_openenv import ENVS, ask, eventually, live_env_ids, socket
from tools.server_thread import ServerThread

PLAYED = {name: ENVS[name] for name in ("crafter", "textcraft")}


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory, ray_local: None) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("openenv-ray")
    settings = served_settings(tmp, "ray", trace_db=tmp / "traces.db")
    server = ServerThread(create_app(settings), name="openenv-ray").start(timeout_s=120)
    try:
        yield server.base_url, tmp / "traces.db"
    finally:
        server.stop()


def test_openenv_clients_play_through_ray(front: tuple[str, Path], pytestconfig: pytest.Config) -> None:
    base, trace_db = front
    report: dict[str, Any] = shared_driver(pytestconfig).play(
        {"base": base, "scenario": "episodes", "envs": PLAYED, "headers": {}}
    )
    for client in ("generic", "mcp", "typed", "autoenv"):
        assert all(episode["done"] for episode in report[client].values()), client
    concurrent = report["concurrent"]
    assert concurrent["texts"]["a"] == concurrent["alone"]
    with httpx.Client(base_url=base, timeout=60) as http:  # the front tells the hosts as sockets close

        def left() -> bool:
            return not any(e["rl_run_id"] == "openenv" for e in http.get("/env/list").json()["envs"])

        eventually(left, timeout_s=30)

    def traced() -> set[str]:
        if not trace_db.exists():
            return set()
        with TraceReader(trace_db) as reader:
            return {
                s["policy_config"]["episode_id"] for s in reader.sessions() if s["policy_name"] == "openenv"
            }

    eventually(lambda: {f"generic-{name}" for name in PLAYED} <= traced(), timeout_s=30)


def test_a_sessions_env_lives_on_a_host(front: tuple[str, Path]) -> None:
    base, _ = front
    with httpx.Client(base_url=base, timeout=60) as http:
        front_tag = http.get("/health").json()["instance"]
        with socket(base) as ws:
            env_id = ask(ws, {"type": "reset", "data": {"seed": 4}})["data"]["metadata"]["env_id"]
            assert not env_id.startswith(front_tag), "the env is a host's, not the front's"
            assert env_id in live_env_ids(http)
            snapshot = http.post("/env/snapshot", json={"env_id": env_id})
            assert snapshot.status_code == 200, snapshot.text
            ws.send(json.dumps({"type": "close"}))
        eventually(lambda: env_id not in live_env_ids(http), timeout_s=30)


def test_json_nested_too_deep_is_invalid_json_through_ray(front: tuple[str, Path]) -> None:
    """The front parses a frame and a ``/mcp`` body with the same strict parser as one process:
    nesting past Python's recursion is ``INVALID_JSON`` on the socket (which goes on) and JSON-RPC's
    parse error on ``/mcp``, never an execution error or a 500."""
    base, _ = front
    with socket(base) as ws:
        ask(ws, {"type": "reset", "data": {"seed": 9}})
        reply = ask(ws, "[" * 5_000 + "]" * 5_000)
        assert reply["type"] == "error" and reply["data"]["code"] == "INVALID_JSON", reply
        assert ask(ws, {"type": "step", "data": {"action": "noop"}})["type"] == "observation"
    for depth in (1_200, 5_000):
        rpc = httpx.post(f"{base}/openenv/crafter/mcp", content=b"[" * depth + b"]" * depth, timeout=30)
        assert rpc.status_code == 200, rpc.text
        assert rpc.json()["error"]["code"] == -32700 and "nested" in rpc.json()["error"]["message"]
