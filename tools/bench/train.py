"""``grpo-service bench train``: our GRPO against stable-baselines3's PPO on CartPole-v1, from
scratch, on one core, in the same run: wall time and environment steps until the mean return of
the last 20 training episodes reaches 475, on the same step budget, over several seeds.

PPO uses rl-baselines3-zoo's tuned CartPole-v1 hyperparameters (the strongest anchor a user
would pick); GRPO uses `GRPO_BENCH` below. Both runs alternate seed by seed, in this process,
pinned to one CPU with one torch thread; imports happen before any clock starts.
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

TARGET = 475.0
WINDOW = 20
ENV = "CartPole-v1"
MODES: dict[str, dict[str, Any]] = {
    "smoke": {"seeds": [0], "budget": 1_000},
    "quick": {"seeds": [0, 1, 2], "budget": 300_000},
    "full": {"seeds": [0, 1, 2, 3, 4, 5], "budget": 600_000},
}
GRPO_BENCH: dict[str, Any] = {
    "env_name": ENV,
    "reward_function_type": "optimized_cartpole",
    "learning_rate": 1e-2,
    "n_steps": 32,
    "group_size": 8,
    "batch_size": 64,
    "n_epochs": 4,
}
PPO_ZOO: dict[str, Any] = {
    "n_envs": 8,
    "n_steps": 32,
    "batch_size": 256,
    "gae_lambda": 0.8,
    "gamma": 0.98,
    "n_epochs": 20,
    "ent_coef": 0.0,
    "learning_rate": 0.001,  # linear schedule to 0, as the zoo's lin_0.001
    "clip_range": 0.2,  # linear schedule to 0, as the zoo's lin_0.2
}


@contextlib.contextmanager
def one_cpu() -> Iterator[str]:
    """This process on one CPU with one torch thread; both restored afterwards."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cpus = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {max(cpus)})
        pinning = f"pinned to CPU {max(cpus)}, 1 torch thread"
    except (AttributeError, OSError):
        cpus, pinning = None, "not pinned (no sched_setaffinity), 1 torch thread"
    try:
        yield pinning
    finally:
        torch.set_num_threads(threads)
        if cpus is not None:
            os.sched_setaffinity(0, cpus)


def run_grpo(seed: int, budget: int, models_dir: Path) -> dict[str, Any]:
    from training.context import TrainContext
    from training.gym.config import GymTrainConfig
    from training.gym.trainer import train_gym

    config = GymTrainConfig(**GRPO_BENCH, seed=seed, total_timesteps=budget, target_return=TARGET)
    t0 = time.perf_counter()
    result = train_gym(config, TrainContext(models_dir, f"bench_grpo_{seed}"))
    wall = time.perf_counter() - t0
    m = result["metrics"]
    # Within the budget: an update that crosses it is not counted (PPO stops at the budget).
    reached = result["reason"] == "target_reached" and m.get("timesteps", 0) <= budget
    return {
        "algo": "grpo",
        "seed": seed,
        "reached": reached,
        "wall_s": round(wall, 2),
        "env_steps": m.get("timesteps", 0),
        "final_mean_return": round(m.get("mean_episode_return", 0.0), 1),
    }


