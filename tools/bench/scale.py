"""``grpo-service bench scale``: the task app embedded against served through Ray (1 and N hosts).

For each serving, in one run on this machine: ``POST /env/step`` steps/s (16 keep-alive clients,
each on its own env), ``/rollout/group`` decisions/s and env steps/s against a zero-latency fake
LLM (64 rollouts in groups of 16), the service's CPU per decision in that load (the CPU time of
the server's whole process tree: the front, and through Ray the raylet, GCS and hosts), and the
LLM-bound load (200 ms fake, 128 rollouts) against its ideal. The in-process env step rate is
the denominator of ``rollout_vs_inproc``. Nothing is pinned: every serving shares all CPUs with
the fake LLM and the load generator, as a user's machine does.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from tools.bench import inproc, served
from tools.bench.procs import ChildServer, cpu_count
from tools.bench.run import FAKE_MODEL, LLM_LATENCY_S

SEEDS = [101, 102, 103, 104]
PLANS: dict[str, dict[str, Any]] = {
    # repeats, seconds of stepping, rollouts (zero-latency), turns, LLM-bound rollouts, turns
    "smoke": {"repeats": 1, "step_s": 0.3, "http_s": 0.5, "rollouts": 4, "group": 2, "turns": 3, "llm": 4},
    "quick": {
        "repeats": 2,
        "step_s": 1.5,
        "http_s": 2.5,
        "rollouts": 64,
        "group": 16,
        "turns": 40,
        "llm": 128,
    },
    "full": {
        "repeats": 3,
        "step_s": 3.0,
        "http_s": 5.0,
        "rollouts": 64,
        "group": 16,
        "turns": 60,
        "llm": 128,
    },
}
LLM_TURNS = 20


def servings(hosts: int) -> dict[str, dict[str, Any]]:
    """The servings compared: settings overrides of each."""
    ray = {"ray_address": "local", "ray_host_cpus": 0.0}
    return {
        "embedded": {},
        "ray_1host": {**ray, "ray_hosts": 1},
        f"ray_{hosts}hosts": {**ray, "ray_hosts": hosts},
    }


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and every descendant alive now."""
    total = 0.0
    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                total += times.user + times.system
    return total


def run_scale_bench(mode: str, log: Callable[[str], None]) -> dict[str, Any]:
    plan = PLANS[mode]
    hosts = max(2, cpu_count())
    samples: dict[str, dict[str, list[float]]] = {}
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        workdir = Path(tmp)
        fakes = {
            "fast": ChildServer("fake", {"model": FAKE_MODEL, "latency_s": 0.0}, cpus=None, log=None).start(),
            "slow": ChildServer(
                "fake", {"model": FAKE_MODEL, "latency_s": LLM_LATENCY_S}, cpus=None, log=None
            ),
        }
        fakes["slow"].start()
        try:
            for fake in fakes.values():
                fake.wait_ready()
            for rep in range(plan["repeats"]):
                log(f"repeat {rep + 1}/{plan['repeats']}")
                inproc_rate = inproc.env_steps_per_s(plan["step_s"], SEEDS, rep)
                samples.setdefault("inproc", {}).setdefault("env_steps_per_s", []).append(inproc_rate)
                log(f"  in-process env steps/s {inproc_rate:,.0f}")
                for name, overrides in servings(hosts).items():
                    figures = _measure(name, overrides, plan, fakes, workdir / f"{name}-{rep}", hosts, log)
                    for key, value in figures.items():
                        samples.setdefault(name, {}).setdefault(key, []).append(value)
        finally:
            for fake in fakes.values():
                fake.stop()
    return _report(samples, mode, hosts, time.time() - started)


