"""``grpo-service serve`` as a real subprocess: tracing to a fresh or named DB, flushing on shutdown,
surviving ``kill -9``, and handing settings to the ``--reload`` child."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from grpo_service.cli.serve import build_settings, trace_db_path
from grpo_service.config import Settings
from grpo_service.tracing import TraceReader
from tests.conftest import MODEL, REPO, Served, write_env_file
from tools.fake_server import FakeInferenceServer


def rollout(base_url: str, run_id: str, turns: int = 3, policy: str = "crafter-react") -> dict:
    body = {
        "run_id": run_id,
        "env": {"env_name": "crafter", "seed": 1},
        "policy": {"policy_name": policy},
        "max_turns": turns,
        "record": {"trajectories": False},
    }
    r = httpx.post(base_url + "/rollout", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def sessions_visible(db: Path) -> set[str]:
    if not db.exists():
        return set()
    conn = sqlite3.connect(db, timeout=5)
    try:
        return {row[0] for row in conn.execute("SELECT run_id FROM sessions")}
    except sqlite3.OperationalError:  # tables not created yet
        return set()
    finally:
        conn.close()


@pytest.mark.slow
def test_trace_dir_db_survives_kill_9_with_every_finished_rollout(
    serve: Callable[..., Served], tmp_path: Path
) -> None:
    served = serve("--trace", "traces/v3")
    (db,) = (tmp_path / "traces" / "v3").glob("task_app_traces_*.db")
    for i in range(3):
        rollout(served.base_url, f"react-{i}")
    # Then rollouts keep finishing on three connections when the process is killed.
    finished: list[tuple[str, float]] = []
    stop = threading.Event()

    def stream(worker: int) -> None:
        for i in range(10_000):
            if stop.is_set():
                return
            try:
                rollout(served.base_url, f"w{worker}-{i}", turns=4, policy="crafter-random")
            except (httpx.HTTPError, AssertionError):  # the server dies under it
                return
            finished.append((f"w{worker}-{i}", time.monotonic()))

    workers = [threading.Thread(target=stream, args=(w,), daemon=True) for w in range(3)]
    for w in workers:
        w.start()
    while len(finished) < 12:
        time.sleep(0.01)
    os.killpg(served.proc.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    served.proc.wait(10)
    stop.set()

    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    with TraceReader(db) as reader:
        present = {s["run_id"]: s for s in reader.sessions()}
        # Group commit makes a rollout durable within milliseconds of its response.
        settled = {run_id for run_id, at in finished if at < killed_at - 0.25}
        assert {"react-0", "react-1", "react-2"} | settled <= set(present)
        for s in present.values():  # each rollout is all there or not at all
            turns = reader.turns(s["session_id"])
            assert len(turns) == s["num_turns"] and all(t["env"] for t in turns)
        (writer,) = reader.writers()
        assert writer["closed_at"] is None and writer["written"] == len(present)  # the crash shows


@pytest.mark.slow
def test_trace_db_appends_across_server_runs_and_flushes_on_shutdown(
    serve: Callable[..., Served], tmp_path: Path
) -> None:
    db = tmp_path / "named" / "run.db"
    for run in range(2):
        served = serve("--trace-db", str(db))
        info = httpx.get(served.base_url + "/info", timeout=5).json()
        assert info["tracing"] == str(db)
        for i in range(2):
            rollout(served.base_url, f"run{run}-{i}", turns=2, policy="crafter-random")
        served.proc.send_signal(signal.SIGINT)  # graceful: the writer drains and records its counters
        assert served.proc.wait(15) == 0, served.log.read_text()
    with TraceReader(db) as reader:
        assert sorted(s["run_id"] for s in reader.sessions()) == ["run0-0", "run0-1", "run1-0", "run1-1"]
        writers = reader.writers()
        assert [(w["written"], w["dropped"]) for w in writers] == [(2, 0), (2, 0)]
        assert all(w["closed_at"] is not None for w in writers)


@pytest.mark.slow
def test_reload_hands_settings_to_the_child(serve: Callable[..., Served], tmp_path: Path) -> None:
    served = serve("--reload", "--trace", "traces")
    (db,) = (tmp_path / "traces").glob("task_app_traces_*.db")
    info = httpx.get(served.base_url + "/info", timeout=5).json()
    assert info["tracing"] == str(Path("traces") / db.name)
    assert info["inference"]["default_model"] == MODEL  # from --env-file, via the environment
    rollout(served.base_url, "reloaded", turns=2, policy="crafter-random")
    deadline = time.monotonic() + 5
    while "reloaded" not in sessions_visible(db) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "reloaded" in sessions_visible(db)


def test_trace_paths_and_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.mktime((2025, 3, 4, 5, 6, 7, 0, 0, -1))
    path = trace_db_path(tmp_path, None, now)
    assert path == tmp_path / "task_app_traces_2025-03-04_05-06-07.db"
    path.touch()
    assert trace_db_path(tmp_path, None, now) == tmp_path / "task_app_traces_2025-03-04_05-06-07_2.db"
    assert trace_db_path(tmp_path, tmp_path / "x.db", now) == tmp_path / "x.db"  # --trace-db wins
    assert trace_db_path(None, None, now) is None

    env_file = tmp_path / "a.env"
    env_file.write_text("PORT=9001\nENVIRONMENT_API_KEY=k123\nDEFAULT_MODEL=from-file\n")
    monkeypatch.delenv("PORT", raising=False)
    settings = build_settings(env_file, port=None, host="127.0.0.1", trace_db=tmp_path / "t.db")
    assert (settings.port, settings.default_model, settings.trace_db) == (
        9001,
        "from-file",
        tmp_path / "t.db",
    )
    # What the reload child gets rebuilds the same settings from the environment alone.
    settings.inference_key_urls = ["http://127.0.0.1:1234"]  # a list field survives too
    for key, value in settings.as_environment().items():
        monkeypatch.setenv(key, value)
    rebuilt = Settings(_env_file=None)  # type: ignore[call-arg]
    assert rebuilt.model_dump() == settings.model_dump()


def test_an_unsafe_bind_is_refused_before_anything_is_announced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from grpo_service.cli import app

    monkeypatch.chdir(tmp_path)  # no ./.env
    monkeypatch.delenv("ENVIRONMENT_API_KEY", raising=False)
    refused = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0", "--port", "1"])
    assert refused.exit_code != 0 and "refusing to serve on 0.0.0.0" in str(refused.exception)
    assert "Serving" not in refused.output


def test_a_taken_port_fails_before_ray_starts(tmp_path: Path, fake_llm: FakeInferenceServer) -> None:
    """The port is bound before the app's lifespan starts Ray, whose processes take ports of
    their own: so a taken port fails at once, and Ray can never take the port it was given."""
    pytest.importorskip("ray")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        cmd = [sys.executable, "-m", "grpo_service.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["--env-file", str(write_env_file(tmp_path, fake_llm.base_url)), "--workers", "2"]
        done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    log = done.stdout + done.stderr
    assert done.returncode != 0 and "Address already in use" in log, log
    assert f"cannot listen on 127.0.0.1:{port}: pick another --port" in log, log
    assert "Started a local Ray instance" not in log and "Application startup" not in log, log
