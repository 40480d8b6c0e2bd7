"""TRL's GRPOTrainer beside the project's GRPO, from one SFT checkpoint, on BabyAI.

    python scripts/bench_trl.py --out bench_trl [--seeds 0 1 2] [--steps 10] [--groups 2] [--group-size 4]

Everything runs in this process on 127.0.0.1: the task app and `serve-model`; the BabyAI solver's
episodes in both conversation shapes (TRL's: the env's observations come back as tool results, via
`grpo_service.client.trl_env.play_episode`; the project's agent with the ``tool_calls`` format: its traced
rollouts through ``export-sft``); `init-model` and the project's SFT on both; then for each seed
TRL's `GRPOTrainer` (``environment_factory`` over the task app, ``use_vllm=False``) and the
project's `train --type rl` with the same budget of episodes (steps x B x G) and learning rate.
Each GRPO run is evaluated on held-out tasks in the shape it trained in (TRL's conversation played
against `serve-model`; the project's `eval`), as is the SFT checkpoint before it.

Writes OUT/report.json (success rates and scores before and after, per seed, the wall time per
step of each trainer and the task app's share of a TRL step) and OUT/report.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import torch

from grpo_service import Settings, create_app
from grpo_service.client.eval import EvalConfig, run_eval
from grpo_service.client.trl_env import (
    SERVICE_CLOCK,
    TaskAppEnv,
    environment_factory,
    play_episode,
    solver_reply,
    write_demonstrations,
)
from grpo_service.tracing.export import ExportFilters, export_sft
from grpo_service.training_api.llm_jobs import TaskAppGroups
from scripts.bench_llm_loop import GAMES, bench_model_spec, bootstrap_interval, collect_teacher
from tools.server_thread import ServerThread
from training.llm.config import RLConfig, SFTConfig
from training.llm.model import environment_corpus, init_model, jsonl_corpus
from training.llm.rl import train_rl
from training.llm.server import ModelEngine, create_model_app
from training.llm.sft import train_sft

GAME = GAMES["babyai"]
SYSTEM = (
    "You play BabyAI, a grid world. Reach the goal the observation names. Each turn, call the act "
    "tool with one of the available actions. When the episode is over, answer Done."
)
PROMPT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ""}]
MAX_TOKENS = 64


def agent_config(args: argparse.Namespace, temperature: float, **extra: Any) -> dict[str, Any]:
    """The project's BabyAI agent in the tool-calling format, with TRL's system prompt."""
    return {
        "inference_url": args.model_url,
        "prompt_format": "tool_calls",
        "system_prompt": SYSTEM,
        "history_window": args.history,
        "temperature": temperature,
        "max_tokens": MAX_TOKENS,
        **extra,
    }


def summary(success: list[float], scores: list[float]) -> dict[str, Any]:
    low, high = bootstrap_interval(success)
    return {
        "episodes": len(success),
        "success_rate": statistics.fmean(success),
        "success_ci95": [low, high],
        "mean_score": statistics.fmean(scores),
    }


def eval_agent(app: ServerThread, tasks: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """The project's `eval`: its agent (tool-calling format) against the served weights."""
    config = EvalConfig(
        base_url=app.base_url,
        model="tiny",
        env_name=GAME.env,
        policy=GAME.policy,
        max_turns=args.turns,
        seeds=tasks,
        concurrency=8,
        policy_config=agent_config(args, args.eval_temperature),
    )
    results = asyncio.run(run_eval(config))
    return summary(
        [1.0 if r.returned and r.total_return > 0 else 0.0 for r in results],
        [r.total_return for r in results],
    )


