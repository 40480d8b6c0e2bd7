"""Served through Ray: a real cluster of two nodes on loopback, and what a lost node leaves working.

Two ``ray start`` nodes (one CPU each, so each holds one host), a ``grpo-service serve --ray``
front joined to them, envs on both hosts, a group spanning both; then node B's whole process
tree is killed while the group plays. Everything waits with a deadline; the nodes are killed
at the end whatever happens. About 40 s.
"""

from __future__ import annotations

import asyncio
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

from tests.conftest import Served
from tools.fake_server import FakeInferenceServer
from tools.ray_cluster import RayCluster

pytest.importorskip("ray")

RAY_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_USAGE_STATS_ENABLED")


def post(base: str, path: str, body: dict, timeout: float = 30) -> httpx.Response:
    return httpx.post(base + path, json=body, timeout=timeout)


def tag_of(some_id: str) -> str:
    return some_id.split("-", 1)[0]


def test_a_lost_node_answers_410_or_503_and_the_rest_keeps_working(
    serve: Callable[..., Served],
    fake_llm: FakeInferenceServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with RayCluster(tmp_path) as cluster:
        cluster.add_node("head", cpus=1, resources={"nodeA": 1})
        node_b = cluster.add_node("b", cpus=1, resources={"nodeB": 1})
        for key in RAY_ENV:
            monkeypatch.setenv(key, cluster.environ[key])
        served = serve("--ray", cluster.address, "--ray-hosts", "2", "--trace", "traces", wait_s=120)
        base = served.base_url
        health = httpx.get(base + "/health", timeout=10).json()
        assert health["workers"] == 2 and health["lost_hosts"] == []
        ((victim, victim_pid),) = node_b.pids_with_env("GRPO_INSTANCE_ID").items()  # the host on node B
        # A cluster the front joined: the hosts get a runtime env of their own, at its priority.
        assert psutil.Process(victim_pid).nice() == os.nice(0)

        envs: dict[str, list[str]] = {}
        for seed in range(4):  # placed in turn: two on each host
            r = post(base, "/env/create", {"env_name": "crafter", "seed": seed})
            assert r.status_code == 200, r.text
            envs.setdefault(tag_of(r.json()["env_id"]), []).append(r.json()["env_id"])
        assert len(envs) == 2 and victim in envs
        survivor = next(tag for tag in envs if tag != victim)
        on_b, on_a = envs[victim][0], envs[survivor][0]
        for env_id in (on_a, on_b):
            assert post(base, "/env/step", {"env_id": env_id, "action": "noop"}).status_code == 200
        snapshot = post(base, "/env/snapshot", {"env_id": on_b}).json()["snapshot_id"]
        reported = [f"traced-{i}" for i in range(6)]  # client-chosen ids: hashed over both hosts
        for run_id in reported:
            body = {"env": {"env_name": "crafter"}, "policy": {"policy_name": "crafter-random"}}
            r = post(base, "/rollout", {**body, "max_turns": 3, "run_id": run_id})
            assert r.status_code == 200, r.text
        assert httpx.get(base + "/run/status/traced-0", timeout=10).json()["status"] == "completed"

        # A group of 4 spans both hosts (two members each) and is playing when node B dies.
        original = fake_llm.state.config
        fake_llm.set_config(original.model_copy(update={"latency_s": 0.2}))
        group: list[httpx.Response] = []
        body = {
            "group_size": 4,
            "env": {"env_name": "crafter", "seed": 3},
            "policy": {"policy_name": "crafter-react", "config": {"inference_url": fake_llm.base_url}},
            "max_turns": 25,
        }
        player = threading.Thread(
            target=lambda: group.append(post(base, "/rollout/group", body, timeout=120))
        )
        try:
            player.start()
            time.sleep(2.0)
            node_b.kill()
            player.join(90)
        finally:
            fake_llm.set_config(original)
        assert not player.is_alive() and group[0].status_code == 200, group and group[0].text
        members = group[0].json()["members"]
        failed = [m for m in members if m["status"] == "failed"]
        assert len(failed) == 2 and all(victim in m["error"] for m in failed), members
        assert all(m["status"] == "completed" for m in members if m not in failed)

        # The lost host's envs answer 503 (unreachable), then 410 (known dead), naming it, fast.
        deadline = time.monotonic() + 30
        codes: list[int] = []
        while 410 not in codes:
            started = time.monotonic()
            r = post(base, "/env/step", {"env_id": on_b, "action": "noop"})
            assert time.monotonic() - started < 15
            assert r.status_code in (410, 503) and victim in r.json()["detail"], r.text
            codes.append(r.status_code)
            assert time.monotonic() < deadline, codes
            time.sleep(0.2)
        assert r.json()["code"] == "host_lost"

        # Everything else works: the survivor's envs, its snapshot restored there, new work.
        assert post(base, "/env/step", {"env_id": on_a, "action": "noop"}).status_code == 200
        restored = post(base, "/env/restore", {"snapshot_id": snapshot})
        assert restored.status_code == 200 and tag_of(restored.json()["env_id"]) == survivor, restored.text
        assert restored.json()["step_idx"] == 1
        again = post(base, "/rollout/group", {**body, "group_size": 2, "max_turns": 3}, timeout=60)
        assert again.status_code == 200 and again.json()["metrics"]["completed"] == 2, again.text
        health = httpx.get(base + "/health", timeout=10).json()
        assert health["workers"] == 1 and health["lost_hosts"] == [victim]
        listed = httpx.get(base + "/env/list", timeout=10).json()
        assert {tag_of(e["env_id"]) for e in listed["envs"]} == {survivor}

        os.killpg(served.proc.pid, signal.SIGTERM)  # uvicorn drains, then exits by the signal
        assert served.proc.wait(60) in (0, -signal.SIGTERM)
        assert "Application shutdown complete" in served.log.read_text()
    # No rollout reported before the loss is missing from the trace DB.
    (db,) = (tmp_path / "traces").glob("*.db")
    with sqlite3.connect(db) as conn:
        runs = {row[0] for row in conn.execute("SELECT run_id FROM sessions")}
    assert set(reported) <= runs
    assert sum(1 for run in runs if run.startswith(tag_of(group[0].json()["group_id"]))) >= 2


def test_work_is_split_evenly_and_limits_are_shared_out() -> None:
    from grpo_service.cluster.cluster import share
    from grpo_service.cluster.router import _split

    assert _split(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
    assert _split([7], 1) == [[7]]
    assert [share(10_000, i, 3) for i in range(3)] == [3334, 3333, 3333]
    assert [share(3, i, 2) for i in range(2)] == [2, 1]
    assert [share(1, i, 2) for i in range(2)] == [1, 1]  # at least one each


def test_steps_sent_in_one_turn_go_to_their_host_in_one_call() -> None:
    """`StepBatcher`, with a stand-in for the cluster's actor calls: what arrives for a host in
    one event-loop turn is one call, a lone step goes as a plain request, and a host's failure
    is every waiting request's."""
    from grpo_service.cluster.cluster import HostRef
    from grpo_service.cluster.step_batcher import StepBatcher
    from grpo_service.errors import HostLost

    calls: list[tuple[str, str, int]] = []

    class Calls:
        lost: set[str] = set()

        async def call(self, host: HostRef, method: str, *args: object) -> object:
            await asyncio.sleep(0)
            if host.tag in self.lost:
                raise HostLost(f"host {host.tag} is lost")
            batch = args[0] if method == "requests" else [args]
            calls.append((host.tag, method, len(batch)))
            answers = [(200, [], f"{host.tag}:{body.decode()}".encode()) for *_, body in batch]
            return answers if method == "requests" else answers[0]

    def step(n: int) -> tuple[str, str, bytes, list[tuple[bytes, bytes]], bytes]:
        return ("POST", "/env/step", b"", [], str(n).encode())

    async def run() -> None:
        cluster = Calls()
        batcher = StepBatcher(cluster)  # type: ignore[arg-type]
        a, b = HostRef("a", None), HostRef("b", None)
        answers = await asyncio.gather(*(batcher.request(a if n % 3 else b, step(n)) for n in range(7)))
        assert [body for _, _, body in answers] == [
            f"{'a' if n % 3 else 'b'}:{n}".encode() for n in range(7)
        ]  # each its own, in order
        assert sorted(calls) == [("a", "requests", 4), ("b", "requests", 3)]
        calls.clear()
        assert (await batcher.request(a, step(9)))[2] == b"a:9"
        assert calls == [("a", "request", 1)]
        cluster.lost.add("a")
        failed = await asyncio.gather(
            *(batcher.request(a, step(n)) for n in range(3)), return_exceptions=True
        )
        assert all(isinstance(f, HostLost) for f in failed)

    asyncio.run(run())


def test_hosts_run_at_the_fronts_priority(ray_local: None, tmp_path: Path) -> None:
    """Ray starts its workers at nice 15; the hosts serve every request, so they run at the
    front's own niceness (below it, they waited behind the front for a core: seconds a step). A
    cluster started as a front starts one has every worker at that priority, and the hosts take
    prestarted workers, with no runtime env of their own; on a joined cluster the lost-node test
    checks the runtime env's."""
    import ray

    from grpo_service import create_app
    from tests.conftest import served_settings
    from tools.server_thread import ServerThread

    settings = served_settings(tmp_path, "ray")
    front = ServerThread(create_app(settings), name="front-nice").start(timeout_s=60)
    try:
        hosts = [
            ray.get_actor(a["name"], namespace=settings.ray_namespace)
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == settings.ray_namespace and a["name"].startswith("grpo-host-")
        ]
        assert len(hosts) == 2
        for host in hosts:
            pid = ray.get(host.start.remote(), timeout=30)["pid"]
            assert psutil.Process(pid).nice() == os.nice(0)
            assert "GRPO_INSTANCE_ID" not in psutil.Process(pid).environ()
    finally:
        front.stop()


def test_two_fronts_serve_one_cluster_s_hosts(ray_local: None, tmp_path: Path) -> None:
    """A second front in the same namespace finds the first one's hosts through Ray (no table of
    its own): ids made through one front are served by the other, and listings agree."""
    import ray

    from grpo_service import create_app
    from tests.conftest import served_settings
    from tools.server_thread import ServerThread

    first = served_settings(tmp_path / "a", "ray", ray_keep_hosts=True)
    second = first.model_copy(update={"state_dir": tmp_path / "b" / "state", "ray_keep_hosts": False})
    a = ServerThread(create_app(first), name="front-a").start(timeout_s=60)
    try:
        b = ServerThread(create_app(second), name="front-b").start(timeout_s=60)
        try:
            env = post(a.base_url, "/env/create", {"env_name": "crafter", "seed": 4}).json()["env_id"]
            stepped = post(b.base_url, "/env/step", {"env_id": env, "action": "noop"})
            assert stepped.status_code == 200 and stepped.json()["observation"]["step_idx"] == 1
            for base in (a.base_url, b.base_url):
                health = httpx.get(base + "/health", timeout=10).json()
                assert health["workers"] == 2 and health["envs"] == 1
                listed = httpx.get(base + "/env/list", timeout=10).json()
                assert [e["env_id"] for e in listed["envs"]] == [env]
        finally:
            b.stop()
        assert post(a.base_url, "/env/step", {"env_id": env, "action": "noop"}).status_code == 200
    finally:
        a.stop()
        for actor in ray.util.list_named_actors(all_namespaces=True):  # kept hosts: ours to end
            if actor["namespace"] == first.ray_namespace:
                ray.kill(ray.get_actor(actor["name"], namespace=first.ray_namespace))


def test_a_background_group_is_spread_and_its_status_joins_the_shares(
    ray_local: None, tmp_path: Path
) -> None:
    from grpo_service import create_app
    from tests.conftest import served_settings
    from tools.server_thread import ServerThread

    body = {
        "group_size": 4,
        "env": {"env_name": "crafter", "seed": 5},
        "policy": {"policy_name": "crafter-random", "config": {"seed": 1}},
        "max_turns": 4,
    }
    with ServerThread(create_app(served_settings(tmp_path, "ray")), name="front").start(
        timeout_s=60
    ) as front:
        started = post(front.base_url, "/rollout/group/start", body)
        assert started.status_code == 202, started.text
        group_id = started.json()["run_id"]
        deadline = time.monotonic() + 60
        while True:
            status = httpx.get(f"{front.base_url}/run/status/{group_id}", timeout=10).json()
            if status["status"] != "running":
                break
            assert time.monotonic() < deadline, status
            time.sleep(0.1)
        assert status["status"] == "completed" and status["ops_executed"] == status["ops_total"] == 4 * 8
        assert [m["group_index"] for m in status["members"]] == [0, 1, 2, 3]
        result = status["result"]
        assert [m["run_id"] for m in result["members"]] == [f"{group_id}.{i}" for i in range(4)]
        assert result["metrics"]["completed"] == 4 and len(result["metrics"]["returns"]) == 4
        member = httpx.get(f"{front.base_url}/run/status/{group_id}.3", timeout=10).json()
        assert member["status"] == "completed"  # a member is found on whichever host ran it
        blocking = post(front.base_url, "/rollout/group", body).json()  # the same seeds, the same play
        assert blocking["metrics"]["returns"] == result["metrics"]["returns"]


def test_a_background_group_reports_every_member_when_a_host_is_lost(
    ray_local: None, tmp_path: Path, fake_llm: FakeInferenceServer
) -> None:
    """A host killed while a background group plays: ``/run/status`` still reports all 8
    members, the lost host's 4 `failed` with ``host_lost``, as the blocking group reports them.
    Then the other host is killed: ``/health`` answers 503 `unavailable` with 0 workers."""
    import ray

    from grpo_service import create_app
    from tests.conftest import served_settings
    from tools.server_thread import ServerThread

    settings = served_settings(tmp_path, "ray")
    body = {
        "group_size": 8,
        "env": {"env_name": "crafter", "seed": 5},
        "policy": {"policy_name": "crafter-react", "config": {"inference_url": fake_llm.base_url}},
        "max_turns": 20,
    }
    original = fake_llm.state.config
    fake_llm.set_config(original.model_copy(update={"latency_s": 0.2}))
    try:
        with ServerThread(create_app(settings), name="front").start(timeout_s=60) as front:
            started = post(front.base_url, "/rollout/group/start", body)
            assert started.status_code == 202, started.text
            group_id = started.json()["run_id"]
            hosts = [
                a["name"]
                for a in ray.util.list_named_actors(all_namespaces=True)
                if a["namespace"] == settings.ray_namespace and a["name"].startswith("grpo-host-")
            ]
            victim = next(name for name in hosts if not name.endswith(tag_of(group_id)))
            time.sleep(1.0)
            ray.kill(ray.get_actor(victim, namespace=settings.ray_namespace))
            deadline = time.monotonic() + 90
            while True:
                r = httpx.get(f"{front.base_url}/run/status/{group_id}", timeout=30)
                assert r.status_code in (200, 503), r.text  # 503: the killed host not yet known lost
                if r.status_code == 200 and r.json()["status"] != "running":
                    break
                assert time.monotonic() < deadline, r.text
                time.sleep(0.2)
            health = httpx.get(f"{front.base_url}/health", timeout=30)
            assert health.status_code == 200 and health.json()["workers"] == 1
            # The last host lost too: every call would be a 503, and so is /health.
            (survivor,) = (name for name in hosts if name != victim)
            ray.kill(ray.get_actor(survivor, namespace=settings.ray_namespace))
            health = httpx.get(f"{front.base_url}/health", timeout=30)
            assert health.status_code == 503, health.text
            assert health.json()["status"] == "unavailable" and health.json()["workers"] == 0
    finally:
        fake_llm.set_config(original)
    status = r.json()
    assert status["status"] == "completed" and status["members_total"] == 8
    assert [m["group_index"] for m in status["members"]] == list(range(8))
    members = status["result"]["members"]
    failed = [m for m in members if m["status"] == "failed"]
    assert len(members) == 8 and len(failed) == 4, members
    assert all("host_lost" in m["error"] and victim.removeprefix("grpo-host-") in m["error"] for m in failed)
    assert status["result"]["metrics"]["completed"] == 4 and status["result"]["metrics"]["failed"] == 4
    assert len(status["result"]["metrics"]["returns"]) == 8


def test_a_stream_of_groups_lives_on_one_host_and_is_reached_through_the_front(
    ray_local: None, tmp_path: Path
) -> None:
    """The stream's id carries its host's tag: take, version and close go to that host."""
    from grpo_service import create_app
    from tests.conftest import served_settings
    from tools.server_thread import ServerThread

    body = {
        "group": {
            "group_size": 2,
            "env": {"env_name": "crafter", "seed": 5},
            "policy": {"policy_name": "crafter-random", "config": {"seed": 1}},
            "max_turns": 3,
        },
        "in_flight": 2,
        "max_groups": 4,
    }
    with ServerThread(create_app(served_settings(tmp_path, "ray")), name="front").start(
        timeout_s=60
    ) as front:
        opened = post(front.base_url, "/rollout/stream", body)
        assert opened.status_code == 201, opened.text
        sid = opened.json()["stream_id"]
        base = f"{front.base_url}/rollout/stream/{sid}"
        assert post(base, "/version", {"weights_version": 1}).json()["weights_version"] == 1
        groups: list[dict] = []
        deadline = time.monotonic() + 60
        while len(groups) < 4 and time.monotonic() < deadline:
            taken = post(base, "/take", {"max_groups": 4, "wait_s": 5}).json()
            groups += taken["groups"]
        assert sorted(g["index"] for g in groups) == [0, 1, 2, 3]
        assert {tag_of(g["group"]["group_id"]) for g in groups} == {tag_of(sid)}  # played on its host
        assert taken["info"]["status"] == "finished"
        assert httpx.delete(base, timeout=10).json()["counters"]["delivered"] == 4
        assert httpx.get(base + "/status", timeout=10).status_code == 404
