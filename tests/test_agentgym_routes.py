"""The AgentGym-compatible servers at /agentgym/<env>, driven the way AgentGym's client drives them.

`AgentGymClient` follows ``agentenv/envs/{textcraft,babyai,sciworld}.py`` request for request
(``requests``, ``POST /create`` with the same body or none, ``_post`` adding ``id``, ``_get``
with ``?id=``, ``assert status_code == 200``, the ``Action:`` parsing of each client) and
``BaseTask._generate_experience_one``'s loop (reset, observe, step until done or max_rounds).
Every payload is checked field by field against the shapes of AgentGym's servers.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

os.environ.setdefault("SCIWORLD_JVMS", "1")

from envs.text_game import parse_react_action  # noqa: E402
from envs.textcraft.planner import Planner  # noqa: E402
from envs.textcraft.recipes import recipe_book  # noqa: E402
from tests.conftest import make_settings  # noqa: E402
from tools.server_thread import ServerThread  # noqa: E402


class AgentGymClient:
    """The HTTP behaviour of AgentGym's env clients, one per game."""

    def __init__(self, base: str, game: str, timeout: int = 300) -> None:
        self.base, self.game, self.timeout = base, game, timeout
        body = {"minecraft_dir": "agentenv_textcraft/", "commands": None, "goal": None}
        ok = requests.post(
            f"{base}/create", timeout=timeout, **({"json": body} if game == "textcraft" else {})
        )
        assert ok.status_code == 200
        created = ok.json()
        self.env_id = created["id"]
        self.info: dict[str, Any] = {"observation": created.get("observation"), "reward": 0, "done": False}

    def _post(self, path: str, data: dict[str, Any]) -> dict[str, Any]:
        data["id"] = self.env_id
        res = requests.post(f"{self.base}/{path}", json=data, timeout=self.timeout)
        assert res.status_code == 200
        return res.json()

    def _get(self, path: str) -> Any:
        res = requests.get(f"{self.base}/{path}?id={self.env_id}", timeout=self.timeout)
        assert res.status_code == 200
        return res.json()

    def observe(self) -> str:
        return self.info["observation"]

    def step(self, reply: str) -> tuple[str, float, bool]:
        if self.game == "sciworld":
            action = parse_react_action(reply)
        else:
            matches = re.findall(r"Action:\s*(.*?)(?=\n|$)", reply, re.DOTALL)
            if len(matches) > 1:
                return (
                    "Error: Only one 'Action' is allowed per response. Please adjust your response.",
                    0,
                    False,
                )
            action = " ".join(re.sub(r"[^A-Za-z0-9, ]+", "", matches[-1] if matches else "").split()).strip()
        response = self._post("step", {"action": action})
        self.info = {k: response[k] for k in ("observation", "reward", "done")} | {
            "score": response.get("score")
        }
        reward = response["reward"] if self.game == "textcraft" else response["score"]
        return response["observation"], reward, response["done"]

    def reset(self, idx: int) -> dict[str, Any]:
        response = self._post("reset", {"data_idx": idx})
        observation = response["observation"]
        if self.game == "sciworld":
            observation = response["task_description"] + "\n" + response["observation"]
        self.info = {"observation": observation, "reward": 0, "score": 0, "done": False}
        return response

    def close(self) -> Any:
        return self._post("close", {})


def run_episode(
    client: AgentGymClient, idx: int, agent: Callable[[str], str], max_rounds: int
) -> dict[str, Any]:
    """``BaseTask._generate_experience_one`` with an API agent: the conversation and the reward."""
    client.reset(idx)
    state = client.observe()
    conversation = [{"role": "user", "content": state}]
    reward, done, rounds = 0.0, False, 0
    while not done:
        reply = agent(state)
        conversation.append({"role": "assistant", "content": reply})
        state, reward, done = client.step(reply)
        conversation.append({"role": "user", "content": state})
        rounds += 1
        if rounds >= max_rounds:
            break
    return {"conversation": conversation, "reward": reward, "done": done, "rounds": rounds}


def react(action: str) -> str:
    return f"Thought:\nI know what to do.\n\nAction:\n{action}"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from grpo_service import create_app

    server = ServerThread(
        create_app(make_settings(tmp_path_factory.mktemp("agentgym"))), name="agentgym"
    ).start()
    try:
        yield server.base_url + "/agentgym"
    finally:
        server.stop()


def keys_and_types(payload: dict[str, Any], shape: dict[str, type | tuple[type, ...]]) -> None:
    assert set(payload) == set(shape), payload
    for key, kind in shape.items():
        assert isinstance(payload[key], kind) and not (isinstance(payload[key], bool) and kind is int), (
            key,
            payload,
        )


