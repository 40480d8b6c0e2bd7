"""Forking GRPO groups: `/rollout/group` with a fork plan, over real HTTP against the fake LLM.

One task app for the module (Crafter, `crafter-react`, the vLLM-shaped fake with token ids and
logprobs); each test plays a few turns.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from envs.crafter.env import CrafterEnv
from grpo_service import create_app
from grpo_service.client.task_app import ServiceCallError, TaskAppClient
from grpo_service.models import ForkPlan, RolloutGroupResponse
from grpo_service.rollout.forks import ForkingGroup
from tests.conftest import make_settings
from tests.llm_toy import toy_plugins
from tools.fake_server import FakeConfig, FakeInferenceServer
from tools.server_thread import ServerThread


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    tmp: Path = tmp_path_factory.mktemp("forks")
    with FakeInferenceServer(FakeConfig()) as fake:
        settings = make_settings(tmp, vllm_base_url=fake.base_url, trace_db=tmp / "traces.db")
        with toy_plugins(), ServerThread(create_app(settings), name="task-app") as server:
            yield server


@pytest.fixture
def client(app: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=app.base_url, timeout=120) as c:
        yield c


def group_body(fork: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "group_size": 2,
        "env": {"env_name": "crafter", "seed": 7},
        "policy": {"policy_name": "crafter-react", "config": {"temperature": 1.0}},
        "max_turns": 4,
        "record": {"logprobs": True},
        **extra,
    }
    if fork is not None:
        body["fork"] = fork
    return body


def steps_of(member: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for t in member["result"]["trajectories"] for s in t["steps"]]


def test_every_k_forks_each_root_into_continuations_from_the_exact_state(client: httpx.Client) -> None:
    r = client.post("/rollout/group", json=group_body({"every": 2, "continuations": 2}))
    assert r.status_code == 200, r.text
    group = r.json()
    members = group["members"]
    assert [m["group_index"] for m in members] == [0, 1, 2, 3, 4, 5]
    tree = group["tree"]
    assert tree["roots"] == [0, 1]
    assert [(f["parent_index"], f["turn"], f["children"]) for f in tree["forks"]] == [
        (0, 2, [2, 3]),
        (1, 2, [4, 5]),
    ]
    assert all(f["surprisal"] is not None and f["surprisal"] >= 0 for f in tree["forks"])
    for m in members[2:]:
        result = m["result"]
        parent = members[result["parent_index"]]
        assert result["fork_turn"] == 2 and result["group_id"] == group["group_id"]
        own = steps_of(m)
        assert [s["turn"] for s in own] == [2, 3]  # the prefix is the parent's, stored once
        # The copy is exact: the continuation saw what its parent saw before turn 2.
        parent_turn2 = next(s for s in steps_of(parent) if s["turn"] == 2)
        assert own[0]["observation"] == parent_turn2["observation"]
        assert own[0]["llm"]["completion_logprobs"] and own[0]["llm"]["prompt_token_ids"]
    assert tree["turns_shared"] == 4 * 2 and tree["turns_played"] == 2 * 4 + 4 * 2
    assert tree["continuations_not_started"] == 0 and tree["fork_s"] >= 0
    assert group["metrics"]["completed"] == 6 and len(group["metrics"]["returns"]) == 6


def test_max_entropy_forks_where_the_root_sampled_its_least_likely_tokens(client: httpx.Client) -> None:
    fork = {"rule": "max_entropy", "count": 1, "continuations": 2}
    group = client.post("/rollout/group", json=group_body(fork)).json()
    forks = group["tree"]["forks"]
    assert len(forks) == 2 and len(group["members"]) == 6
    for f in forks:
        root = group["members"][f["parent_index"]]
        surprisals = {
            s["turn"]: -sum(s["llm"]["completion_logprobs"]) / len(s["llm"]["completion_logprobs"])
            for s in steps_of(root)
            if s["turn"] >= 1
        }
        assert f["turn"] == max(surprisals, key=surprisals.__getitem__)
        assert f["surprisal"] == pytest.approx(surprisals[f["turn"]])


def test_a_fork_turn_a_root_never_reaches_releases_its_slots(client: httpx.Client) -> None:
    # toy-words ends after one decision: no root reaches turn 1.
    body = {
        "group_size": 2,
        "group_id": "unreached",
        "env": {"env_name": "toy-words", "seed": 1},
        "policy": {"policy_name": "toy-say"},
        "max_turns": 3,
        "fork": {"at_turns": [1], "continuations": 3},
    }
    r = client.post("/rollout/group", json=body)
    assert r.status_code == 200, r.text
    group = r.json()
    assert len(group["members"]) == 2 and group["tree"]["forks"] == []
    assert group["tree"]["continuations_not_started"] == 6
    listed = {run["run_id"] for run in client.get("/run/list?limit=100").json()["runs"]}
    assert {"unreached", "unreached.0", "unreached.1"} <= listed and "unreached.2" not in listed


def test_bad_fork_plans_are_422_naming_the_problem(client: httpx.Client, monkeypatch) -> None:
    def refused(body: dict[str, Any], code: str, words: str) -> None:
        r = client.post("/rollout/group", json=body)
        assert r.status_code == 422, r.text
        assert r.json()["code"] == code and words in str(r.json()["detail"])

    refused(group_body({"every": 2, "at_turns": [1]}), "invalid_request", "exactly one of")
    refused(group_body({"every": 2}, on_done="reset"), "invalid_request", "on_done")
    refused(group_body({"every": 1, "continuations": 64}, max_turns=10), "group_too_large", "tree of up to")
    no_logprobs = group_body({"rule": "max_entropy"}, record={"logprobs": False})
    refused(no_logprobs, "invalid_request", "record.logprobs")
    monkeypatch.setattr(CrafterEnv, "snapshots_mid_episode", False)
    refused(group_body({"every": 2}), "fork_unsupported", "'crafter' cannot snapshot mid-episode")


def test_start_then_poll_and_the_typed_client(app: ServerThread, client: httpx.Client) -> None:
    r = client.post("/rollout/group/start", json=group_body({"at_turns": [1, 3], "continuations": 1}))
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 60
    while (status := client.get(r.json()["status_url"]).json())["status"] == "running":
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    assert status["status"] == "completed"
    assert [m["group_index"] for m in status["members"]] == list(range(6))
    tree = status["result"]["tree"]
    assert [(f["parent_index"], f["turn"]) for f in tree["forks"]] == [(0, 1), (0, 3), (1, 1), (1, 3)]

    with TaskAppClient(app.base_url) as typed:
        group = typed.rollout_group(**group_body(None), fork=ForkPlan(every=3, continuations=2))
        assert isinstance(group, RolloutGroupResponse) and group.tree is not None
        assert [m.result.fork_turn for m in group.members if m.result] == [None, None, 3, 3, 3, 3]
        with pytest.raises(ServiceCallError) as refused:
            typed.rollout_group(**group_body(None), fork={"every": 2}, ops=["agent", "env"])
        assert "max_turns" in str(refused.value)


def test_the_trace_and_the_viewer_show_the_tree(client: httpx.Client) -> None:
    body = group_body({"at_turns": [2], "continuations": 2}, group_id="traced-tree")
    played = client.post("/rollout/group", json=body).json()
    deadline = time.monotonic() + 30
    while True:  # the trace writer commits in the background
        r = client.get("/viewer/api/groups/traced-tree")
        if r.status_code == 200 and r.json()["size"] == 6:
            break
        assert time.monotonic() < deadline, r.text
        time.sleep(0.1)
    group = r.json()
    by_index = {m["group_index"]: m for m in group["members"]}
    assert [(i, m["parent_index"], m["fork_turn"]) for i, m in sorted(by_index.items())] == [
        (0, None, None),
        (1, None, None),
        (2, 0, 2),
        (3, 0, 2),
        (4, 1, 2),
        (5, 1, 2),
    ]
    assert by_index[2]["first_turn"] == 2 and by_index[2]["num_turns"] == 2
    fork = group["tree"]["forks"][0]
    assert (fork["parent_index"], fork["turn"], fork["children"]) == (0, 2, [2, 3])
    root = played["members"][0]["result"]
    from_turn_2 = sum(s["reward"] for s in steps_of(played["members"][0]) if s["turn"] >= 2)
    kids = [played["members"][i]["result"]["metrics"]["episode_returns"][0] for i in (2, 3)]
    assert fork["value"] == pytest.approx((from_turn_2 + sum(kids)) / 3, abs=1e-6)
    assert by_index[2]["advantage"] == pytest.approx(kids[0] - fork["value"], abs=1e-6)
    assert root["fork_turn"] is None
    # The viewer replays a continuation from its parent's turns before the fork: no divergence.
    replay = client.get(f"/viewer/api/rollouts/{by_index[3]['session_id']}/replay").json()
    assert replay["available"] and replay["divergence"] is None and replay["checked"] == 2


def test_max_entropy_holds_only_the_states_a_fork_can_still_need(
    client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule ranks each turn once its decision is sampled and keeps `count` + 1 states per root
    (the best so far and the one being decided), not one per turn until the root ends: a root of
    T turns would otherwise hold T states, each as large as its policy's history (T² bytes)."""
    held: list[tuple[int, int, int]] = []  # (states held, their bytes, the largest one's bytes)
    capture = ForkingGroup._capture

    async def measured(self: ForkingGroup, root: int, loop: Any, turn: int) -> Any:
        made = await capture(self, root, loop, turn)
        states = [*self.captures[root].values(), made]
        sizes = [len(c.env_state) + len(c.policy_state) for c in states]
        held.append((len(states), sum(sizes), max(sizes)))
        return made

    monkeypatch.setattr(ForkingGroup, "_capture", measured)
    count = 2
    fork = {"rule": "max_entropy", "count": count, "continuations": 1}
    r = client.post("/rollout/group", json=group_body(fork, group_size=1, max_turns=40))
    assert r.status_code == 200, r.text
    group = r.json()
    root = group["members"][0]
    turns = len(steps_of(root))
    assert turns >= 30 and len(held) == turns - 1, (turns, len(held))  # a state before every turn but 0
    assert max(n for n, _, _ in held) == count + 1
    assert max(total for _, total, _ in held) <= (count + 1) * max(big for _, _, big in held)
    # The same forks as ranking every turn at the end: the `count` least likely samples.
    surprisals = {
        s["turn"]: -sum(s["llm"]["completion_logprobs"]) / len(s["llm"]["completion_logprobs"])
        for s in steps_of(root)
        if s["turn"] >= 1
    }
    best = sorted(surprisals, key=lambda t: (surprisals[t], t), reverse=True)[:count]
    assert sorted(f["turn"] for f in group["tree"]["forks"]) == sorted(best)