def eval_trl_shape(
    env_class: type[TaskAppEnv], model_url: str, tasks: list[int], args: argparse.Namespace
) -> dict[str, Any]:
    """Episodes in TRL's conversation, the served weights replying (8 at a time, batched)."""

    def play(task: int) -> tuple[float, float]:
        env = env_class()
        client = httpx.Client(base_url=model_url, timeout=600)

        def reply(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
            body = {
                "model": "tiny",
                "messages": messages,
                "tools": tools,
                "temperature": args.eval_temperature,
                "max_tokens": MAX_TOKENS,
                "seed": task,
            }
            answer = client.post("/v1/chat/completions", json=body)
            answer.raise_for_status()
            message = answer.json()["choices"][0]["message"]
            out: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
            if message.get("tool_calls"):
                out["tool_calls"] = message["tool_calls"]
            return out

        try:
            episode = play_episode(env, PROMPT, {"seed": task}, reply, args.turns + 1)
        finally:
            env._close()
            client.close()
        return (1.0 if episode.reward > 0 else 0.0), episode.reward

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(play, tasks))
    return summary([s for s, _ in results], [r for _, r in results])


def collect_agent_demos(
    app: ServerThread, tasks: list[int], args: argparse.Namespace, db: Path, out: Path
) -> int:
    """The solver through the project's agent (tool-calling format), traced, then `export-sft`."""
    collect_teacher(app, GAME, tasks, args.turns, agent_config(args, 0.0, teacher="oracle"), db)
    return export_sft(db, out, ExportFilters(model="oracle")).examples


def train_trl(
    env_class: type[TaskAppEnv], model: str, tasks: list[int], seed: int, out: Path, args: argparse.Namespace
) -> dict[str, Any]:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    rng = random.Random(seed)
    rows = [{"prompt": PROMPT, "seed": rng.choice(tasks)} for _ in range(args.steps * args.groups)]
    config = GRPOConfig(
        output_dir=str(out),
        max_steps=args.steps,
        per_device_train_batch_size=args.groups * args.group_size,
        num_generations=args.group_size,
        max_completion_length=args.max_completion,
        max_tool_calling_iterations=args.turns,
        temperature=1.0,
        learning_rate=args.lr,
        beta=0.0,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=seed,
        shuffle_dataset=False,
    )
    trainer = GRPOTrainer(
        model=model, args=config, train_dataset=Dataset.from_list(rows), environment_factory=env_class
    )
    SERVICE_CLOCK.reset()
    started = time.monotonic()
    trainer.train()
    wall = time.monotonic() - started
    trainer.save_model(str(out / "final"))
    trainer.processing_class.save_pretrained(str(out / "final"))
    for env in trainer._environment_pool[None]:
        env._close()
    logs = [e for e in trainer.state.log_history if "loss" in e]
    return {
        "final": str(out / "final"),
        "steps": trainer.state.global_step,
        "episodes": args.steps * args.groups * args.group_size,
        "wall_s": round(wall, 1),
        "step_s": round(wall / max(1, trainer.state.global_step), 2),
        "service_s": round(SERVICE_CLOCK.seconds, 2),
        "service_frames": SERVICE_CLOCK.frames,
        "service_share": round(SERVICE_CLOCK.seconds / wall, 4),
        "reward_by_step": [round(e.get("reward", 0.0), 4) for e in logs],
        "tool_calls_per_step": [round(e.get("tools/call_frequency", 0.0), 3) for e in logs],
    }


