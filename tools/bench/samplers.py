"""``grpo-service bench samplers``: GRPO groups through ``/rollout/group`` against each inference
server the project runs on a CPU: the real vLLM (its CPU build, when ``scripts/install-vllm.sh``
has installed it), ``serve-model`` and the vLLM-shaped fake, in one run on this machine.

Each sampler serves the same tiny Qwen3 made here (the fake ignores it). The task app runs
embedded (one process) and plays BabyAI with its LLM agent in ``rl`` mode (token ids and
logprobs recorded): ``groups`` groups of ``group_size`` members, ``turns`` decisions each,
``max_tokens`` per reply. Reported per sampler: decisions per second, and the share of a
decision's wall time spent waiting for the sampler (the LLM calls' latency as the task app
measured it) against the rest (the task app: the agent, the env, the trace, HTTP).
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

PLANS: dict[str, dict[str, int]] = {
    "smoke": {"repeats": 1, "groups": 1, "group_size": 2, "turns": 2, "max_tokens": 8},
    "quick": {"repeats": 2, "groups": 4, "group_size": 8, "turns": 4, "max_tokens": 32},
    "full": {"repeats": 3, "groups": 8, "group_size": 8, "turns": 6, "max_tokens": 32},
}
SERVED = "tiny-qwen3"


SAMPLERS = ("fake", "serve-model", "vllm")


@contextlib.contextmanager
def sampler_server(
    name: str, checkpoint: Path, root: Path, served_name: str = SERVED, max_model_len: int = 4096
) -> Iterator[str]:
    """Start sampler ``name`` (one of `SAMPLERS`) on ``checkpoint``; its base URL until exit."""
    from tools.server_thread import ServerThread

    if name == "fake":
        from tools.fake_server import FakeConfig, FakeInferenceServer

        config = FakeConfig(model=served_name, text_actions=["turn left", "turn right", "move forward"])
        with FakeInferenceServer(config) as fake:
            yield fake.base_url
    elif name == "serve-model":
        from training.llm.server import ModelEngine, create_model_app

        engine = ModelEngine(checkpoint, served_name=served_name)
        try:
            with ServerThread(create_model_app(engine), name="serve-model") as server:
                yield server.base_url
        finally:
            engine.close()
    else:
        from inference.vllm_server import VLLMServer, find_python, serve_args, serve_env
        from tools.ray_cluster import free_port

        args = serve_args(
            str(checkpoint),
            served_model_name=served_name,
            port=free_port(),
            dtype="float32",
            max_model_len=max_model_len,
        )
        with VLLMServer(
            find_python(), args, env=serve_env(kv_cache_gib=1), log_path=root / "vllm.log"
        ) as vllm:
            yield vllm.base_url


def _play(base_url: str, plan: dict[str, int], seed: int) -> dict[str, float]:
    body = {
        "group_size": plan["group_size"],
        "env": {"env_name": "babyai", "seed": seed},
        "policy": {
            "policy_name": "babyai-agent",
            "config": {"model": SERVED, "temperature": 1.0, "max_tokens": plan["max_tokens"]},
        },
        "max_turns": plan["turns"],
        "mode": "rl",
    }
    r = httpx.post(f"{base_url}/rollout/group", json=body, timeout=600)
    r.raise_for_status()
    decisions, llm_s, wall_s = 0, 0.0, 0.0
    for member in r.json()["members"]:
        result = member["result"]
        wall_s += result["metrics"]["wall_time_s"]
        for trajectory in result["trajectories"]:
            for step in trajectory["steps"]:
                if step.get("llm"):
                    decisions += 1
                    llm_s += step["llm"]["latency_ms"] / 1000
    return {"decisions": decisions, "llm_s": llm_s, "wall_s": wall_s}


def run_samplers_bench(
    mode: str, log: Callable[[str], None] = print, samplers: tuple[str, ...] = SAMPLERS
) -> dict[str, Any]:
    from grpo_service import Settings, create_app
    from inference.vllm_server import find_python
    from tools.server_thread import ServerThread
    from training.llm.model import ModelSpec, environment_corpus, init_model

    plan = PLANS[mode]
    started = time.monotonic()
    skipped: dict[str, str] = {}
    if "vllm" in samplers:
        try:
            find_python()
        except FileNotFoundError as exc:
            samplers = tuple(n for n in samplers if n != "vllm")
            skipped["vllm"] = str(exc)
    report: dict[str, Any] = {"mode": mode, "plan": plan, "samplers": {}, "skipped": skipped}
    with tempfile.TemporaryDirectory(prefix="bench-samplers-") as tmp:
        root = Path(tmp)
        texts = list(environment_corpus(seeds=1, steps=4, env_names=["babyai"]))
        spec = ModelSpec(vocab_size=768, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1)
        init_model(root / "model", texts, spec)
        for name in samplers:
            log(f"sampler {name}: starting")
            t0 = time.monotonic()
            with sampler_server(name, root / "model", root) as url:
                startup_s = time.monotonic() - t0
                settings = Settings(
                    _env_file=None,
                    state_dir=root / name / "state",
                    snapshot_secret="bench-" + "s" * 40,
                    vllm_base_url=url,
                    default_model=SERVED,
                    trace_db=root / name / "traces.db",
                )
                with ServerThread(create_app(settings), name="task-app") as app:
                    _play(app.base_url, {**plan, "groups": 1}, seed=0)  # warm-up
                    rates, llm_shares = [], []
                    for repeat in range(plan["repeats"]):
                        t1 = time.monotonic()
                        with ThreadPoolExecutor(plan["groups"]) as pool:
                            seeds = [1000 * repeat + g for g in range(plan["groups"])]
                            parts = list(pool.map(lambda s, url=app.base_url: _play(url, plan, s), seeds))
                        wall = time.monotonic() - t1
                        decisions = sum(p["decisions"] for p in parts)
                        rates.append(decisions / wall)
                        llm_shares.append(sum(p["llm_s"] for p in parts) / sum(p["wall_s"] for p in parts))
            share = statistics.median(llm_shares)
            report["samplers"][name] = {
                "startup_s": round(startup_s, 1),
                "decisions_per_s": round(statistics.median(rates), 2),
                "spread": [round(min(rates), 2), round(max(rates), 2)],
                "sampler_share": round(share, 3),
                "task_app_share": round(1 - share, 3),
            }
            log(f"sampler {name}: {report['samplers'][name]}")
    report["duration_s"] = round(time.monotonic() - started, 1)
    return report


def render_samplers_report(report: dict[str, Any], console: Any) -> None:
    from tools.bench import rich_table

    plan = report["plan"]
    console.print(
        f"[bold]grpo-service bench samplers[/] ({report['mode']}, {report['duration_s']} s): "
        f"{plan['groups']} BabyAI groups of {plan['group_size']} at once, {plan['turns']} decisions each, "
        f"{plan['max_tokens']} tokens per reply"
    )
    table = rich_table(
        ("sampler", "left"),
        *(
            (column, "right")
            for column in ("decisions/s", "spread", "in the sampler", "in the task app", "startup s")
        ),
    )
    for name, row in report["samplers"].items():
        lo, hi = row["spread"]
        table.add_row(
            name,
            f"{row['decisions_per_s']:.2f}",
            f"{lo:.2f} - {hi:.2f}",
            f"{row['sampler_share']:.0%}",
            f"{row['task_app_share']:.0%}",
            f"{row['startup_s']:.1f}",
        )
    console.print(table)
    for name, why in report["skipped"].items():
        console.print(f"{name}: skipped ({why})")
