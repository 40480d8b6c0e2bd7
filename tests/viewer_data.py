"""Trace DBs for the viewer's tests: real rollouts recorded by a real task app, and synthetic bulk.

``record_real_db`` serves the task app with tracing on and plays, over real HTTP: a GRPO group
of the scripted Crafter policy, LLM rollouts against the vLLM-shaped fake (one cut short by a
reply without a tool call), so every view has real frames, replies, timings and errors.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from grpo_service.tracing.derive import derive_file
from tools.fake_server import FakeConfig, FakeInferenceServer
from tools.synthetic_traces import write_synthetic_db
from tools.task_app import recording_task_app

MODEL = "fake-qwen3"
GROUP_SEED = 5
GROUP_SIZE = 4


def record_real_db(
    path: Path, state_dir: Path, *, group_turns: int = 40, llm_turns: int = 12
) -> dict[str, Any]:
    """Record real rollouts into ``path``; return what was played (run ids, group id)."""
    with (
        FakeInferenceServer(FakeConfig(model=MODEL)) as llm,
        recording_task_app(
            path,
            state_dir,
            name="viewer-recorder",
            timeout_s=120,
            default_model=MODEL,
            vllm_base_url=llm.base_url,
        ) as app,
    ):
        app.rollout_group(
            group_id="viewer-group",
            group_size=GROUP_SIZE,
            env={"env_name": "crafter", "seed": GROUP_SEED},
            policy={"policy_name": "crafter-random", "config": {"seed": 1}},
            vary_policy_seed=True,
            max_turns=group_turns,
        )
        react = {"policy_name": "crafter-react", "config": {"model": MODEL}}
        for seed in (1, 2):
            env = {"env_name": "crafter", "seed": seed}
            app.rollout(
                run_id=f"viewer-llm-{seed}",
                env=env,
                policy=react,
                max_turns=llm_turns,
                record={"logprobs": True},
            )
        heuristic = {"policy_name": "crafter-heuristic"}
        app.rollout(
            run_id="viewer-heuristic", env={"env_name": "crafter", "seed": 3}, policy=heuristic, max_turns=60
        )
        llm.set_config(FakeConfig(model=MODEL, fault_script=["ok", "ok", "ok", "no_tool_call"]))
        env = {"env_name": "crafter", "seed": 4}
        ending = {**react, "config": {**react["config"], "on_invalid_reply": "end"}}
        app.rollout(run_id="viewer-policy-error", env=env, policy=ending, max_turns=llm_turns)
    derive_file(path)  # the detail tables filled, as the first reader would find them
    return {
        "group_id": "viewer-group",
        "llm_runs": ["viewer-llm-1", "viewer-llm-2"],
        "heuristic_run": "viewer-heuristic",
        "error_run": "viewer-policy-error",
    }


def synthetic_db(path: Path, rollouts: int, **kwargs: Any) -> Path:
    asyncio.run(write_synthetic_db(path, rollouts, **kwargs))
    return path
