"""A stream of GRPO groups (`/rollout/stream`): ordering, back-pressure, staleness (drop and
restart), a weight push mid-rollout, no starvation, bad input, the idle timeout and the typed
client's async iterator. Over real HTTP against the fake LLM (latency makes the groups overlap);
the same against real vLLM is in tests/test_vllm_service.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from grpo_service import create_app
from grpo_service.client.group_stream import GroupStreamClient
from grpo_service.client.task_app import AsyncTaskAppClient
from tests.conftest import make_settings
from tools.fake_server import FakeConfig, FakeInferenceServer
from tools.server_thread import ServerThread

LATENCY_S = 0.05


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    tmp: Path = tmp_path_factory.mktemp("stream")
    with FakeInferenceServer(FakeConfig(latency_s=LATENCY_S, vary_unseeded=True)) as fake:
        settings = make_settings(tmp, vllm_base_url=fake.base_url)
        with ServerThread(create_app(settings), name="task-app") as server:
            yield server


@pytest.fixture
def client(app: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=app.base_url, timeout=60) as c:
        yield c


def stream_body(**extra: Any) -> dict[str, Any]:
    return {
        "group": {
            "group_size": 2,
            "env": {"env_name": "crafter", "seed": 0},
            "policy": {"policy_name": "crafter-react", "config": {"temperature": 1.0}},
            "max_turns": 3,
            "record": {"logprobs": True},
        },
        **extra,
    }


def open_stream(client: httpx.Client, **extra: Any) -> str:
    r = client.post("/rollout/stream", json=stream_body(**extra))
    assert r.status_code == 201, r.text
    return r.json()["stream_id"]


def take(client: httpx.Client, stream_id: str, max_groups: int = 16, wait_s: float = 10.0) -> dict[str, Any]:
    r = client.post(f"/rollout/stream/{stream_id}/take", json={"max_groups": max_groups, "wait_s": wait_s})
    assert r.status_code == 200, r.text
    return r.json()


def take_all(client: httpx.Client, stream_id: str, count: int) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while len(groups) < count and time.monotonic() < deadline:
        groups += take(client, stream_id)["groups"]
    return groups


def info(client: httpx.Client, stream_id: str) -> dict[str, Any]:
    r = client.get(f"/rollout/stream/{stream_id}/status")
    assert r.status_code == 200, r.text
    return r.json()


def wait_until_sampling(client: httpx.Client, stream_id: str) -> None:
    """Until every running group of the stream has made LLM calls (played an op or more)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        runs, offset = [], 0
        while offset is not None:  # every page: a server that ran other tests lists more than one
            page = client.get("/run/list", params={"limit": 100, "offset": offset}).json()
            runs, offset = runs + page["runs"], page["next_offset"]
        running = [r for r in runs if r["kind"] == "group" and r["status"] == "running"]
        if running and all(r["ops_executed"] >= 2 for r in running):
            return
        time.sleep(0.05)
    raise AssertionError("the stream's groups never sampled")


def member_versions(member: dict[str, Any]) -> list[int]:
    return [
        s["llm"]["weights_version"]
        for t in member["result"]["trajectories"]
        for s in t["steps"]
        if s.get("llm")
    ]


def versions_of(taken: dict[str, Any]) -> list[int]:
    return [v for m in taken["group"]["members"] for v in member_versions(m)]


def test_back_pressure_bounds_the_groups_in_flight_and_they_arrive_in_completion_order(
    client: httpx.Client,
) -> None:
    sid = open_stream(client, in_flight=2, max_groups=5, seeds=[3, 4])
    time.sleep(1.0)  # the trainer takes nothing: the stream starts no more than 2
    state = info(client, sid)
    assert state["counters"]["started"] == 2
    assert state["counters"]["running"] + state["counters"]["ready"] == 2
    groups = take_all(client, sid, 5)
    assert sorted(g["index"] for g in groups) == [0, 1, 2, 3, 4]
    assert [g["seed"] for g in sorted(groups, key=lambda g: g["index"])] == [3, 4, 3, 4, 3]
    finished = [client.get(f"/run/status/{g['group']['group_id']}").json()["finished_at"] for g in groups]
    assert finished == sorted(finished)  # completion order
    last = take(client, sid, wait_s=0)
    assert last["done"] and last["info"]["status"] == "finished" and last["groups"] == []
    assert last["info"]["counters"]["delivered"] == 5 and last["info"]["staleness"] == {"0": 5}
    assert client.delete(f"/rollout/stream/{sid}").status_code == 200


def test_a_weight_push_mid_rollout_tags_each_span_and_does_not_drain_the_stream(client: httpx.Client) -> None:
    sid = open_stream(client, in_flight=2, max_staleness=1, group={**stream_body()["group"], "max_turns": 12})
    wait_until_sampling(client, sid)  # the groups are under way, sampled by version 0
    assert client.post(f"/rollout/stream/{sid}/version", json={"weights_version": 1}).status_code == 200
    groups = take_all(client, sid, 2)
    spanning = [g for g in groups if g["oldest_version"] == 0 and g["newest_version"] == 1]
    assert spanning, [(g["oldest_version"], g["newest_version"]) for g in groups]
    for g in spanning:
        assert set(versions_of(g)) == {0, 1}
        for member in g["group"]["members"]:
            seen = member_versions(member)
            assert seen == sorted(seen)  # each span its version, in order
        assert g["staleness"] == 1 and not g["over_staleness"]
        member = g["group"]["members"][0]["result"]
        assert member["metrics"]["weights_version"] == 0
    assert client.delete(f"/rollout/stream/{sid}").json()["counters"]["dropped_stale"] == 0


