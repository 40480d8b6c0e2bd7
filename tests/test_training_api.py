"""Seed 004's training job API over real HTTP: short GRPO jobs in their own processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tools.server_thread import ServerThread
from training.gym.config import GymTrainConfig
from training.gym.policy import MLPPolicy
from training.jobs import JobRunner, JobType

SHORT = {"env_name": "CartPole-v1", "learning_rate": 0.01, "n_epochs": 2, "n_steps": 16, "group_size": 8}


def wait_for(client: httpx.Client, job_id: str, until: Callable[[dict[str, Any]], bool], timeout: float = 60):
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        status = client.get(f"/training/{job_id}/status").json()
        seen.append(status["status"])
        if until(status):
            return status, seen
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} never got there: {seen[-5:]}, last {status}")


@pytest.fixture
def api(start_server: Callable[..., ServerThread], tmp_path: Path):
    server = start_server(training_max_jobs=1, training_plugins=["tests.training_plugin"])
    with httpx.Client(base_url=server.base_url, timeout=90) as c:  # POST /train waits for the job
        yield c, tmp_path / "state" / "models"


def test_short_job_end_to_end(api: tuple[httpx.Client, Path]) -> None:
    client, models = api
    root = client.get("/").json()
    assert root["message"] == "grpo-service" and root["endpoints"]["train"] == "POST /train"
    r = client.post("/train", json={**SHORT, "total_timesteps": 3000, "model_name": "t1"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["message"] == "Training started"
    config = body["config"]
    assert config["model_name"] == "t1" and config["batch_size"] == 64 and config["total_timesteps"] == 3000
    assert config["reward_function_type"] == "optimized_cartpole" and config["type"] == "gymnasium"
    job_id = body["job_id"]
    status, seen = wait_for(client, job_id, lambda s: s["status"] in ("completed", "failed"))
    assert status["status"] == "completed", status
    assert "pending" in seen or "running" in seen
    assert status["progress"] == 1.0 and status["current_timesteps"] >= 3000 and status["end_time"]
    for key in ("mean_episode_return", "loss", "updates", "steps_per_s", "clip_fraction", "approx_kl"):
        assert key in status["metrics"], key
    assert [j["job_id"] for j in client.get("/training/jobs").json()["jobs"]] == [job_id]
    # The zip, its metrics and its curves are next to each other; the zip reloads.
    assert {p.name for p in models.iterdir()} >= {"t1.zip", "t1.metrics.jsonl", "t1.png"}
    policy = MLPPolicy.load(models / "t1.zip")
    assert policy.meta["env_name"] == "CartPole-v1" and policy.meta["status"] == "completed"
    assert client.get("/models").json()["models"] == [{"name": "t1", "status": "saved", "training": False}]
    obs = [0.1, 0.0, 0.05, 0.0]
    pred = client.post("/inference", json={"model_name": "t1", "observation": obs}).json()
    assert abs(sum(pred["action_probs"]) - 1.0) < 1e-6 and len(pred["action_probs"]) == 2
    assert pred["action"] == int(np.argmax(pred["action_probs"])) and pred["value"] is None
    assert np.allclose(pred["action_probs"], policy.probs(np.asarray([obs], np.float32))[0], atol=1e-6)
    sampled = client.post("/inference", json={"model_name": "t1", "observation": obs, "deterministic": False})
    assert sampled.json()["action"] in (0, 1)
    assert client.get("/models").json()["models"][0]["status"] == "loaded"
    health = client.get("/health").json()
    assert health["active_jobs"] == 0 and health["loaded_models"] == 1
    # Same name again: refused (nothing stored is lost) unless overwrite is asked for.
    again = client.post("/train", json={**SHORT, "total_timesteps": 100, "model_name": "t1"})
    assert again.status_code == 409 and "already exists" in again.json()["detail"]
    assert client.delete("/models/t1").json() == {"message": "Model t1 deleted", "name": "t1"}
    assert not list(models.glob("t1*"))
    assert client.post("/inference", json={"model_name": "t1", "observation": obs}).status_code == 404


@pytest.mark.slow
def test_stop_within_a_second_keeps_the_checkpoint_and_jobs_are_bounded(
    api: tuple[httpx.Client, Path],
) -> None:
    client, models = api
    # A reward function of the user's own, registered by a module named in TRAINING_PLUGINS.
    long = {**SHORT, "total_timesteps": 1_000_000, "model_name": "long", "reward_function_type": "centred"}
    r = client.post("/train", json=long)
    job_id = r.json()["job_id"]
    # The initial model is written before the job process starts: it answers at once.
    first = client.post("/inference", json={"model_name": "long", "observation": [0, 0, 0, 0]})
    assert first.status_code == 200 and abs(sum(first.json()["action_probs"]) - 1) < 1e-6
    status, _ = wait_for(
        client, job_id, lambda s: s["metrics"].get("updates", 0) >= 2 or s["status"] == "failed"
    )
    assert status["status"] == "running" and 0 < status["progress"] < 1
    assert client.get("/health").json()["active_jobs"] == 1
    over = client.post("/train", json={**SHORT, "model_name": "second"})
    assert over.status_code == 429 and "already running" in over.json()["detail"]
    assert client.delete("/models/long").status_code == 409  # being written
    t0 = time.monotonic()
    stopped = client.post(f"/training/{job_id}/stop")
    elapsed = time.monotonic() - t0
    assert stopped.status_code == 200 and stopped.json()["status"] == "stopped"
    assert elapsed < 1.5, elapsed  # 1 s for the job, the rest for HTTP on a busy machine
    status = client.get(f"/training/{job_id}/status").json()
    assert status["status"] == "stopped" and status["end_time"]
    assert MLPPolicy.load(models / "long.zip").meta["status"] in ("stopped", "training")
    assert client.post(f"/training/{job_id}/stop").status_code == 200  # idempotent
    pred = client.post("/inference", json={"model_name": "long", "observation": [0, 0, 0, 0]})
    assert pred.status_code == 200


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"env_name": "NoSuchEnv-v0"}, "env_name"),
        ({"env_name": "Pendulum-v1", "reward_function_type": "env"}, "env_name"),  # continuous actions
        ({"reward_function_type": "nope"}, "reward_function_type"),
        ({"env_name": "Acrobot-v1"}, "not 'Acrobot-v1'"),  # a CartPole reward on another env
        ({"n_steps": 0}, "n_steps"),
        ({"batch_size": -1}, "batch_size"),
        ({"total_timesteps": 0}, "total_timesteps"),
        ({"learning_rate": 0}, "learning_rate"),
        ({"n_steps": 12}, "multiple of group_size"),
        ({"model_name": "../etc/passwd"}, "model_name"),
        ({"model_name": "a/b"}, "model_name"),
        ({"model_name": ".hidden"}, "model_name"),
        ({"type": "nope"}, "type"),
        ({"n_stepz": 3}, "n_stepz"),
        ({"type": "rl", "model": "m", "advantage": "tree"}, "needs a fork plan"),
        ({"type": "rl", "model": "m", "fork": {"every": 2}}, 'set advantage = \\"tree\\"'),
        ({"type": "rl", "model": "m", "advantage": "vine"}, "advantage"),
    ],
)
def test_bad_train_requests_are_422_naming_the_field(
    api: tuple[httpx.Client, Path], body: dict[str, Any], field: str
) -> None:
    client, _ = api
    r = client.post("/train", json=body)
    assert r.status_code == 422, r.text
    assert field in r.text


def test_bad_lookups_are_4xx(api: tuple[httpx.Client, Path]) -> None:
    client, models = api
    rng = np.random.default_rng(0)
    MLPPolicy(4, 2, [(rng.normal(size=(4, 8)), np.zeros(8)), (rng.normal(size=(8, 2)), np.zeros(2))]).save(
        models / "m.zip"
    )
    (models / "junk.zip").write_bytes(b"not a zip")
    assert client.get("/training/nope/status").status_code == 404
    assert client.post("/training/nope/stop").status_code == 404
    assert client.post("/inference", json={"model_name": "ghost", "observation": [0] * 4}).status_code == 404
    wrong = client.post("/inference", json={"model_name": "m", "observation": [0, 1]})
    assert wrong.status_code == 422 and "4 values" in wrong.json()["detail"]
    assert client.post("/inference", json={"model_name": "m/../x", "observation": [0] * 4}).status_code == 422
    assert client.post("/inference", json={"model_name": "junk", "observation": [0] * 4}).status_code == 422
    ok = client.post("/inference", json={"model_name": "m", "observation": [0, 1, 0, 1]}).json()
    assert abs(sum(ok["action_probs"]) - 1) < 1e-6
    assert client.delete("/models/ghost").status_code == 404
    assert client.delete("/models/..x").status_code == 422
    assert (models / "m.zip").exists()


def test_training_api_can_be_switched_off(start_server: Callable[..., ServerThread]) -> None:
    server = start_server(training_enabled=False)
    with httpx.Client(base_url=server.base_url) as c:
        assert c.post("/train", json={}).status_code == 404
        assert c.get("/health").json()["active_jobs"] == 0


def test_a_crashing_job_is_failed_with_its_message(tmp_path: Path) -> None:
    runner = JobRunner(tmp_path / "models", jobs_dir=tmp_path / "jobs")
    try:
        job_type = JobType("crash", GymTrainConfig, "tests.training_helpers:crashing_trainer")
        job = runner.submit(job_type, GymTrainConfig(model_name="boom"))
        deadline = time.monotonic() + 30
        while job.status not in ("failed", "completed") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert job.status == "failed"
        assert job.error_message == "RuntimeError: reward function exploded at step 1"
    finally:
        runner.close()
    # The record survives a restart of the service.
    again = JobRunner(tmp_path / "models", jobs_dir=tmp_path / "jobs")
    try:
        assert again.get(job.job_id).status == "failed"
    finally:
        again.close()


def test_cli_train_then_jobs(tmp_path: Path, start_server: Callable[..., ServerThread]) -> None:
    from typer.testing import CliRunner

    from grpo_service.cli import app

    models = tmp_path / "models"
    args = ["train", "--type", "gymnasium", "--env", "CartPole-v1", "--timesteps", "1500", "--lr", "0.01"]
    args += ["--epochs", "2", "--set", "n_steps=16", "--models-dir", str(models), "--model-name", "cli"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "completed" in result.output and (models / "cli.zip").exists() and (models / "cli.png").exists()
    assert MLPPolicy.load(models / "cli.zip").meta["config"]["n_steps"] == 16
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 2 and "exists" in again.output
    bad = CliRunner().invoke(app, ["train", "--env", "Nope-v0", "--models-dir", str(models)])
    assert bad.exit_code == 2 and "env_name" in bad.output
    server = start_server()
    listed = CliRunner().invoke(app, ["jobs", "--base-url", server.base_url, "--json"])
    assert listed.exit_code == 0 and '"jobs": []' in listed.output


@pytest.mark.slow
def test_a_stop_right_after_train_is_recorded_stopped(api: tuple[httpx.Client, Path]) -> None:
    """Stopped while its process is still starting (importing torch), a job is ``stopped``, not
    ``failed`` with the exit code of the terminated process."""
    client, _ = api
    for n in range(3):
        r = client.post("/train", json={**SHORT, "total_timesteps": 1_000_000, "model_name": f"quick{n}"})
        assert r.status_code == 200, r.text
        job_id = r.json()["job_id"]
        stopped = client.post(f"/training/{job_id}/stop")
        assert stopped.status_code == 200 and stopped.json()["status"] == "stopped", stopped.text
        time.sleep(0.5)  # the watcher has seen the process end by now
        status = client.get(f"/training/{job_id}/status").json()
        ended = (status["status"], status["end_reason"], status["error_message"])
        assert ended == ("stopped", "stopped", None)


def test_job_threads_stay_within_the_servers_threads_per_job(api: tuple[httpx.Client, Path]) -> None:
    """A job may ask for fewer torch threads than TRAINING_THREADS_PER_JOB (1 here), never more:
    a 422 naming both numbers, before any process starts."""
    client, models = api
    (models / "tiny").mkdir(parents=True)
    (models / "tiny" / "config.json").write_text("{}")
    for job in ({"type": "rl", "model": "tiny"}, {"type": "sft", "model": "tiny", "dataset": "d.jsonl"}):
        r = client.post("/train", json={**job, "threads": 64})
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert "threads: 64" in detail and "TRAINING_THREADS_PER_JOB=1" in detail, detail
    assert client.get("/training/jobs").json()["jobs"] == []


def test_job_paths_are_names_inside_the_services_directories(api: tuple[httpx.Client, Path]) -> None:
    """Under the job API ``model`` names a checkpoint in STATE_DIR/models and ``dataset`` a file in
    STATE_DIR/datasets; a server path, a climb out or a link out is a 422 naming the field."""
    client, models = api
    (models / "tiny").mkdir(parents=True)
    (models / "tiny" / "config.json").write_text("{}")
    datasets = models.parent / "datasets"
    datasets.mkdir()
    (datasets / "out.jsonl").symlink_to("/etc/passwd")
    (models / "escape").symlink_to("/etc", target_is_directory=True)
    sft = {"type": "sft", "model": "tiny", "max_steps": 1}
    refused = [
        ({**sft, "dataset": "/etc/passwd"}, "dataset"),
        ({**sft, "dataset": "../../../../../../etc/passwd"}, "dataset"),
        ({**sft, "dataset": "out.jsonl"}, "dataset"),  # a link that leads out
        ({**sft, "dataset": "absent.jsonl"}, "dataset"),
        ({"type": "sft", "model": "tiny"}, "dataset"),  # required under the job API
        ({**sft, "model": "/etc", "dataset": "x"}, "model"),
        ({**sft, "model": "tiny/../../../..", "dataset": "x"}, "model"),
        ({**sft, "model": "escape", "dataset": "x"}, "model"),
        ({"type": "rl", "model": "/tmp"}, "model"),
        ({"type": "rl", "model": "ghost"}, "model"),
    ]
    for body, field in refused:
        r = client.post("/train", json=body)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["detail"].startswith(f"{field}: "), (body, r.text)
    assert client.get("/training/jobs").json()["jobs"] == []
    # A name inside the directories is taken, resolved to the file it names.
    (datasets / "chat.jsonl").write_text("")
    taken = client.post("/train", json={**sft, "dataset": "chat.jsonl", "model_name": "ok"})
    assert taken.status_code == 200, taken.text
    config = taken.json()["config"]
    assert Path(config["dataset"]) == (datasets / "chat.jsonl").resolve()
    assert Path(config["model"]) == (models / "tiny").resolve()
    client.post(f"/training/{taken.json()['job_id']}/stop")