def _measure(
    name: str,
    overrides: dict[str, Any],
    plan: dict[str, Any],
    fakes: dict[str, ChildServer],
    workdir: Path,
    hosts: int,
    log: Callable[[str], None],
) -> dict[str, float]:
    settings = {
        "state_dir": str(workdir / "state"),
        "snapshot_secret": "bench-secret-" + "x" * 32,
        "default_model": FAKE_MODEL,
        "vllm_base_url": fakes["fast"].base_url,
        "reaper_interval_s": 3600.0,
        "inference_max_retries": 0,
        **overrides,
    }
    workdir.mkdir(parents=True)
    server = ChildServer("service", settings, cpus=None, log=workdir / "service.log").start()
    try:
        server.wait_ready(180.0)
        copies = overrides.get("ray_hosts", 1)
        asyncio.run(served.warm_worlds(server.base_url, SEEDS, 2, hosts=copies))
        figures: dict[str, float] = {}
        figures["http_steps_per_s"] = asyncio.run(
            served.http_steps_per_s(server.base_url, 16, plan["http_s"], 7)
        )
        groups = _groups(
            server.base_url, fakes["fast"].base_url, plan, plan["rollouts"], plan["turns"], "terminate"
        )
        groups()  # warm: each host builds its inference client, the fake fills its caches
        cpu_before = tree_cpu_s(server.pid)
        run = groups()
        cpu_s = tree_cpu_s(server.pid) - cpu_before
        figures["rollout_decisions_per_s"] = run.decisions_per_s
        figures["rollout_steps_per_s"] = run.steps_per_s
        figures["service_cpu_ms_per_decision"] = 1000 * cpu_s / max(1, run.decisions)
        llm = _groups(server.base_url, fakes["slow"].base_url, plan, plan["llm"], LLM_TURNS, "reset")()
        figures["llm_bound_decisions_per_s"] = llm.decisions_per_s
        figures["llm_bound_efficiency"] = llm.decisions_per_s / (plan["llm"] / LLM_LATENCY_S)
        failed = run.failed + llm.failed
        log(
            f"  {name}: http {figures['http_steps_per_s']:,.0f} steps/s; groups "
            f"{run.decisions_per_s:,.0f} decisions/s ({run.steps_per_s:,.0f} steps/s), "
            f"{figures['service_cpu_ms_per_decision']:.2f} ms CPU/decision; LLM-bound "
            f"{llm.decisions_per_s:,.0f} decisions/s ({figures['llm_bound_efficiency']:.2f} of ideal)"
            + (f"; {failed} rollouts failed" if failed else "")
        )
        return figures
    finally:
        server.stop(60.0)


def _groups(
    url: str, inference_url: str, plan: dict[str, Any], rollouts: int, turns: int, on_done: str
) -> Callable[[], served.GroupRun]:
    def run() -> served.GroupRun:
        return asyncio.run(
            served.rollout_groups(
                url,
                inference_url=inference_url,
                rollouts=rollouts,
                group_size=plan["group"],
                turns=turns,
                seeds=SEEDS,
                on_done=on_done,
            )
        )

    return run


def _report(
    samples: dict[str, dict[str, list[float]]], mode: str, hosts: int, wall_s: float
) -> dict[str, Any]:
    medians = {name: {k: statistics.median(v) for k, v in figs.items()} for name, figs in samples.items()}
    inproc_rate = medians["inproc"]["env_steps_per_s"]
    for figs in medians.values():
        if "rollout_steps_per_s" in figs:
            figs["rollout_vs_inproc"] = figs["rollout_steps_per_s"] / inproc_rate
    return {
        "mode": mode,
        "hosts": hosts,
        "cpus": cpu_count(),
        "duration_s": round(wall_s, 1),
        "medians": medians,
        "samples": samples,
    }


def render_scale_report(report: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    console.print(
        f"[bold]grpo-service bench scale[/] ({report['mode']}, {report['duration_s']} s, "
        f"{report['cpus']} CPUs): embedded vs through Ray"
    )
    medians = report["medians"]
    names = [n for n in medians if n != "inproc"]
    table = Table()
    table.add_column("figure (median)")
    for name in names:
        table.add_column(name, justify="right")
    keys = [k for k in medians[names[0]]]
    for key in keys:
        table.add_row(key, *(f"{medians[n].get(key, float('nan')):,.2f}" for n in names))
    console.print(table)
    console.print(f"in-process env steps/s: {medians['inproc']['env_steps_per_s']:,.0f}")
