"""Figures measured through a running task-app server (the load generator runs here)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from envs.crafter.actions import ACTIONS as ACTION_NAMES
from tools.bench.http import HTTPError, RawClient
from tools.bench.procs import HOST


def _port(base_url: str) -> int:
    return int(base_url.rsplit(":", 1)[1])


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


async def create_env(client: RawClient, seed: int) -> str:
    body = await client.post_json("/env/create", {"env_name": "crafter", "seed": seed})
    return body["env_id"]


async def warm_worlds(base_url: str, seeds: list[int], episodes: int = 1, *, hosts: int = 1) -> None:
    """Generate (and cache in every host of the server) the worlds of the first ``episodes``
    episodes of ``seeds``, outside any timing: a rollout that dies and resets then finds its
    next world cached, as a trainer replaying its seeds would. Through Ray, ``hosts`` envs of a
    seed alive at once are placed one per host. World generation has its own figure."""
    async with await RawClient(HOST, _port(base_url)).connect() as client:
        for seed in seeds:
            env_ids = [await create_env(client, seed) for _ in range(hosts)]
            for env_id in env_ids:
                for _ in range(episodes - 1):
                    await client.post_json("/env/reset", {"env_id": env_id})
                await client.post_json("/env/terminate", {"env_id": env_id})


# ------------------------------------------------------------------------------ /env/step


async def http_steps_per_s(base_url: str, clients: int, seconds: float, seed: int) -> float:
    """``clients`` keep-alive connections, each stepping its own env with one random action per
    request (``{"env_id", "action"}``; the full response with the text observation is read and
    parsed). A finished episode is reset to the same seed (not counted). Steps completed in the
    window / window. Through Ray, the clients' envs are spread over the hosts."""
    conns = [await RawClient(HOST, _port(base_url)).connect() for _ in range(clients)]
    env_ids = [await create_env(conns[i], seed) for i in range(clients)]
    count = 0
    stop = False

    async def drive(i: int) -> None:
        nonlocal count
        rng = random.Random(seed * 1000 + i)
        conn, env_id = conns[i], env_ids[i]
        prefix = b'{"env_id":"' + env_id.encode() + b'","action":"'
        while not stop:
            status, data = await conn.request(
                "POST", "/env/step", prefix + rng.choice(ACTION_NAMES).encode() + b'"}'
            )
            if status != 200:
                raise RuntimeError(f"/env/step answered {status}: {data[:200]!r}")
            count += 1
            if b'"done":true' in data:  # same seed again: a cached world, as in the in-process figure
                await conn.post_json("/env/reset", {"env_id": env_id, "seed": seed})

    tasks = [asyncio.create_task(drive(i)) for i in range(clients)]
    try:
        await asyncio.sleep(min(0.5, seconds / 4))  # warm-up
        start_count, t0 = count, time.perf_counter()
        await asyncio.sleep(seconds)
        done_count, t1 = count, time.perf_counter()
        for t in tasks:
            if t.done() and t.exception():
                raise t.exception()  # type: ignore[misc]
    finally:
        stop = True
        await asyncio.gather(*tasks, return_exceptions=True)
        for conn, env_id in zip(conns, env_ids, strict=True):
            await conn.post_json("/env/terminate", {"env_id": env_id})
            await conn.close()
    return (done_count - start_count) / (t1 - t0)


# --------------------------------------------------------------------------- /rollout/group


@dataclass
class GroupRun:
    steps: int
    decisions: int
    wall_s: float
    failed: int
    stop_reasons: dict[str, int]
    member_wall_s: float = 0.0  # summed over members: each member's own wall time
    member_llm_s: float = 0.0  # summed over members: time in LLM calls (sent to reply handled)

    @property
    def turn_ms(self) -> float:
        """A member's mean wall time per decision."""
        return self.member_wall_s / max(1, self.decisions) * 1000.0

    @property
    def call_ms(self) -> float:
        """A member's mean time per LLM call, from sending it to its reply being handled."""
        return self.member_llm_s / max(1, self.decisions) * 1000.0

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.wall_s

    @property
    def decisions_per_s(self) -> float:
        return self.decisions / self.wall_s


