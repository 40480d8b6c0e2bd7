"""`serve --workers N`: one port, N processes, requests forwarded to the worker that owns an id.

Real `grpo-service serve` subprocesses on 127.0.0.1; every request below opens a fresh
connection (``httpx.post`` without a client), so the kernel picks a worker for each one and
forwarding is exercised, not avoided.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest

from grpo_service.serving.peers import PeerForwarder, WorkerLoads
from tests.conftest import Served
from tools.fake_server import FakeInferenceServer

TAG_A, TAG_B = "0a0a0a0a", "0b0b0b0b"
HEX = "0123456789abcdef" * 2


def post(base_url: str, path: str, body: dict, timeout: float = 60) -> httpx.Response:
    return httpx.post(base_url + path, json=body, timeout=timeout)


def instance_of(some_id: str) -> str:
    return some_id.split("-", 1)[0]


def create_on_each_worker(base_url: str, workers: int) -> dict[str, str]:
    """An env on every worker: {instance: env_id} (fresh connections land on random workers)."""
    envs: dict[str, str] = {}
    for seed in range(200):
        if len(envs) == workers:
            return envs
        r = post(base_url, "/env/create", {"env_name": "crafter", "seed": seed})
        assert r.status_code == 200, r.text
        env_id = r.json()["env_id"]
        if instance_of(env_id) in envs:
            post(base_url, "/env/terminate", {"env_id": env_id})
        else:
            envs[instance_of(env_id)] = env_id
    raise AssertionError(f"reached only {len(envs)} of {workers} workers")


def worker_pids(served: Served) -> list[int]:
    return [
        p.pid
        for p in psutil.Process(served.proc.pid).children()
        if "grpo_service.serving.workers" in p.cmdline()
    ]


@pytest.fixture
def two_workers(serve: Callable[..., Served]) -> Served:
    return serve("--workers", "2", "--trace", "traces")


def test_every_request_reaches_the_owner_of_its_ids(two_workers: Served) -> None:
    base = two_workers.base_url
    health = [httpx.get(base + "/health", timeout=5).json() for _ in range(40)]
    assert {h["workers"] for h in health} == {2}
    assert len({h["instance"] for h in health}) == 2  # both workers accept on the one port

    envs = create_on_each_worker(base, 2)
    for env_id in envs.values():
        for i in range(6):  # fresh connections: about half land on the other worker
            r = post(base, "/env/step", {"env_id": env_id, "action": "noop"})
            assert r.status_code == 200, r.text
            assert r.json()["observation"]["step_idx"] == i + 1  # one env, stepped in order
    a, b = envs.values()

    # A snapshot is stored on disk: any worker restores it (its new env belongs to that worker).
    snap = post(base, "/env/snapshot", {"env_id": a}).json()
    restored = post(base, "/env/restore", {"snapshot_id": snap["snapshot_id"]}).json()
    state = post(base, "/env/step", {"env_id": restored["env_id"], "action": "noop"}).json()
    assert state["observation"]["step_idx"] == 7

    # A background rollout on a live env runs in the env's worker; polls find it from anywhere.
    started = post(
        base,
        "/rollout/start",
        {"env": {"env_id": b}, "policy": {"policy_name": "crafter-random"}, "max_turns": 5},
    )
    assert started.status_code == 202, started.text
    run_id = started.json()["run_id"]
    assert instance_of(run_id) == instance_of(b)
    deadline = time.monotonic() + 30
    while True:
        status = httpx.get(base + f"/run/status/{run_id}", timeout=10)
        assert status.status_code == 200, status.text
        if status.json()["status"] != "running":
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert status.json()["status"] == "completed"

    # Ids of two workers in one request: a clear 421 naming the foreign id, nothing created.
    r = post(base, "/branch", {"env_ids": [a, b], "num_children": 2})
    assert r.status_code == 421, r.text
    assert r.json()["code"] == "wrong_instance"
    assert a in r.json()["detail"] or b in r.json()["detail"]
    counts = [httpx.get(base + "/health", timeout=5).json()["envs"] for _ in range(20)]
    assert max(counts) <= 3  # a, b and the restored env: no branch children anywhere

    # An id of no worker of this server (another replica) is not forwarded: 421 as before.
    r = post(base, "/env/step", {"env_id": f"{'f' * 8}-{HEX}", "action": "noop"})
    assert r.status_code == 421 and r.json()["code"] == "wrong_instance"
    for env_id in (*envs.values(), restored["env_id"]):
        assert post(base, "/env/terminate", {"env_id": env_id}).json()["ok"] is True


def test_new_groups_are_placed_on_the_least_loaded_worker(
    two_workers: Served, fake_llm: FakeInferenceServer
) -> None:
    """Two groups sent on connections to the *same* worker still run on different workers."""
    base = two_workers.base_url
    clients = [
        httpx.Client(base_url=base, timeout=60, limits=httpx.Limits(max_connections=1)) for _ in range(40)
    ]
    try:
        by_worker: dict[str, list[httpx.Client]] = {}
        for client in clients:
            by_worker.setdefault(client.get("/health").json()["instance"], []).append(client)
        first, second = next(c for c in by_worker.values() if len(c) >= 2)[:2]
        original = fake_llm.state.config
        fake_llm.set_config(original.model_copy(update={"latency_s": 0.05}))
        body = {
            "group_size": 4,
            "env": {"env_name": "crafter", "seed": 3},
            "policy": {"policy_name": "crafter-react", "config": {"inference_url": fake_llm.base_url}},
            "max_turns": 10,
        }
        results: list[httpx.Response] = []
        threads = [
            threading.Thread(target=lambda c=c: results.append(c.post("/rollout/group", json=body)))
            for c in (first, second)
        ]
        threads[0].start()
        time.sleep(0.2)  # the first group is running when the second arrives
        threads[1].start()
        for t in threads:
            t.join(60)
    finally:
        fake_llm.set_config(original)
        for client in clients:
            client.close()
    assert [r.status_code for r in results] == [200, 200], [r.text for r in results]
    tags = {instance_of(r.json()["group_id"]) for r in results}
    assert len(tags) == 2  # one group per worker
    for r in results:
        assert all(m["status"] == "completed" for m in r.json()["members"])


def test_a_dead_worker_is_restarted_and_the_server_stops_cleanly(two_workers: Served, tmp_path: Path) -> None:
    base = two_workers.base_url
    envs = create_on_each_worker(base, 2)
    pids = worker_pids(two_workers)
    assert len(pids) == 2
    victim_tag, victim_env = next(iter(envs.items()))
    victim = next(pid for pid in pids if psutil.Process(pid).environ().get("GRPO_INSTANCE_ID") == victim_tag)
    os.kill(victim, signal.SIGKILL)
    # Until it is back, its ids answer 503 (forwarded, nobody home) or 404 (restarted, empty).
    seen: set[int] = set()
    deadline = time.monotonic() + 30
    while 404 not in seen:
        r = post(base, "/env/step", {"env_id": victim_env, "action": "noop"})
        assert r.status_code in (404, 503), r.text
        assert r.json()["code"] in ("env_not_found", "worker_unavailable")
        seen.add(r.status_code)
        assert time.monotonic() < deadline, "the worker was not restarted"
        time.sleep(0.05)
    survivor_env = next(e for tag, e in envs.items() if tag != victim_tag)
    assert post(base, "/env/step", {"env_id": survivor_env, "action": "noop"}).status_code == 200
    assert len(worker_pids(two_workers)) == 2

    # Rollouts from both workers land in the one trace file; SIGTERM stops everything.
    for i in range(4):
        r = post(
            base,
            "/rollout",
            {
                "env": {"env_name": "crafter"},
                "policy": {"policy_name": "crafter-random"},
                "max_turns": 3,
                "run_id": f"traced-{i}",
            },
        )
        assert r.status_code == 200, r.text
    pids = worker_pids(two_workers)
    os.kill(two_workers.proc.pid, signal.SIGTERM)
    assert two_workers.proc.wait(30) == 0
    assert not [
        pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    ]
    (db,) = (tmp_path / "traces").glob("*.db")
    with sqlite3.connect(db) as conn:
        runs = {row[0] for row in conn.execute("SELECT run_id FROM sessions")}
    assert {f"traced-{i}" for i in range(4)} <= runs


def test_a_worker_that_keeps_dying_stops_the_server(serve: Callable[..., Served], tmp_path: Path) -> None:
    served = serve("--workers", "2")
    state = tmp_path / "state"  # the env file's STATE_DIR: a file there fails every worker start
    state.rename(tmp_path / "state-moved")
    state.write_text("not a directory")
    for pid in worker_pids(served):
        os.kill(pid, signal.SIGKILL)
    assert served.proc.wait(120) == 1
    assert "stopping the server" in served.log.read_text()


def test_peer_routing_rules() -> None:
    forwarder = PeerForwarder(TAG_A, {TAG_A: "http://127.0.0.1:1", TAG_B: "http://127.0.0.1:2/"}, 5.0)
    own, other = f"{TAG_A}-{HEX}", f"{TAG_B}-{HEX}"
    assert forwarder.peers == {TAG_B: "http://127.0.0.1:2"}
    assert forwarder.owner("/env/step", f'{{"env_id": "{other}"}}'.encode()) == TAG_B
    assert forwarder.owner(f"/run/status/{other}.3", b"") == TAG_B  # a group member's run id
    assert forwarder.owner("/env/step", f'{{"env_id": "{own}"}}'.encode()) is None  # mine
    assert forwarder.owner("/branch", f'{{"env_ids": ["{own}", "{other}"]}}'.encode()) is None  # mixed
    assert forwarder.owner("/env/step", f'{{"env_id": "{"c" * 8}-{HEX}"}}'.encode()) is None  # not ours
    assert forwarder.owner("/env/step", f'{{"note": "x{other}"}}'.encode()) is None  # not a whole string


def test_worker_loads_prefer_this_worker_on_a_tie(tmp_path: Path) -> None:
    path = tmp_path / "loads"
    WorkerLoads.create(path, 2)
    mine, theirs = WorkerLoads(path, 0, 2), WorkerLoads(path, 1, 2)
    assert mine.least_loaded() == 0 and theirs.least_loaded() == 1
    mine.add(0, 16)
    assert mine.least_loaded() == 1 and theirs.least_loaded() == 1
    theirs.add(1, 16)
    theirs.add(0, 4)  # worker 1 placed a group on worker 0
    assert (mine.load(0), mine.load(1)) == (20, 16)
    assert mine.least_loaded() == 1
    mine.add(0, -16)
    assert mine.least_loaded() == 0
    restarted = WorkerLoads(path, 1, 2)  # a restarted worker's old placements are gone
    assert (restarted.load(0), restarted.load(1)) == (0, 0)
    for loads in (mine, theirs, restarted):
        loads.close()


def test_workers_setting_and_reload_do_not_mix(tmp_path: Path) -> None:
    from grpo_service.config import Settings
    from grpo_service.serving.server import serve as serve_settings
    from grpo_service.serving.workers import cpu_count, resolve_workers

    assert resolve_workers(0) == cpu_count() >= 1
    assert resolve_workers(3) == 3
    settings = Settings(_env_file=None, workers=2, state_dir=tmp_path)  # type: ignore[call-arg]
    with pytest.raises(SystemExit, match="--reload serves one process"):
        serve_settings(settings, reload=True)
