"""Seed 000's "Example Usage", verbatim but for the URLs, against `uvicorn main:app`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import free_port
from tools.fake_server import FakeInferenceServer

ROOT = Path(__file__).resolve().parent.parent

EXAMPLE = """
import httpx

# Create environment
env_response = httpx.post(
    "http://localhost:8000/env/create",
    json={
        "env_name": "crafter",
        "config": {},
        "seed": 42,
        "rl_run_id": "test-run-1"
    }
)
env_id = env_response.json()["env_id"]

# Create policy
policy_response = httpx.post(
    "http://localhost:8000/policy/create",
    json={
        "policy_name": "crafter-react",
        "config": {"inference_url": "http://vllm:8001"},
        "rl_run_id": "test-run-1",
        "bound_env_id": env_id
    }
)
policy_id = policy_response.json()["policy_id"]

# Execute rollout
rollout_response = httpx.post(
    "http://localhost:8000/rollout",
    json={
        "run_id": "test-run-1",
        "env": {"env_id": env_id},
        "policy": {"policy_id": policy_id},
        "ops": ["agent", "env"] * 10,
        "on_done": "reset"
    }
)
trajectories = rollout_response.json()["trajectories"]
"""


def test_seed_example_verbatim(tmp_path: Path) -> None:
    port = free_port()
    with FakeInferenceServer() as fake:
        env = {k: v for k, v in os.environ.items() if k not in ("DEFAULT_MODEL", "ENVIRONMENT_API_KEY")}
        env.update(STATE_DIR=str(tmp_path / "state"), NO_PROXY="*")
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "main:app", "--port", str(port), "--log-level", "warning"],
            cwd=ROOT,
            env=env,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert server.poll() is None and time.monotonic() < deadline, "server did not start"
                time.sleep(0.1)
            code = EXAMPLE.replace("http://localhost:8000", f"http://127.0.0.1:{port}").replace(
                "http://vllm:8001", fake.base_url
            )
            namespace: dict = {}
            exec(compile(code, "seed_example", "exec"), namespace)
            trajectories = namespace["trajectories"]
            steps = [s for t in trajectories for s in t["steps"]]
            assert len(steps) == 10
            assert all(s["tool_calls"] and isinstance(s["reward"], float) for s in steps)
        finally:
            server.terminate()
            server.wait(timeout=20)
