"""The environments' figures: steps/s in-process, over HTTP and over OpenEnv's WebSocket, snapshot
costs, and the oracle
baselines' success rates (TextCraft's recipe planner, minigrid's BabyAI bot, SciWorld's gold
paths), each played through the service's own API. Printed by ``grpo-service bench`` after
the service figures; ``grpo-service bench --envs-only`` runs these alone.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from envs import environment_class
from envs.base import Environment


@dataclass(frozen=True)
class EnvPlan:
    seconds: float  # per steps/s figure
    textcraft_tasks: int
    babyai_tasks: int
    sciworld_tasks: int  # first variation of this many task types


ENV_PLANS = {
    "smoke": EnvPlan(0.3, 20, 2, 1),  # the bot plays a BabyAI level for seconds: two levels
    "quick": EnvPlan(2.0, 544, 80, 6),
    "full": EnvPlan(5.0, 544, 400, 23),
}

_SCIWORLD_ACTIONS = [
    "look around",
    "inventory",
    "open door to kitchen",
    "go to kitchen",
    "go to hallway",
    "wait1",
]
_TEXTCRAFT_ACTIONS = [
    "inventory",
    "get 1 oak logs",
    "craft 4 oak planks using 1 oak logs",
    "get 2 iron ingot",
]


def _action_picker(name: str, rng: random.Random) -> Callable[[dict[str, Any]], Any]:
    if name == "crafter":
        from envs.crafter.actions import ACTIONS

        return lambda obs: rng.choice(ACTIONS)
    if name == "babyai":
        return lambda obs: rng.choice(obs["available_actions"])
    if name == "sciworld":
        return lambda obs: rng.choice(_SCIWORLD_ACTIONS)
    return lambda obs: rng.choice(_TEXTCRAFT_ACTIONS)


def steps_per_second_inproc(name: str, seconds: float, seed: int = 1) -> float:
    """Single-action steps/s of one env in this process (resets on episode end not counted)."""
    env = environment_class(name).create({}, seed)
    pick = _action_picker(name, random.Random(seed))
    result = env.reset()
    steps, spent = 0, 0.0
    while spent < seconds:
        action = pick(result.observation)
        t0 = time.perf_counter()
        result = env.step([action])
        spent += time.perf_counter() - t0
        steps += 1
        if result.done:
            result = env.reset()
    env.close()
    return steps / spent


def steps_per_second_http(client: httpx.Client, name: str, seconds: float, seed: int = 1) -> float:
    """Sequential ``/env/step`` calls of one action per second, one client."""
    body = client.post("/env/create", json={"env_name": name, "seed": seed}).json()
    env_id, observation = body["env_id"], body["observation"]
    pick = _action_picker(name, random.Random(seed))
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        r = client.post("/env/step", json={"env_id": env_id, "action": pick(observation)}).json()
        observation = r["observation"]
        steps += 1
        if r["done"]:
            observation = client.post("/env/reset", json={"env_id": env_id}).json()["observation"]
    elapsed = time.perf_counter() - started
    client.post("/env/terminate", json={"env_id": env_id})
    return steps / elapsed


def steps_per_second_openenv(base_url: str, name: str, seconds: float, seed: int = 1) -> float:
    """Sequential ``step`` frames over one OpenEnv WebSocket (``/openenv/<env>/ws``), one action
    per frame: the frames OpenEnv's client sends, on one connection."""
    from websockets.sync.client import connect

    url = base_url.replace("http", "ws", 1) + f"/openenv/{name}/ws"
    with connect(url, open_timeout=600, max_size=None) as ws:

        def ask(frame: dict[str, Any]) -> dict[str, Any]:
            ws.send(json.dumps(frame))
            reply = json.loads(ws.recv(timeout=600))
            if reply["type"] == "error":
                raise RuntimeError(f"OpenEnv error frame: {reply['data']}")
            return reply["data"]

        observation = ask({"type": "reset", "data": {"seed": seed}})["observation"]
        pick = _action_picker(name, random.Random(seed))
        steps, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            data = ask({"type": "step", "data": {"action": pick(observation)}})
            observation = data["observation"]
            steps += 1
            if data["done"]:
                observation = ask({"type": "reset"})["observation"]
        elapsed = time.perf_counter() - started
    return steps / elapsed


def oracle_success(client: httpx.Client, name: str, seeds: list[int], max_turns: int) -> dict[str, Any]:
    """The ``oracle`` policy's success rate through ``/rollout/group`` (one member per task)."""
    successes, scores, turns = 0, [], []
    for seed in seeds:
        r = client.post(
            "/rollout",
            json={
                "env": {"env_name": name, "seed": seed, "config": {"oracle": True}},
                "policy": {"policy_name": "oracle"},
                "max_turns": max_turns,
                "on_done": "terminate",
                "record": {"observations": False},
            },
        )
        r.raise_for_status()
        steps = r.json()["trajectories"][0]["steps"]
        info = steps[-1]["info"] if steps and steps[-1]["info"] else {}
        successes += bool(info.get("success"))
        scores.append(float(info.get("score", 0.0)))
        turns.append(len(steps))
    return {
        "tasks": len(seeds),
        "success_rate": round(successes / len(seeds), 4),
        "mean_score": round(statistics.fmean(scores), 3),
        "mean_turns": round(statistics.fmean(turns), 1),
    }


