"""Synchronous GRPO beside asynchronous GRPO on BabyAI, from one SFT checkpoint: the project's
trainer in both modes and TRL's AsyncGRPOTrainer on the task app's stream of groups.

    python scripts/bench_async.py --out bench_async [--seeds 0 1 2] [--steps 12] [--groups 2] [--group-size 4]

Everything runs in this process on 127.0.0.1: the task app and `serve-model` (the sampler). The
BabyAI solver's decisions through the project's agent (tool-calling format) are exported and a
model made here is SFT'd on them (reused from OUT when present). Then, for each seed and each
trainer, from the SFT weights, every episode played as one token stream (the policy's
``tokenizer`` is the checkpoint), and with the same budget: ``--steps`` optimizer steps of B
groups of G episodes each (steps x B x G episodes trained on):

- ``sync``: `train --type rl` as it is: request B groups, wait, train, push;
- ``async``: `train --type rl` with ``mode = "async"``: B groups taken from the stream, which keeps
  ``--in-flight`` groups playing while the trainer trains (``--max-staleness``, restart policy);
- ``trl``: TRL's AsyncGRPOTrainer with `grpo_service.client.trl_async`'s rollout worker (the same
  stream, one sample per episode stream, zero advantages kept) and weight transfer (into
  serve-model), batching by count (``token_budget=0``): G samples a micro-batch, B micro-batches
  an optimizer step, ``--steps`` optimizer steps.

Each is evaluated on held-out tasks with the project's `eval` (95 % bootstrap interval). Reported
per run: success after, wall time per 1,000 episodes, the share of the wall time the trainer sat
waiting for groups and the sampler sat with no group playing, the staleness of the groups trained
on, the stale groups restarted or dropped, the optimizer steps and episodes trained on, and the
machine's 1-minute load average while it ran; then what the measured sync split predicts for
async on separate devices. Writes OUT/report.json and OUT/report.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import threading
import time
from collections import Counter
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


class LoadProbe:
    """The machine's 1-minute load average, sampled every ``every_s`` in a thread."""

    def __init__(self, every_s: float = 15.0) -> None:
        self.every_s, self.samples = every_s, [os.getloadavg()[0]]
        self._stop = threading.Event()
        threading.Thread(target=self._run, name="load-probe", daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append(os.getloadavg()[0])

    def since(self, start: int) -> dict[str, float]:
        window = self.samples[start:] or self.samples[-1:]
        return {"mean": round(statistics.fmean(window), 2), "max": round(max(window), 2)}


def rl_config(args: argparse.Namespace, sft: str, out: Path, seed: int, mode: str) -> RLConfig:
    return RLConfig(
        model=sft,
        out=str(out),
        task_app_url=args.app_url,
        model_server_url=args.model_url,
        env_name=GAME.env,
        policy_name=GAME.policy,
        policy_config=agent_config(args, 1.0, tokenizer=sft),
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
    counts: Counter[str] = Counter()
    if mode == "async":
        last = rows[-1]
        sampler_busy = last.get("stream_sampler_busy_s", 0.0) / max(last.get("stream_open_s", 0.0), 1e-9)
        for r in rows:
            counts.update(r.get("stream_staleness_counts", {}))
        restarted, dropped = last.get("stream_restarted_stale", 0), last.get("stream_dropped_stale", 0)
    else:
        sampler_busy = waiting / wall  # groups play only while the step collects them
        counts["0"], restarted, dropped = sum(r["groups"] for r in rows), 0, 0
    episodes = sum(r["groups"] for r in rows) * args.group_size
    return {
        "final": result["final"],
        "wall_s": round(wall, 2),
        "episodes_trained": episodes,
        "optimizer_steps": len(rows),
        "steps_without_signal": sum(1 for r in rows if not r.get("samples")),  # no update made
        "s_per_1000_episodes": round(wall / max(episodes, 1) * 1000, 1),
        "trainer_idle": round(waiting / wall, 4),
        "sampler_idle": round(1 - sampler_busy, 4),
        "staleness": dict(sorted(counts.items())),
        "restarted_stale": restarted,
        "dropped_stale": dropped,
        "stale_samples_dropped": sum(r.get("stale_samples", 0) for r in rows),
        "groups_all_equal": sum(r.get("groups_all_equal", 0) for r in rows),
        "stream_samples": sum(r.get("streams", 0) for r in rows),
        "train_success": [r.get("success_rate") for r in rows],
    }


def run_trl(args: argparse.Namespace, sft: str, out: Path, seed: int) -> dict[str, Any]:
    from datasets import Dataset
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    template = rl_config(args, sft, out, seed, "async")
    stream = {
        "group": {
            "group_size": args.group_size,
            "env": {"env_name": GAME.env, "seed": 0},
            "policy": {
                "policy_name": GAME.policy,
                "config": agent_config(args, 1.0, model="tiny", tokenizer=sft),
            },
            "max_turns": args.turns,
            "record": {"logprobs": True, "observations": False},
        },
        "seeds": template.seeds,
        "in_flight": args.in_flight or 2 * args.groups,
        "max_staleness": args.max_staleness,
    }
    samples_per_group: Counter[int] = Counter()

    def to_samples(taken: Any, credit: Any) -> list[Any]:
        # one sample per episode stream, zero advantages kept: a step of B x G samples is B groups
        out = trl_async.decision_samples(taken, credit, keep_zero_advantage=True)
        samples_per_group[len(out)] += 1
        return out

    # TRL's queue holds one group's samples: the worker then runs at most about one group ahead
    # of the stream's in-flight bound, as our async trainer does with the stream alone
    worker = trl_async.TaskAppRolloutWorker(
        args.app_url, stream, to_samples=to_samples, queue_maxsize=args.group_size
    )
    transfer = trl_async.TaskAppWeightTransfer(
        args.model_url, sft, out / "weights", on_version=worker.note_version
    )
    config = AsyncGRPOConfig(
        output_dir=str(out / "trl"),
        max_steps=args.steps,
        per_device_train_batch_size=args.group_size,  # a micro-batch: G samples, one group
        gradient_accumulation_steps=args.groups,  # an optimizer step: B groups
        token_budget=0,  # batch by count, not by tokens
        bf16=False,
        dtype="float32",
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        temperature=1.0,
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
            )
            trainer.train()
    finally:
        worker.stop()
    wall = time.monotonic() - started
    logs = trainer.state.log_history
    waiting = sum(x.get("perf/rollout_wait_s", 0.0) for x in logs)
    info = worker.info
    busy = info.busy_s / max(info.open_s, 1e-9) if info is not None else 0.0
    # TRL's count batcher: exactly B x G samples an optimizer step, one per episode when every
    # group gave G samples (`samples_per_group`), less any TRL dropped as stale when it took them
    dropped_samples = int(sum(x.get("sample/dropped_stale_total", 0.0) for x in logs))
    episodes = trainer.state.global_step * args.groups * args.group_size
    return {
        "final": str(out / "weights" / f"v{transfer.version}"),
        "wall_s": round(wall, 2),
        "episodes_trained": episodes,
        "optimizer_steps": trainer.state.global_step,
        # a step on B groups all without signal: zero gradient (AdamW's momentum still moves)
        "steps_without_signal": sum(1 for x in logs if "grad_norm" in x and x["grad_norm"] == 0),
        "s_per_1000_episodes": round(wall / max(episodes, 1) * 1000, 1),
        "trainer_idle": round(min(1.0, waiting / wall), 4),
        "sampler_idle": round(1 - busy, 4),
        "staleness": {str(k): v for k, v in sorted(info.staleness.items())} if info else {},
        "restarted_stale": info.counters.restarted_stale if info else 0,
        "dropped_stale": info.counters.dropped_stale if info else 0,
        "stale_samples_dropped": dropped_samples,
        "consumed_staleness_max": max((x.get("sample/staleness_max", 0.0) for x in logs), default=0.0),
        "groups_taken": worker.groups,
        "samples_per_group": {str(k): v for k, v in sorted(samples_per_group.items())},
    }


def split_prediction(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """What async can buy with the sampler and the trainer on separate devices, from the sync
    runs' split: a sync step is sampling S then training and push T (the trainer waits exactly
    while its groups play); an async step costs at best max(S, T), and the faster side idles. The
    mirrored split (sampling taking the share training takes here) has the same bound with the
    idle roles swapped; ``gpu_sampling_0_8`` is a GPU step where sampling takes 0.8."""
    sync = [r for r in runs if r["trainer"] == "sync"]
    if not sync:
        return {}
    sampling = statistics.fmean(r["trainer_idle"] for r in sync)
    training = 1 - sampling

    def bound(s: float, t: float) -> dict[str, float]:
        return {
            "sampling_share": round(s, 4),
            "training_share": round(t, 4),
            "speedup_bound": round(1 / max(s, t), 3),
            "trainer_idle": round(max(0.0, 1 - t / s), 4),
            "sampler_idle": round(max(0.0, 1 - s / t), 4),
        }

    measured = {t: [r["s_per_1000_episodes"] for r in runs if r["trainer"] == t] for t in TRAINERS}
    means = {t: statistics.fmean(v) for t, v in measured.items() if v}
    return {
        "measured_sync_split": bound(sampling, training),
        "mirrored_split": bound(training, sampling),
        "gpu_sampling_0_8": bound(0.8, 0.2),
        "measured_speedup_over_sync": {
            t: round(means["sync"] / m, 3) for t, m in means.items() if t != "sync" and "sync" in means
        },
    }


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    ax = axes[0]
    for i, trainer in enumerate(TRAINERS):
        mine = [r for r in runs if r["trainer"] == trainer]
        for j, r in enumerate(mine):
            x = i + (j - (len(mine) - 1) / 2) * 0.15
            low, high = r["success_ci95"]
            ax.errorbar(
                x,
                r["success_after"],
                yerr=[[r["success_after"] - low], [high - r["success_after"]]],
                fmt="o",
                capsize=3,
                c=f"C{i}",
            )
    ax.axhline(report["sft_success"], ls="--", c="grey", label="SFT")
    ax.axhspan(*report["sft_ci95"], color="grey", alpha=0.12)
    ax.set_xticks(range(len(TRAINERS)), TRAINERS)
    ax.set_title(f"eval success after ({report['args']['eval_tasks']} tasks, 95% CI)")
    ax.legend()
    ax = axes[1]
    for i, trainer in enumerate(TRAINERS):
        values = [r["s_per_1000_episodes"] for r in runs if r["trainer"] == trainer]
        ax.scatter([i] * len(values), values, c=f"C{i}")
        if values:
            ax.bar(i, statistics.fmean(values), alpha=0.3, color=f"C{i}")
    ax.set_xticks(range(len(TRAINERS)), TRAINERS)
    ax.set_title("wall s per 1,000 episodes")
    width = 0.35
    for j, key in enumerate(("trainer_idle", "sampler_idle")):
        means = [statistics.fmean([r[key] for r in runs if r["trainer"] == t] or [0]) for t in TRAINERS]
        axes[2].bar([i + (j - 0.5) * width for i in range(len(TRAINERS))], means, width, label=key)
    axes[2].set_xticks(range(len(TRAINERS)), TRAINERS)
    axes[2].set_ylim(0, 1)
    axes[2].set_title("share of wall time idle (mean of seeds)")
    axes[2].legend()
    ax = axes[3]
    ages = sorted({int(k) for r in runs for k in r["staleness"]})
    for j, trainer in enumerate(TRAINERS):
        totals = Counter()
        for r in runs:
            if r["trainer"] == trainer:
                totals.update({int(k): v for k, v in r["staleness"].items()})
        n = sum(totals.values()) or 1
        ax.bar([a + (j - 1) * 0.27 for a in ages], [totals[a] / n for a in ages], 0.27, label=trainer)
    ax.set_xticks(ages)
    ax.set_xlabel("versions behind when taken")
    ax.set_title("staleness of the groups taken")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench_async"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--trainers", nargs="+", default=list(TRAINERS), choices=TRAINERS)
    parser.add_argument("--levels", type=int, nargs="+", default=[0, 1, 2], help="BabyAI levels played.")
    parser.add_argument("--teacher-tasks", type=int, default=30)
    parser.add_argument("--train-tasks", type=int, default=60)
    parser.add_argument("--eval-tasks", type=int, default=60)
    parser.add_argument("--turns", type=int, default=5, help="Decisions per episode at most.")
    parser.add_argument("--history", type=int, default=2, help="Past turns the agent replays.")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--sft-steps", type=int, default=80)
    parser.add_argument("--sft-lr", type=float, default=3e-3)
    parser.add_argument("--steps", type=int, default=12, help="Optimizer steps, every trainer.")
    parser.add_argument("--groups", type=int, default=2, help="B: groups per step.")
    parser.add_argument("--group-size", type=int, default=4, help="G: rollouts per group.")
    parser.add_argument("--in-flight", type=int, default=None, help="Async and TRL: groups in flight (2B).")
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--eval-temperature", type=float, default=0.7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    GAME.levels = args.levels
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": []}
    started = time.monotonic()
    load = LoadProbe()

    def lap(what: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] load {os.getloadavg()[0]:.2f} {what}", flush=True)

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
        sft_dir = str(sft_final.resolve())
        engine = ModelEngine(sft_final, served_name="tiny", max_batch_rows=32)
        with ServerThread(create_model_app(engine), name="model-server") as model_server:
            args.model_url = model_server.base_url
            eval_tasks = GAME.task_ids(1000, args.eval_tasks)
            sft_eval = eval_agent(app, eval_tasks, args)
            report["sft_success"], report["sft_ci95"] = sft_eval["success_rate"], sft_eval["success_ci95"]
            lap(f"eval sft: {report['sft_success']:.2f} {report['sft_ci95']}")
            for seed in args.seeds:
                for trainer in args.trainers:
                    engine.reload_weights(sft_final)
                    run_dir = out / f"{trainer}-s{seed}"
                    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run (train_rl would resume)
                    probe_from = len(load.samples)
                    if trainer == "trl":
                        run = run_trl(args, sft_dir, run_dir, seed)
                    else:
                        run = run_ours(args, sft_dir, run_dir, seed, trainer)
                    run["load_1min"] = load.since(probe_from)
                    engine.reload_weights(run["final"])
                    after = eval_agent(app, eval_tasks, args)
                    run["success_after"], run["success_ci95"] = after["success_rate"], after["success_ci95"]
                    report["runs"].append({"trainer": trainer, "seed": seed, **run})
                    report["prediction"] = split_prediction(report["runs"])
                    report["load_1min"] = load.since(0)
                    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
                    lap(
                        f"{trainer} seed {seed}: success {run['success_after']:.2f}, "
                        f"{run['optimizer_steps']} steps, {run['episodes_trained']} episodes, "
                        f"{run['s_per_1000_episodes']} s/1k episodes, "
                        f"trainer idle {run['trainer_idle']:.2f}, "
                        f"sampler idle {run['sampler_idle']:.2f}, staleness {run['staleness']}"
                    )
        engine.close()
    plot(report, out / "report.png")
    lap("done")


if __name__ == "__main__":
    main()
