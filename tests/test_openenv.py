"""OpenEnv's protocol at /openenv/<env> against the served app (uvicorn on 127.0.0.1): OpenEnv 0.10's
own clients play whole episodes of every env; two sessions are isolated; every session is a live
env of the registry (listed, snapshotted, traced, removed when its socket closes or drops, refused
at capacity); bad frames get OpenEnv's error frames and the session goes on; `openenv validate
--url` passes for every env. One server for the module; the clients run in OpenEnv's own venv."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from envs.base import ENVIRONMENTS
from grpo_service import create_app
from grpo_service.tracing import TraceReader
from tests.conftest import make_settings
from tests.openenv_venv import OpenEnvDriver, shared_driver
from tools.server_thread import ServerThread

MAX_ENVS = 6
MAX_FRAME = 64 * 1024  # the service's MAX_REQUEST_BYTES, which bounds a frame too
# How each env is played to its end: the text games by their scripted solver (the `oracle`
# config shows its next action), Crafter until its step cap.
ENVS: dict[str, dict[str, Any]] = {
    "crafter": {"seed": 3, "config": {"max_steps": 8}},
    "textcraft": {"seed": 1, "config": {"oracle": True, "max_steps": 40}},
    "babyai": {"seed": 0, "config": {"oracle": True, "max_steps": 40}},
    "sciworld": {"seed": 0, "config": {"oracle": True, "max_steps": 60}},
}


@pytest.fixture(scope="module")
def driver(pytestconfig: pytest.Config) -> OpenEnvDriver:
    return shared_driver(pytestconfig)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, Path]]:
    tmp = tmp_path_factory.mktemp("openenv")
    trace_db = tmp / "traces.db"
    settings = make_settings(tmp, trace_db=trace_db, max_envs=MAX_ENVS, max_request_bytes=MAX_FRAME)
    with ServerThread(create_app(settings), name="openenv-app") as server:
        yield server, trace_db


@pytest.fixture(scope="module")
def base(served: tuple[ServerThread, Path]) -> str:
    return served[0].base_url


@pytest.fixture(scope="module")
def http(base: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base, timeout=30) as client:
        yield client


def play(driver: OpenEnvDriver, base: str, scenario: str, **spec: Any) -> dict[str, Any]:
    return driver.play({"base": base, "scenario": scenario, "envs": ENVS, "headers": {}, **spec})


@pytest.fixture(scope="module")
def report(driver: OpenEnvDriver, base: str) -> dict[str, Any]:
    return play(driver, base, "episodes")


def socket(base: str, env: str = "crafter", **kwargs: Any) -> ClientConnection:
    return connect(base.replace("http", "ws", 1) + f"/openenv/{env}/ws", open_timeout=30, **kwargs)


def ask(ws: ClientConnection, frame: dict[str, Any] | str | bytes) -> dict[str, Any]:
    ws.send(frame if isinstance(frame, (str, bytes)) else json.dumps(frame))
    return json.loads(ws.recv(timeout=30))


def live_env_ids(http: httpx.Client) -> set[str]:
    return {e["env_id"] for e in http.get("/env/list").json()["envs"]}


def eventually(check: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


# ------------------------------------------------------------------ OpenEnv's clients, every env


def test_every_registered_env_is_served() -> None:
    assert set(ENVS) == set(ENVIRONMENTS)


@pytest.mark.slow
def test_generic_client_plays_a_whole_episode_of_every_env(report: dict[str, Any]) -> None:
    for name, episode in report["generic"].items():
        assert episode["done"], name
        assert episode["reset_state"]["episode_id"] == f"generic-{name}"
        assert episode["reset_state"]["step_count"] == 0
        assert episode["state"]["step_count"] == episode["steps"] > 0
        assert episode["state"]["env_name"] == name
        assert episode["metadata"]["env_id"] == episode["state"]["env_id"]
        assert all(isinstance(r, float) for r in episode["rewards"])
        if ENVS[name]["config"].get("oracle"):
            assert sum(episode["rewards"]) > 0, f"{name}: the solver's episode is a success"
    crafter = report["generic"]["crafter"]
    assert crafter["steps"] == ENVS["crafter"]["config"]["max_steps"]
    assert crafter["metadata"]["truncated"] is True


def test_typed_client_autoenv_and_mcp_tool_client(report: dict[str, Any]) -> None:
    for name, typed in report["typed"].items():
        assert typed["done"] and typed["observation_type"] == "TextObservation", name
        assert typed["state"]["step_count"] == typed["steps"] > 0
        autoenv = report["autoenv"][name]
        assert autoenv["client"] == "GenericEnvClient" and autoenv["done"], name
        if ENVS[name]["config"].get("oracle"):
            assert typed["reward"] > 0 and autoenv["reward"] > 0, name
    for name, episode in report["mcp"].items():
        assert episode["tools"] == [t["function"]["name"] for t in ENVIRONMENTS[name].tools()]
        assert episode["input_schema"]["type"] == "object"
        assert episode["done"], name
        assert episode["state"]["step_count"] == episode["steps"]


def test_two_concurrent_sessions_are_isolated(report: dict[str, Any]) -> None:
    concurrent = report["concurrent"]
    assert concurrent["texts"]["a"] == concurrent["alone"], "interleaving changed session a's episode"
    assert concurrent["texts"]["b"][0] != concurrent["texts"]["a"][0]
    a, b = concurrent["states"]["a"], concurrent["states"]["b"]
    assert a["env_id"] != b["env_id"] and a["session_id"] != b["session_id"]
    assert (a["episode_id"], b["episode_id"]) == ("ep-a", "ep-b")
    assert a["step_count"] == b["step_count"] == 3


def test_episodes_are_traced_and_envs_released(
    report: dict[str, Any], served: tuple[ServerThread, Path], http: httpx.Client
) -> None:
    assert not any(e["rl_run_id"] == "openenv" for e in http.get("/env/list").json()["envs"])
    _, trace_db = served
    generic = report["generic"]

    def traced() -> list[dict[str, Any]]:
        with TraceReader(trace_db) as reader:
            return [s for s in reader.sessions() if s["policy_name"] == "openenv"]

    eventually(lambda: {s["env_name"] for s in traced()} == set(ENVS))
    by_episode = {s["policy_config"]["episode_id"]: s for s in traced()}
    for name, episode in generic.items():
        session = by_episode[f"generic-{name}"]
        assert session["num_turns"] == episode["steps"]
        assert session["stop_reason"] == "episode_done"
        assert session["total_reward"] == pytest.approx(sum(episode["rewards"]))
        assert session["seed"] == ENVS[name]["seed"]
        if name != "sciworld":  # the viewer replays it from its seed and tool calls (a JVM spared)
            replay = http.get(f"/viewer/api/rollouts/{session['session_id']}/replay").json()
            assert replay["available"] and replay["divergence"] is None, replay
            assert replay["positions"] == episode["steps"] + 1


def test_openenv_validate_passes_for_every_env(driver: OpenEnvDriver, base: str) -> None:
    for name, result in play(driver, base, "validate").items():
        report = result["report"]
        assert result["exit_code"] == 0 and report["passed"], (name, report["criteria"])
        assert report["mode"] == "production" and report["target"] == f"{base}/openenv/{name}"


def test_openenv_runtime_graders_pass_for_every_env(driver: OpenEnvDriver, base: str) -> None:
    for name, result in play(driver, base, "graders").items():
        assert result["failure"] is None and result["exchanges"] >= 4, (name, result)
        for check, (status, evidence) in result["checks"].items():
            assert status == "pass", (name, check, evidence)


# ------------------------------------------------------------- sessions are the registry's envs


def test_state_env_id_works_with_the_http_api(base: str, http: httpx.Client) -> None:
    with socket(base) as ws:
        ask(ws, {"type": "reset", "data": {"seed": 5}})
        ask(ws, {"type": "step", "data": {"actions": ["move_left", "do"]}})
        state = ask(ws, {"type": "state"})["data"]
        listed = {e["env_id"]: e for e in http.get("/env/list").json()["envs"]}
        assert listed[state["env_id"]]["step_idx"] == state["step_idx"] == 2
        snapshot = http.post("/env/snapshot", json={"env_id": state["env_id"]})
        assert snapshot.status_code == 200, snapshot.text
        restored = http.post("/env/restore", json={"snapshot_id": snapshot.json()["snapshot_id"]}).json()
        assert restored["step_idx"] == 2
        mid = ask(ws, {"type": "step", "data": {"action": "noop"}})["data"]
        copy = http.post("/env/step", json={"env_id": restored["env_id"], "action": "noop"}).json()
        assert copy["observation"]["text"] == mid["observation"]["text"]
        http.post("/env/terminate", json={"env_id": restored["env_id"]})
    eventually(lambda: state["env_id"] not in live_env_ids(http))


def test_a_dropped_socket_removes_its_env(base: str, http: httpx.Client) -> None:
    with socket(base, "textcraft") as ws:
        env_id = ask(ws, {"type": "reset", "data": {"seed": 2}})["data"]["metadata"]["env_id"]
        assert env_id in live_env_ids(http)
        ws.socket.close()  # no close frame: the connection just drops
        eventually(lambda: env_id not in live_env_ids(http))


def test_a_config_reset_rebuilds_the_env(base: str, http: httpx.Client) -> None:
    with socket(base) as ws:
        first = ask(ws, {"type": "reset", "data": {"seed": 1}})["data"]["metadata"]["env_id"]
        reply = ask(ws, {"type": "reset", "data": {"seed": 1, "max_steps": 3}})["data"]
        assert reply["observation"]["text"].startswith("Step 0/3")
        second = ask(ws, {"type": "state"})["data"]["env_id"]
        assert second != first and first not in live_env_ids(http) and second in live_env_ids(http)


def test_capacity_reached(driver: OpenEnvDriver, base: str, http: httpx.Client) -> None:
    with contextlib.ExitStack() as fillers:
        while len(http.get("/env/list").json()["envs"]) < MAX_ENVS:
            ask(fillers.enter_context(socket(base)), {"type": "reset"})
        with socket(base) as refused:
            error = json.loads(refused.recv(timeout=30))
            assert error["type"] == "error" and error["data"]["code"] == "CAPACITY_REACHED"
            assert error["data"]["max_sessions"] == error["data"]["active_sessions"] == MAX_ENVS
            with pytest.raises(ConnectionClosed):
                refused.recv(timeout=30)
            assert refused.close_code == 1013
        assert "CAPACITY_REACHED" in play(driver, base, "capacity")["error"]
    eventually(lambda: not any(e["rl_run_id"] == "openenv" for e in http.get("/env/list").json()["envs"]))
    with socket(base) as ws:
        assert ask(ws, {"type": "reset"})["type"] == "observation"


def test_a_terminated_env_ends_the_session(base: str, http: httpx.Client) -> None:
    with socket(base) as ws:
        env_id = ask(ws, {"type": "reset"})["data"]["metadata"]["env_id"]
        assert http.post("/env/terminate", json={"env_id": env_id}).json()["existed"]
        error = ask(ws, {"type": "step", "data": {"action": "noop"}})
        assert error["data"]["code"] == "SESSION_ERROR" and "gone" in error["data"]["message"]
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=30)


# ----------------------------------------------------------------------------------- bad frames

BAD_FRAMES: list[tuple[Any, str]] = [
    ("not json", "INVALID_JSON"),
    ('{"type": "step", "data": {"action": NaN}}', "INVALID_JSON"),
    (b"\xff\xfe", "INVALID_JSON"),
    ("[1, 2]", "VALIDATION_ERROR"),
    ({"type": "dance"}, "UNKNOWN_TYPE"),
    ({"no": "type"}, "UNKNOWN_TYPE"),
    ({"type": "step", "data": {}}, "VALIDATION_ERROR"),
    ({"type": "step", "data": {"action": "x", "actions": ["y"]}}, "VALIDATION_ERROR"),
    ({"type": "step", "data": [1]}, "VALIDATION_ERROR"),
    ({"type": "step", "extra": 1}, "VALIDATION_ERROR"),
    ({"type": "reset", "data": {"seed": "seven"}}, "VALIDATION_ERROR"),
    ({"type": "reset", "data": {"seed": -1}}, "VALIDATION_ERROR"),
    ({"type": "reset", "data": {"max_steps": 0}}, "VALIDATION_ERROR"),
    ({"type": "reset", "data": {"no_such_option": 1}}, "VALIDATION_ERROR"),
    ({"type": "reset", "data": {"rl_run_id": "../x"}}, "VALIDATION_ERROR"),
    ({"type": "call_tool"}, "VALIDATION_ERROR"),
    ('{"type": "step", "data": {"action": "' + "x" * MAX_FRAME + '"}}', "VALIDATION_ERROR"),
]


def test_bad_frames_get_openenv_error_frames_and_the_session_goes_on(base: str) -> None:
    with socket(base) as ws:
        reset = ask(ws, {"type": "reset", "data": {"seed": 9, "episode_id": "bad-frames"}})
        env_id = reset["data"]["metadata"]["env_id"]
        for frame, code in BAD_FRAMES:
            reply = ask(ws, frame)
            assert reply["type"] == "error" and reply["data"]["code"] == code, (frame, reply)
            assert reply["data"]["message"]
            if code == "VALIDATION_ERROR" and frame != "[1, 2]" and "errors" in reply["data"]:
                assert all({"loc", "msg"} <= set(e) for e in reply["data"]["errors"])
        state = ask(ws, {"type": "state"})["data"]
        assert (state["env_id"], state["episode_id"], state["step_count"]) == (env_id, "bad-frames", 0)
        assert ask(ws, {"type": "step", "data": {"action": "noop"}})["data"]["reward"] == 0.0


def test_an_episode_over_is_an_execution_error(base: str) -> None:
    with socket(base, "textcraft") as ws:
        ask(ws, {"type": "reset", "data": {"seed": 1, "oracle": True}})
        reply: dict[str, Any] = {"data": {"done": False, "observation": {}}}
        while not reply["data"]["done"]:
            action = reply["data"]["observation"].get("oracle_action")
            reply = ask(ws, {"type": "step", "data": {"action": action or "inventory"}})
        over = ask(ws, {"type": "step", "data": {"action": "inventory"}})
        assert over["data"]["code"] == "EXECUTION_ERROR"
        refused = ask(ws, {"type": "step", "data": {"tool_calls": [{"tool": "fly", "args": {}}]}})
        assert refused["data"]["code"] == "EXECUTION_ERROR", "an invalid action after the end too"
        assert ask(ws, {"type": "reset", "data": {"seed": 2}})["type"] == "observation"


def test_json_nested_too_deep_is_invalid_json_and_logs_no_traceback(
    base: str, http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    """Nesting past what Python's parser can recurse (thousands of levels, a few KB) is refused by
    the service's one strict parser like any other unreadable JSON: an ``INVALID_JSON`` frame on
    the socket (the session goes on), JSON-RPC's parse error on ``/mcp``; no traceback in the log."""
    deep_frames = ["[" * 5_000, "[" * 5_000 + "]" * 5_000, '{"type": "step", "data": ' + "[" * 5_000]
    with caplog.at_level("WARNING"), socket(base) as ws:
        ask(ws, {"type": "reset", "data": {"seed": 9}})
        for frame in deep_frames:
            reply = ask(ws, frame)
            assert reply["type"] == "error" and reply["data"]["code"] == "INVALID_JSON", reply
        assert ask(ws, {"type": "step", "data": {"action": "noop"}})["type"] == "observation"
        for depth in (1_200, 5_000):
            rpc = http.post("/openenv/crafter/mcp", content=b"[" * depth + b"]" * depth)
            assert rpc.status_code == 200, rpc.text
            assert rpc.json()["error"]["code"] == -32700 and "nested" in rpc.json()["error"]["message"]
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize(
    "through", ["embedded", pytest.param("ray", marks=pytest.mark.slow)], ids=["embedded", "ray"]
)
def test_a_key_in_a_websocket_query_string_is_not_logged(tmp_path: Path, through: str) -> None:
    """A key sent as ``?api_key=`` / ``?token=`` on the socket is refused (the service reads keys
    from headers only), and uvicorn's WebSocket handshake lines (its ``uvicorn.error`` logger, not
    the access log) show the path with the value cut, as HTTP access lines do; through a Ray front
    of one host as well (the front's server is the one that logs the handshake)."""
    from websockets.exceptions import InvalidStatus

    from tests.hardening import start_service

    key = "sk-ws-key-in-query-0123456789abcdef"
    environ = {"ENVIRONMENT_API_KEY": key, "STATE_DIR": str(tmp_path / "state"), "SNAPSHOT_SECRET": "s" * 40}
    if through == "ray":
        environ.update(RAY_ADDRESS="local", RAY_HOSTS="1", RAY_NAMESPACE=f"ws-log-{tmp_path.name}")
    service = start_service(tmp_path, environ, wait_s=120.0)
    ws_base = service.base_url.replace("http", "ws", 1)
    try:
        for query in (f"api_key={key}", f"token={key}", f"session_id=x&access_token={key}"):
            with pytest.raises(InvalidStatus) as refused:
                connect(ws_base + f"/openenv/crafter/ws?{query}", open_timeout=30)
            assert refused.value.response.status_code == 401
        # Accepted (the key in its header): the "[accepted]" line names the path too.
        url = ws_base + f"/openenv/crafter/ws?token={key}"
        with connect(url, open_timeout=30, additional_headers={"X-API-Key": key}) as ws:
            assert ask(ws, {"type": "reset", "data": {"seed": 1}})["type"] == "observation"
    finally:
        service.stop()
    log = service.log.read_text()
    assert '"WebSocket /openenv/crafter/ws?api_key=***"' in log, log[-2000:]
    assert "ws?session_id=***&access_token=***" in log and "ws?token=*** [accepted]" in log.replace('"', "")
    assert all(key[i : i + 8] not in log for i in range(len(key) - 7)), log[-2000:]


