"""Seed 001's loop at toy scale, every part real: init a model here -> serve-model -> collect
traced rollouts through the task app -> export-sft -> SFT -> GRPO steps -> eval.

The environment is `tests/llm_toy.py`'s one-decision ``toy-words`` (its reward varies even for
a model too small to call tools yet); the demonstrations come from a scripted teacher (the
vLLM-shaped fake, which calls the tool with random words) through the same task app and trace DB
a real teacher would use.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file

import grpo_service.cli  # noqa: F401  (first: grpo_service.client.eval and the CLI import each other)
from grpo_service import create_app
from grpo_service.client.eval import EvalConfig, run_eval
from grpo_service.tracing import TraceReader
from grpo_service.tracing.export import ExportFilters, export_sft
from grpo_service.training_api.llm_jobs import TaskAppGroups
from tests.conftest import make_settings
from tests.llm_helpers import TINY
from tests.llm_toy import toy_plugins
from tools.fake_server import FakeConfig, FakeInferenceServer
from tools.server_thread import ServerThread
from training.llm.config import RLConfig, SFTConfig
from training.llm.logprobs import completion_logprobs
from training.llm.model import environment_corpus, init_model, load
from training.llm.rl import build_batch, collect, train_rl
from training.llm.server import ModelEngine, create_model_app
from training.llm.sft import train_sft

POLICY = {"max_tokens": 16}


def teacher_groups(app: ServerThread, teacher: FakeInferenceServer, seeds: range) -> None:
    for seed in seeds:
        body = {
            "group_size": 2,
            "env": {"env_name": "toy-words", "seed": seed},
            "policy": {
                "policy_name": "toy-say",
                "config": {
                    "max_tokens": 64,
                    "inference_url": teacher.base_url,
                    "model": "teacher",
                    "seed": seed,
                },
            },
            "max_turns": 1,
        }
        r = httpx.post(f"{app.base_url}/rollout/group", json=body, timeout=120)
        assert r.status_code == 200, r.text


def evaluate(app: ServerThread, seeds: list[int]) -> dict[str, float]:
    config = EvalConfig(
        base_url=app.base_url,
        model="tiny",
        policy="toy-say",
        env_name="toy-words",
        max_turns=1,
        seeds=seeds,
        concurrency=4,
        policy_config={**POLICY, "temperature": 1.0},
    )
    results = asyncio.run(run_eval(config))
    assert all(r.returned for r in results)
    acted = [not (r.stop_reason or "").startswith("policy_error") for r in results]
    return {"acted": sum(acted) / len(acted), "return": sum(r.total_return for r in results) / len(results)}


def wait_for_runs(db: Path, run_ids: set[str]) -> None:
    for _ in range(200):
        with TraceReader(db) as reader:
            if run_ids <= {s["run_id"] for s in reader.sessions()}:
                return
        time.sleep(0.05)
    raise AssertionError(f"runs missing from {db}")


def wait_for_sessions(db: Path, n: int) -> None:
    for _ in range(200):
        with TraceReader(db) as reader:
            if reader.count("sessions") >= n:
                return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} sessions in {db}")


@pytest.mark.slow
def test_init_serve_collect_export_sft_grpo_eval(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    db = tmp_path / "traces.db"
    with toy_plugins():
        # 1. A model made here: a tokenizer trained on the environments' own text.
        model_dir = tmp_path / "model"
        corpus = list(environment_corpus(seeds=1, steps=3, env_names=["crafter", "toy-words"]))
        assert any("name a fruit" in text for text in corpus)
        info = init_model(model_dir, corpus * 3, TINY)
        assert info["parameters"] > 10_000
        # 2. serve-model, and the task app (traced) whose default inference server it is.
        engine = ModelEngine(model_dir, served_name="tiny")
        model_server = ServerThread(create_model_app(engine), name="model-server").start()
        settings = make_settings(tmp_path, trace_db=db, vllm_base_url=model_server.base_url)
        with (
            model_server,
            FakeInferenceServer(FakeConfig(model="teacher")) as teacher,
            ServerThread(create_app(settings), name="task-app") as app,
        ):
            # 3. collect: a teacher's traced rollouts through the task app.
            teacher_groups(app, teacher, range(8))
            wait_for_sessions(db, 16)
            # 4. export.
            report = export_sft(db, tmp_path / "sft.jsonl", ExportFilters(model="teacher"))
            assert report.examples == 16 and report.sessions_kept == 16, report.as_dict()
            # 5. SFT on the export.
            sft = train_sft(
                SFTConfig(
                    model=str(model_dir),
                    out=str(tmp_path / "sft"),
                    dataset=str(tmp_path / "sft.jsonl"),
                    epochs=3,
                    batch_size=8,
                    lr=1e-2,
                )
            )
            assert sft["steps"] == 6 and sft["last_loss"] < sft["first_loss"], sft
            # 6. GRPO steps against the task app, the model server as the policy's inference URL.
            config = RLConfig(
                model=sft["final"],
                out=str(tmp_path / "rl"),
                task_app_url=app.base_url,
                model_server_url=model_server.base_url,
                env_name="toy-words",
                policy_name="toy-say",
                # Hot sampling: after SFT the answers are alike, and a group needs spread to train.
                policy_config={**POLICY, "temperature": 2.0},
                seeds=[11, 12],
                steps=2,
                groups_per_step=2,
                group_size=6,
                max_turns=1,
                lr=1e-2,
                kl_coef=0.05,
                updates_per_step=2,
                save_every=1,
                sequences="decision",  # the by-hand check below reads per-decision samples
            )
            engine.reload_weights(sft["final"])
            before = evaluate(app, list(range(100, 106)))
            rl = train_rl(config, task_app=TaskAppGroups(app.base_url))
            after = evaluate(app, list(range(100, 106)))

            # The weights changed, and every push advanced the server's version.
            start = load_file(Path(sft["final"]) / "model.safetensors")
            end = load_file(Path(rl["final"]) / "model.safetensors")
            assert any(not torch.equal(start[k], end[k]) for k in start)
            rows = [json.loads(x) for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
            trained = [r for r in rows if "loss" in r]
            assert trained, rows
            assert rl["weights_version_last"] == rl["weights_version_first"] + len(trained)
            assert engine.weights_version == str(rl["weights_version_last"])
            for r in trained:  # sampler and trainer agreed on every batch trained on
                assert r["logprob_max_abs_diff"] < 1e-4, r
                assert r["weights_version_after"] == r["weights_version"] + 1 and r["samples"] > 0
                assert 0 <= r["clip_fraction"] <= 1 and r["kl_ref"] >= 0
            assert all(r["groups"] == 2 and 0 <= r["groups_all_equal"] <= 2 for r in rows)
            assert (tmp_path / "rl" / "curves.png").stat().st_size > 1000

            # End to end, once more by hand: the tokens trained on are the server's (as traced),
            # the advantages are the group-relative rewards, and the logprobs are the trainer's.
            groups, errors = asyncio.run(
                collect(TaskAppGroups(app.base_url), config, 7, "tiny", int(engine.weights_version))
            )
            assert errors == []
            batch = build_batch(groups, config, int(engine.weights_version))
            assert batch.samples, batch.stats
            model, _ = load(rl["final"])
            by_group: dict[int, list[float]] = {}
            for reward, group in zip(batch.rewards, batch.group_ids, strict=True):
                by_group.setdefault(group, []).append(reward)
            run_ids = {s.run_id for s in batch.samples}
            wait_for_runs(db, run_ids)
            with TraceReader(db) as reader:
                for s in batch.samples:
                    (session_id,) = reader.session_ids(s.run_id)
                    traced = reader.turns(session_id)[s.turn]["llm"]
                    assert traced["prompt_token_ids"] == s.prompt_ids
                    assert traced["completion_token_ids"] == s.completion_ids
                    assert traced["completion_logprobs"] == s.old_logprobs
                    assert traced["weights_version"] == s.weights_version == int(engine.weights_version)
                    rewards = by_group[s.group]
                    mean = sum(rewards) / len(rewards)
                    assert (s.advantage > 0) == (batch.rewards[s.member] > mean)
                    recomputed = completion_logprobs(model, [s.prompt_ids], [s.completion_ids], 0)[0]
                    assert max(abs(a - b) for a, b in zip(recomputed, s.old_logprobs, strict=True)) < 1e-4
        engine.close()
    print(
        f"\nloop: eval before RL {before}, after {after}; SFT loss {sft['first_loss']} -> {sft['last_loss']}"
    )
