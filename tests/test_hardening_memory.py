"""What one request can make the server hold, and admission under concurrency.

- A request that may play more turns (members × turns, continuations included; a batch's
  ids × max_round) than ``MAX_REQUEST_TURNS`` is refused up front with a 422 naming the numbers.
- Finished background results are kept as JSON within ``MAX_FINISHED_RESULT_BYTES``: the oldest
  are dropped (the run stays listed, ``result_evicted``), measured on the bodies of /run/status.
- What is admitted is held: concurrent groups, fork trees and batches on a table too small for
  all of them are each admitted whole (every member plays) or refused up front with 429.

One in-process task app for the module, with ``MAX_ENVS`` and ``MAX_POLICIES`` of 20, and a fake
LLM answering in 50 ms (so that concurrent requests overlap); crafter-random needs no LLM.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from grpo_service import create_app
from grpo_service.models import RolloutStep
from tests.conftest import MODEL, make_settings
from tests.hardening import assert_error, counts
from tools.fake_server import FakeConfig, FakeInferenceServer
from tools.server_thread import ServerThread

TURN_BUDGET = 100
RESULT_BYTES = 200_000
SLOTS = 20  # MAX_ENVS and MAX_POLICIES


@pytest.fixture(scope="module")
def llm() -> Iterator[FakeInferenceServer]:
    with FakeInferenceServer(FakeConfig(model=MODEL, latency_s=0.05)) as fake:
        yield fake


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, llm: FakeInferenceServer) -> Iterator[httpx.Client]:
    tmp: Path = tmp_path_factory.mktemp("memory")
    settings = make_settings(
        tmp,
        vllm_base_url=llm.base_url,
        max_request_turns=TURN_BUDGET,
        max_finished_result_bytes=RESULT_BYTES,
        max_envs=SLOTS,
        max_policies=SLOTS,
    )
    with (
        ServerThread(create_app(settings), name="task-app") as server,
        httpx.Client(base_url=server.base_url, timeout=120) as c,
    ):
        yield c


def group(size: int, turns: int, **extra: Any) -> dict[str, Any]:
    return {
        "group_size": size,
        "env": {"env_name": "crafter", "seed": 3},
        "policy": {"policy_name": "crafter-random", "config": {"seed": 0}},
        "max_turns": turns,
        **extra,
    }


def poll(client: httpx.Client, run_id: str) -> httpx.Response:
    deadline = time.monotonic() + 60
    while (r := client.get(f"/run/status/{run_id}")).json()["status"] == "running":
        assert time.monotonic() < deadline, r.text[:300]
        time.sleep(0.05)
    return r


def test_a_request_over_the_turn_budget_is_refused_up_front_naming_the_numbers(client: httpx.Client) -> None:
    before = counts(client)
    single = {"env": {"env_name": "crafter"}, "policy": {"policy_name": "crafter-random"}}
    for path in ("/rollout", "/rollout/start"):
        body = assert_error(client.post(path, json={**single, "max_turns": 101}), 422, "too_many_turns")
        assert "up to 101 turns" in body["detail"] and "MAX_REQUEST_TURNS is 100" in body["detail"]
    for path in ("/rollout/group", "/rollout/group/start"):
        body = assert_error(client.post(path, json=group(4, 26)), 422, "too_many_turns")
        assert "(4 members × 26 turns) may play up to 104 turns" in body["detail"], body
    # A fork tree counts its continuations' turns: 2 × (20 + 2 × (15 + 10 + 5)) = 160.
    tree = group(2, 20, fork={"every": 5, "continuations": 2})
    body = assert_error(client.post("/rollout/group", json=tree), 422, "too_many_turns")
    assert "fork tree (2 roots × 20 turns and up to 12 continuations) may play up to 160" in body["detail"]
    batch = {"env": "textcraft", "model": "m", "base_url": "http://127.0.0.1:9", "ids": list(range(11))}
    body = assert_error(client.post("/rollouts", json={**batch, "max_round": 10}), 422, "too_many_turns")
    assert "(11 ids × max_round 10) may play up to 110 turns" in body["detail"]
    assert counts(client) == before
    # At the budget it plays: max_ops caps the turns too (50 turns asked, 30 at most).
    assert client.post("/rollout/group", json=group(4, 25)).status_code == 200
    capped = {**single, "max_turns": 1_000, "safety": {"max_ops": 60}}
    assert client.post("/rollout", json=capped).json()["metrics"]["num_decisions"] == 30
    assert client.get("/info").json()["limits"]["max_request_turns"] == TURN_BUDGET


def live_steps() -> int:
    """Step records alive in this process (the task app runs in a thread of it)."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is RolloutStep)