@pytest.mark.parametrize("policy", ["drop", "restart"])
def test_stale_groups_are_dropped_or_restarted_and_counted(client: httpx.Client, policy: str) -> None:
    sid = open_stream(
        client,
        in_flight=2,
        max_groups=2,
        max_staleness=0,
        stale_policy=policy,
        group={**stream_body()["group"], "max_turns": 12},
    )
    wait_until_sampling(client, sid)
    state = client.post(f"/rollout/stream/{sid}/version", json={"weights_version": 1}).json()
    counters = state["counters"]
    key = "dropped_stale" if policy == "drop" else "restarted_stale"
    assert counters[key] == 2 and counters["started"] == 4  # both replaced at once
    groups = take_all(client, sid, 2)
    assert len(groups) == 2
    for g in groups:
        assert g["oldest_version"] == 1 and g["staleness"] == 0 and set(versions_of(g)) == {1}
        assert g["attempt"] == (1 if policy == "restart" else 0)
    expected = [0, 1] if policy == "restart" else [2, 3]  # a restart replays its group's seed
    assert sorted(g["index"] for g in groups) == expected
    if policy == "restart":
        assert sorted(g["seed"] for g in groups) == [0, 1]
    client.delete(f"/rollout/stream/{sid}")


def test_slow_groups_are_not_starved_by_a_trainer_that_pushes_after_every_group(client: httpx.Client) -> None:
    """Each take is followed by a push, with max_staleness 0: a long group is restarted, and then
    no fresh group starts until it is done, so it finishes fresh (or, at worst, flagged)."""
    sid = open_stream(
        client,
        in_flight=3,
        max_groups=6,
        max_staleness=0,
        stale_policy="restart",
        seeds=[0, 1, 2, 3, 4, 5],
        group={**stream_body()["group"], "max_turns": 6},
    )
    version, groups = 0, []
    deadline = time.monotonic() + 90
    while len(groups) < 6 and time.monotonic() < deadline:
        batch = take(client, sid, max_groups=1)
        if batch["groups"]:
            groups += batch["groups"]
            version += 1
            client.post(f"/rollout/stream/{sid}/version", json={"weights_version": version})
    assert sorted(g["index"] for g in groups) == [0, 1, 2, 3, 4, 5]  # every group delivered once
    final = client.delete(f"/rollout/stream/{sid}").json()
    assert final["counters"]["restarted_stale"] >= 1
    assert all(not g["over_staleness"] for g in groups) or final["counters"]["delivered_over_staleness"] > 0


def test_bad_requests_are_4xx(client: httpx.Client) -> None:
    body = stream_body()
    assert client.post("/rollout/stream", json={**body, "in_flight": 0}).status_code == 422
    with_id = {**body, "group": {**body["group"], "group_id": "g1"}}
    assert "group_id" in client.post("/rollout/stream", json=with_id).text
    unknown = {**body, "group": {**body["group"], "env": {"env_name": "no-such-env", "seed": 0}}}
    assert client.post("/rollout/stream", json=unknown).status_code in (404, 422)
    assert client.post("/rollout/stream/nope/take", json={}).status_code == 404
    assert client.get("/rollout/stream/nope/status").json()["code"] == "stream_not_found"
    sid = open_stream(client, in_flight=1)
    assert client.post(f"/rollout/stream/{sid}/take", json={"wait_s": 61}).status_code == 422
    assert client.post(f"/rollout/stream/{sid}/version", json={"weights_version": 2}).status_code == 200
    backwards = client.post(f"/rollout/stream/{sid}/version", json={"weights_version": 1})
    assert backwards.status_code == 409 and backwards.json()["code"] == "version_backwards"
    assert client.delete(f"/rollout/stream/{sid}").json()["status"] == "closed"
    assert client.delete(f"/rollout/stream/{sid}").status_code == 404


def test_a_stream_whose_client_went_away_closes_itself_and_aborts_its_groups(client: httpx.Client) -> None:
    sid = open_stream(
        client, in_flight=2, idle_timeout_s=0.5, group={**stream_body()["group"], "max_turns": 50}
    )
    time.sleep(1.5)
    state = info(client, sid)
    assert state["status"] == "closed" and state["counters"]["running"] == 0
    runs = client.get("/run/list", params={"limit": 100}).json()["runs"]
    assert not [r for r in runs if r["kind"] == "group" and r["status"] == "running"]


def test_the_typed_client_iterates_the_stream(app: ServerThread) -> None:
    async def main() -> tuple[list[int], dict[str, Any]]:
        async with (
            AsyncTaskAppClient(app.base_url) as tac,
            GroupStreamClient(tac, stream_body(in_flight=2, max_groups=3), wait_s=5) as stream,
        ):
            indices, version = [], 0
            async for taken in stream:
                indices.append(taken.index)
                version += 1
                await stream.set_version(version)
            assert stream.info is not None
            return indices, stream.info.model_dump()

    indices, final = asyncio.run(main())
    assert sorted(indices) == [0, 1, 2]
    assert final["status"] == "finished" and final["weights_version"] == 3