async def rollout_groups(
    base_url: str,
    *,
    inference_url: str,
    rollouts: int,
    group_size: int,
    turns: int,
    seeds: list[int],
    on_done: str,
) -> GroupRun:
    """``rollouts // group_size`` concurrent ``/rollout/group`` requests (one connection each,
    default recording: trajectories with observations), the crafter-react policy against the
    fake at ``inference_url``. Wall time runs from the first request to the last response.
    Through Ray, each group's members are spread over the hosts."""
    groups = rollouts // group_size
    conns = [await RawClient(HOST, _port(base_url)).connect() for _ in range(groups)]

    async def one(i: int) -> tuple[bytes, float]:
        body = {
            "group_size": group_size,
            "env": {"env_name": "crafter", "seed": seeds[i % len(seeds)]},
            "policy": {
                "policy_name": "crafter-react",
                "config": {"inference_url": inference_url, "seed": i},
            },
            "max_turns": turns,
            "on_done": on_done,
            "safety": {"max_time_s": 600},
        }
        status, data = await conns[i].request("POST", "/rollout/group", json.dumps(body).encode())
        if status != 200:
            raise HTTPError(status, data)
        return data, time.perf_counter()

    try:
        t0 = time.perf_counter()
        answers = await asyncio.gather(*(one(i) for i in range(groups)))
    finally:
        for conn in conns:
            await conn.close()
    # The clock stops when the last answer has arrived; parsing a group's answer (about 1 MB
    # for 16 x 30 turns) is the load generator's work, and is done after the timing.
    wall = max(done for _, done in answers) - t0
    results = [json.loads(data) for data, _ in answers]
    steps = decisions = failed = 0
    member_wall = member_llm = 0.0
    reasons: dict[str, int] = {}
    for group in results:
        for member in group["members"]:
            result = member.get("result")
            if member["status"] == "failed" or result is None:
                failed += 1
                reasons["failed"] = reasons.get("failed", 0) + 1
                continue
            steps += result["metrics"]["num_steps"]
            decisions += result["metrics"]["num_decisions"]
            member_wall += result["metrics"]["wall_time_s"]
            member_llm += result["metrics"]["llm_time_s"]
            reasons[result["stop_reason"]] = reasons.get(result["stop_reason"], 0) + 1
    return GroupRun(steps, decisions, wall, failed, reasons, member_wall, member_llm)


# ------------------------------------------------------------------ snapshots and branching


async def _stepped_env(client: RawClient, seed: int, steps: int) -> str:
    env_id = await create_env(client, seed)
    rng = random.Random(seed)
    for _ in range(steps):
        body = await client.post_json("/env/step", {"env_id": env_id, "action": rng.choice(ACTION_NAMES)})
        if body["done"]:
            await client.post_json("/env/reset", {"env_id": env_id})
    return env_id


async def snapshot_restore(base_url: str, count: int, seed: int) -> dict[str, float]:
    """Sequential ``/env/snapshot`` then ``/env/restore`` of an env 100 random steps in.

    Sizes are the stored snapshot (compressed state + signed envelope) in bytes."""
    async with RawClient(HOST, _port(base_url)) as client:
        env_id = await _stepped_env(client, seed, 100)
        snap_ms, restore_ms, sizes = [], [], []
        for _ in range(count):
            t0 = time.perf_counter()
            snap = await client.post_json("/env/snapshot", {"env_id": env_id})
            t1 = time.perf_counter()
            restored = await client.post_json("/env/restore", {"snapshot_id": snap["snapshot_id"]})
            t2 = time.perf_counter()
            await client.post_json("/env/terminate", {"env_id": restored["env_id"]})
            snap_ms.append((t1 - t0) * 1000)
            restore_ms.append((t2 - t1) * 1000)
            sizes.append(snap["size"])
        await client.post_json("/env/terminate", {"env_id": env_id})
    return {
        "snapshot_p50_ms": _percentile(snap_ms, 0.5),
        "snapshot_p99_ms": _percentile(snap_ms, 0.99),
        "restore_p50_ms": _percentile(restore_ms, 0.5),
        "restore_p99_ms": _percentile(restore_ms, 0.99),
        "snapshot_bytes": _percentile([float(s) for s in sizes], 0.5),
    }