# ------------------------------------------------------------------------- MCP and the documents


def test_mcp_json_rpc(base: str, http: httpx.Client) -> None:
    mcp = "/openenv/textcraft/mcp"

    def rpc(method: str, **params: Any) -> dict[str, Any]:
        return http.post(mcp, json={"jsonrpc": "2.0", "id": 7, "method": method, "params": params}).json()

    assert [t["name"] for t in rpc("tools/list")["result"]["tools"]] == ["act"]
    assert rpc("initialize")["result"]["capabilities"] == {"tools": {"listChanged": False}}
    assert rpc("tools/call", name="act", arguments={"action": "inventory"})["error"]["code"] == -32602
    assert rpc("nope")["error"]["code"] == -32601
    assert http.post(mcp, content=b"{").json()["error"]["code"] == -32700
    assert http.post(mcp, json={}).json()["error"]["code"] == -32600
    session = rpc("openenv/session/create", seed=1)["result"]["session_id"]
    called = rpc("tools/call", name="act", arguments={"action": "inventory"}, session_id=session)["result"]
    assert called["isError"] is False
    assert called["data"]["observation"]["text"] == called["content"][0]["text"]
    bad = rpc("tools/call", name="act", arguments={"action": 3.5}, session_id=session)["result"]
    assert bad["isError"] is True and bad["data"]["reward"] == 0.0, "refused: MCP's tool error"
    attach = base.replace("http", "ws", 1) + f"/openenv/textcraft/ws?session_id={session}"
    attached = connect(attach, open_timeout=30)
    with attached:
        state = ask(attached, {"type": "state"})["data"]
        assert state["session_id"] == session and state["step_count"] == 2
        again = connect(attach, open_timeout=30)
        with again:
            assert json.loads(again.recv(timeout=30))["data"]["code"] == "SESSION_ERROR"
        over_ws = ask(attached, {"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}})
        assert over_ws["type"] == "mcp" and over_ws["data"]["result"]["tools"][0]["name"] == "act"
    assert state["env_id"] in live_env_ids(http), "closing an attached socket keeps the MCP session"
    closed = rpc("openenv/session/close", session_id=session)["result"]
    assert closed == {"session_id": session, "closed": True}
    assert state["env_id"] not in live_env_ids(http)
    assert rpc("openenv/session/close", session_id=session)["error"]["code"] == -32602


def test_documents(http: httpx.Client) -> None:
    for name, cls in ENVIRONMENTS.items():
        prefix = f"/openenv/{name}"
        assert http.get(f"{prefix}/health").json() == {"status": "healthy"}
        metadata = http.get(f"{prefix}/metadata").json()
        assert (metadata["name"], metadata["description"]) == (name, cls.description)
        assert metadata["tools"] == cls.tools()
        schema = http.get(f"{prefix}/schema").json()
        assert {"action", "observation", "state"} <= set(schema)
        assert {"episode_id", "step_count", "env_id"} <= set(schema["state"]["properties"])
        paths = http.get(f"{prefix}/openapi.json").json()["paths"]
        assert {"/health", "/metadata", "/schema", "/mcp"} <= set(paths) and "/reset" not in paths


def test_the_readme_recipe_runs_as_written(driver: OpenEnvDriver, base: str) -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Use it from OpenEnv", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    code = "\n".join(blocks).replace("http://localhost:8000", base)
    printed = play(driver, base, "code", code=code)["stdout"]
    assert "interact_many" in printed and "Goal:" in printed


def test_attaching_to_another_replicas_session_names_it(base: str) -> None:
    foreign = "ffffffff-" + "0" * 32
    with connect(
        base.replace("http", "ws", 1) + f"/openenv/crafter/ws?session_id={foreign}", open_timeout=30
    ) as ws:
        error = json.loads(ws.recv(timeout=30))["data"]
    assert error["code"] == "SESSION_ERROR" and "another replica" in error["message"]


def test_a_reset_the_env_refuses_leaves_the_session_as_it_was(base: str, http: httpx.Client) -> None:
    with socket(base, "textcraft") as ws:
        env_id = ask(ws, {"type": "reset", "data": {"seed": 1, "oracle": True}})["data"]["metadata"]["env_id"]
        same = ask(ws, {"type": "reset", "data": {"seed": 2, "oracle": True}})["data"]["metadata"]["env_id"]
        assert same == env_id, "the same config again keeps the env"
        refused = ask(ws, {"type": "reset", "data": {"seed": 10**6, "max_steps": 5}})
        assert refused["data"]["code"] == "VALIDATION_ERROR" and "10" in refused["data"]["message"]
        state = ask(ws, {"type": "state"})["data"]
        assert state["env_id"] == env_id and env_id in live_env_ids(http)
        assert ask(ws, {"type": "step", "data": {"action": "inventory"}})["type"] == "observation"
