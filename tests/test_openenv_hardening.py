"""OpenEnv's routes under misuse and as a consumer meets them (uvicorn on 127.0.0.1, one server for
the module): a socket's own session is that socket's alone; an env is built by the first frame
that needs one and freed with its socket; invalid actions are observations, not error frames, on
every env, over MCP and on the AgentGym routes alike; `/schema` is each env's own; the first
observation names the actions."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from envs.base import ENVIRONMENTS
from envs.crafter.actions import ACTIONS
from grpo_service import create_app
from grpo_service.tracing import TraceReader
from tests.conftest import make_settings
from tests.test_openenv import ask, eventually, live_env_ids, socket
from tools.server_thread import ServerThread

MAX_ENVS = 4


@pytest.fixture(scope="module")
def trace_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("openenv-hardening-traces") / "traces.db"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, trace_db: Path) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("openenv-hardening")
    settings = make_settings(tmp, max_envs=MAX_ENVS, trace_db=trace_db)
    with ServerThread(create_app(settings), name="openenv-hardening") as server:
        yield server.base_url


@pytest.fixture(scope="module")
def http(base: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base, timeout=30) as client:
        yield client


def rpc(http: httpx.Client, env: str, method: str, **params: Any) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return http.post(f"/openenv/{env}/mcp", json=body).json()


# ------------------------------------------------------------------- a socket's session is its own


def test_a_second_socket_cannot_take_over_a_sockets_session(base: str, http: httpx.Client) -> None:
    """Attaching to a session a WebSocket opened (its id is in `state`) is refused, as are MCP's
    calls and close by that id; the owner plays on and its env lives."""
    with socket(base) as owner:
        ask(owner, {"type": "reset", "data": {"seed": 4}})
        state = ask(owner, {"type": "state"})["data"]
        session, env_id = state["session_id"], state["env_id"]
        with connect(f"{base.replace('http', 'ws', 1)}/openenv/crafter/ws?session_id={session}") as thief:
            error = json.loads(thief.recv(timeout=30))
            assert error["type"] == "error" and error["data"]["code"] == "SESSION_ERROR", error
            assert "belongs to the WebSocket" in error["data"]["message"]
            with pytest.raises(ConnectionClosed):
                thief.recv(timeout=30)
        called = rpc(
            http,
            "crafter",
            "tools/call",
            name="interact_many",
            arguments={"actions": ["noop"]},
            session_id=session,
        )
        assert called["error"]["code"] == -32602 and called["error"]["data"]["code"] == "SESSION_ERROR"
        closed = rpc(http, "crafter", "openenv/session/close", session_id=session)
        assert closed["error"]["code"] == -32602, closed
        assert env_id in live_env_ids(http)
        after = ask(owner, {"type": "state"})["data"]
        assert (after["env_id"], after["step_count"]) == (env_id, 0), "nothing stepped the owner's env"
        assert ask(owner, {"type": "step", "data": {"action": "noop"}})["type"] == "observation"
    eventually(lambda: env_id not in live_env_ids(http))


# ------------------------------------------------------------- an env only for a socket that plays


def openenv_envs(http: httpx.Client) -> set[str]:
    return {e["env_id"] for e in http.get("/env/list").json()["envs"] if e["rl_run_id"] == "openenv"}


def test_a_silent_socket_holds_no_env_and_its_first_step_builds_one(base: str, http: httpx.Client) -> None:
    """Sockets that send nothing (or only `state` and `list_tools`) hold no env and do not count
    against MAX_ENVS: more of them than MAX_ENVS are all accepted. The first reset or step builds
    the env; the socket's end frees it."""
    eventually(lambda: not openenv_envs(http))
    with contextlib.ExitStack() as silent:
        sockets = [silent.enter_context(socket(base)) for _ in range(MAX_ENVS + 2)]
        state = ask(sockets[0], {"type": "state"})["data"]
        assert state["env_id"] is None and state["step_count"] == 0 and state["session_id"]
        assert ask(sockets[1], {"type": "list_tools"})["data"]["observation"]["tools"]
        assert not openenv_envs(http), "no env for a socket that has not played"
        stepped = ask(sockets[2], {"type": "step", "data": {"action": "noop"}})["data"]
        reset = ask(sockets[3], {"type": "reset", "data": {"seed": 3, "max_steps": 5}})["data"]
        assert reset["observation"]["text"].startswith("Step 0/5"), (
            "the first env is built with the reset's config"
        )
        built = {stepped["metadata"]["env_id"], reset["metadata"]["env_id"]}
        assert openenv_envs(http) == built
        assert ask(sockets[2], {"type": "state"})["data"]["step_count"] == 1
    eventually(lambda: not openenv_envs(http))


