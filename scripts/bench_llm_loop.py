"""SFT then GRPO as a benchmark: does a model made here learn to play a text game?

    python scripts/bench_llm_loop.py --out bench_llm [--env babyai] [--sft-steps 150] [--rl-steps 40]
        [--sampler serve-model|vllm] [--seed 0] [--sft-from RUN] [--token-stream]
    python scripts/bench_llm_loop.py --summarize RUN [RUN ...] --out SUMMARY [--keep SUMMARY.json]

Everything runs on 127.0.0.1: `init-model` (a Qwen3 with a tokenizer trained on the game's text)
→ the task app and the sampler (`serve-model` in this process, or the real vLLM with ``--sampler
vllm``; both load new weights through vLLM's weight-sync routes) → collect the scripted solver's
traced rollouts (the game's own LLM agent with ``teacher: oracle``: the agent's exact prompts
answered by the solver's action) → `export-sft` → SFT → GRPO against the task app → `eval` on held-out
tasks after each stage. The default game is BabyAI's single-room "go to" levels, which the
model plays in AgentGym's conversation (``Action: go to red ball 1``).

By default every stage plays one chat completion per decision (the last ``--history`` turns
replayed) and GRPO trains one sequence per decision. ``--token-stream`` plays every stage as the
trained model is sampled in a token stream (`envs.agent.streams`, mode ``exact``): the oracle's
replies are spans of each episode's stream (the tokens the model has to write, logprobs 0),
`export-sft --streams` gives one line per episode, SFT trains on those lines, GRPO plays and trains
on streams (``sequences = "stream"``), and the evaluations play streams too (``record.logprobs``
with the checkpoint as the policy's ``tokenizer``).

Writes OUT/report.json (success rate and mean score of the start model, after SFT and after
GRPO, each with its spread over the held-out tasks, a 95% interval and per level),
OUT/report.png (those figures), OUT/sft/curves.png and OUT/rl/curves.png (the runs' curves).
``--summarize`` gathers several runs' reports (training seeds, samplers) into SUMMARY/summary.json
and SUMMARY/summary.png: per sampler, each stage's success as mean and spread over the seeds, the
gain of GRPO over SFT paired by seed, and the wall time of a GRPO step and of its parts (runs with
``--token-stream`` under the sampler's name + ``-streams``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import torch

from grpo_service import Settings, create_app
from grpo_service.client.eval import EpisodeResult, EvalConfig, run_eval
from grpo_service.tracing import TraceReader
from grpo_service.tracing.export import ExportFilters, export_sft
from grpo_service.training_api.llm_jobs import TaskAppGroups
from tools.bench.samplers import sampler_server
from tools.server_thread import ServerThread
from training.llm.config import RLConfig, SFTConfig
from training.llm.model import ModelSpec, environment_corpus, init_model
from training.llm.rl import train_rl
from training.llm.sft import train_sft
from training.llm.weight_sync import WeightSync

BABYAI_LEVELS = 40  # AgentGym's task numbering: task i plays level i % 40 with reset seed i // 40


class Game:
    """How the benchmark plays one environment: its LLM agent and which tasks train and test."""

    def __init__(self, env: str, policy: str, levels: list[int] | None, success_reward: float) -> None:
        self.env, self.policy, self.levels = env, policy, levels
        self.success_reward = success_reward  # a rollout whose return reaches this solved its task

    def task_ids(self, start: int, count: int) -> list[int]:
        """``count`` task ids from the ``start``-th instance on (BabyAI: of each chosen level)."""
        if self.levels is None:
            return list(range(start, start + count))
        per_level = -(-count // len(self.levels))
        ids = [BABYAI_LEVELS * k + level for k in range(start, start + per_level) for level in self.levels]
        return ids[:count]

    def level(self, task: int) -> str:
        return f"level {task % BABYAI_LEVELS}" if self.levels is not None else "all"


GAMES = {
    # BabyAI's single-room "go to" levels: GoToRedBallGrey, GoToRedBall, GoToRedBallNoDists,
    # GoToObjS6, GoToLocalS8N7.
    # A solved task pays 1 - 0.9 * steps / max_steps (at least 0.1), an unsolved one 0.
    "babyai": Game("babyai", "babyai-agent", levels=[0, 1, 2, 3, 4], success_reward=0.1),
    "textcraft": Game("textcraft", "textcraft-agent", levels=None, success_reward=1.0),
}


def evaluate(
    app: ServerThread, game: Game, tasks: list[int], args: argparse.Namespace, tokenizer: Path
) -> dict[str, Any]:
    config = EvalConfig(
        base_url=app.base_url,
        model="tiny",
        env_name=game.env,
        policy=game.policy,
        max_turns=args.turns,
        seeds=tasks,
        concurrency=8,
        policy_config=policy_config(args, temperature=args.eval_temperature, tokenizer=tokenizer),
        logprobs=args.token_stream,  # with a tokenizer: each episode one token stream
    )
    return stage_report(asyncio.run(run_eval(config)), game)


def stage_report(results: list[EpisodeResult], game: Game) -> dict[str, Any]:
    """One evaluation's figures: success and score over the held-out tasks, per level, failures."""
    success = [1.0 if r.returned and r.total_return > 0 else 0.0 for r in results]
    scores = [r.total_return for r in results]
    by_level: dict[str, list[float]] = defaultdict(list)
    for r, s in zip(results, success, strict=True):
        by_level[game.level(r.seed)].append(s)
    failures: dict[str, int] = defaultdict(int)
    for r in results:
        if r.stop_reason and r.total_return <= 0:
            failures[r.stop_reason.split(":")[0]] += 1
    low, high = bootstrap_interval(success)
    return {
        "episodes": len(results),
        "success_rate": statistics.fmean(success),
        "success_std": statistics.pstdev(success),
        "success_ci95": [low, high],
        "mean_score": statistics.fmean(scores),
        "score_std": statistics.pstdev(scores),
        "mean_turns": statistics.fmean(r.turns for r in results),
        "invalid_turns": sum(r.invalid_turns for r in results),
        "success_by_level": {k: statistics.fmean(v) for k, v in sorted(by_level.items())},
        "unsolved_by_stop_reason": dict(failures),
    }