async def branch16(base_url: str, count: int, seed: int, children: int = 16) -> dict[str, float]:
    """Sequential ``/branch`` of one live env into ``children`` (snapshot stored + copies)."""
    async with RawClient(HOST, _port(base_url)) as client:
        env_id = await _stepped_env(client, seed, 100)
        times = []
        for _ in range(count):
            t0 = time.perf_counter()
            body = await client.post_json("/branch", {"env_ids": [env_id], "num_children": children})
            times.append((time.perf_counter() - t0) * 1000)
            for kid in body["env_branches"][env_id]:
                await client.post_json("/env/terminate", {"env_id": kid})
        await client.post_json("/env/terminate", {"env_id": env_id})
    return {"branch16_p50_ms": _percentile(times, 0.5), "branch16_p99_ms": _percentile(times, 0.99)}


async def fork_group(
    base_url: str,
    inference_url: str,
    rss_bytes: Callable[[], int],
    seed: int,
    *,
    roots: int = 4,
    turns: int = 8,
    continuations: int = 4,
) -> dict[str, float]:
    """One forking ``/rollout/group`` (started, then polled): ``roots`` Crafter roots forked at every
    turn into ``continuations`` copies, against the fake at ``inference_url``. Forks and copies
    per second of the group's fork work (``tree.fork_s``: reading the states, restoring and
    registering the copies), and the server's RSS growth per member alive, sampled while it plays
    (the most members alive at once)."""
    body = {
        "group_size": roots,
        "env": {"env_name": "crafter", "seed": seed},
        "policy": {"policy_name": "crafter-react", "config": {"inference_url": inference_url}},
        "max_turns": turns,
        "fork": {"every": 1, "continuations": continuations},
        "record": {"logprobs": False},
        "safety": {"max_time_s": 600},
    }
    async with RawClient(HOST, _port(base_url)) as client:
        before = rss_bytes()
        started = await client.post_json("/rollout/group/start", body)
        live_peak, growth_at_peak = 0, 0
        while (status := await client.get_json(started["status_url"]))["status"] == "running":
            live = sum(1 for m in status["members"] if m["status"] == "running" and m["ops_executed"] > 0)
            if live > live_peak:
                live_peak, growth_at_peak = live, rss_bytes() - before
            await asyncio.sleep(0.02)
    tree = status["result"]["tree"]
    forks = len(tree["forks"])
    copies = sum(len(f["children"]) for f in tree["forks"])
    return {
        "forks_per_s": forks / tree["fork_s"] if tree["fork_s"] else 0.0,
        "fork_copies_per_s": copies / tree["fork_s"] if tree["fork_s"] else 0.0,
        "rss_per_live_fork_kb": growth_at_peak / live_peak / 1024 if live_peak else 0.0,
    }


async def create_many(base_url: str, count: int, seeds: list[int], clients: int = 8) -> list[str]:
    port = _port(base_url)
    ids: list[str] = []

    async def worker(w: int) -> None:
        async with RawClient(HOST, port) as client:
            for i in range(w, count, clients):
                ids.append(await create_env(client, seeds[i % len(seeds)]))

    await asyncio.gather(*(worker(w) for w in range(clients)))
    return ids


# ------------------------------------------------------------------- the fake LLM on its own


def crafter_request_body(model: str) -> bytes:
    """A real crafter-react chat request (system prompt, tool schema, first observation)."""

    from envs.base import PolicyContext
    from envs.crafter.env import CrafterConfig, CrafterEnv
    from envs.crafter.policy import CrafterReActConfig, CrafterReActPolicy

    observation = CrafterEnv(CrafterConfig(), 101).reset().observation
    context = PolicyContext(inference_url="http://127.0.0.1:9", model=model)
    request = CrafterReActPolicy(CrafterReActConfig(), context).build_request(observation)
    return json.dumps(request).encode()


async def fake_alone(base_url: str, body: bytes, concurrency: int, calls_each: int) -> float:
    """Requests/s the fake LLM sustains with ``concurrency`` clients doing nothing else: the
    ceiling the service is measured against in practice (the fake needs CPU too)."""
    port = _port(base_url)
    conns = [await RawClient(HOST, port).connect() for _ in range(concurrency)]

    async def loop(conn: RawClient) -> None:
        for _ in range(calls_each):
            status, data = await conn.request("POST", "/v1/chat/completions", body)
            if status != 200:
                raise RuntimeError(f"fake answered {status}: {data[:200]!r}")

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(loop(c) for c in conns))
        wall = time.perf_counter() - t0
    finally:
        for conn in conns:
            await conn.close()
    return concurrency * calls_each / wall