def reevaluate(
    engine: ModelEngine,
    play_class: type[TaskAppEnv],
    app: ServerThread,
    sft_final: str,
    out: Path,
    report: dict[str, Any],
    tasks: list[int],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Every checkpoint of the run (SFT, and each seed's TRL and project GRPO) in both shapes."""

    def both(path: str) -> dict[str, Any]:
        engine.reload_weights(path)
        return {
            "trl_shape": eval_trl_shape(play_class, args.model_url, tasks, args),
            "agent": eval_agent(app, tasks, args),
        }

    result: dict[str, Any] = {"tasks": len(tasks), "sft": both(sft_final), "runs": []}
    for run in report["runs"]:
        seed = run["seed"]
        result["runs"].append(
            {
                "seed": seed,
                "trl": both(str(out / f"trl-{seed}" / "final")),
                "project": both(str(out / f"rl-{seed}" / "final")),
            }
        )
    engine.reload_weights(sft_final)
    return result


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    labels, means, points = [], [], []
    again = report.get("reeval")
    for key, label in (("trl", "TRL GRPOTrainer"), ("project", "project GRPO")):
        if again:  # each trainer in the conversation shape it trained in
            shape = "trl_shape" if key == "trl" else "agent"
            before = again["sft"][shape]["success_rate"]
            after = [run[key][shape]["success_rate"] for run in again["runs"]]
        else:
            before = report["sft"][f"eval_{key}"]["success_rate"]
            after = [run[key]["eval"]["success_rate"] for run in report["runs"]]
        labels += [f"{label}\nbefore (SFT)", f"{label}\nafter"]
        means += [before, statistics.fmean(after)]
        points += [[before], after]
    colors = ["#999", "#d98c4a", "#999", "#4a90d9"]
    ax.bar(range(4), means, color=colors)
    for i, values in enumerate(points):
        ax.scatter([i] * len(values), values, color="black", zorder=3, s=14)
    ax.set_xticks(range(4), labels)
    ax.set_ylim(0, 1)
    tasks = again["tasks"] if again else report["sft"]["eval_trl"]["episodes"]
    ax.set_ylabel(f"success rate, {tasks} held-out tasks")
    budget = report["runs"][0]["trl"]["episodes"]
    ax.set_title(
        f"BabyAI: one SFT checkpoint, then {budget} training episodes per run ({len(report['runs'])} seeds)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench_trl"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--levels", type=int, nargs="+", default=[0, 1, 2], help="BabyAI levels played.")
    parser.add_argument("--teacher-tasks", type=int, default=60)
    parser.add_argument("--eval-tasks", type=int, default=30)
    parser.add_argument("--turns", type=int, default=5, help="Decisions per episode at most.")
    parser.add_argument("--history", type=int, default=2, help="Past turns the project's agent replays.")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--sft-steps", type=int, default=200)
    parser.add_argument("--sft-lr", type=float, default=3e-3)
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps of each trainer.")
    parser.add_argument("--groups", type=int, default=2, help="B: prompts (starts) per step.")
    parser.add_argument("--group-size", type=int, default=4, help="G: rollouts per prompt.")
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--max-completion", type=int, default=1024, help="TRL: tokens of a whole episode.")
    parser.add_argument("--eval-temperature", type=float, default=0.7)
    parser.add_argument(
        "--reeval",
        action="store_true",
        help="Evaluate OUT's checkpoints again on --eval-tasks tasks, each in both conversation shapes.",
    )
    args = parser.parse_args()
    args.model_url = "http://127.0.0.1:9"  # the solver's rollouts call no model; set once one is served
    torch.set_num_threads(1)
    game = GAMES["babyai"]
    game.levels = args.levels
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    teacher_tasks = game.task_ids(0, args.teacher_tasks)
    eval_tasks = game.task_ids(1000, args.eval_tasks)
    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": []}
    started = time.monotonic()

    def lap(what: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {what}", flush=True)

    db = out / "traces.db"
    model_dir, sft_dir = out / "model", out / "sft"
    settings = Settings(
        _env_file=None,
        state_dir=out / "state",
        trace_db=db,
        snapshot_secret="bench-" + "x" * 32,
        max_envs=256,
    )
    with ServerThread(create_app(settings), name="task-app") as app:
        play_class = environment_factory(app.base_url, GAME.env, config={"max_steps": 64})
        if not (sft_dir / "final" / "config.json").exists():
            teacher = environment_factory(app.base_url, GAME.env, config={"oracle": True})
            trl_demos = write_demonstrations(
                teacher,
                PROMPT,
                [{"seed": t} for t in teacher_tasks],
                out / "demos_trl.jsonl",
                solver_reply,
                args.turns + 1,
            )
            agent_examples = collect_agent_demos(app, teacher_tasks, args, db, out / "demos_agent.jsonl")
            with open(out / "sft.jsonl", "w") as f:
                for name in ("demos_trl.jsonl", "demos_agent.jsonl"):
                    f.write((out / name).read_text())
            report["demos"] = {
                "trl_episodes": len(trl_demos),
                "trl_solved": sum(e.reward > 0 for e in trl_demos),
                "agent_examples": agent_examples,
            }
            lap("demonstrations")
            spec = bench_model_spec(args.hidden, args.layers, max_positions=4096)
            texts = list(jsonl_corpus([out / "sft.jsonl"])) + list(
                environment_corpus(seeds=10, env_names=[GAME.env])
            )
            report["model"] = init_model(model_dir, texts, spec)
            sft = train_sft(
                SFTConfig(
                    model=str(model_dir),
                    dataset=str(out / "sft.jsonl"),
                    out=str(sft_dir),
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
                k: sft[k] for k in ("steps", "examples", "skipped", "first_loss", "last_loss", "wall_s")
            }
            lap("sft")
        else:
            previous = json.loads((out / "report.json").read_text())
            keep = ("demos", "model", "sft") + (("runs",) if args.reeval else ())
            report.update({k: v for k, v in previous.items() if k in keep})
        sft_final = str(sft_dir / "final")
        engine = ModelEngine(sft_final, served_name="tiny", max_batch_rows=32)
        with ServerThread(create_model_app(engine), name="model-server") as model_server:
            args.model_url = model_server.base_url
            if args.reeval:
                report["reeval"] = reevaluate(
                    engine, play_class, app, sft_final, out, report, eval_tasks, args
                )
                (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
                lap("re-evaluated")
                engine.close()
                plot(report, out / "report.png")
                return
            if "eval_trl" not in report["sft"]:
                report["sft"]["eval_trl"] = eval_trl_shape(
                    play_class, model_server.base_url, eval_tasks, args
                )
                report["sft"]["eval_project"] = eval_agent(app, eval_tasks, args)
                lap(
                    f"eval sft: {report['sft']['eval_trl']['success_rate']:.2f} (TRL shape), "
                    f"{report['sft']['eval_project']['success_rate']:.2f} (agent)"
                )
            (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
            for seed in args.seeds:
                run: dict[str, Any] = {"seed": seed}
                trl_run = train_trl(play_class, sft_final, teacher_tasks, seed, out / f"trl-{seed}", args)
                engine.reload_weights(trl_run["final"])
                trl_run["eval"] = eval_trl_shape(play_class, model_server.base_url, eval_tasks, args)
                run["trl"] = trl_run
                lap(
                    f"seed {seed}: TRL {trl_run['eval']['success_rate']:.2f}, {trl_run['step_s']} s/step, "
                    f"service share {trl_run['service_share']:.1%}"
                )
                engine.reload_weights(sft_final)
                t0 = time.monotonic()
                rl = train_rl(
                    RLConfig(
                        model=sft_final,
                        out=str(out / f"rl-{seed}"),
                        task_app_url=app.base_url,
                        model_server_url=model_server.base_url,
                        env_name=GAME.env,
                        policy_name=GAME.policy,
                        policy_config=agent_config(args, 1.0),
                        seeds=teacher_tasks,
                        steps=args.steps,
                        groups_per_step=args.groups,
                        group_size=args.group_size,
                        max_turns=args.turns,
                        lr=args.lr,
                        success_reward=game.success_reward,
                        updates_per_step=1,
                        micro_batch=16,
                        save_every=1000,
                        seed=seed,
                    ),
                    task_app=TaskAppGroups(app.base_url),
                )
                wall = time.monotonic() - t0
                run["project"] = {
                    "steps": rl["steps"],
                    "episodes": args.steps * args.groups * args.group_size,
                    "wall_s": round(wall, 1),
                    "step_s": round(wall / max(1, rl["steps"]), 2),
                    "reward_first": rl["reward_first"],
                    "reward_last": rl["reward_last"],
                    "eval": eval_agent(app, eval_tasks, args),  # the server holds the trained weights
                }
                project = run["project"]
                lap(f"seed {seed}: project {project['eval']['success_rate']:.2f}, {project['step_s']} s/step")
                engine.reload_weights(sft_final)
                report["runs"].append(run)
                (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        engine.close()
    plot(report, out / "report.png")
    for key in ("trl", "project"):
        after = [r[key]["eval"]["success_rate"] for r in report["runs"]]
        print(
            f"{key:8s} before {report['sft'][f'eval_{key}']['success_rate']:.2f}  after "
            f"{statistics.fmean(after):.2f} (sd {statistics.pstdev(after):.2f}, per seed {after})"
        )


if __name__ == "__main__":
    main()
