"""Per-turn credit from forking groups against plain GRPO, at an equal budget of sampled decisions.

    python scripts/bench_tree_credit.py run --sft-from bench_llm --out bench_tree --mode tree --seeds 0 1 2
    python scripts/bench_tree_credit.py run --sft-from bench_llm --out bench_tree --mode sft --seeds 0 1 2
    python scripts/bench_tree_credit.py summarize --out bench_tree

``run`` starts, from one SFT checkpoint (a ``scripts/bench_llm_loop.py`` run's OUT: its model and
``sft/final``), the task app and ``serve-model`` on 127.0.0.1 and, for each training seed, trains
GRPO with ``advantage = MODE`` until ``--turn-budget`` decisions have been sampled (every member's,
a fork's continuations included), then evaluates on the same held-out tasks as bench_llm_loop.py.
``group`` plays groups of ``--group-size`` from one start; ``tree`` plays ``--roots`` roots, each
forked by ``--fork`` (default: at its most uncertain turn into 2 continuations). ``sft`` trains
nothing: it evaluates the SFT checkpoint again per seed, the evaluation's own noise (it samples at
``--eval-temperature``). Modes and seeds can run side by side (one process each).

``summarize`` writes OUT/report.json (per mode: held-out success per seed, mean and spread, the
share of groups with no signal, wall time, decisions and tokens sampled) and OUT/curves.png.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import time
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_llm_loop import GAMES, evaluate, policy_config  # noqa: E402

from grpo_service import Settings, create_app  # noqa: E402
from grpo_service.training_api.llm_jobs import TaskAppGroups  # noqa: E402
from tools.server_thread import ServerThread  # noqa: E402
from training.llm.config import RLConfig  # noqa: E402
from training.llm.rl import train_rl  # noqa: E402
from training.llm.server import ModelEngine, create_model_app  # noqa: E402

MODES = ("sft", "group", "tree")  # sft: no training, the SFT checkpoint evaluated again (eval noise)
DEFAULT_FORK = {"rule": "max_entropy", "count": 1, "continuations": 2}


def rl_config(
    args: argparse.Namespace, mode: str, seed: int, sft: Path, out: Path, urls: tuple[str, str]
) -> RLConfig:
    game = GAMES[args.env]
    tree = mode == "tree"
    return RLConfig(
        model=str(sft),
        out=str(out),
        task_app_url=urls[0],
        model_server_url=urls[1],
        env_name=game.env,
        policy_name=game.policy,
        policy_config=policy_config(args, temperature=1.0),
        seeds=game.task_ids(0, args.teacher_tasks),  # the tasks SFT was distilled from
        steps=10_000,  # the turn budget stops the run
        turn_budget=args.turn_budget,
        groups_per_step=args.groups,
        group_size=args.roots if tree else args.group_size,
        advantage="tree" if tree else "group",
        fork=json.loads(args.fork) if tree else {},
        max_turns=args.turns,
        lr=args.rl_lr,
        success_reward=game.success_reward,
        micro_batch=16,
        save_every=10_000,
        seed=seed,
    )


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    game = GAMES[args.env]
    sft = args.sft_from / "sft" / "final"
    eval_tasks = game.task_ids(1000, args.eval_tasks)  # bench_llm_loop.py's held-out tasks
    out: Path = args.out / args.mode
    out.mkdir(parents=True, exist_ok=True)
    engine = ModelEngine(sft, served_name="tiny", max_batch_rows=32)
    own = out / f"seeds-{'-'.join(map(str, args.seeds))}"  # processes running other seeds beside this one
    with ServerThread(create_model_app(engine), name="model-server") as model_server:
        settings = Settings(
            _env_file=None,
            state_dir=own / "state",
            trace_db=own / "traces.db",
            vllm_base_url=model_server.base_url,
            snapshot_secret="bench-" + "x" * 32,
        )
        with ServerThread(create_app(settings), name="task-app") as app:
            for seed in args.seeds:
                run_dir = out / f"seed-{seed}"
                if args.mode == "sft":
                    run_dir.mkdir(parents=True, exist_ok=True)
                    held_out = evaluate(app, game, eval_tasks, args)
                    result = {"mode": "sft", "seed": seed, "eval": held_out}
                    (run_dir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
                    print(f"sft evaluation {seed}: success {held_out['success_rate']:.2f}", flush=True)
                    continue
                config = rl_config(args, args.mode, seed, sft, run_dir, (app.base_url, model_server.base_url))
                started = time.monotonic()
                rl = train_rl(config, task_app=TaskAppGroups(app.base_url))
                wall_s = time.monotonic() - started
                held_out = evaluate(app, game, eval_tasks, args)
                result = {
                    "mode": args.mode,
                    "seed": seed,
                    "config": config.model_dump(mode="json"),
                    "rl": {k: rl[k] for k in ("steps", "turns_sampled", "totals", "reward_last")},
                    "rl_wall_s": round(wall_s, 1),
                    "eval": held_out,
                }
                (run_dir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
                print(
                    f"{args.mode} seed {seed}: success {held_out['success_rate']:.2f} after "
                    f"{rl['steps']} steps, {rl['turns_sampled']} decisions, {wall_s:.0f} s",
                    flush=True,
                )
    engine.close()


def _metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trace_facts(out: Path, mode: str) -> dict[str, Any]:
    """What the training groups in the traces show: groups whose roots all earned the same (GRPO's
    no-signal case), how many of those a fork's continuation broke the tie in, where forks were
    made, and how often a continuation succeeded from a failed root's state."""
    groups: dict[str, list[sqlite3.Row]] = {}
    for db in sorted(out.glob(f"{mode}/seeds-*/traces.db")):
        with closing(sqlite3.connect(db)) as conn:
            conn.row_factory = sqlite3.Row
            rows = conn.execute(
                "SELECT group_id, group_index, parent_index, fork_turn, total_reward FROM sessions "
                "WHERE mode = 'rl' AND group_id IS NOT NULL"
            ).fetchall()
        for row in rows:
            groups.setdefault(f"{db}:{row['group_id']}", []).append(row)
    tied = broken = 0
    fork_turns: Counter[int] = Counter()
    from_failed = [0, 0]  # continuations of failed roots: played, succeeded
    from_solved = [0, 0]
    for members in groups.values():
        roots = {m["group_index"]: m["total_reward"] for m in members if m["parent_index"] is None}
        kids = [m for m in members if m["parent_index"] is not None]
        if len(set(roots.values())) == 1:
            tied += 1
            broken += any(k["total_reward"] > 0 for k in kids) and not any(r > 0 for r in roots.values())
        for k in kids:
            fork_turns[k["fork_turn"]] += 1
            tally = from_solved if roots.get(k["parent_index"], 0) > 0 else from_failed
            tally[0] += 1
            tally[1] += k["total_reward"] > 0
    return {
        "groups": len(groups),
        "roots_all_equal": tied,
        "roots_all_failed_but_a_copy_succeeded": broken,
        "continuations_by_fork_turn": dict(sorted(fork_turns.items())),
        "continuations_of_failed_roots": from_failed[0],
        "of_those_succeeded": from_failed[1],
        "continuations_of_solved_roots": from_solved[0],
        "of_those_succeeded_too": from_solved[1],
    }


