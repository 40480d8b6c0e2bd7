"""``POST /rollouts`` (seed 003's batch) against the vLLM-shaped fake, with a real trace DB."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tools.fake_server import FakeConfig, FakeInferenceServer
from tools.server_thread import ServerThread

pytestmark = pytest.mark.through_ray  # through Ray, the ids are spread over two hosts


def batch(client: httpx.Client, llm: FakeInferenceServer, **fields: object) -> httpx.Response:
    body = {"env": "crafter", "model": "fake-qwen3", "base_url": llm.base_url, "ids": [0, 1], "max_round": 2}
    return client.post("/rollouts", json={**body, **fields})


def traced_sessions(db: Path, expected: int, deadline_s: float = 10.0) -> list[tuple]:
    stop = time.monotonic() + deadline_s
    while True:
        with sqlite3.connect(db) as conn:
            rows = conn.execute("SELECT env_name, seed, run_id, num_turns FROM sessions").fetchall()
        if len(rows) >= expected or time.monotonic() > stop:
            return rows
        time.sleep(0.1)


def test_seed_request_returns_one_result_per_id_in_order_and_traces_each(
    start_server: Callable[..., ServerThread], fake_llm: FakeInferenceServer, tmp_path: Path
) -> None:
    db = tmp_path / "traces.db"
    server = start_server(trace_db=db)
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        r = batch(client, fake_llm, ids=[3, 1, 2], max_round=2)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [res["id"] for res in body["results"]] == [3, 1, 2]
    assert body["completed"] == 3 and body["failed"] == 0
    for res in body["results"]:
        assert res["error"] is None and res["rounds"] == 2 and isinstance(res["score"], float)
        roles = [m["role"] for m in res["conversation"]]
        assert roles[:2] == ["system", "user"] and roles.count("assistant") == 2
        assert len(res["turns"]) == 2
        assert all(
            t["completion_token_ids"] and len(t["completion_logprobs"]) == len(t["completion_token_ids"])
            for t in res["turns"]
        )
    rows = traced_sessions(db, 3)
    assert sorted((env, seed) for env, seed, _, _ in rows) == [("crafter", 1), ("crafter", 2), ("crafter", 3)]
    assert {run for _, _, run, _ in rows} == {res["run_id"] for res in body["results"]}


def test_bad_input_names_the_valid_range(client: httpx.Client, fake_llm: FakeInferenceServer) -> None:
    r = batch(client, fake_llm, env="webshop")
    assert r.status_code == 422 and "valid: " in r.json()["detail"] and "crafter" in r.json()["detail"]
    r = batch(client, fake_llm, max_round=0)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "max_round"]
    r = batch(client, fake_llm, ids=[])
    assert r.status_code == 422
    r = batch(client, fake_llm, ids=[-1])
    assert r.status_code == 422
    r = batch(client, fake_llm, policy_config={"prompt_format": "nope"})
    assert r.status_code == 422
    r = batch(client, fake_llm, surprise=1)
    assert r.status_code == 422


def test_an_unreachable_or_wrong_model_server_is_a_422(
    client: httpx.Client, fake_llm: FakeInferenceServer
) -> None:
    r = batch(client, fake_llm, base_url="http://127.0.0.1:9")
    assert r.status_code == 422 and r.json()["code"] == "inference_unreachable", r.text
    r = batch(client, fake_llm, model="no-such-model")
    assert r.status_code == 422 and "fake-qwen3" in r.json()["detail"], r.text
    r = batch(client, fake_llm, temperature=True)
    assert r.status_code == 422


def test_a_failing_id_does_not_sink_the_batch(client: httpx.Client, fake_llm: FakeInferenceServer) -> None:
    # One rollout at a time: id 0's model call succeeds, id 1's fails on every attempt.
    fake_llm.set_config(FakeConfig(model="fake-qwen3", fault_script=["ok"] + ["http_500"] * 10))
    try:
        r = batch(client, fake_llm, ids=[0, 1], max_round=1, concurrency=1, policy_config={"timeout_s": 5})
    finally:
        fake_llm.set_config(FakeConfig(model="fake-qwen3"))
    assert r.status_code == 200, r.text
    first, second = r.json()["results"]
    assert (first["id"], first["stop_reason"]) == (0, "completed")
    assert second["id"] == 1 and second["stop_reason"].startswith("policy_error:inference")


def test_a_batch_over_the_turn_budget_is_refused_whole(
    start_server: Callable[..., ServerThread], fake_llm: FakeInferenceServer
) -> None:
    # Through Ray the front splits the ids (3 + 3 turns × 2 rounds would fit each host): it checks the whole.
    server = start_server(max_request_turns=10)
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        r = batch(client, fake_llm, ids=list(range(6)), max_round=2)
        assert r.status_code == 422 and r.json()["code"] == "too_many_turns", r.text
        assert "(6 ids × max_round 2) may play up to 12 turns" in r.json()["detail"]
        assert batch(client, fake_llm, ids=list(range(5)), max_round=2).json()["completed"] == 5
