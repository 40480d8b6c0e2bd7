"""`grpo-service bench`: a smoke run only (tiny sizes, seconds); no timing assertions."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grpo_service.cli import app
from tools.bench import FIGURE_KEYS, RATIO_KEYS
from tools.bench.http import RawClient
from tools.bench.procs import ChildServer

ISSUE_FIGURES = {
    "raw_crafter_steps_per_s",
    "env_steps_per_s",
    "raw_reset_s",
    "env_reset_cached_s",
    "http_steps_per_s",
    "rollout_steps_per_s",
    "rollout_traced_steps_per_s",
    "llm_bound",
    "sessions_held",
    "sessions_p99_step_ms",
}
ISSUE_RATIOS = {
    "step_vs_raw",
    "reset_cached_vs_raw",
    "llm_bound_efficiency",
    "http_vs_floor",
    "decision_cpu_vs_floor",
    "trace_share_of_decision_cpu",
    "openenv_vs_peer_1",
    "openenv_vs_peer_16",
    "agentgym_vs_peer_1",
    "agentgym_vs_peer_8",
}
DECISION_FIGURES = {
    "floor_http_steps_per_s",
    "service_cpu_us_per_decision",
    "task_app_cpu_us_per_decision",
    "trace_share_of_decision_cpu",
    "side_by_side_traced_cpu_us_per_decision",
    "trace_writer_cpu_us_per_decision",
    "floor_cpu_us_per_decision",
}


@pytest.mark.slow
def test_bench_smoke_writes_valid_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(app, ["bench", "--smoke", "--no-envs", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "step_vs_raw" in result.output  # the table was printed

    report = json.loads(out.read_text())
    assert set(report["figures"]) >= ISSUE_FIGURES | DECISION_FIGURES
    assert set(report["figures"]) == set(FIGURE_KEYS)
    assert set(report["ratios"]) == set(RATIO_KEYS) == ISSUE_RATIOS
    assert {
        "http_vs_inproc",
        "rollout_vs_inproc",
        "trace_on_vs_off",
        "llm_bound_floor_efficiency",
        "llm_bound_1worker_vs_floor",
    } <= set(report["info_ratios"])
    for key, fig in report["figures"].items():
        if fig["median"] is None:  # skipped figures say why
            assert fig["skipped"], key
            continue
        assert math.isfinite(fig["median"]) and fig["median"] >= 0, key
        lo, hi = fig["spread"]
        assert lo <= fig["median"] <= hi and fig["n"] == len(fig["values"]) >= 1, key
    for key, ratio in report["ratios"].items():
        assert {"value", "goal", "met", "numerator", "denominator"} <= set(ratio), key
        if ratio["value"] is not None:
            at_most = ratio.get("at_most", False)
            met = ratio["value"] <= ratio["goal"] if at_most else ratio["value"] >= ratio["goal"]
            assert ratio["value"] >= 0 and ratio["met"] == met, key
    machine = report["machine"]
    assert machine["nproc"] >= 1 and machine["python"] and "cpu_model" in machine


def test_bench_is_a_registered_subcommand() -> None:
    result = CliRunner().invoke(app, ["bench", "--help"])
    assert result.exit_code == 0 and "--quick" in result.output and "--json" in result.output


async def test_child_server_listens_on_loopback_and_stops(tmp_path: Path) -> None:
    server = ChildServer("fake", {"model": "m"}, cpus=None, log=tmp_path / "fake.log").start()
    try:
        server.wait_ready()
        assert server.base_url.startswith("http://127.0.0.1:")
        async with RawClient("127.0.0.1", server.port) as client:
            models = await client.get_json("/v1/models")
        assert models["data"][0]["id"] == "m"
    finally:
        proc = server.proc
        server.stop()
    assert proc is not None and proc.poll() is not None


def test_floor_plays_the_llm_bound_load(tmp_path: Path) -> None:
    """The floor's groups: every member plays every turn, token ids kept; the LLM-bound rate is a
    rate (the load itself is the bench's)."""
    import asyncio

    import orjson

    from tools.bench import floor

    fake = ChildServer("fake", {"model": "m"}, cpus=None, log=tmp_path / "fake.log").start()
    bare = ChildServer("floor", {"model": "m"}, cpus=None, log=tmp_path / "floor.log").start()
    try:
        fake.wait_ready()
        bare.wait_ready()
        answers, wall_s = asyncio.run(floor._groups(bare.base_url, fake.base_url, [101, 102], 2, 3, "reset"))
        members = [member for answer in answers for member in orjson.loads(answer)["members"]]
        assert wall_s > 0 and len(members) == 4
        for member in members:
            assert member["decisions"] == 3 and member["steps"] >= 3
            assert all(turn["prompt_token_ids"] and turn["token_ids"] for turn in member["turns"])
        assert floor.llm_bound_decisions_per_s(bare.base_url, fake.base_url, [101], 2, 2) > 0
    finally:
        fake.stop()
        bare.stop()


def test_serving_gc_raises_thresholds_and_restores_them() -> None:
    import gc

    from grpo_service.gc_tuning import SERVING_THRESHOLDS, serving_gc

    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        with serving_gc():
            assert gc.get_threshold() == SERVING_THRESHOLDS
        assert gc.get_threshold() == (700, 10, 10)
        gc.set_threshold(1234, 5, 5)  # someone's own choice is left alone
        with serving_gc():
            assert gc.get_threshold() == (1234, 5, 5)
    finally:
        gc.set_threshold(*before)


def test_progress_lines_show_every_kind_of_value() -> None:
    from tools.bench.run import _shown

    assert _shown(1234.5) == ": 1,234" and _shown(3) == ": 3.00" and _shown(0.25) != ""
    assert _shown({"snapshot_p50_ms": 2.5, "note": "x"}) == ": snapshot_p50_ms 2.50"
    assert _shown(object()) == ""  # a run's figures are logged on the next line


def test_bench_samplers_smoke_reports_each_sampler() -> None:
    """`grpo-service bench samplers` at smoke size on the two stand-ins (vLLM's run is the
    benchmark's, a minute to start: tests/test_vllm_service.py covers the server itself)."""
    from tools.bench.samplers import run_samplers_bench

    report = run_samplers_bench("smoke", log=lambda _: None, samplers=("fake", "serve-model"))
    assert set(report["samplers"]) == {"fake", "serve-model"}
    for row in report["samplers"].values():
        assert row["decisions_per_s"] > 0 and 0 < row["sampler_share"] < 1
        assert row["task_app_share"] == pytest.approx(1 - row["sampler_share"], abs=1e-3)


def test_decision_cost_smoke_both_modes(tmp_path: Path) -> None:
    """`tools.bench.decision`: one tiny load embedded and over HTTP; the JSON has a CPU figure."""
    from tools.bench.decision import main

    out = tmp_path / "decision.json"
    main(
        [
            "--repeats",
            "1",
            "--groups",
            "1",
            "--group-size",
            "2",
            "--turns",
            "2",
            "--no-pin",
            "--json",
            str(out),
        ]
    )
    results = json.loads(out.read_text())["results"]
    for mode in ("http", "embedded"):
        (run,) = results[mode]["runs"]
        # 4 decisions take a few ms: at the clock's 10 ms resolution their CPU may read 0.
        assert run["decisions"] == 4 and run["cpu_s"] >= 0 and run["cpu_us_per_decision"] >= 0, (mode, run)


def test_flame_budget_charges_each_sample_to_its_innermost_part(tmp_path: Path) -> None:
    from tools.bench.flame import budget_report

    stacks = tmp_path / "stacks.txt"
    loop = "run (/usr/lib/python3.11/asyncio/runners.py:10)"
    step = "EpisodeLoop._act (/app/grpo_service/rollout/episode.py:5)"
    stacks.write_text(
        f"{loop};{step};Env.step (/x/site-packages/crafter/env.py:3) 6\n"
        f"{loop};{step};dumps (/usr/lib/python3.11/json/__init__.py:2) 3\n"
        f"{loop};Condition.wait (/usr/lib/python3.11/threading.py:320) 50\n"  # idle: dropped
        f"{loop} 1\n"
    )
    report = budget_report(stacks, 1000.0, title="t")
    assert report["samples"] == 10
    assert report["us_per_decision"] == {
        "crafter simulation": 600.0,
        "coordinator and episode loop": 300.0,  # the JSON encoder counts for its caller
        "event loop and tasks": 100.0,
    }
    assert (tmp_path / "stacks.png").stat().st_size > 1000