def traced_evaluations(db: Path) -> list[list[EpisodeResult]]:
    """The evaluations a run's trace DB holds, in the order they ran (one `run_eval` call's episodes
    share the run-id tag ``eval-<tag>-``), each episode as `run_eval` reports it."""
    by_tag: dict[str, list[EpisodeResult]] = defaultdict(list)
    with TraceReader(db) as reader:
        for s in reader.sessions():
            if s["mode"] != "eval" or not s["run_id"].startswith("eval-"):
                continue
            m = s["metrics"] or {}
            by_tag[s["run_id"].split("-")[1]].append(
                EpisodeResult(
                    index=len(by_tag[s["run_id"].split("-")[1]]),
                    seed=s["seed"],
                    run_id=s["run_id"],
                    returned=True,
                    status=s["status"],
                    stop_reason=s["stop_reason"],
                    turns=m.get("num_decisions", s["num_turns"]),
                    invalid_turns=m.get("invalid_decisions", 0),
                    steps=s["num_steps"],
                    total_return=float(sum(m.get("episode_returns", [s["total_reward"]]))),
                )
            )
    return list(by_tag.values())  # sessions() is ordered by start: so are the tags


def recover_report(game: Game, eval_tasks: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """The report of a run cut short before it wrote one (give the run's own arguments): the
    evaluations it finished, from its trace DB; SFT's and GRPO's progress, from their metrics."""
    out: Path = args.out
    report: dict[str, Any] = {
        "game": f"{game.env} levels {game.levels}" if game.levels else game.env,
        "eval_tasks": len(eval_tasks),
        "args": vars(args) | {"out": str(out), "sft_from": str(args.sft_from)},
        "finished": False,
        "recovered": True,
    }
    stages = ["eval_start"] if not (args.skip_start_eval or args.sft_from) else []
    evaluations = traced_evaluations(out / "traces.db")
    for stage, results in zip([*stages, "eval_sft", "eval_rl"], evaluations, strict=False):
        if len(results) == len(eval_tasks):  # an evaluation cut short is left out
            report[stage] = stage_report(results, game)
    sft = metrics_rows(out / "sft" / "metrics.jsonl")
    if sft:
        report["sft"] = {"steps": sft[-1]["step"], "first_loss": sft[0]["loss"], "last_loss": sft[-1]["loss"]}
    report["rl"] = {"steps": len(metrics_rows(out / "rl" / "metrics.jsonl"))}
    return report


def metrics_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.is_file() else []


def bootstrap_interval(values: list[float], draws: int = 2000) -> tuple[float, float]:
    """95% bootstrap interval of the mean over the held-out tasks."""
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(draws))
    return means[int(0.025 * draws)], means[int(0.975 * draws) - 1]


