"""Leaks: create/terminate cycles and abandoned envs and policies must leave live counts at zero
and the server's memory flat (AgentGym#62: an env server leaked instances until it ran out of
memory; OpenEnv#1000: leaked sessions until every new episode failed). The bulk runs through
the service objects directly (HTTP would dominate the time); a real-HTTP slice drives the same
paths and the real reaper task. RSS is read in this process, which hosts the server."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from grpo_service.api.services import Services
from grpo_service.app import build_services, reap_idle
from tests.conftest import MODEL, make_settings
from tests.hardening import counts, rss_mb
from tools.fake_server import FakeConfig, FakeInferenceServer
from tools.server_thread import ServerThread

pytestmark = [pytest.mark.slow, pytest.mark.through_ray]

CYCLES = 4_000
ABANDONED = 1_000
# One live env holds about 45 KB here: leaked whole, the cycles' envs would pass this 7 times over.
# The allocator's noise, 6 to 8 MB whatever the count of cycles (2,000 to 20,000), stays under it.
RSS_BOUND_MB = 24.0
# Objects the garbage collector tracks, grown over the cycles: 48 after 2,000, 4,000 or 8,000
# cycles. A leak of one Python object every ten cycles passes this.
OBJECTS_BOUND = CYCLES // 10
WIDTH = 16  # operations in flight at once


async def batched(n: int, op: Callable[[int], Awaitable[Any]]) -> list[Any]:
    out: list[Any] = []
    for start in range(0, n, WIDTH):
        out += await asyncio.gather(*(op(i) for i in range(start, min(n, start + WIDTH))))
    return out


def live(services: Services) -> dict[str, int]:
    return services.registry.counts()


def settled_rss() -> float:
    gc.collect()
    return rss_mb()


def test_create_terminate_cycles_leave_nothing(tmp_path: Path) -> None:
    """RSS is the whole process's, so the cycles run in a fresh interpreter: what earlier tests
    left in this one (a JVM bridge's threads, job watchers, torch's allocator) must not count."""
    code = (
        "import asyncio, pathlib, tests.test_hardening_leaks as t; "
        f"asyncio.run(t.create_terminate_cycles_leave_nothing(pathlib.Path({str(tmp_path)!r})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=280,
    )
    print(result.stdout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


async def create_terminate_cycles_leave_nothing(tmp_path: Path) -> None:
    services = build_services(make_settings(tmp_path))

    async def cycle(i: int) -> None:
        env = await services.envs.create("crafter", None, i % 4, "default")
        policy = await services.policies.create("crafter-random", {"seed": i}, "default", bound_env_id=env.id)
        await services.envs.step_handle(env, ["noop"])
        assert await services.policies.terminate(policy.id) and await services.envs.terminate(env.id)

    await batched(1_000, cycle)  # warm-up: world cache, thread pool, allocator arenas
    rss0, threads0, fds0 = settled_rss(), threading.active_count(), psutil.Process().num_fds()
    objects0 = len(gc.get_objects())  # after settled_rss's collection
    t0 = time.perf_counter()
    await batched(CYCLES, cycle)
    elapsed = time.perf_counter() - t0
    growth = settled_rss() - rss0
    objects = len(gc.get_objects()) - objects0
    print(f"{CYCLES} cycles in {elapsed:.1f} s: RSS {growth:+.1f} MB, {objects:+d} objects")
    assert live(services) == {"envs": 0, "policies": 0, "runs_active": 0, "snapshots": 0}
    assert growth < RSS_BOUND_MB and objects < OBJECTS_BOUND
    assert threading.active_count() <= threads0 + 2 and psutil.Process().num_fds() <= fds0 + 4


async def test_abandoned_envs_and_policies_are_reaped_and_their_memory_reused(tmp_path: Path) -> None:
    services = build_services(make_settings(tmp_path, idle_ttl_s=0.05))

    async def abandon(i: int) -> weakref.ref:
        env = await services.envs.create("crafter", None, i % 4, "default")
        await services.policies.create("crafter-random", None, "default", bound_env_id=env.id)
        return weakref.ref(env.env)

    rounds = []
    for _ in range(2):
        refs = await batched(ABANDONED, abandon)
        assert live(services)["envs"] == ABANDONED and live(services)["policies"] == ABANDONED
        await asyncio.sleep(0.1)
        assert await reap_idle(services) == 2 * ABANDONED
        assert live(services)["envs"] == 0 and live(services)["policies"] == 0
        gc.collect()
        assert not any(ref() is not None for ref in refs), "a reaped env is still referenced"
        rounds.append(settled_rss())
    print(f"{ABANDONED} abandoned envs + policies per round: RSS {rounds[1] - rounds[0]:+.1f} MB in round 2")
    assert rounds[1] - rounds[0] < RSS_BOUND_MB / 2  # the first round's memory was freed and reused


def test_http_cycles_and_rollouts_leave_nothing(start_server: Callable[..., ServerThread]) -> None:
    server = start_server()
    rollout = {"env": {"env_name": "crafter", "seed": 1}, "policy": {"policy_name": "crafter-random"}}

    def cycle(client: httpx.Client, i: int) -> None:
        env = client.post("/env/create", json={"env_name": "crafter", "seed": i % 4}).json()["env_id"]
        assert client.post("/env/step", json={"env_id": env, "action": "noop"}).status_code == 200
        assert client.post("/env/terminate", json={"env_id": env}).json()["existed"] is True
        assert client.post("/rollout", json={**rollout, "max_turns": 2}).json()["status"] == "completed"

    def run(n: int) -> None:
        with httpx.Client(base_url=server.base_url, timeout=60) as client, ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda i: cycle(client, i), range(n)))

    run(100)
    rss0 = settled_rss()
    run(500)
    growth = settled_rss() - rss0
    print(f"500 HTTP create/step/terminate + rollout cycles: RSS {growth:+.1f} MB")
    with httpx.Client(base_url=server.base_url) as client:
        assert counts(client) == {"envs": 0, "policies": 0, "runs_active": 0}
    assert growth < RSS_BOUND_MB


def test_the_reaper_task_clears_abandoned_state(start_server: Callable[..., ServerThread]) -> None:
    ttl_s = 3.0
    server = start_server(idle_ttl_s=ttl_s, reaper_interval_s=0.2)
    with httpx.Client(base_url=server.base_url, timeout=60) as client, ThreadPoolExecutor(4) as pool:

        def abandon(i: int) -> None:
            env = client.post("/env/create", json={"env_name": "crafter", "seed": i % 4}).json()["env_id"]
            client.post("/policy/create", json={"policy_name": "crafter-random", "bound_env_id": env})

        started = time.monotonic()
        list(pool.map(abandon, range(200)))
        if time.monotonic() - started < ttl_s / 2:  # on a loaded machine some may already be reaped
            assert counts(client)["envs"] == 200 and counts(client)["policies"] == 200
        deadline = time.monotonic() + ttl_s + 3.0  # TTL + a few reaper passes
        while counts(client)["envs"] or counts(client)["policies"]:
            assert time.monotonic() < deadline, counts(client)
            time.sleep(0.1)
        assert client.post("/env/create", json={"env_name": "crafter"}).status_code == 200


def test_the_reaper_spares_what_running_rollouts_use(start_server: Callable[..., ServerThread]) -> None:
    """An LLM call longer than the idle TTL must not cost the rollout its env (it used to: the
    reaper terminated the env mid-rollout and the whole rollout failed with a 404)."""
    with FakeInferenceServer(FakeConfig(model=MODEL, latency_s=0.3)) as slow:
        server = start_server(vllm_base_url=slow.base_url, idle_ttl_s=0.1, reaper_interval_s=0.02)
        react = {"policy_name": "crafter-react"}
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            out = client.post(
                "/rollout", json={"env": {"env_name": "crafter"}, "policy": react, "max_turns": 3}
            )
            assert out.status_code == 200 and out.json()["stop_reason"] == "completed", out.text[:300]
            group = {"group_size": 3, "env": {"env_name": "crafter"}, "policy": react, "max_turns": 3}
            members = client.post("/rollout/group", json=group).json()["members"]
            assert [m["status"] for m in members] == ["completed"] * 3, members
            # An env handed to a rollout is pinned only while the rollout runs.
            env = client.post("/env/create", json={"env_name": "crafter"}).json()["env_id"]
            body = {"env": {"env_id": env}, "policy": react, "max_turns": 2}
            assert client.post("/rollout", json=body).json()["stop_reason"] == "completed"
            time.sleep(0.3)
            assert counts(client)["envs"] == 0