def test_textcraft_evaluation_by_agentgyms_client(base: str) -> None:
    url = f"{base}/textcraft"
    assert requests.get(url + "/").json() == "This is environment TextCraft."
    client = AgentGymClient(url, "textcraft")
    assert client.env_id == 0 and client.observe().startswith("Crafting commands:\n")
    created = requests.post(f"{url}/create", json={}).json()
    keys_and_types(created, {"id": int, "observation": str, "done": bool, "reward": int})
    assert created["id"] == 1  # AgentGym: the task of a new env is its id's

    book = recipe_book()
    planner: dict[str, Planner] = {}

    def agent(state: str) -> str:
        if state.startswith("Crafting commands:"):
            commands, goal = state.split("\n\nGoal: craft ")
            planner["p"] = Planner(book, commands.removeprefix("Crafting commands:\n"))
            planner["goal"] = goal.rstrip(".")
            planner["inventory"] = {}
        inventory = planner["inventory"]
        got = re.fullmatch(r"Got (\d+) (.+)", state)
        if got:
            inventory[got.group(2)] = inventory.get(got.group(2), 0) + int(got.group(1))
        crafted = re.fullmatch(r"Crafted (\d+) minecraft:(.+)", state)
        if crafted:
            made = crafted.group(2).replace("_", " ")
            inventory[made] = inventory.get(made, 0) + int(crafted.group(1))
            used = re.search(r"using (.+)$", planner["last"])
            for part in used.group(1).split(", ") if used else []:
                n, name = part.split(" ", 1)
                inventory[name] -= int(n)
        planner["last"] = planner["p"].next_action(planner["goal"], inventory)
        return react(planner["last"])

    for idx in (0, 7, 543):
        episode = run_episode(client, idx, agent, max_rounds=40)
        assert episode["done"] and episode["reward"] == 1, episode["conversation"][-3:]

    reset = client._post("reset", {"data_idx": 5})
    keys_and_types(reset, {"id": int, "observation": str, "done": bool, "reward": int})
    step = client._post("step", {"action": "get 1 oak logs"})
    keys_and_types(step, {"observation": str, "reward": int, "done": bool})
    assert client._get("observation") == step["observation"]
    keys_and_types(client._get("detail"), {"observation": str, "reward": int, "done": bool, "deleted": bool})
    assert client._get("goal").startswith("minecraft:") and "craft " in client._get("commands")
    assert client.step("Action: a\nAction: b")[0].startswith("Error: Only one 'Action'")
    assert client.close() is True
    assert requests.post(f"{url}/close", json={"id": 999}).json() is False
    assert requests.post(f"{url}/step", json={"id": 999, "action": "x"}).json() == {
        "error": "The id 999 is not valid."
    }
    assert requests.post(f"{url}/step", json={"action": "x"}).status_code == 422  # FastAPI's own validation


def test_babyai_evaluation_by_agentgyms_client(base: str) -> None:
    url = f"{base}/babyai"
    assert requests.get(url + "/").json() == "This is environment BabyAI."
    client = AgentGymClient(url, "babyai")
    assert requests.get(f"{url}/observation", params={"id": client.env_id}).json()["observation"] == (
        "Environment not initialized"
    )
    reset = client.reset(1)  # GoToRedBall, seed 0
    keys_and_types(
        reset, {"observation": str, "reward": float, "score": float, "deleted": bool, "done": bool}
    )
    assert reset["observation"].startswith("Your goal: go to the red ball\n")

    def agent(state: str) -> str:
        listed = re.search(r"Available actions: \[(.*)\]$", state).group(1)
        actions = [a.strip('"') for a in listed.split('", "')]
        target = [a for a in actions if a.startswith("go to red ball")]
        return react(target[0] if target else "turn left")

    episode = run_episode(client, 1, agent, max_rounds=10)
    assert episode["done"] and 0.5 < episode["reward"] <= 1
    assert (
        episode["conversation"][-1]["content"]
        .split("\nAvailable actions")[0]
        .endswith("The task is completed.")
    )
    finished = requests.post(f"{url}/step", json={"id": client.env_id, "action": "turn left"}).json()
    assert finished == {"error": f"The task with environment {client.env_id} has finished."}

    client.reset(2)
    step = client._post("step", {"action": "turn right"})
    keys_and_types(step, {"observation": str, "reward": float, "score": float, "done": bool})
    observed = client._get("observation")
    keys_and_types(
        observed, {"observation": str, "reward": float, "score": float, "done": bool, "deleted": bool}
    )
    assert observed["observation"].startswith("Your goal: ") and observed["observation"].endswith(
        step["observation"]
    )
    render = requests.post(f"{url}/render", json={"id": client.env_id}).json()
    assert render.startswith("data:image/png;base64,iVBOR")
    assert client.close() is True
    assert client._post("close", {}) is False