def test_finished_background_results_are_kept_within_their_byte_budget(client: httpx.Client) -> None:
    """Three background groups of about 90 KB of JSON each and a 200 KB budget: the oldest result
    is dropped, the two newest are answered whole, and what the server keeps (measured as the
    result bodies /run/status answers) stays under the budget; no step object of theirs is alive."""
    steps_alive = live_steps()
    ids = []
    for i in range(3):
        started = client.post("/rollout/group/start", json=group(4, 10, group_id=f"kept-{i}"))
        assert started.status_code == 202, started.text
        poll(client, started.json()["run_id"])  # one after another: the first finishes first
        ids.append(started.json()["run_id"])
    answers = [client.get(f"/run/status/{run_id}") for run_id in ids]
    oldest, *newest = (a.json() for a in answers)
    assert oldest["status"] == "completed" and oldest["result"] is None and oldest["result_evicted"]
    assert len(answers[0].content) < 2_000  # its status, progress and members: no result
    kept = [len(a.content) - len(answers[0].content) for a in answers[1:]]
    assert all(size > 60_000 for size in kept) and sum(kept) <= RESULT_BYTES, kept
    for status in newest:
        assert not status["result_evicted"] and len(status["result"]["members"]) == 4
        assert all(len(m["result"]["trajectories"][0]["steps"]) == 10 for m in status["result"]["members"])
    # Nothing else of them is alive: not the response objects (a finished task's return value).
    assert live_steps() == steps_alive
    # Dropped one by one, oldest first, as new results arrive; the runs stay listed.
    listed = {r["run_id"] for r in client.get("/run/list?limit=500").json()["runs"]}
    assert set(ids) <= listed


def react_group(size: int, **extra: Any) -> dict[str, Any]:
    return group(size, 4, policy={"policy_name": "crafter-react"}, record={"logprobs": True}, **extra)


async def concurrently(base_url: str, calls: list[tuple[str, dict[str, Any]]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as c:
        return list(await asyncio.gather(*(c.post(path, json=body) for path, body in calls)))


REFUSED_TOGETHER = {
    # Three trees of 2 roots × (1 + 5 continuations) = 12 members each: 36 > 20 slots.
    "fork trees": [("/rollout/group", react_group(2, fork={"at_turns": [1], "continuations": 5}))] * 3,
    "rule trees": [("/rollout/group", react_group(2, fork={"rule": "max_entropy", "continuations": 5}))] * 3,
    "background trees": [("/rollout/group/start", react_group(2, fork={"every": 2, "continuations": 5}))] * 3,
    "groups": [("/rollout/group", react_group(12))] * 2,
    "background groups": [("/rollout/group/start", react_group(12))] * 2,
}


@pytest.mark.parametrize("calls", REFUSED_TOGETHER.values(), ids=REFUSED_TOGETHER.keys())
def test_concurrent_groups_and_trees_are_each_admitted_whole_or_refused_429(
    client: httpx.Client, calls: list[tuple[str, dict[str, Any]]]
) -> None:
    answers = asyncio.run(concurrently(str(client.base_url), calls))
    admitted = [a for a in answers if a.status_code in (200, 202)]
    refused = [a for a in answers if a.status_code == 429]
    assert len(admitted) == 1 and len(refused) == len(calls) - 1, [a.text[:300] for a in answers]
    for answer in refused:
        body = assert_error(answer, 429)
        assert answer.headers["retry-after"] == "1" and "of MAX_ENVS 20 are free" in body["detail"], body
    played = admitted[0].json()
    if admitted[0].status_code == 202:  # its members' statuses (its result may be over RESULT_BYTES)
        played = poll(client, played["run_id"]).json()
    assert {m["status"] for m in played["members"]} == {"completed"}, played["members"]
    assert counts(client) == {"envs": 0, "policies": 0, "runs_active": 0}
    # Every held slot came back: the whole table serves one request again.
    assert client.post("/rollout/group", json=group(SLOTS, 2)).status_code == 200


def test_a_batch_holds_the_slots_of_its_rollouts_in_flight(
    client: httpx.Client, llm: FakeInferenceServer
) -> None:
    batch = {"env": "textcraft", "model": MODEL, "base_url": llm.base_url, "max_round": 2}
    # Two batches of 12 at once on 20 slots: one plays every id, the other is refused up front.
    calls = [("/rollouts", {**batch, "ids": list(range(12)), "concurrency": 12})] * 2
    answers = asyncio.run(concurrently(str(client.base_url), calls))
    assert sorted(a.status_code for a in answers) == [200, 429], [a.text[:300] for a in answers]
    played = next(a for a in answers if a.status_code == 200).json()
    assert played["failed"] == 0 and played["completed"] == 12
    refused = assert_error(next(a for a in answers if a.status_code == 429), 429)
    assert "the batch (12 rollouts at once) needs 12 env slots" in refused["detail"], refused
    # 12 ids, 4 at a time: 4 slots held for the whole batch and reused, beside a group of 12.
    calls = [
        ("/rollouts", {**batch, "ids": list(range(12)), "concurrency": 4}),
        ("/rollout/group", react_group(12)),
    ]
    many, beside = asyncio.run(concurrently(str(client.base_url), calls))
    assert many.status_code == 200 and many.json()["completed"] == 12, many.text[:500]
    assert beside.status_code == 200 and beside.json()["metrics"]["failed"] == 0
    assert counts(client) == {"envs": 0, "policies": 0, "runs_active": 0}


def test_an_rl_job_whose_groups_the_task_app_would_refuse_fails_at_once(client: httpx.Client) -> None:
    """The task app's budget, read from /info before the model is loaded: 8 × 20 turns > 100."""
    from grpo_service.training_api.llm_jobs import train_rl_job
    from training.llm.config import RLConfig

    config = RLConfig(task_app_url=str(client.base_url), group_size=8, max_turns=20, model="/nonexistent")
    with pytest.raises(ValueError, match=r"up to 160 turns \(group_size 8 × max_turns 20\).*more than 100"):
        train_rl_job(config)