def restore_costs(name: str, seed: int, steps: int) -> dict[str, float]:
    """Snapshot size and the ms of ``get_state``, ``from_state``, and the first step after a
    restore (which is where SciWorld replays its history) vs a step on the live env."""
    cls = environment_class(name)
    env: Environment = cls.create({}, seed)
    result = env.reset()
    pick = _action_picker(name, random.Random(seed))
    for _ in range(steps):
        if result.done:
            break
        result = env.step([pick(result.observation)])
    t0 = time.perf_counter()
    state = env.get_state()
    t1 = time.perf_counter()
    copy = cls.from_state(state)
    t2 = time.perf_counter()
    action = pick(result.observation)
    copy.step([action])
    t3 = time.perf_counter()
    env.step([action])
    t4 = time.perf_counter()
    return {
        "history_steps": env.step_idx - 1,
        "snapshot_bytes": len(state),
        "get_state_ms": round((t1 - t0) * 1000, 3),
        "from_state_ms": round((t2 - t1) * 1000, 3),
        "first_step_after_restore_ms": round((t3 - t2) * 1000, 2),
        "live_step_ms": round((t4 - t3) * 1000, 2),
    }


def run_env_bench(mode: str, log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    from grpo_service import Settings, create_app
    from tools.server_thread import ServerThread

    plan = ENV_PLANS[mode]
    report: dict[str, Any] = {"mode": mode, "steps_per_s": {}, "restore": {}, "oracle": {}}
    names = ["crafter", "textcraft", "babyai", "sciworld"]
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(_env_file=None, state_dir=Path(tmp) / "state", snapshot_secret="b" * 40)
        server = ServerThread(create_app(settings), name="bench-envs").start()
        try:
            with httpx.Client(base_url=server.base_url, timeout=600) as client:
                for name in names:
                    log(f"envs: {name} steps/s")
                    if name == "sciworld":  # start the JVM outside the timing
                        environment_class(name).create({}, 0).reset()
                    report["steps_per_s"][name] = {
                        "in_process": round(steps_per_second_inproc(name, plan.seconds), 1),
                        "http": round(steps_per_second_http(client, name, plan.seconds), 1),
                        "openenv": round(steps_per_second_openenv(server.base_url, name, plan.seconds), 1),
                    }
                    report["restore"][name] = restore_costs(name, 1, 20)
                log("envs: oracle baselines")
                report["oracle"]["textcraft"] = oracle_success(
                    client, "textcraft", list(range(plan.textcraft_tasks)), 60
                )
                report["oracle"]["babyai"] = oracle_success(
                    client, "babyai", list(range(plan.babyai_tasks)), 400
                )
                from envs.sciworld.tasks import TASKS

                firsts = [i for i, t in enumerate(TASKS) if t.variation == 0][: plan.sciworld_tasks]
                report["oracle"]["sciworld"] = oracle_success(client, "sciworld", firsts, 100)
        finally:
            server.stop()
    return report


def render(report: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    table = Table(title=f"environments ({report['mode']})")
    columns = (
        "env",
        "steps/s in-process",
        "steps/s HTTP",
        "steps/s OpenEnv",
        "snapshot B",
        "restore+step ms",
    )
    for col in (*columns, "live step ms"):
        table.add_column(col, justify="right" if col != "env" else "left")
    for name, rates in report["steps_per_s"].items():
        restore = report["restore"][name]
        table.add_row(
            name,
            f"{rates['in_process']:,.1f}",
            f"{rates['http']:,.1f}",
            f"{rates['openenv']:,.1f}" if "openenv" in rates else "-",
            f"{restore['snapshot_bytes']:,}",
            f"{restore['from_state_ms'] + restore['first_step_after_restore_ms']:.1f}",
            f"{restore['live_step_ms']:.1f}",
        )
    console.print(table)
    oracle = Table(title="oracle baselines (through /rollout with the oracle policy)")
    for col in ("env", "tasks", "success rate", "mean score", "mean turns"):
        oracle.add_column(col, justify="right" if col != "env" else "left")
    for name, entry in report["oracle"].items():
        oracle.add_row(
            name,
            str(entry["tasks"]),
            f"{entry['success_rate']:.1%}",
            f"{entry['mean_score']:g}",
            f"{entry['mean_turns']:g}",
        )
    console.print(oracle)
