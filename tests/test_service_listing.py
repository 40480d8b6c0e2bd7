"""Listing live objects (``GET /env/list``, ``/policy/list``, ``/run/list``) with paging and owner
filters, and a group's progress in ``GET /run/status`` while it runs and after."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from tests.conftest import MODEL
from tools.fake_server import FakeConfig, FakeInferenceServer
from tools.server_thread import ServerThread


def test_envs_and_policies_are_listed_by_owner_a_page_at_a_time(client: httpx.Client) -> None:
    envs = [
        client.post("/env/create", json={"env_name": "crafter", "seed": i, "rl_run_id": owner}).json()[
            "env_id"
        ]
        for i, owner in enumerate(["run-a", "run-b", "run-a"])
    ]
    client.post("/env/step", json={"env_id": envs[0], "actions": ["noop", "noop"]})
    client.post(
        "/policy/create",
        json={"policy_name": "crafter-random", "rl_run_id": "run-a", "bound_env_id": envs[0]},
    )

    listed = client.get("/env/list").json()
    assert [e["env_id"] for e in listed["envs"]] == envs and listed["total"] == 3
    first = listed["envs"][0]
    assert first["env_name"] == "crafter" and first["step_idx"] == 2 and first["rl_run_id"] == "run-a"
    assert first["age_s"] >= 0 and first["idle_s"] >= 0 and first["in_use"] is False

    page = client.get("/env/list", params={"rl_run_id": "run-a", "limit": 1}).json()
    assert (
        [e["env_id"] for e in page["envs"]] == [envs[0]] and page["total"] == 2 and page["next_offset"] == 1
    )
    page = client.get("/env/list", params={"rl_run_id": "run-a", "limit": 1, "offset": 1}).json()
    assert [e["env_id"] for e in page["envs"]] == [envs[2]] and page["next_offset"] is None
    assert client.get("/env/list", params={"rl_run_id": "nobody"}).json() == {
        "total": 0,
        "offset": 0,
        "limit": 100,
        "next_offset": None,
        "envs": [],
    }
    (policy,) = client.get("/policy/list", params={"rl_run_id": "run-a"}).json()["policies"]
    assert policy["policy_name"] == "crafter-random" and policy["bound_env_id"] == envs[0]

    bad = client.get("/env/list", params={"limit": 0})
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_request"


def test_a_group_reports_its_members_progress_while_it_runs_and_after(
    start_server: Callable[..., ServerThread],
) -> None:
    turns, size = 8, 3
    with FakeInferenceServer(FakeConfig(model=MODEL, latency_s=0.05)) as slow:
        server = start_server(vllm_base_url=slow.base_url)
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            started = client.post(
                "/rollout/group/start",
                json={
                    "group_size": size,
                    "env": {"env_name": "crafter", "seed": 5},
                    "policy": {"policy_name": "crafter-react"},
                    "max_turns": turns,
                    "rl_run_id": "grpo-1",
                },
            )
            assert started.status_code == 202, started.text
            url = started.json()["status_url"]
            seen_running_progress = False
            deadline = time.monotonic() + 60
            while (status := client.get(url).json())["status"] == "running":
                assert time.monotonic() < deadline
                members = status["members"]
                assert status["ops_executed"] == sum(m["ops_executed"] for m in members)
                seen_running_progress |= 0 < status["ops_executed"] < status["ops_total"]
                time.sleep(0.02)
            assert seen_running_progress, "a running group never showed progress"
            assert status["status"] == "completed"
            assert status["ops_executed"] == status["ops_total"] == 2 * turns * size
            assert status["timings"]["llm_s"] > 0 and status["timings"]["env_s"] > 0
            assert [m["status"] for m in status["members"]] == ["completed"] * size

            runs = client.get("/run/list", params={"rl_run_id": "grpo-1"}).json()["runs"]
            kinds = sorted(r["kind"] for r in runs)
            assert kinds == ["group"] + ["rollout"] * size
            group = next(r for r in runs if r["kind"] == "group")
            assert group["ops_executed"] == 2 * turns * size and group["finished_at"] is not None