def bench_model_spec(hidden: int, layers: int, max_positions: int, seed: int = 0) -> ModelSpec:
    """The benchmarks' model: heads of 32 (vLLM's CPU kernels), a 2,048-token vocabulary."""
    return ModelSpec(
        vocab_size=2048,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=hidden // 32,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=2 * hidden,
        max_positions=max_positions,
        seed=seed,
    )


def policy_config(
    args: argparse.Namespace, temperature: float, tokenizer: Path, **extra: Any
) -> dict[str, Any]:
    """The agent's config; with ``--token-stream`` it names the model's tokenizer (the checkpoint
    directory), so a rollout that records token ids plays each episode as one token stream."""
    streams = {"tokenizer": str(tokenizer.resolve()), "token_stream": "exact"} if args.token_stream else {}
    return {
        "history_window": args.history,
        "temperature": temperature,
        "max_tokens": 24,
        **streams,
        **extra,
    }


def collect_teacher(
    app: ServerThread, game: Game, tasks: list[int], turns: int, policy: dict[str, Any], db: Path
) -> None:
    """The solver's rollouts through the task app (``policy``: the agent's config, with
    ``teacher: oracle``): the agent's prompts, the oracle's replies; returns once the trace DB
    holds all of them (the writer commits in the background)."""
    batch = f"{random.getrandbits(32):08x}"
    group_ids = {f"teacher-{batch}-{task}" for task in tasks}
    with httpx.Client(base_url=app.base_url, timeout=600) as client:
        for task in tasks:
            body = {
                "group_id": f"teacher-{batch}-{task}",
                "group_size": 1,
                "env": {"env_name": game.env, "seed": task, "config": {"oracle": True}},
                "max_turns": turns,
                "policy": {"policy_name": game.policy, "config": policy},
            }
            client.post("/rollout/group", json=body).raise_for_status()
    for _ in range(600):
        with TraceReader(db) as reader:
            if sum(1 for s in reader.sessions() if s["group_id"] in group_ids) >= len(group_ids):
                return
        time.sleep(0.1)


