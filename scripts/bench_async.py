"""Synchronous GRPO beside asynchronous GRPO on BabyAI, from one SFT checkpoint: the project's
trainer in both modes and TRL's AsyncGRPOTrainer on the task app's stream of groups.

    python scripts/bench_async.py --out bench_async [--seeds 0 1 2] [--steps 10] [--groups 2] [--group-size 4]

Everything runs in this process on 127.0.0.1: the task app and `serve-model` (the sampler). The
BabyAI solver's decisions through the project's agent (tool-calling format) are exported and a
model made here is SFT'd on them (reused from OUT when present). Then, for each seed and each
trainer, from the SFT weights and with the same budget of episodes (steps x B x G):

- ``sync``: `train --type rl` as it is: request B groups, wait, train, push;
- ``async``: `train --type rl` with ``mode = "async"``: B groups taken from the stream, which keeps
  ``--in-flight`` groups playing while the trainer trains (``--max-staleness``, restart policy);
- ``trl``: TRL's AsyncGRPOTrainer with `grpo_service.client.trl_async`'s rollout worker (the same
  stream) and weight transfer (into serve-model), stopped once it has taken the same groups.

Each is evaluated on held-out tasks with the project's `eval`. Reported per run: success before
and after, wall time per 1,000 episodes, the share of the wall time the trainer sat waiting for
groups and the sampler sat with no group playing, and the staleness of the groups trained on.
Writes OUT/report.json and OUT/report.png.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from grpo_service import Settings, create_app
from grpo_service.client import trl_async
from grpo_service.training_api.llm_jobs import TaskAppGroups
from scripts.bench_llm_loop import GAMES, bench_model_spec
from scripts.bench_trl import agent_config, collect_agent_demos, eval_agent
from tools.server_thread import ServerThread
from training.llm.config import RLConfig, SFTConfig
from training.llm.model import environment_corpus, init_model, jsonl_corpus
from training.llm.rl import train_rl
from training.llm.server import ModelEngine, create_model_app
from training.llm.sft import train_sft

GAME = GAMES["babyai"]
TRAINERS = ("sync", "async", "trl")


def rl_config(args: argparse.Namespace, sft: str, out: Path, seed: int, mode: str) -> RLConfig:
    return RLConfig(
        model=sft,
        out=str(out),
        task_app_url=args.app_url,
        model_server_url=args.model_url,
        env_name=GAME.env,
        policy_name=GAME.policy,
        policy_config=agent_config(args, 1.0),
        seeds=GAME.task_ids(0, args.train_tasks),
        seed=seed,
        steps=args.steps,
        groups_per_step=args.groups,
        group_size=args.group_size,
        max_turns=args.turns,
        lr=args.lr,
        success_reward=GAME.success_reward,
        mode=mode,  # type: ignore[arg-type]
        in_flight=args.in_flight,
        max_staleness=args.max_staleness if mode == "async" else 0,
        save_every=1000,
    )


def run_ours(args: argparse.Namespace, sft: str, out: Path, seed: int, mode: str) -> dict[str, Any]:
    started = time.monotonic()
    result = train_rl(rl_config(args, sft, out, seed, mode), task_app=TaskAppGroups(args.app_url))
    wall = time.monotonic() - started
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    waiting = sum(r.get("rollout_s", 0.0) for r in rows)  # the trainer waits for its groups
    if mode == "async":
        last = rows[-1]
        sampler_busy = last.get("stream_sampler_busy_s", 0.0) / max(last.get("stream_open_s", 0.0), 1e-9)
        counts: dict[str, int] = {}
        for r in rows:
            for k, v in r.get("stream_staleness_counts", {}).items():
                counts[k] = counts.get(k, 0) + v
        restarted = last.get("stream_restarted_stale", 0)
    else:
        sampler_busy = waiting / wall  # groups play only while the step collects them
        counts, restarted = {"0": sum(r["groups"] for r in rows)}, 0
    episodes = args.steps * args.groups * args.group_size
    return {
        "final": result["final"],
        "wall_s": round(wall, 2),
        "s_per_1000_episodes": round(wall / episodes * 1000, 1),
        "trainer_idle": round(waiting / wall, 4),
        "sampler_idle": round(1 - sampler_busy, 4),
        "staleness": counts,
        "restarted_stale": restarted,
        "train_success": [r.get("success_rate") for r in rows],
    }


def run_trl(args: argparse.Namespace, sft: str, out: Path, seed: int) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    template = rl_config(args, sft, out, seed, "async")
    stream = {
        "group": {
            "group_size": args.group_size,
            "env": {"env_name": GAME.env, "seed": 0},
            "policy": {"policy_name": GAME.policy, "config": agent_config(args, 1.0, model="tiny")},
            "max_turns": args.turns,
            "record": {"logprobs": True, "observations": False},
        },
        "seeds": template.seeds,
        "in_flight": args.in_flight or 2 * args.groups,
        "max_staleness": args.max_staleness,
    }
    worker = trl_async.TaskAppRolloutWorker(args.app_url, stream)
    transfer = trl_async.TaskAppWeightTransfer(
        args.model_url, sft, out / "weights", on_version=worker.note_version
    )
    budget = args.steps * args.groups

    class Budget(TrainerCallback):  # the same episodes as the other trainers
        def on_step_end(self, _args: Any, _state: Any, control: Any, **_: Any) -> None:
            if worker.groups >= budget:
                control.should_training_stop = True

    config = AsyncGRPOConfig(
        output_dir=str(out / "trl"),
        max_steps=100_000,
        bf16=False,
        dtype="float32",
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        temperature=1.0,
        token_budget=args.token_budget,
        max_staleness=args.max_staleness,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=seed,
    )
    placeholder = Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * 4})
    started = time.monotonic()
    try:
        with trl_async.cpu_shims():
            trainer = AsyncGRPOTrainer(
                model=sft,
                args=config,
                train_dataset=placeholder,
                rollout_worker=worker,
                weight_transfer=transfer,
                callbacks=[Budget()],
            )
            trainer.train()
    finally:
        worker.stop()
    wall = time.monotonic() - started
    logs = trainer.state.log_history
    waiting = sum(x.get("perf/rollout_wait_s", 0.0) for x in logs)
    info = worker.info
    busy = info.busy_s / max(info.open_s, 1e-9) if info is not None else 0.0
    episodes = worker.groups * args.group_size
    return {
        "final": str(out / "weights" / f"v{transfer.version}"),
        "wall_s": round(wall, 2),
        "s_per_1000_episodes": round(wall / max(episodes, 1) * 1000, 1),
        "trainer_idle": round(min(1.0, waiting / wall), 4),
        "sampler_idle": round(1 - busy, 4),
        "staleness": {str(k): v for k, v in (info.staleness.items() if info else [])},
        "restarted_stale": info.counters.restarted_stale if info else 0,
        "optimizer_steps": trainer.state.global_step,
        "groups": worker.groups,
    }


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, key, title in (
        (axes[0], "success_after", "eval success after GRPO"),
        (axes[1], "s_per_1000_episodes", "wall s per 1,000 episodes"),
    ):
        for i, trainer in enumerate(TRAINERS):
            values = [r[key] for r in runs if r["trainer"] == trainer]
            ax.scatter([i] * len(values), values)
            if values:
                ax.bar(i, statistics.fmean(values), alpha=0.3)
        ax.set_xticks(range(len(TRAINERS)), TRAINERS)
        ax.set_title(title)
    axes[0].axhline(report["sft_success"], ls="--", c="grey", label="SFT")
    axes[0].legend()
    width = 0.35
    for j, key in enumerate(("trainer_idle", "sampler_idle")):
        means = [statistics.fmean([r[key] for r in runs if r["trainer"] == t] or [0]) for t in TRAINERS]
        axes[2].bar([i + (j - 0.5) * width for i in range(len(TRAINERS))], means, width, label=key)
    axes[2].set_xticks(range(len(TRAINERS)), TRAINERS)
    axes[2].set_title("share of wall time idle")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench_async"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--trainers", nargs="+", default=list(TRAINERS), choices=TRAINERS)
    parser.add_argument("--levels", type=int, nargs="+", default=[0, 1, 2], help="BabyAI levels played.")
    parser.add_argument("--teacher-tasks", type=int, default=60)
    parser.add_argument("--train-tasks", type=int, default=60)
    parser.add_argument("--eval-tasks", type=int, default=30)
    parser.add_argument("--turns", type=int, default=5, help="Decisions per episode at most.")
    parser.add_argument("--history", type=int, default=2, help="Past turns the agent replays.")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--sft-steps", type=int, default=200)
    parser.add_argument("--sft-lr", type=float, default=3e-3)
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps (sync/async).")
    parser.add_argument("--groups", type=int, default=2, help="B: groups per step.")
    parser.add_argument("--group-size", type=int, default=4, help="G: rollouts per group.")
    parser.add_argument("--in-flight", type=int, default=None, help="Async: groups in flight (2B).")
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--token-budget", type=int, default=8192, help="TRL: tokens per micro-batch row.")
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--eval-temperature", type=float, default=0.7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    GAME.levels = args.levels
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": []}
    started = time.monotonic()

    def lap(what: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {what}", flush=True)

    db = out / "traces.db"
    settings = Settings(
        _env_file=None,
        state_dir=out / "state",
        trace_db=db,
        snapshot_secret="bench-" + "x" * 32,
        max_envs=512,
    )
    args.model_url = "http://127.0.0.1:9"  # the solver's rollouts call no model
    with ServerThread(create_app(settings), name="task-app") as app:
        args.app_url = app.base_url
        sft_final = out / "sft" / "final"
        previous = out / "report.json"
        if previous.exists():  # the SFT below is reused: keep what it was
            report["sft"] = json.loads(previous.read_text()).get("sft")
        if not (sft_final / "config.json").exists():
            examples = collect_agent_demos(
                app, GAME.task_ids(0, args.teacher_tasks), args, db, out / "sft.jsonl"
            )
            texts = list(jsonl_corpus([out / "sft.jsonl"])) + list(
                environment_corpus(seeds=10, env_names=[GAME.env])
            )
            init_model(out / "model", texts, bench_model_spec(args.hidden, args.layers, max_positions=4096))
            sft = train_sft(
                SFTConfig(
                    model=str(out / "model"),
                    dataset=str(out / "sft.jsonl"),
                    out=str(out / "sft"),
                    max_steps=args.sft_steps,
                    epochs=10_000,
                    batch_size=8,
                    lr=args.sft_lr,
                    warmup_steps=10,
                    save_every=1000,
                    max_length=4096,
                )
            )
            report["sft"] = {
                "examples": examples,
                "first_loss": sft["first_loss"],
                "last_loss": sft["last_loss"],
            }
            lap("sft")
        engine = ModelEngine(sft_final, served_name="tiny", max_batch_rows=32)
        with ServerThread(create_model_app(engine), name="model-server") as model_server:
            args.model_url = model_server.base_url
            eval_tasks = GAME.task_ids(1000, args.eval_tasks)
            report["sft_success"] = eval_agent(app, eval_tasks, args)["success_rate"]
            lap(f"eval sft: {report['sft_success']:.2f}")
            for seed in args.seeds:
                for trainer in args.trainers:
                    engine.reload_weights(sft_final)
                    run_dir = out / f"{trainer}-s{seed}"
                    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run (train_rl would resume)
                    if trainer == "trl":
                        run = run_trl(args, str(sft_final), run_dir, seed)
                    else:
                        run = run_ours(args, str(sft_final), run_dir, seed, trainer)
                    engine.reload_weights(run["final"])
                    run["success_after"] = eval_agent(app, eval_tasks, args)["success_rate"]
                    report["runs"].append({"trainer": trainer, "seed": seed, **run})
                    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
                    lap(
                        f"{trainer} seed {seed}: success {run['success_after']:.2f}, "
                        f"{run['s_per_1000_episodes']} s/1k episodes, "
                        f"trainer idle {run['trainer_idle']:.2f}, "
                        f"sampler idle {run['sampler_idle']:.2f}, staleness {run['staleness']}"
                    )
        engine.close()
    plot(report, out / "report.png")
    lap("done")


if __name__ == "__main__":
    main()
