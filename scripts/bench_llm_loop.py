"""Seed 001's loop as a benchmark: does it learn? init a model here -> collect a teacher's traced
rollouts through the task app -> export -> SFT -> eval -> GRPO -> eval, on Crafter with
`crafter-react`, everything on 127.0.0.1 in this process.

    python scripts/bench_llm_loop.py --out bench_llm [--sft-steps 400] [--rl-steps 20] [--eval-seeds 16]

Writes OUT/report.json (eval before SFT, after SFT and after GRPO: the share of decisions that
were a valid tool call, mean return, each with its spread over the eval seeds) and the SFT and
GRPO runs with their curves (OUT/sft/curves.png, OUT/rl/curves.png). The teacher is the scripted
vLLM-shaped fake (valid random actions), so what SFT can teach is the tool-call format, and the
GRPO reward adds a format penalty: a rollout that ends in a policy error scores -1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import httpx
import torch

import grpo_service.cli  # noqa: F401  (first: grpo_service.eval and the CLI import each other)
from grpo_service import Settings, create_app
from grpo_service.eval import EvalConfig, run_eval
from grpo_service.llm_training import TaskAppClient
from grpo_service.tracing import TraceReader
from grpo_service.tracing.export import ExportFilters, export_sft
from tools.fake_server import FakeConfig, FakeInferenceServer
from tools.server_thread import ServerThread
from training.llm.config import RLConfig, SFTConfig
from training.llm.model import ModelSpec, environment_corpus, init_model
from training.llm.rl import train_rl
from training.llm.server import ModelEngine, create_model_app
from training.llm.sft import train_sft

SYSTEM = "You play Crafter. Call interact_many with 1 or 2 actions."
POLICY = {"system_prompt": SYSTEM, "history_window": 1, "max_actions_per_call": 2}


def evaluate(app: ServerThread, seeds: list[int], turns: int) -> dict[str, float]:
    config = EvalConfig(
        base_url=app.base_url,
        model="tiny",
        max_turns=turns,
        seeds=seeds,
        concurrency=8,
        policy_config={**POLICY, "temperature": 1.0, "max_tokens": 48},
    )
    results = asyncio.run(run_eval(config))
    acted = [0.0 if (r.stop_reason or "").startswith("policy_error") else 1.0 for r in results]
    valid = [r.turns for r in results]
    returns = [r.total_return for r in results]
    return {
        "episodes": len(results),
        "acted_rate": statistics.fmean(acted),
        "acted_rate_std": statistics.pstdev(acted),
        "mean_valid_turns": statistics.fmean(valid),
        "mean_return": statistics.fmean(returns),
        "return_std": statistics.pstdev(returns),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench_llm"))
    parser.add_argument("--teacher-rollouts", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--sft-steps", type=int, default=400)
    parser.add_argument("--rl-steps", type=int, default=20)
    parser.add_argument("--eval-seeds", type=int, default=16)
    parser.add_argument(
        "--sft-from", type=Path, help="A previous run's OUT: reuse its model and SFT result, run GRPO only."
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        timings[name] = round(time.monotonic() - started - sum(timings.values()), 1)
        print(f"[{time.monotonic() - started:7.1f}s] {name} done", flush=True)

    previous = json.loads((args.sft_from / "report.json").read_text()) if args.sft_from else None
    model_dir = (args.sft_from or out) / "model"
    spec = ModelSpec(
        vocab_size=2048,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=2 * args.hidden,
        max_positions=2048,
    )
    if previous is None:
        corpus = list(environment_corpus(seeds=3, env_names=["crafter"])) + [SYSTEM]
        info = init_model(model_dir, corpus, spec)
    else:
        info = previous["model"]
    lap("init-model")
    engine = ModelEngine(model_dir, served_name="tiny", max_batch_rows=16)
    db = out / "traces.db"
    db.unlink(missing_ok=True)
    eval_seeds = list(range(10_000, 10_000 + args.eval_seeds))
    report: dict = {"model": info, "args": vars(args) | {"out": str(out)}}
    with ServerThread(create_model_app(engine), name="model-server") as model_server:
        settings = Settings(
            _env_file=None,
            state_dir=out / "state",
            trace_db=db,
            vllm_base_url=model_server.base_url,
            snapshot_secret="bench-" + "x" * 32,
        )
        with (
            FakeInferenceServer(FakeConfig(model="teacher", actions_per_call=(1, 2))) as teacher,
            ServerThread(create_app(settings), name="task-app") as app,
        ):
            report["eval_start"] = evaluate(app, eval_seeds, args.turns)
            lap("eval start")
            if previous is not None:
                sft = {"final": str(args.sft_from / "sft" / "final")}
                report["sft"] = previous["sft"]
            for seed in range(args.teacher_rollouts // 8 if previous is None else 0):
                body = {
                    "group_size": 8,
                    "env": {"env_name": "crafter", "seed": seed},
                    "max_turns": args.turns,
                    "policy": {
                        "policy_name": "crafter-react",
                        "config": {
                            **POLICY,
                            "inference_url": teacher.base_url,
                            "model": "teacher",
                            "seed": seed,
                        },
                    },
                }
                httpx.post(f"{app.base_url}/rollout/group", json=body, timeout=600).raise_for_status()
            for _ in range(100 if previous is None else 0):
                with TraceReader(db) as reader:
                    if reader.count("sessions") >= args.teacher_rollouts:
                        break
                time.sleep(0.1)
            if previous is None:
                export = export_sft(db, out / "sft.jsonl", ExportFilters(model="teacher"))
                report["export"] = export.as_dict()
                lap("collect + export")
                sft = train_sft(
                    SFTConfig(
                        model=str(model_dir),
                        out=str(out / "sft"),
                        dataset=str(out / "sft.jsonl"),
                        max_steps=args.sft_steps,
                        epochs=10_000,
                        batch_size=8,
                        lr=3e-3,
                        warmup_steps=20,
                        save_every=100,
                    )
                )
                report["sft"] = {
                    k: sft[k] for k in ("steps", "examples", "first_loss", "last_loss", "wall_s")
                }
                lap("sft")
            engine.load_weights(sft["final"])
            report["eval_sft"] = evaluate(app, eval_seeds, args.turns)
            lap("eval sft")
            config = RLConfig(
                model=sft["final"],
                out=str(out / "rl"),
                task_app_url=app.base_url,
                model_server_url=model_server.base_url,
                policy_config={**POLICY, "temperature": 1.0, "max_tokens": 48},
                steps=args.rl_steps,
                groups_per_step=2,
                group_size=8,
                max_turns=args.turns,
                lr=1e-3,
                kl_coef=0.02,
                format_penalty=1.0,
                updates_per_step=2,
                micro_batch=8,
                save_every=10,
            )
            rl = train_rl(config, task_app=TaskAppClient(app.base_url))
            report["rl"] = {
                k: rl[k]
                for k in (
                    "steps",
                    "reward_first",
                    "reward_last",
                    "totals",
                    "weights_version_first",
                    "weights_version_last",
                )
            }
            lap("rl")
            report["eval_rl"] = evaluate(app, eval_seeds, args.turns)
            lap("eval rl")
    engine.close()
    report["timings_s"] = timings
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    for stage in ("eval_start", "eval_sft", "eval_rl"):
        e = report[stage]
        print(
            f"{stage:10s} acted {e['acted_rate']:.2f} (sd {e['acted_rate_std']:.2f})  "
            f"valid turns {e['mean_valid_turns']:.2f}  "
            f"return {e['mean_return']:+.3f} (sd {e['return_std']:.3f})"
        )


if __name__ == "__main__":
    main()
