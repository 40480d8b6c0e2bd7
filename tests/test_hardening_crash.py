"""Crash safety: ``kill -9`` a real server process (``uvicorn main:app``, TRACE_DB set, STATE_DIR
in a temporary directory) while traced rollouts, groups and snapshots are in flight. The trace DB
must pass ``PRAGMA integrity_check`` and hold every rollout that finished before the kill, whole;
every snapshot acknowledged before the kill must restore, bit-identically, in a new process with
the same SNAPSHOT_SECRET and STATE_DIR; and nothing may be written outside those places."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from grpo_service.tracing import TraceReader
from tests.conftest import MODEL
from tests.hardening import ServiceProcess, start_service
from tools.fake_server import FakeConfig, FakeInferenceServer

pytestmark = pytest.mark.slow

ACTIONS = ["move_left", "do", "move_up", "do", "noop", "move_right", "do", "move_down"] * 3
# Group commit: a finished rollout is durable within one writer batch (milliseconds) of its
# response; rollouts that finished in the last moment before the kill may be lost.
DURABILITY_WINDOW_S = 0.25


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Callable[[], ServiceProcess]]:
    started: list[ServiceProcess] = []
    with FakeInferenceServer(FakeConfig(model=MODEL, latency_s=0.05)) as fake:
        environ = {
            "STATE_DIR": str(tmp_path / "state"),
            "TRACE_DB": str(tmp_path / "traces" / "trace.db"),
            "SNAPSHOT_SECRET": "crash-test-secret-" + "s" * 32,
            "VLLM_BASE_URL": fake.base_url,
            "DEFAULT_MODEL": MODEL,
            "REAPER_INTERVAL_S": "3600",
        }

        def start() -> ServiceProcess:
            started.append(start_service(tmp_path, environ))
            return started[-1]

        yield start
        for service in started:
            if service.proc.poll() is None:
                service.kill9()


def play(client: httpx.Client, env_id: str) -> list[dict[str, Any]]:
    out = []
    for action in ACTIONS:
        step = client.post("/env/step", json={"env_id": env_id, "action": action}).json()
        out.append({k: v for k, v in step.items() if k != "env_id"})
    return out


class Load:
    """Rollouts, groups and snapshots streaming from a few threads until ``stop``."""

    def __init__(self, base_url: str):
        self.base_url = base_url
        self.stop = threading.Event()
        self.finished: list[tuple[str, float]] = []  # run ids, with when their response arrived
        self.snapshots: list[str] = []
        self.threads = [
            threading.Thread(target=self._loop, args=(self._rollout, w), daemon=True) for w in range(3)
        ] + [
            threading.Thread(target=self._loop, args=(self._group, 0), daemon=True),
            threading.Thread(target=self._loop, args=(self._snapshot, 0), daemon=True),
        ]

    def count(self, kind: str) -> int:
        return sum(run_id.startswith(kind) for run_id, _ in self.finished)

    def settled(self, before: float) -> set[str]:
        """The run ids of rollouts answered before ``before`` (monotonic time)."""
        return {run_id for run_id, at in list(self.finished) if at < before}

    def _loop(self, fn: Callable[[httpx.Client, str], None], worker: int) -> None:
        with httpx.Client(base_url=self.base_url, timeout=60) as client:
            for i in range(100_000):
                if self.stop.is_set():
                    return
                try:
                    fn(client, f"{fn.__name__[1:]}-{worker}-{i}")
                except httpx.HTTPError:  # the server died under us
                    return

    def _rollout(self, client: httpx.Client, run_id: str) -> None:
        body = {
            "run_id": run_id,
            "env": {"env_name": "crafter", "seed": 1},
            "policy": {"policy_name": "crafter-react"},
            "max_turns": 4,
            "record": {"logprobs": True},
        }
        if client.post("/rollout", json=body).status_code == 200:
            self.finished.append((run_id, time.monotonic()))

    def _group(self, client: httpx.Client, group_id: str) -> None:
        body = {
            "group_id": group_id,
            "group_size": 4,
            "env": {"env_name": "crafter", "seed": 2},
            "policy": {"policy_name": "crafter-random", "config": {"seed": 0}},
            "max_turns": 6,
        }
        r = client.post("/rollout/group", json=body)
        if r.status_code == 200:
            at = time.monotonic()
            self.finished += [(m["run_id"], at) for m in r.json()["members"]]

    def _snapshot(self, client: httpx.Client, _: str) -> None:
        env_id = client.post("/env/create", json={"env_name": "crafter", "seed": 3}).json()["env_id"]
        client.post("/env/step", json={"env_id": env_id, "actions": ["move_left", "do"]})
        r = client.post("/env/snapshot", json={"env_id": env_id})
        if r.status_code == 200:
            self.snapshots.append(r.json()["snapshot_id"])
        client.post("/env/terminate", json={"env_id": env_id})


def test_kill_9_loses_no_finished_rollout_and_no_snapshot(
    services: Callable[[], ServiceProcess], tmp_path: Path
) -> None:
    first = services()
    with httpx.Client(base_url=first.base_url, timeout=60) as client:
        # Snapshots taken before the storm, with the continuation each must reproduce later.
        continuations: dict[str, list[dict[str, Any]]] = {}
        for seed in (1, 2, 3):
            env_id = client.post("/env/create", json={"env_name": "crafter", "seed": seed}).json()["env_id"]
            client.post("/env/step", json={"env_id": env_id, "actions": ACTIONS[:5]})
            snapshot_id = client.post("/env/snapshot", json={"env_id": env_id}).json()["snapshot_id"]
            continuations[snapshot_id] = play(client, env_id)
        policy_id = client.post("/policy/create", json={"policy_name": "crafter-react"}).json()["policy_id"]
        obs = client.post("/env/create", json={"env_name": "crafter"}).json()["observation"]
        client.post("/policy/step", json={"policy_id": policy_id, "observation": obs})
        policy_snapshot = client.post("/policy/snapshot", json={"policy_id": policy_id}).json()["snapshot_id"]

    load = Load(first.base_url)
    for thread in load.threads:
        thread.start()
    started, deadline = time.monotonic(), time.monotonic() + 60
    # Enough finished work before the kill, whatever the host's speed: 20 rollouts settled (past
    # the durability window), single rollouts among them, and snapshots.
    while (
        time.monotonic() - started < 1.5
        or load.count("rollout") < 6
        or len(load.snapshots) < 5
        or len(load.settled(time.monotonic() - DURABILITY_WINDOW_S)) < 20
    ):
        assert time.monotonic() < deadline, (len(load.finished), len(load.snapshots))
        time.sleep(0.02)
    first.kill9()
    killed_at = time.monotonic()
    load.stop.set()
    for thread in load.threads:
        thread.join(10)

    db = tmp_path / "traces" / "trace.db"
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    with TraceReader(db) as reader:
        present = {s["run_id"]: s for s in reader.sessions()}
        settled = load.settled(killed_at - DURABILITY_WINDOW_S)
        assert len(settled) >= 20 and settled <= set(present), sorted(settled - set(present))[:10]
        for session in present.values():  # all of a rollout or none of it
            assert len(reader.turns(session["session_id"])) == session["num_turns"]

    second = services()
    with httpx.Client(base_url=second.base_url, timeout=60) as client:
        for snapshot_id, expected in continuations.items():
            restored = client.post("/env/restore", json={"snapshot_id": snapshot_id})
            assert restored.status_code == 200, restored.text
            assert play(client, restored.json()["env_id"]) == expected
        for snapshot_id in load.snapshots:
            assert client.post("/env/restore", json={"snapshot_id": snapshot_id}).status_code == 200
        assert client.post("/policy/restore", json={"snapshot_id": policy_snapshot}).status_code == 200
        body = {
            "run_id": "after",
            "env": {"env_name": "crafter"},
            "policy": {"policy_name": "crafter-random"},
        }
        assert client.post("/rollout", json={**body, "max_turns": 2}).status_code == 200
    second.stop()
    with TraceReader(db) as reader:
        writers = reader.writers()
        assert len(writers) == 2 and writers[0]["closed_at"] is None and writers[1]["closed_at"] is not None
        assert reader.session_ids("after")

    done, kept = len(load.finished), len(settled)
    print(f"kill -9 after {done} rollouts ({kept} settled) and {len(load.snapshots)} snapshots")
    # Nothing outside STATE_DIR, the trace directory and the service logs.
    logs = {service.log.name for service in (first, second)}
    assert {path.name for path in tmp_path.iterdir()} <= {"state", "traces", *logs}