def test_a_socket_that_finds_the_service_full_at_its_first_reset_gets_capacity_reached(
    base: str, http: httpx.Client
) -> None:
    with contextlib.ExitStack() as stack:
        late = stack.enter_context(socket(base))  # accepted: there was room
        for _ in range(MAX_ENVS - len(live_env_ids(http))):
            assert ask(stack.enter_context(socket(base)), {"type": "reset"})["type"] == "observation"
        error = ask(late, {"type": "reset", "data": {"seed": 1}})
        assert error["type"] == "error" and error["data"]["code"] == "CAPACITY_REACHED", error
        assert error["data"]["active_sessions"] == error["data"]["max_sessions"] == MAX_ENVS
        with pytest.raises(ConnectionClosed):
            late.recv(timeout=30)
        assert late.close_code == 1013
    eventually(lambda: not openenv_envs(http))


# ------------------------------------------------------------ invalid actions are observations

INVALID: list[Any] = [
    pytest.param("crafter", {"action": "dance"}, "unknown action 'dance'", id="crafter-name"),
    pytest.param("crafter", {"tool_calls": [{"tool": "fly", "args": {}}]}, "unknown tool", id="crafter-tool"),
    pytest.param("crafter", {"action": 99}, "index 99", id="crafter-index"),
    pytest.param("babyai", {"action": 9}, "primitive actions are 0-6", id="babyai-index"),
    pytest.param("textcraft", {"action": 3}, "must be a string", id="textcraft-int"),
    pytest.param("sciworld", {"action": 3}, "must be a string", id="sciworld-int", marks=pytest.mark.slow),
]
VALID = {"crafter": "noop", "babyai": "turn left", "textcraft": "inventory", "sciworld": "look around"}


@pytest.mark.parametrize(("env", "step", "feedback"), INVALID)
def test_an_invalid_action_is_an_observation_with_the_envs_feedback(
    base: str, env: str, step: dict[str, Any], feedback: str
) -> None:
    """As AgentGym's servers answer an action their game does not know: the env's message as the
    observation's text, reward 0, the step counted; the episode goes on (an error frame would end
    an OpenEnv consumer's episode)."""
    with socket(base, env) as ws:
        first = ask(ws, {"type": "reset", "data": {"seed": 1}})["data"]
        reply = ask(ws, {"type": "step", "data": step})
        assert reply["type"] == "observation", reply
        data = reply["data"]
        assert feedback in data["observation"]["text"] and data["reward"] == 0.0 and data["done"] is False
        assert data["metadata"]["info"]["invalid_action"] == data["observation"]["text"]
        assert data["metadata"]["step_idx"] == first["metadata"]["step_idx"], "no game step was taken"
        assert ask(ws, {"type": "state"})["data"]["step_count"] == 1
        played = ask(ws, {"type": "step", "data": {"action": VALID[env]}})["data"]
        assert "invalid_action" not in played["metadata"]["info"]
        assert ask(ws, {"type": "state"})["data"]["step_count"] == 2


def test_an_invalid_tool_call_over_mcp_is_a_tool_error_with_the_feedback(
    base: str, http: httpx.Client
) -> None:
    """MCP agrees with the socket: the refused call's result is MCP's tool error (``isError``), its
    content the env's message, its data the observation (reward 0); a ``call_tool`` frame too."""
    session = rpc(http, "crafter", "openenv/session/create", seed=2)["result"]["session_id"]
    try:
        called = rpc(
            http,
            "crafter",
            "tools/call",
            name="interact_many",
            arguments={"actions": ["fly"]},
            session_id=session,
        )["result"]
        assert called["isError"] is True and "unknown action 'fly'" in called["content"][0]["text"]
        assert (
            called["data"]["reward"] == 0.0
            and called["data"]["observation"]["text"] == called["content"][0]["text"]
        )
        with socket(base) as ws:
            ask(ws, {"type": "reset", "data": {"seed": 2}})
            frame = ask(ws, {"type": "call_tool", "tool_name": "fly", "arguments": {}})
            assert frame["type"] == "observation" and frame["data"]["observation"]["error"] is None
            assert (
                frame["data"]["observation"]["result"]["isError"] is True and frame["data"]["reward"] == 0.0
            )
    finally:
        rpc(http, "crafter", "openenv/session/close", session_id=session)


def test_an_invalid_turn_is_traced_and_the_episode_replays(
    base: str, http: httpx.Client, trace_db: Path
) -> None:
    with socket(base) as ws:
        ask(ws, {"type": "reset", "data": {"seed": 6, "episode_id": "with-invalid-turn"}})
        ask(ws, {"type": "step", "data": {"action": "dance"}})
        ask(ws, {"type": "step", "data": {"action": "move_left"}})

    def traced() -> list[dict[str, Any]]:
        with TraceReader(trace_db) as reader:
            return [
                s for s in reader.sessions() if s["policy_config"].get("episode_id") == "with-invalid-turn"
            ]

    eventually(lambda: bool(traced()))
    session = traced()[0]
    assert session["num_turns"] == 2
    replay = http.get(f"/viewer/api/rollouts/{session['session_id']}/replay").json()
    assert replay["available"] and replay["divergence"] is None, replay


# ---------------------------------------------------------------------- each env's own schemas