def summarize(args: argparse.Namespace) -> None:
    report: dict[str, Any] = {"modes": {}}
    runs: dict[str, list[dict[str, Any]]] = {}
    for mode in MODES:
        results = sorted(args.out.glob(f"{mode}/seed-*/result.json"))
        if not results:
            continue
        evaluated = [json.loads(p.read_text()) for p in results]
        success = [r["eval"]["success_rate"] for r in evaluated]
        held_out = {
            "seeds": [r["seed"] for r in evaluated],
            "success": success,
            "success_mean": statistics.fmean(success),
            "success_sd": statistics.stdev(success) if len(success) > 1 else 0.0,
            "success_by_level": {
                level: statistics.fmean(r["eval"]["success_by_level"][level] for r in evaluated)
                for level in evaluated[0]["eval"]["success_by_level"]
            },
        }
        if mode == "sft":
            report["modes"][mode] = held_out
            continue
        metrics = [_metrics(p.parent / "metrics.jsonl") for p in results]
        runs[mode] = [r | {"metrics": m} for r, m in zip(evaluated, metrics, strict=True)]
        groups = sum(r["rl"]["totals"].get("groups", 0) for r in runs[mode])
        silent = sum(r["rl"]["totals"].get("groups_all_equal", 0) for r in runs[mode])
        tokens = [sum(m.get("completion_tokens", 0) for m in r["metrics"]) for r in runs[mode]]
        report["modes"][mode] = held_out | {
            "groups": groups,
            "groups_no_signal": silent,
            "share_no_signal": silent / groups if groups else None,
            "subgroups": sum(r["rl"]["totals"].get("subgroups", 0) for r in runs[mode]),
            "subgroups_no_signal": sum(r["rl"]["totals"].get("subgroups_all_equal", 0) for r in runs[mode]),
            "continuations": sum(r["rl"]["totals"].get("continuations", 0) for r in runs[mode]),
            "steps": [r["rl"]["steps"] for r in runs[mode]],
            "decisions": [r["rl"]["turns_sampled"] for r in runs[mode]],
            "completion_tokens": tokens,
            "rl_wall_s": [r["rl_wall_s"] for r in runs[mode]],
            "train_success_last": [r["metrics"][-1].get("success_rate") for r in runs[mode]],
            "traces": trace_facts(args.out, mode),
        }
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, runs, args.out / "curves.png")
    for mode, m in report["modes"].items():
        line = f"{mode} held-out success {m['success_mean']:.3f} (sd {m['success_sd']:.3f}: {m['success']})"
        if mode != "sft":
            line += (
                f"; no-signal groups {m['groups_no_signal']}/{m['groups']}; wall {m['rl_wall_s']} s; "
                f"decisions {m['decisions']}; tokens {m['completion_tokens']}"
            )
        print(line)


