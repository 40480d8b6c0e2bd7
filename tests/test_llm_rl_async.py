"""`train --type rl` in async mode (``mode = "async"``): the groups come from the task app's stream
while the trainer trains, every push advances the stream's version before the sampler resumes,
the staleness of what is trained on stays within ``max_staleness``, and each decision is checked
against the weights that sampled it. A model made here, served by serve-model, on ``toy-words``.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch

from grpo_service import create_app
from grpo_service.training_api.llm_jobs import TaskAppGroups
from tests.conftest import make_settings
from tests.llm_helpers import TINY
from tests.llm_toy import toy_plugins
from tools.server_thread import ServerThread
from training.llm.config import RLConfig
from training.llm.model import environment_corpus, init_model
from training.llm.rl import train_rl
from training.llm.server import ModelEngine, create_model_app


@pytest.mark.slow
def test_async_grpo_trains_on_the_stream_with_bounded_staleness(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    with toy_plugins():
        model_dir = tmp_path / "model"
        init_model(model_dir, list(environment_corpus(seeds=1, steps=3, env_names=["toy-words"])) * 3, TINY)
        engine = ModelEngine(model_dir, served_name="tiny")
        with (
            ServerThread(create_model_app(engine), name="model-server") as model_server,
            ServerThread(
                create_app(make_settings(tmp_path, vllm_base_url=model_server.base_url)), name="task-app"
            ) as app,
        ):
            config = RLConfig(
                model=str(model_dir),
                out=str(tmp_path / "rl"),
                task_app_url=app.base_url,
                model_server_url=model_server.base_url,
                env_name="toy-words",
                policy_name="toy-say",
                policy_config={"max_tokens": 16, "temperature": 1.0},
                steps=3,
                groups_per_step=2,
                group_size=4,
                max_turns=1,
                lr=1e-2,
                mode="async",
                sequences="decision",  # toy-say plays no token stream
                in_flight=4,
                max_staleness=1,
                save_every=10,
            )
            result = train_rl(config, task_app=TaskAppGroups(app.base_url))
            streams = httpx.get(f"{app.base_url}/run/list", params={"limit": 100}).json()["runs"]
        engine.close()
    rows = [json.loads(x) for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "loss" in r]
    assert len(rows) == 3 and trained, rows
    assert result["weights_version_last"] == len(trained) and engine.weights_version == str(len(trained))
    for r in trained:
        assert r["logprob_max_abs_diff"] < 1e-4, r  # each decision under the weights that sampled it
        assert r["fidelity_checked_samples"] == r["samples"] and not r.get("fidelity_unchecked_samples")
    for r in rows:
        assert r["groups"] == 2 and r["stream_staleness_max"] <= 1
    assert any(r["stream_staleness_max"] == 1 for r in rows[1:]), rows  # sampled while the trainer trained
    assert any(r["logprob_gap_to_current"] > 0 for r in trained[1:])
    assert not [r for r in streams if r["kind"] == "group" and r["status"] == "running"]  # closed