# What a consumer needs to turn a model's reply into each env's action: the vocabulary, in /schema.
VOCABULARY = {
    "textcraft": ["get N item", "craft N item using N item, ...", "inventory"],
    "babyai": ["go to <obj> <id>", "toggle and go through <door> <id>", "check available actions"],
    "sciworld": ["focus on OBJ", "look around", "pour OBJ into OBJ"],
}


@pytest.mark.parametrize("env", sorted(ENVIRONMENTS))
def test_schema_publishes_the_envs_own_action_observation_and_state(http: httpx.Client, env: str) -> None:
    schema = http.get(f"/openenv/{env}/schema").json()
    title = ENVIRONMENTS[env].__name__.removesuffix("Env")
    action = schema["action"]
    assert action["title"] == f"{title}Action" and action["required"] == ["action"]
    assert action["examples"] and all(jsonschema.validate(e, action) is None for e in action["examples"])
    field = action["properties"]["action"]
    if env == "crafter":
        assert field["enum"] == list(ACTIONS)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"action": "dance"}, action)
    else:
        assert all(f'"{form}"' in field["description"] for form in VOCABULARY[env]), field
    if env == "babyai":
        assert {"type": "integer", "minimum": 0, "maximum": 6}.items() <= field["anyOf"][1].items()
    assert schema["observation"]["title"] == f"{title}Observation"
    assert {"text", *ENVIRONMENTS[env].observation_model.model_fields} <= set(
        schema["observation"]["properties"]
    )
    assert "vocabulary" in schema["reset_observation"]["required"]
    assert schema["state"]["title"] == f"{title}State"
    assert schema["state"]["properties"]["env_name"]["const"] == env


@pytest.mark.parametrize("env", ["crafter", "textcraft", "babyai"])
def test_what_an_env_answers_validates_against_its_schema(base: str, http: httpx.Client, env: str) -> None:
    schema = http.get(f"/openenv/{env}/schema").json()
    step = schema["action"]["examples"][0]
    jsonschema.validate(step, schema["action"])
    with socket(base, env) as ws:
        reset = ask(
            ws, {"type": "reset", "data": {"seed": 2, "oracle": True} if env != "crafter" else {"seed": 2}}
        )
        jsonschema.validate(reset["data"]["observation"], schema["reset_observation"])
        for frame in ({"action": 99}, step):  # refused, then played: both observations
            stepped = ask(ws, {"type": "step", "data": frame})
            jsonschema.validate(stepped["data"]["observation"], schema["observation"])
        jsonschema.validate(ask(ws, {"type": "state"})["data"], schema["state"])


# ------------------------------------------------------------ the model is told the actions

FIRST_WORDS = {"crafter": '"make_iron_sword"', "textcraft": '"get N item"', "babyai": '"go to <obj> <id>"'}


@pytest.mark.parametrize("env", sorted(FIRST_WORDS))
def test_the_first_observation_names_the_actions(base: str, env: str) -> None:
    """What a consumer shows its model first (the reset's `text`) ends with the env's vocabulary,
    also given as `vocabulary`; later observations are the env's own."""
    with socket(base, env) as ws:
        observation = ask(ws, {"type": "reset", "data": {"seed": 1}})["data"]["observation"]
        vocabulary = observation["vocabulary"]
        assert vocabulary == ENVIRONMENTS[env].vocabulary() and FIRST_WORDS[env] in vocabulary
        assert observation["text"].endswith("\n\n" + vocabulary)
        step = ask(ws, {"type": "step", "data": {"action": VALID[env]}})["data"]["observation"]
        assert "vocabulary" not in step and not step["text"].endswith(vocabulary)


@pytest.mark.parametrize("env", ["textcraft", "babyai"])
def test_agentgym_and_openenv_answer_a_refused_action_alike(base: str, http: httpx.Client, env: str) -> None:
    """An action longer than any command, the one string a text game refuses: AgentGym's surface
    answers it in the game's shape with the env's message (its client reads `observation`; an
    `{"error"}` would crash it), as the OpenEnv socket does; the game goes on."""
    action = "craft " * 100
    prefix = f"/agentgym/{env}"
    if env == "textcraft":
        idx = http.post(f"{prefix}/create", json={}).json()["id"]
    else:
        idx = http.post(f"{prefix}/create").json()["id"]
        http.post(f"{prefix}/reset", json={"id": idx, "data_idx": 1})
    try:
        reply = http.post(f"{prefix}/step", json={"id": idx, "action": action}).json()
        assert "error" not in reply and reply["reward"] == 0 and reply["done"] is False, reply
        with socket(base, env) as ws:
            ask(ws, {"type": "reset", "data": {"seed": 1}})
            over_openenv = ask(ws, {"type": "step", "data": {"action": action}})["data"]["observation"][
                "text"
            ]
        assert reply["observation"] == over_openenv and "longer than" in over_openenv
        again = http.post(f"{prefix}/step", json={"id": idx, "action": VALID[env]}).json()
        assert "error" not in again and again["observation"] != reply["observation"]
    finally:
        http.post(f"{prefix}/close", json={"id": idx})
