"""/rollout, /rollout/group, /branch, /run/* over real HTTP against the fake inference server."""

from __future__ import annotations

import time

import httpx

from tests.conftest import MODEL
from tools.fake_server import FakeConfig, FakeInferenceServer


def rollout(client: httpx.Client, **body: object) -> dict:
    r = client.post("/rollout", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_rollout_with_react_policy_records_tokens(client: httpx.Client) -> None:
    out = rollout(
        client,
        run_id="r1",
        env={"env_name": "crafter", "seed": 5},
        policy={"policy_name": "crafter-react", "config": {"model": MODEL}},
        ops=["agent", "env"] * 4,
        record={"logprobs": True},
    )
    assert out["status"] == "completed" and out["stop_reason"] == "completed" and out["ops_executed"] == 8
    (traj,) = out["trajectories"]
    assert len(traj["steps"]) == 4
    for step in traj["steps"]:
        llm = step["llm"]
        assert llm["prompt_token_ids"] and llm["completion_token_ids"]
        assert len(llm["completion_token_ids"]) == len(llm["completion_logprobs"])
        assert step["tool_calls"][0]["tool"] == "interact_many"
        assert 1 <= len(step["actions"]) <= 8 and isinstance(step["reward"], float)
    m = out["metrics"]
    assert m["num_decisions"] == 4 and m["llm_calls"] == 4 and m["num_steps"] >= 4
    assert m["prompt_tokens"] > 0 and m["llm_time_s"] > 0 and m["env_time_s"] > 0
    # Envs and policies a rollout created are released with it.
    assert client.get("/health").json()["envs"] == 0


def test_rollout_on_existing_env_and_policy_keeps_them(client: httpx.Client) -> None:
    env_id = client.post("/env/create", json={"env_name": "crafter", "seed": 1}).json()["env_id"]
    policy_id = client.post(
        "/policy/create",
        json={"policy_name": "crafter-random", "config": {"seed": 1}, "bound_env_id": env_id},
    ).json()["policy_id"]
    out = rollout(client, env={"env_id": env_id}, policy={"policy_id": policy_id}, max_turns=3)
    assert out["env_id"] == env_id and out["policy_id"] == policy_id
    assert client.post("/env/step", json={"env_id": env_id, "action": "noop"}).json()["step_idx"] == 4


def test_episode_end_reset_and_terminate(client: httpx.Client) -> None:
    base = {
        "env": {"env_name": "crafter", "seed": 2, "config": {"max_steps": 5}},
        "policy": {"policy_name": "crafter-random", "config": {"seed": 0, "actions_per_call": 1}},
        "max_turns": 12,
    }
    out = rollout(client, **base, on_done="reset")
    trajs = out["trajectories"]
    assert [t["length"] for t in trajs] == [5, 5, 2]
    assert trajs[0]["done"] and trajs[0]["truncated"] and trajs[0]["stop_reason"] == "truncated"
    assert trajs[0]["steps"][-1]["done"] and trajs[0]["steps"][-1]["truncated"]
    assert out["metrics"]["num_episodes"] == 3

    out = rollout(client, **base, on_done="terminate")
    assert out["stop_reason"] == "episode_done" and len(out["trajectories"]) == 1
    assert out["ops_executed"] == 10


def test_heuristic_policy_unlocks_achievements(client: httpx.Client) -> None:
    out = rollout(
        client,
        env={"env_name": "crafter", "seed": 1},
        policy={"policy_name": "crafter-heuristic"},
        max_turns=150,
    )
    assert out["metrics"]["achievements_count"] >= 2, out["metrics"]


def test_policy_failures_are_recorded_not_raised(start_server, tmp_path) -> None:
    with FakeInferenceServer(FakeConfig(model=MODEL, fault_script=["ok", "no_tool_call"])) as fake:
        server = start_server(vllm_base_url=fake.base_url)
        with httpx.Client(base_url=server.base_url, timeout=60) as c:
            ending = {"policy_name": "crafter-react", "config": {"on_invalid_reply": "end"}}
            out = rollout(c, env={"env_name": "crafter"}, policy=ending, max_turns=5)
            assert out["stop_reason"] == "policy_error:no_tool_call"
            steps = out["trajectories"][0]["steps"]
            assert steps[-1]["decision_error"] == "no_tool_call" and len(steps) == 2
            assert steps[-1]["feedback"] is None and out["metrics"]["invalid_decisions"] == 1

            fake.set_config(FakeConfig(model=MODEL, fault_script=["invalid_action"]))
            out = rollout(c, env={"env_name": "crafter"}, policy=ending, max_turns=5)
            assert out["stop_reason"] == "policy_error:invalid_action"
            assert "fly" in (out["trajectories"][0]["steps"][0]["decision_error_detail"] or "")


def test_invalid_replies_are_answered_and_the_episode_goes_on(start_server) -> None:
    script = ["ok", "no_tool_call", "invalid_action", "ok"]
    with FakeInferenceServer(FakeConfig(model=MODEL, fault_script=script)) as fake:
        server = start_server(vllm_base_url=fake.base_url)
        with httpx.Client(base_url=server.base_url, timeout=60) as c:
            out = rollout(
                c,
                env={"env_name": "crafter", "seed": 3},
                policy={"policy_name": "crafter-react"},
                max_turns=4,
                record={"logprobs": True, "return_trace": True},
            )
    assert out["stop_reason"] == "completed" and out["metrics"]["invalid_decisions"] == 2
    steps = out["trajectories"][0]["steps"]
    assert [s["decision_error"] for s in steps] == [None, "no_tool_call", "invalid_action", None]
    first, no_call, bad, last = steps
    # An invalid turn takes no env step, earns nothing, and keeps the sampler's tokens.
    assert no_call["actions"] == [] and no_call["reward"] == 0.0 and bad["actions"] == []
    assert no_call["step_idx"] == 0 and bad["llm"]["completion_token_ids"]
    assert last["observation"]["step_idx"] == first["step_idx"]  # the env did not move meanwhile
    assert (
        no_call["feedback"].startswith("Error: you called no tool") and "interact_many" in no_call["feedback"]
    )
    assert "'fly'" in bad["feedback"]
    # The model is told: the next prompts carry the feedback (in a user message after a reply
    # without calls, in the tool message answering an invalid call).
    turns = out["trace"]["turns"]
    assert turns[2]["messages"][-1] == {"role": "user", "content": no_call["feedback"]}
    assert (
        turns[3]["messages"][-1]["role"] == "tool" and turns[3]["messages"][-1]["content"] == bad["feedback"]
    )
    assert turns[1]["error"] == "no_tool_call"


def test_time_limit_and_abort(start_server) -> None:
    with FakeInferenceServer(FakeConfig(model=MODEL, latency_s=0.3)) as fake:
        server = start_server(vllm_base_url=fake.base_url)
        with httpx.Client(base_url=server.base_url, timeout=60) as c:
            t0 = time.monotonic()
            out = rollout(
                c,
                env={"env_name": "crafter"},
                policy={"policy_name": "crafter-react"},
                max_turns=100,
                safety={"max_time_s": 1.0},
            )
            assert time.monotonic() - t0 < 10
            assert out["stop_reason"] == "time_limit" and out["aborted"] is True
            assert 1 <= len(out["trajectories"][0]["steps"]) < 100

            r = c.post(
                "/rollout/start",
                json={
                    "run_id": "long",
                    "env": {"env_name": "crafter"},
                    "policy": {"policy_name": "crafter-react"},
                    "max_turns": 1000,
                },
            )
            assert r.status_code == 202 and r.json()["status_url"] == "/run/status/long"
            deadline = time.monotonic() + 20
            while c.get("/run/status/long").json()["ops_executed"] < 2:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert c.post("/run/abort", json={"run_id": "long"}).json()["ok"] is True
            while (status := c.get("/run/status/long").json())["status"] == "running":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert status["status"] == "aborted"
            result = status["result"]
            assert result["aborted"] is True and result["stop_reason"] == "aborted"
            assert len(result["trajectories"][0]["steps"]) >= 1
            assert c.post("/run/abort", json={"run_id": "never"}).status_code == 404


def test_group_rollout_same_start_distinct_samples(client: httpx.Client) -> None:
    r = client.post(
        "/rollout/group",
        json={
            "group_size": 4,
            "env": {"env_name": "crafter", "seed": 9},
            "policy": {"policy_name": "crafter-random", "config": {"seed": 100}},
            "max_turns": 6,
        },
    )
    assert r.status_code == 200, r.text
    group = r.json()
    members = group["members"]
    assert [m["group_index"] for m in members] == [0, 1, 2, 3]
    firsts = [m["result"]["trajectories"][0]["steps"][0]["observation"] for m in members]
    assert all(f == firsts[0] for f in firsts)
    actions = [tuple(tuple(s["actions"]) for s in m["result"]["trajectories"][0]["steps"]) for m in members]
    assert len(set(actions)) > 1
    assert all(m["result"]["group_id"] == group["group_id"] for m in members)
    assert group["metrics"]["completed"] == 4 and len(group["metrics"]["returns"]) == 4


def test_group_from_snapshot_and_failed_member(start_server) -> None:
    with FakeInferenceServer(FakeConfig(model=MODEL, fault_script=["http_400"] * 0)) as fake:
        server = start_server(vllm_base_url=fake.base_url)
        with httpx.Client(base_url=server.base_url, timeout=60) as c:
            env_id = c.post("/env/create", json={"env_name": "crafter", "seed": 4}).json()["env_id"]
            c.post("/env/step", json={"env_id": env_id, "actions": ["move_left"] * 5})
            snap = c.post("/env/snapshot", json={"env_id": env_id}).json()["snapshot_id"]
            fake.set_config(FakeConfig(model=MODEL, fault_script=["no_tool_call"]))
            group = c.post(
                "/rollout/group",
                json={
                    "group_size": 3,
                    "env": {"snapshot_id": snap},
                    "policy": {"policy_name": "crafter-react", "config": {"on_invalid_reply": "end"}},
                    "max_turns": 2,
                },
            ).json()
            members = group["members"]
            assert len(members) == 3
            assert all(
                m["result"]["trajectories"][0]["steps"][0]["observation"]["step_idx"] == 5 for m in members
            )
            reasons = sorted(m["result"]["stop_reason"] for m in members)
            assert reasons == ["completed", "completed", "policy_error:no_tool_call"]


def test_branch_children_are_exact_copies(client: httpx.Client) -> None:
    env_id = client.post("/env/create", json={"env_name": "crafter", "seed": 8}).json()["env_id"]
    client.post("/env/step", json={"env_id": env_id, "actions": ["move_up", "do", "move_left"]})
    policy_id = client.post(
        "/policy/create",
        json={"policy_name": "crafter-random", "bound_env_id": env_id, "config": {"seed": 3}},
    ).json()["policy_id"]
    r = client.post("/branch", json={"env_ids": [env_id], "policy_ids": [policy_id], "num_children": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    kids = body["env_branches"][env_id]
    assert len(kids) == 3
    assert [c["bound_env_id"] for c in body["children"] if c["parent_id"] == policy_id] == kids
    parent_snapshot = body["children"][0]["parent_snapshot_id"]
    # The lineage snapshot is real: it restores.
    assert client.post("/env/restore", json={"snapshot_id": parent_snapshot}).status_code == 200
    steps = [client.post("/env/step", json={"env_id": k, "actions": ["do", "noop"]}).json() for k in kids]
    steps.append(client.post("/env/step", json={"env_id": env_id, "actions": ["do", "noop"]}).json())
    assert all({**s, "env_id": ""} == {**steps[0], "env_id": ""} for s in steps)
    r = client.post("/branch", json={"env_ids": [env_id], "num_children": 5, "max_branches": 2})
    assert r.status_code == 422


def test_policy_snapshot_restore_and_dry_run(client: httpx.Client) -> None:
    env = client.post("/env/create", json={"env_name": "crafter"}).json()
    pid = client.post(
        "/policy/create", json={"policy_name": "crafter-react", "bound_env_id": env["env_id"], "config": {}}
    ).json()["policy_id"]
    dry = client.post("/policy/step", json={"policy_id": pid, "dry_run": True}).json()
    req = dry["meta"]["inference_request"]
    assert dry["tool_calls"] == [] and req["parallel_tool_calls"] is False
    assert req["tool_choice"]["function"]["name"] == "interact_many"
    step = client.post("/policy/step", json={"policy_id": pid, "observation": env["observation"]}).json()
    assert step["tool_calls"] and step["error"] is None
    snap = client.post("/policy/snapshot", json={"policy_id": pid}).json()
    restored = client.post("/policy/restore", json={"snapshot_id": snap["snapshot_id"]}).json()
    assert restored["policy_id"] != pid and restored["parent_policy_id"] == pid
    assert client.post("/env/restore", json={"snapshot_id": snap["snapshot_id"]}).status_code == 404


def test_ops_validation(client: httpx.Client) -> None:
    base = {"env": {"env_name": "crafter"}, "policy": {"policy_name": "crafter-random"}}
    for body, needle in [
        ({**base, "ops": ["env"]}, "no 'agent'"),
        ({**base, "ops": ["agent", "env"] * 3, "safety": {"max_ops": 4}}, "max_ops"),
        ({**base}, "max_turns"),
        ({**base, "ops": ["agent", "walk"]}, "ops"),
        ({"env": {}, "policy": base["policy"], "max_turns": 1}, "exactly one"),
    ]:
        r = client.post("/rollout", json=body)
        assert r.status_code == 422 and needle in r.text, (body, r.text)
    assert client.get("/health").json()["envs"] == 0


def test_health_reports_trace_writer_counts(start_server, fake_llm, tmp_path) -> None:
    server = start_server(vllm_base_url=fake_llm.base_url, trace_db=tmp_path / "t.db")
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        assert c.get("/health").json()["tracing"]["written"] == 0
        rollout(c, env={"env_name": "crafter"}, policy={"policy_name": "crafter-random"}, max_turns=2)
        deadline = time.monotonic() + 10
        while c.get("/health").json()["tracing"]["written"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert c.get("/health").json()["tracing"]["dropped"] == 0


def test_blocking_runs_do_not_keep_their_result(client: httpx.Client) -> None:
    rollout(
        client,
        run_id="sync",
        env={"env_name": "crafter"},
        policy={"policy_name": "crafter-random"},
        max_turns=2,
    )
    status = client.get("/run/status/sync").json()
    assert status["status"] == "completed" and status["ops_executed"] == 4 and status["result"] is None