def plot_report(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = [("eval_start", "start model"), ("eval_sft", "after SFT"), ("eval_rl", "after GRPO")]
    stages = [(key, label) for key, label in stages if key in report]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    rates = [report[k]["success_rate"] for k, _ in stages]
    errors = [
        [r - report[k]["success_ci95"][0] for (k, _), r in zip(stages, rates, strict=True)],
        [report[k]["success_ci95"][1] - r for (k, _), r in zip(stages, rates, strict=True)],
    ]
    left.bar(
        [label for _, label in stages],
        rates,
        yerr=errors,
        capsize=6,
        color=["#999", "#4a90d9", "#2e8b57"][-len(stages) :],
    )
    left.set_ylim(0, 1)
    left.set_ylabel("success rate (held-out tasks, 95% interval)")
    left.set_title(f"{report['game']}: {report['eval_tasks']} held-out tasks")
    levels = sorted(report[stages[0][0]]["success_by_level"])
    width = 0.8 / len(stages)
    for i, (key, label) in enumerate(stages):
        xs = [j + i * width for j in range(len(levels))]
        right.bar(xs, [report[key]["success_by_level"][lvl] for lvl in levels], width, label=label)
    right.set_xticks([j + width * (len(stages) - 1) / 2 for j in range(len(levels))], levels)
    right.set_ylim(0, 1)
    right.set_title("success rate by level")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def kept_reports(summary_path: Path) -> dict[str, list[dict[str, Any]]]:
    """An earlier summary.json's seeds, per sampler, as the run reports `summarize` reads (the
    per-seed figures a summary keeps): for runs whose output directories are gone."""
    kept: dict[str, list[dict[str, Any]]] = {}
    for sampler, s in json.loads(summary_path.read_text())["samplers"].items():
        reports = []
        for i, seed in enumerate(s["seeds"]):
            by_seed = s["by_seed"][str(seed)]
            report: dict[str, Any] = {
                "args": {"seed": seed},
                "finished": s["finished"][i],
                "eval_tasks": s["eval_tasks"],
                "step_s": {part: v["values"][i] for part, v in s["rl_step_s"].items()},
                "rl_tokens": {key: v["values"][i] for key, v in s["rl_step_tokens"].items()},
                "rl_logprob_gap": by_seed["rl_logprob_gap_max"],
                "rl": {
                    "steps": s["rl_steps"][i],
                    "totals": by_seed["rl_totals"],
                    "weights_version_last": by_seed["weights_version_last"],
                },
                "sft": {"examples": s["sft_examples"][i]},
            }
            for stage, v in s["success"].items():
                if seed in v["seeds"]:
                    report[stage] = {
                        "success_rate": v["values"][v["seeds"].index(seed)],
                        "success_by_level": by_seed["success_by_level"].get(stage, {}),
                    }
            reports.append(report)
        kept[sampler] = reports
    return kept


def summarize(
    runs: list[Path], out: Path, beside: list[Path] | None = None, keep: Path | None = None
) -> dict[str, Any]:
    """Several runs' reports, per sampler: each stage's held-out success over the training seeds
    (mean, sample sd), GRPO's gain over the same seed's SFT checkpoint, and a GRPO step's wall time.
    ``keep``: an earlier summary.json whose seeds these runs do not give are kept from it (a run
    given for a kept seed replaces it). The plot shows the samplers of earlier summaries
    (``beside``) too; summary.json holds these runs."""
    by_sampler: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        report = json.loads((run / "report.json").read_text())
        steps = metrics_rows(run / "rl" / "metrics.jsonl")
        report["step_s"] = {
            part: statistics.fmean(m.get(part, 0.0) for m in steps)
            for part in ("rollout_s", "train_s", "weight_sync_s")
        }
        if "rl" in report.get("timings_s", {}):
            report["step_s"]["wall_s"] = report["timings_s"]["rl"] / len(steps)
        elif len(steps) > 1:  # cut short during GRPO: the time between its steps' records
            report["step_s"]["wall_s"] = (steps[-1]["time"] - steps[0]["time"]) / (len(steps) - 1)
        else:
            report["step_s"]["wall_s"] = sum(report["step_s"].values())
        report["rl_tokens"] = {
            key: statistics.fmean(m[key] for m in steps)
            for key in ("forward_tokens", "trained_tokens", "sequences")
            if all(key in m for m in steps)
        }
        report["rl_logprob_gap"] = max((m.get("logprob_max_abs_diff", 0.0) for m in steps), default=0.0)
        streams = "-streams" if report["args"].get("token_stream") else ""
        by_sampler[report["args"]["sampler"] + streams].append(report)
    for sampler, reports in (kept_reports(keep) if keep else {}).items():
        given = {r["args"]["seed"] for r in by_sampler[sampler]}
        by_sampler[sampler] += [r for r in reports if r["args"]["seed"] not in given]

    def spread(values: list[float]) -> dict[str, Any]:
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return {"values": values, "mean": statistics.fmean(values), "sd": sd}

    summary: dict[str, Any] = {"samplers": {}}
    for sampler, reports in by_sampler.items():
        reports.sort(key=lambda r: r["args"]["seed"])
        # each stage over the runs that reached it (a run cut short: the seeds say which)
        has = {k: [r for r in reports if k in r] for k in ("eval_start", "eval_sft", "eval_rl")}
        stages = {
            k: spread([r[k]["success_rate"] for r in done]) | {"seeds": [r["args"]["seed"] for r in done]}
            for k, done in has.items()
            if done
        }
        summary["samplers"][sampler] = {
            "seeds": [r["args"]["seed"] for r in reports],
            # False: the run was cut short (its report recovered: `--recover`)
            "finished": [r.get("finished", True) for r in reports],
            "eval_tasks": reports[0]["eval_tasks"],
            "success": stages,
            "success_by_level": {
                stage: {
                    level: statistics.fmean(r[stage]["success_by_level"][level] for r in has[stage])
                    for level in has[stage][0][stage]["success_by_level"]
                }
                for stage in ("eval_sft", "eval_rl")
                if has[stage]
            },
            "rl_step_s": {
                part: spread([r["step_s"][part] for r in reports]) for part in reports[0]["step_s"]
            },
            "rl_steps": [r["rl"]["steps"] for r in reports],
            # per GRPO step, mean over its steps: tokens one pass over the batch fed the model
            # (prompts included), tokens trained on, training sequences
            "rl_step_tokens": {
                key: spread([r["rl_tokens"][key] for r in reports])
                for key in reports[0]["rl_tokens"]
                if all(key in r["rl_tokens"] for r in reports)
            },
            "rl_logprob_gap_max": max(r["rl_logprob_gap"] for r in reports),
            # per seed: each stage by level, and GRPO's counts (streams, groups with no signal, stale)
            "by_seed": {
                str(r["args"]["seed"]): {
                    "success_by_level": {
                        k: r[k]["success_by_level"] for k in ("eval_sft", "eval_rl") if k in r
                    },
                    "rl_totals": r["rl"].get("totals"),
                    "weights_version_last": r["rl"].get("weights_version_last"),
                    "rl_logprob_gap_max": r["rl_logprob_gap"],
                }
                for r in reports
            },
            "sft_examples": [(r.get("sft") or {}).get("examples") for r in reports],
        }
        if both := [r for r in reports if "eval_sft" in r and "eval_rl" in r]:
            summary["samplers"][sampler]["gain_rl_over_sft"] = spread(
                [r["eval_rl"]["success_rate"] - r["eval_sft"]["success_rate"] for r in both]
            ) | {"seeds": [r["args"]["seed"] for r in both]}
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    earlier = [json.loads(path.read_text())["samplers"] for path in beside or []]
    plot_summary(
        {"samplers": {k: v for e in earlier for k, v in e.items()} | summary["samplers"]}, out / "summary.png"
    )
    for sampler, s in summary["samplers"].items():
        line = ", ".join(
            f"{k.removeprefix('eval_')} {v['mean']:.3f} (sd {v['sd']:.3f})" for k, v in s["success"].items()
        )
        w = s["rl_step_s"]["wall_s"]
        if g := s.get("gain_rl_over_sft"):
            per_seed = [round(v, 3) for v in g["values"]]
            line += f"; GRPO - SFT {g['mean']:+.3f} (sd {g['sd']:.3f}, per seed {per_seed})"
        print(f"{sampler:12s} seeds {s['seeds']}: {line}; GRPO step {w['mean']:.1f} s (sd {w['sd']:.1f})")
    return summary


def plot_summary(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samplers = list(summary["samplers"])
    stages = [("eval_start", "start"), ("eval_sft", "after SFT"), ("eval_rl", "after GRPO")]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / len(samplers)
    for i, sampler in enumerate(samplers):
        s = summary["samplers"][sampler]
        xs = [j + i * width for j in range(len(stages))]
        means = [s["success"][k]["mean"] if k in s["success"] else 0.0 for k, _ in stages]
        sds = [s["success"][k]["sd"] if k in s["success"] else 0.0 for k, _ in stages]
        cut = [seed for seed, done in zip(s["seeds"], s.get("finished", []), strict=False) if not done]
        label = f"{sampler} (seeds {s['seeds']}" + (f"; cut short: {cut})" if cut else ")")
        left.bar(xs, means, width, yerr=sds, capsize=5, label=label)
        for x, (k, _) in zip(xs, stages, strict=True):
            if k not in s["success"]:  # not evaluated
                continue
            left.scatter(
                [x] * len(s["success"][k]["values"]), s["success"][k]["values"], color="k", s=12, zorder=3
            )
        if "gain_rl_over_sft" in s:
            gains = s["gain_rl_over_sft"]["values"]
            right.scatter([i] * len(gains), gains, color="k", zorder=3)
            right.bar(
                [i], [s["gain_rl_over_sft"]["mean"]], 0.5, yerr=[s["gain_rl_over_sft"]["sd"]], capsize=6
            )
    left.set_xticks(
        [j + width * (len(samplers) - 1) / 2 for j in range(len(stages))], [lbl for _, lbl in stages]
    )
    left.set_ylim(0, 1)
    left.set_ylabel(f"held-out success ({summary['samplers'][samplers[0]]['eval_tasks']} tasks)")
    left.set_title("mean and sd over training seeds (dots: seeds)")
    left.legend(loc="upper left")
    right.axhline(0, color="#999", lw=1)
    right.set_xticks(range(len(samplers)), samplers)
    right.set_ylabel("success after GRPO - after SFT")
    right.set_title("GRPO's gain over the same seed's SFT")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench_llm"))
    parser.add_argument("--env", choices=sorted(GAMES), default="babyai")
    parser.add_argument("--teacher-tasks", type=int, default=200, help="Solver rollouts distilled by SFT.")
    parser.add_argument("--eval-tasks", type=int, default=100, help="Held-out tasks of each evaluation.")
    parser.add_argument("--turns", type=int, default=6, help="Decisions per episode at most.")
    parser.add_argument("--history", type=int, default=2, help="Past turns replayed to the model.")
    parser.add_argument("--hidden", type=int, default=192)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--sft-steps", type=int, default=250)
    parser.add_argument("--sft-lr", type=float, default=2e-3)
    parser.add_argument("--rl-steps", type=int, default=40)
    parser.add_argument("--rl-lr", type=float, default=2e-4)
    parser.add_argument("--kl", type=float, default=0.0, help="KL coefficient to the SFT model.")
    parser.add_argument("--groups", type=int, default=6, help="B: starts per GRPO step.")
    parser.add_argument("--group-size", type=int, default=6, help="G: rollouts per start.")
    parser.add_argument("--eval-temperature", type=float, default=0.7)
    parser.add_argument(
        "--seed", type=int, default=0, help="Seed of initialisation, data order and sampling."
    )
    parser.add_argument(
        "--sampler", choices=["serve-model", "vllm"], default="serve-model", help="The inference server."
    )
    parser.add_argument(
        "--sft-from", type=Path, help="A previous run's OUT: reuse its model and SFT result, run GRPO only."
    )
    parser.add_argument(
        "--skip-start-eval",
        action="store_true",
        help="Do not evaluate the start model (random weights: it writes no action, and its "
        "evaluation is the slowest, every episode running to --turns with full-length replies).",
    )
    parser.add_argument(
        "--token-stream",
        action="store_true",
        help="Play every stage (teacher, SFT data, GRPO, evaluation) as token streams, not per decision.",
    )
    parser.add_argument(
        "--summarize", type=Path, nargs="+", metavar="RUN", help="Gather these runs' reports into --out."
    )
    parser.add_argument(
        "--recover",
        action="store_true",
        help="With the arguments of a run cut short (--out its OUT): write its OUT/report.json from what "
        "it left (finished evaluations, SFT and GRPO metrics), for --summarize.",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="SUMMARY",
        help="With --summarize: an earlier summary.json; its seeds that no RUN gives are kept.",
    )
    parser.add_argument(
        "--beside",
        type=Path,
        nargs="+",
        metavar="SUMMARY",
        help="With --summarize: earlier summary.json files whose samplers the plot shows too.",
    )
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize, args.out, args.beside, args.keep)
        return
    game = GAMES[args.env]
    eval_tasks = game.task_ids(1000, args.eval_tasks)  # instances no training run ever sees
    if args.recover:
        report = recover_report(game, eval_tasks, args)
        (args.out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        stages = [k for k in ("eval_start", "eval_sft", "eval_rl") if k in report]
        print(f"wrote {args.out / 'report.json'}: {stages}")
        return
    torch.set_num_threads(1)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    timings: dict[str, float] = {}
    report: dict[str, Any] = {}

    def lap(name: str) -> None:
        timings[name] = round(time.monotonic() - started - sum(timings.values()), 1)
        print(f"[{time.monotonic() - started:7.1f}s] {name} done", flush=True)
        if report:  # after each stage: a run cut short keeps what it measured
            partial = {**report, "timings_s": timings, "finished": False}
            (out / "report.json").write_text(json.dumps(partial, indent=2, default=str) + "\n")

    previous = json.loads((args.sft_from / "report.json").read_text()) if args.sft_from else None
    model_dir = (args.sft_from or out) / "model"
    teacher_tasks = game.task_ids(0, args.teacher_tasks)
    spec = bench_model_spec(args.hidden, args.layers, max_positions=2048, seed=args.seed)
    if previous is None:
        info = init_model(model_dir, environment_corpus(seeds=40, env_names=[game.env]), spec)
    else:
        info = previous["model"]
    lap("init-model")
    db = out / "traces.db"
    db.unlink(missing_ok=True)
    report.update(
        game=f"{game.env} levels {game.levels}" if game.levels else game.env,
        eval_tasks=len(eval_tasks),
        model=info,
        args=vars(args) | {"out": str(out), "sft_from": str(args.sft_from)},
    )
    with sampler_server(args.sampler, model_dir, out, served_name="tiny", max_model_len=2048) as sampler_url:
        settings = Settings(
            _env_file=None,
            state_dir=out / "state",
            trace_db=db,
            vllm_base_url=sampler_url,
            snapshot_secret="bench-" + "x" * 32,
        )
        with ServerThread(create_app(settings), name="task-app") as app:
            if previous is not None:  # the same start checkpoint: its evaluation is the previous run's
                if "eval_start" in previous:
                    report["eval_start"] = previous["eval_start"]
            elif not args.skip_start_eval:
                report["eval_start"] = evaluate(app, game, eval_tasks, args, model_dir)
            lap("eval start")
            if previous is None:
                teacher = policy_config(args, 0.0, model_dir, teacher="oracle")
                collect_teacher(app, game, teacher_tasks, args.turns, teacher, db)
                export = export_sft(
                    db, out / "sft.jsonl", ExportFilters(model="oracle"), streams=args.token_stream
                )
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
                        lr=args.sft_lr,
                        warmup_steps=10,
                        save_every=50,
                        seed=args.seed,
                    )
                )
                report["sft"] = {
                    k: sft[k] for k in ("steps", "examples", "first_loss", "last_loss", "wall_s")
                }
                lap("sft")
            else:
                sft = {"final": str(args.sft_from / "sft" / "final")}
                report["sft"] = previous["sft"]
                report["export"] = previous.get("export")
            WeightSync(sampler_url).load(Path(sft["final"]), 0)
            report["eval_sft"] = evaluate(app, game, eval_tasks, args, model_dir)
            lap("eval sft")
            rl = train_rl(
                RLConfig(
                    model=sft["final"],
                    out=str(out / "rl"),
                    task_app_url=app.base_url,
                    model_server_url=sampler_url,
                    env_name=game.env,
                    policy_name=game.policy,
                    policy_config=policy_config(args, temperature=1.0, tokenizer=model_dir),
                    sequences="stream" if args.token_stream else "decision",
                    seeds=teacher_tasks,  # GRPO plays the tasks SFT was distilled from
                    steps=args.rl_steps,
                    groups_per_step=args.groups,
                    group_size=args.group_size,
                    max_turns=args.turns,
                    lr=args.rl_lr,
                    kl_coef=args.kl,
                    success_reward=game.success_reward,
                    updates_per_step=1,
                    micro_batch=16,
                    save_every=20,
                    seed=args.seed,
                ),
                task_app=TaskAppGroups(app.base_url),
            )
            keys = (
                "steps",
                "reward_first",
                "reward_last",
                "totals",
                "weights_version_first",
                "weights_version_last",
            )
            report["rl"] = {k: rl[k] for k in keys}
            lap("rl")
            report["eval_rl"] = evaluate(app, game, eval_tasks, args, model_dir)
            lap("eval rl")
    report["timings_s"], report["finished"] = timings, True
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    plot_report(report, out / "report.png")
    for stage in [k for k in ("eval_start", "eval_sft", "eval_rl") if k in report]:
        e = report[stage]
        low, high = e["success_ci95"]
        print(
            f"{stage:10s} success {e['success_rate']:.2f} (sd {e['success_std']:.2f}, "
            f"95% {low:.2f}-{high:.2f})  "
            f"score {e['mean_score']:.3f} (sd {e['score_std']:.3f})  turns {e['mean_turns']:.2f}  "
            f"by level {e['success_by_level']}"
        )


if __name__ == "__main__":
    main()