def test_sciworld_evaluation_by_agentgyms_client(base: str) -> None:
    url = f"{base}/sciworld"
    assert requests.get(url + "/").json() == "This is environment ScienceWorld."
    client = AgentGymClient(url, "sciworld")
    reset = client.reset(0)
    keys_and_types(
        reset,
        {
            "task_name": str,
            "var_num": int,
            "task_description": str,
            "observation": str,
            "reward": int,
            "score": int,
            "deleted": bool,
            "done": bool,
        },
    )
    assert (reset["task_name"], reset["var_num"]) == ("boil", 0)
    assert client.observe().startswith("Your task is to boil water.")
    script = iter(["open door to kitchen", "go to kitchen", "pick up thermometer"])
    episode = run_episode(client, 0, lambda _: react(next(script)), max_rounds=3)
    assert episode["rounds"] == 3 and not episode["done"]
    assert "thermometer" in episode["conversation"][-1]["content"]
    step = client._post("step", {"action": "look around"})
    keys_and_types(step, {"observation": str, "reward": int, "score": int, "done": bool})
    assert client._get("observation") == step["observation"]
    hint = client._get("action_hint")
    assert set(hint) == {"possible_actions", "possible_objects"} and "look around" in hint["possible_actions"]
    assert set(client._get("goals")) == {"goals"}
    assert client._get("task_description")["task_description"].startswith("Your task is to boil water")
    assert set(client._get("detail")) >= {"deleted", "done", "observation", "score", "task_name"}
    out_of_range = requests.post(f"{url}/reset", json={"id": client.env_id, "data_idx": 4639}).json()
    assert "out of range" in out_of_range["error"]
    assert client.close() is True
    gone = requests.get(f"{url}/observation", params={"id": client.env_id}).json()
    assert gone == {"error": f"The task with environment {client.env_id} has been deleted."}


@pytest.mark.parametrize(
    "body", [{"id": False, "data_idx": 0}, {"id": 0, "data_idx": False}, {"id": 0, "data_idx": 1.5}]
)
def test_ids_and_task_indices_must_be_integers(base: str, body: dict[str, Any]) -> None:
    """``false`` or ``1.5`` is a 422 naming the field, never silently id 0 or task 0."""
    answer = requests.post(f"{base}/babyai/reset", json=body, timeout=30)
    assert answer.status_code == 422, answer.text
    wrong = next(key for key, value in body.items() if type(value) is not int)
    assert wrong in answer.text


def test_a_step_is_answered_alike_before_and_by_the_route(base: str) -> None:
    """A well-formed ``/step`` is answered ahead of FastAPI's routing (`FastPaths`): byte for
    byte as the route answers it (a content type that path leaves to the route), and whatever
    it does not take (a malformed body) gets the route's own 422."""
    url = f"{base}/textcraft"
    ids = [requests.post(f"{url}/create", json={}, timeout=30).json()["id"] for _ in range(2)]
    for idx in ids:
        requests.post(f"{url}/reset", json={"id": idx, "data_idx": 3}, timeout=30).raise_for_status()
    routed_type = {"Content-Type": "application/json; charset=utf-8"}
    for action in ["inventory", "get 1 oak logs", "dance", "ä" * 3]:
        fast = requests.post(f"{url}/step", json={"id": ids[0], "action": action}, timeout=30)
        body = json.dumps({"id": ids[1], "action": action})
        routed = requests.post(f"{url}/step", data=body, headers=routed_type, timeout=30)
        assert fast.status_code == routed.status_code == 200
        assert fast.content == routed.content, (fast.content, routed.content)
        assert {k: v for k, v in fast.headers.items() if k != "date"} == {
            k: v for k, v in routed.headers.items() if k != "date"
        }
    unknown = requests.post(f"{url}/step", json={"id": 10**6, "action": "inventory"}, timeout=30)
    assert unknown.json() == {"error": "The id 1000000 is not valid."}
    as_json = {"Content-Type": "application/json"}
    for bad in (b'{"id": false, "action": "inventory"}', b'{"id": 0, "action": NaN}', b"{", b""):
        answer = requests.post(f"{url}/step", data=bad, headers=as_json, timeout=30)
        assert answer.status_code == 422, (bad, answer.text)
