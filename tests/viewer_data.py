"""Trace DBs for the viewer's tests: real rollouts recorded by a real task app, and synthetic bulk.

``record_real_db`` serves the task app with tracing on and plays, over real HTTP: a GRPO group
of the scripted Crafter policy, LLM rollouts against the vLLM-shaped fake (one cut short by a
reply without a tool call), so every view has real frames, replies, timings and errors.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from grpo_service import Settings, create_app
from tools.fake_server import FakeConfig, FakeInferenceServer
from tools.server_thread import ServerThread
from tools.synthetic_traces import write_synthetic_db

MODEL = "fake-qwen3"
GROUP_SEED = 5
GROUP_SIZE = 4


def record_real_db(
    path: Path, state_dir: Path, *, group_turns: int = 40, llm_turns: int = 12
) -> dict[str, Any]:
    """Record real rollouts into ``path``; return what was played (run ids, group id)."""
    with FakeInferenceServer(FakeConfig(model=MODEL)) as llm:
        settings = Settings(
            _env_file=None,
            state_dir=state_dir,
            snapshot_secret="viewer-test-" + "x" * 32,
            default_model=MODEL,
            vllm_base_url=llm.base_url,
            trace_db=path,
            reaper_interval_s=3600.0,
        )
        server = ServerThread(create_app(settings), name="viewer-recorder").start()
        try:
            with httpx.Client(base_url=server.base_url, timeout=120) as client:
                group = client.post(
                    "/rollout/group",
                    json={
                        "group_id": "viewer-group",
                        "group_size": GROUP_SIZE,
                        "env": {"env_name": "crafter", "seed": GROUP_SEED},
                        "policy": {"policy_name": "crafter-random", "config": {"seed": 1}},
                        "vary_policy_seed": True,
                        "max_turns": group_turns,
                    },
                )
                group.raise_for_status()
                for seed in (1, 2):
                    r = client.post(
                        "/rollout",
                        json={
                            "run_id": f"viewer-llm-{seed}",
                            "env": {"env_name": "crafter", "seed": seed},
                            "policy": {"policy_name": "crafter-react", "config": {"model": MODEL}},
                            "max_turns": llm_turns,
                            "record": {"logprobs": True},
                        },
                    )
                    r.raise_for_status()
                heuristic = client.post(
                    "/rollout",
                    json={
                        "run_id": "viewer-heuristic",
                        "env": {"env_name": "crafter", "seed": 3},
                        "policy": {"policy_name": "crafter-heuristic"},
                        "max_turns": 60,
                    },
                )
                heuristic.raise_for_status()
                llm.set_config(FakeConfig(model=MODEL, fault_script=["ok", "ok", "ok", "no_tool_call"]))
                failed = client.post(
                    "/rollout",
                    json={
                        "run_id": "viewer-policy-error",
                        "env": {"env_name": "crafter", "seed": 4},
                        "policy": {"policy_name": "crafter-react", "config": {"model": MODEL}},
                        "max_turns": llm_turns,
                    },
                )
                failed.raise_for_status()
        finally:
            server.stop()  # closes the trace writer: every rollout is in the file
    return {
        "group_id": "viewer-group",
        "llm_runs": ["viewer-llm-1", "viewer-llm-2"],
        "heuristic_run": "viewer-heuristic",
        "error_run": "viewer-policy-error",
    }


def synthetic_db(path: Path, rollouts: int, **kwargs: Any) -> Path:
    asyncio.run(write_synthetic_db(path, rollouts, **kwargs))
    return path