def run_ppo(seed: int, budget: int) -> dict[str, Any]:
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    returns: deque[float] = deque(maxlen=WINDOW)
    state: dict[str, Any] = {"reached_at": None}

    class UntilTarget(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    returns.append(float(info["episode"]["r"]))
            if len(returns) == WINDOW and statistics.fmean(returns) >= TARGET:
                state["reached_at"] = self.num_timesteps
                return False
            return True

    hp = dict(PPO_ZOO)
    env = make_vec_env(ENV, n_envs=hp.pop("n_envs"), seed=seed)
    lr, clip = hp.pop("learning_rate"), hp.pop("clip_range")
    t0 = time.perf_counter()
    model = PPO(
        "MlpPolicy",
        env,
        learning_rate=lambda progress: lr * progress,
        clip_range=lambda progress: clip * progress,
        seed=seed,
        device="cpu",
        verbose=0,
        **hp,
    )
    model.learn(total_timesteps=budget, callback=UntilTarget())
    wall = time.perf_counter() - t0
    env.close()
    return {
        "algo": "sb3_ppo",
        "seed": seed,
        "reached": state["reached_at"] is not None,
        "wall_s": round(wall, 2),
        "env_steps": int(state["reached_at"] or model.num_timesteps),
        "final_mean_return": round(statistics.fmean(returns), 1) if returns else 0.0,
    }


def summarize(runs: list[dict[str, Any]], algo: str) -> dict[str, Any]:
    mine = [r for r in runs if r["algo"] == algo]
    reached = [r for r in mine if r["reached"]]
    return {
        "seeds": len(mine),
        "reached": len(reached),
        "median_wall_s": round(statistics.median(r["wall_s"] for r in mine), 2) if mine else None,
        "max_wall_s": max((r["wall_s"] for r in mine), default=None),
        "median_env_steps": int(statistics.median(r["env_steps"] for r in mine)) if mine else None,
    }


def run_train_bench(mode: str = "quick", log: Callable[[str], None] = print) -> dict[str, Any]:
    import gymnasium
    import stable_baselines3
    import torch

    import training.gym.trainer  # noqa: F401  (imported before any clock starts)

    warm = torch.nn.Linear(1, 1)  # the first optimizer step imports torch._dynamo (seconds): not timed
    optimizer = torch.optim.Adam(warm.parameters())
    warm(torch.ones(1)).sum().backward()
    optimizer.step()

    settings = MODES[mode]
    runs: list[dict[str, Any]] = []
    started = time.perf_counter()
    with one_cpu() as pinning, tempfile.TemporaryDirectory() as tmp:
        for seed in settings["seeds"]:
            for algo in ("grpo", "sb3_ppo") if seed % 2 == 0 else ("sb3_ppo", "grpo"):
                run = (
                    run_grpo(seed, settings["budget"], Path(tmp))
                    if algo == "grpo"
                    else run_ppo(seed, settings["budget"])
                )
                log(
                    f"{algo:8} seed {seed}: {'reached' if run['reached'] else 'NOT reached'} "
                    f"in {run['wall_s']} s, {run['env_steps']} env steps (mean {run['final_mean_return']})"
                )
                runs.append(run)
    grpo, ppo = summarize(runs, "grpo"), summarize(runs, "sb3_ppo")
    ratio = (
        round(ppo["median_wall_s"] / grpo["median_wall_s"], 2)
        if grpo["median_wall_s"] and ppo["median_wall_s"]
        else None
    )
    return {
        "mode": mode,
        "env": ENV,
        "target": f"mean return of the last {WINDOW} episodes >= {TARGET:g}",
        "budget_env_steps": settings["budget"],
        "duration_s": round(time.perf_counter() - started, 1),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "nproc": os.cpu_count(),
            "pinning": pinning,
            "torch": torch.__version__,
            "gymnasium": gymnasium.__version__,
            "stable_baselines3": stable_baselines3.__version__,
        },
        "grpo_config": GRPO_BENCH,
        "ppo_config": PPO_ZOO,
        "runs": runs,
        "summary": {"grpo": grpo, "sb3_ppo": ppo, "ppo_wall_over_grpo_wall": ratio},
        "goal": {
            "grpo_reaches_target_on_every_seed": grpo["reached"] == grpo["seeds"],
            "grpo_faster_than_ppo": ratio is not None and ratio > 1.0,
        },
    }


def render_train_report(report: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    m = report["machine"]
    console.print(
        f"[bold]grpo-service bench train[/] ({report['mode']}, {report['duration_s']} s): {report['env']}, "
        f"{report['target']}, budget {report['budget_env_steps']} steps; {m['nproc']} CPUs, {m['pinning']}"
    )
    table = Table()
    for col in ("algo", "seed", "reached", "wall s", "env steps", "final mean"):
        table.add_column(col, justify="left" if col in ("algo", "reached") else "right")
    for r in report["runs"]:
        table.add_row(
            r["algo"],
            str(r["seed"]),
            "yes" if r["reached"] else "[red]no[/]",
            f"{r['wall_s']:.2f}",
            str(r["env_steps"]),
            f"{r['final_mean_return']:.1f}",
        )
    console.print(table)
    s = report["summary"]
    for algo in ("grpo", "sb3_ppo"):
        x = s[algo]
        console.print(
            f"{algo:8} reached {x['reached']}/{x['seeds']}, median {x['median_wall_s']} s "
            f"(max {x['max_wall_s']} s), median {x['median_env_steps']} env steps"
        )
    console.print(f"PPO wall / GRPO wall (medians): {s['ppo_wall_over_grpo_wall']}")