def plot(report: dict[str, Any], runs: dict[str, list[dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"group": "#4a90d9", "tree": "#2e8b57"}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for mode, results in runs.items():
        for i, r in enumerate(results):
            # By step: step k plays the same start tasks in every run (the seeds list, cycled).
            xs = [m["step"] for m in r["metrics"]]
            label = f"{mode}" if i == 0 else None
            success = [m["success_rate"] for m in r["metrics"]]
            axes[0].plot(xs, success, "o-", color=colors[mode], alpha=0.7, label=label)
            silent = [m["groups_all_equal"] / max(1, m["groups"]) for m in r["metrics"]]
            axes[1].plot(xs, silent, "o-", color=colors[mode], alpha=0.7, label=label)
    axes[0].set_title("training success of the roots (same tasks per step)")
    axes[1].set_title("share of groups with no signal")
    for ax in axes[:2]:
        ax.set_xlabel("GRPO step")
        ax.set_ylim(0, 1)
        ax.legend()
    modes = list(report["modes"])
    colors["sft"] = "#999"
    labels = ["after SFT" if m == "sft" else f"GRPO {m}" for m in modes]
    means = [report["modes"][m]["success_mean"] for m in modes]
    sds = [report["modes"][m]["success_sd"] for m in modes]
    axes[2].bar(labels, means, yerr=sds, capsize=6, color=[colors[m] for m in modes])
    for x, m in enumerate(modes):
        seeds = report["modes"][m]["success"]
        axes[2].scatter([x] * len(seeds), seeds, color="k", zorder=3)
    axes[2].set_ylim(0, 1)
    axes[2].set_title("held-out success (mean, sd; dots: seeds or evaluations)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["run", "summarize"])
    parser.add_argument("--out", type=Path, default=Path("bench_tree"))
    parser.add_argument("--sft-from", type=Path, help="A bench_llm_loop.py run's OUT (its model and SFT).")
    parser.add_argument("--mode", choices=MODES, default="group")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Training seeds.")
    parser.add_argument("--env", choices=sorted(GAMES), default="babyai")
    parser.add_argument("--turn-budget", type=int, default=500, help="Decisions sampled per run.")
    parser.add_argument("--groups", type=int, default=4, help="B: starts per GRPO step.")
    parser.add_argument("--group-size", type=int, default=6, help="G of mode group.")
    parser.add_argument("--roots", type=int, default=4, help="G of mode tree (each root forks).")
    parser.add_argument("--fork", default=json.dumps(DEFAULT_FORK), help="Mode tree's fork plan (JSON).")
    parser.add_argument("--rl-lr", type=float, default=2e-4)
    parser.add_argument("--teacher-tasks", type=int, default=200, help="Training tasks (bench_llm_loop's).")
    parser.add_argument("--eval-tasks", type=int, default=100, help="Held-out tasks (as bench_llm_loop.py).")
    parser.add_argument("--turns", type=int, default=6, help="Decisions per episode at most.")
    parser.add_argument("--history", type=int, default=2, help="Past turns replayed to the model.")
    parser.add_argument("--eval-temperature", type=float, default=0.7)
    args = parser.parse_args()
    if args.command == "run":
        if args.sft_from is None:
            parser.error("run needs --sft-from")
        run(args)
    else:
        summarize(args)


if __name__ == "__main__":
    main()
