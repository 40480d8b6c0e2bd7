"""``grpo-service eval``: seeds, the Crafter score, the aggregate, and runs against a real server."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import envs
from envs.base import Environment
from envs.crafter.env import CrafterEnv, crafter_score
from grpo_service.cli import app
from grpo_service.client.eval import EpisodeResult, EvalConfig, aggregate, parse_seeds
from tests.conftest import MODEL
from tools.fake_server import FakeConfig, FakeInferenceServer
from tools.server_thread import ServerThread

runner = CliRunner()


def test_parse_seeds() -> None:
    assert parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert parse_seeds("1,5,9") == [1, 5, 9]
    assert parse_seeds("0-2, 10") == [0, 1, 2, 10]
    assert parse_seeds([3, 4]) == [3, 4] and parse_seeds(None) is None
    for bad in ("a", "5-1", "", "1-"):
        with pytest.raises(ValueError):
            parse_seeds(bad)
    assert EvalConfig(seeds="0-9", episodes=3).episode_seeds() == [0, 1, 2]
    assert EvalConfig(episodes=3).episode_seeds() == [0, 1, 2]
    with pytest.raises(ValueError):
        EvalConfig(seeds="0-1", episodes=3).episode_seeds()


def test_crafter_score_matches_the_paper_formula() -> None:
    assert crafter_score([0.0] * 22) == 0.0
    assert crafter_score([100.0] * 22) == pytest.approx(100.0)
    one = crafter_score([100.0] + [0.0] * 21)
    assert one == pytest.approx(math.exp(math.log(101) / 22) - 1)  # about 0.233
    assert crafter_score([50.0] * 11 + [0.0] * 11) == pytest.approx(math.sqrt(51) - 1)


def test_aggregate_counts_failures_and_scores_returned_episodes() -> None:
    def ep(
        i: int, achievements: list[str], failure: str | None = None, returned: bool = True
    ) -> EpisodeResult:
        return EpisodeResult(
            index=i,
            seed=i,
            run_id=f"r{i}",
            returned=returned,
            stop_reason=None if not returned else (failure or "episode_done"),
            failure=failure,
            turns=10 if returned else 0,
            achievements=achievements,
            total_return=float(len(achievements)),
        )

    results = [
        ep(0, ["collect_wood", "place_table"]),
        ep(1, ["collect_wood"]),
        ep(2, ["collect_wood"], failure="policy_error:no_tool_call"),
        ep(3, [], failure="http_500", returned=False),
    ]
    s = aggregate(results, CrafterEnv)
    assert (s["completed"], s["total"], s["scored"]) == (2, 4, 3)
    assert s["failures"] == {"policy_error:no_tool_call": 1, "http_500": 1}
    assert s["achievements_freq"] == {"collect_wood": 3, "place_table": 1}
    assert s["success_rates"]["collect_wood"] == 100.0 and s["success_rates"]["place_table"] == pytest.approx(
        100 / 3
    )
    assert s["avg_achievements"] == pytest.approx(4 / 3) and s["avg_turns"] == 10.0
    assert s["mean_return"] == pytest.approx(4 / 3)
    expected = crafter_score([100.0, 100 / 3] + [0.0] * 20)
    assert s["crafter_score"] == pytest.approx(expected) and len(s["success_rates"]) == 22


@pytest.fixture
def faulty_llm() -> Iterator[FakeInferenceServer]:
    with FakeInferenceServer(FakeConfig(model=MODEL)) as server:
        yield server


def test_eval_end_to_end_with_policy_errors(
    start_server: Callable[..., ServerThread], faulty_llm: FakeInferenceServer, tmp_path: Path
) -> None:
    server = start_server(vllm_base_url=faulty_llm.base_url)
    # With one episode at a time the 3rd LLM call is episode 1's first: it calls no tool. By
    # default the reply is answered and the episode goes on (counted as an invalid turn).
    faulty_llm.set_config(FakeConfig(model=MODEL, fault_script=["ok", "ok", "no_tool_call"]))
    out = tmp_path / "eval.json"
    args = ["eval", "--base-url", server.base_url, "--model", MODEL, "--seeds", "1-4", "--max-turns", "2"]
    result = runner.invoke(app, [*args, "--concurrency", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    s = json.loads(out.read_text())["aggregate"]
    assert (s["completed"], s["failures"], s["invalid_turns"], s["avg_turns"]) == (4, {}, 1, 2.0)
    # With on_invalid_reply "end" (a TOML config's policy_config) it ends the episode.
    faulty_llm.set_config(FakeConfig(model=MODEL, fault_script=["ok", "ok", "no_tool_call"]))
    toml = tmp_path / "eval.toml"
    toml.write_text('[policy_config]\non_invalid_reply = "end"\n')
    result = runner.invoke(app, [*args, "--concurrency", "1", "--json", str(out), "--config", str(toml)])
    assert result.exit_code == 0, result.output
    assert "completed / total" in result.output and "3 / 4" in result.output
    report = json.loads(out.read_text())
    s = report["aggregate"]
    assert (s["completed"], s["total"], s["scored"]) == (3, 4, 4)
    assert s["failures"] == {"policy_error:no_tool_call": 1}
    assert s["avg_turns"] == pytest.approx((2 + 1 + 2 + 2) / 4)
    assert set(s) >= {
        "avg_achievements",
        "achievements_freq",
        "crafter_score",
        "success_rates",
        "mean_return",
    }
    assert [e["seed"] for e in report["episodes"]] == [1, 2, 3, 4]
    assert report["episodes"][1]["stop_reason"] == "policy_error:no_tool_call"
    assert faulty_llm.stats()["requests"] == 8 + 7


def test_eval_from_a_toml_config_counts_http_failures(
    start_server: Callable[..., ServerThread], tmp_path: Path
) -> None:
    server = start_server()
    config = tmp_path / "eval.toml"
    config.write_text(
        f'base_url = "{server.base_url}"\npolicy = "crafter-random"\nseeds = "0-2"\nmax_turns = 3\n'
        "concurrency = 3\n[env_config]\nno_such_option = 1\n"
    )
    out = tmp_path / "eval.json"
    result = runner.invoke(app, ["eval", "--config", str(config), "--json", str(out)])
    assert result.exit_code == 1, result.output  # nothing could be scored
    s = json.loads(out.read_text())["aggregate"]
    assert (s["completed"], s["total"], s["scored"]) == (0, 3, 0) and s["failures"] == {"http_422": 3}
    # The same config with a flag overriding it and a valid env config runs.
    config.write_text(config.read_text().replace("[env_config]\nno_such_option = 1\n", ""))
    result = runner.invoke(app, ["eval", "--config", str(config), "--seeds", "5", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["aggregate"]["completed"] == 1 and report["episodes"][0]["seed"] == 5
    assert report["episodes"][0]["turns"] == 3


def test_eval_with_logprobs_plays_token_streams(
    start_server: Callable[..., ServerThread], faulty_llm: FakeInferenceServer, tmp_path: Path
) -> None:
    """`--logprobs` with a policy that names its tokenizer: every decision is a token-id prompt to
    /v1/completions (one stream per episode), not a chat."""
    server = start_server(vllm_base_url=faulty_llm.base_url)
    faulty_llm.set_config(FakeConfig(model=MODEL))
    toml = tmp_path / "eval.toml"
    toml.write_text('[policy_config]\ntokenizer = "toy"\n')
    args = ["eval", "--base-url", server.base_url, "--model", MODEL, "--seeds", "1-2", "--max-turns", "2"]
    before = faulty_llm.stats()["by_route"]
    result = runner.invoke(app, [*args, "--logprobs", "--config", str(toml)])
    assert result.exit_code == 0, result.output
    after = faulty_llm.stats()["by_route"]
    assert after.get("completions", 0) - before.get("completions", 0) == 4
    assert after.get("chat", 0) == before.get("chat", 0)


def test_eval_rejects_a_bad_config_and_an_unreachable_service(tmp_path: Path) -> None:
    config = tmp_path / "eval.toml"
    config.write_text('seeds = "0-2"\nepisodes = 5\n')
    result = runner.invoke(app, ["eval", "--config", str(config)])
    assert result.exit_code == 2 and "only 3 seeds" in result.output
    config.write_text("typo_key = 1\n")
    assert runner.invoke(app, ["eval", "--config", str(config)]).exit_code == 2
    result = runner.invoke(app, ["eval", "--base-url", "http://127.0.0.1:9", "--episodes", "1"])
    assert result.exit_code == 2 and "connect_error" in result.output


def test_a_task_without_achievements_reports_success_rate_and_mean_score() -> None:
    results = [
        EpisodeResult(index=i, seed=i, run_id=f"r{i}", returned=True, turns=3, total_return=r)
        for i, r in enumerate([1.0, 0.0, 1.0, 0.0])
    ]
    s = aggregate(results, Environment)
    assert s["success_rate"] == 0.5 and s["mean_score"] == 0.5 and s["achievements_freq"] == {}
    assert {"completed", "total", "avg_turns", "avg_achievements", "achievements_freq"} <= set(s)


@pytest.mark.parametrize("env_name", sorted(envs.ENVIRONMENTS))
def test_eval_runs_for_every_registered_environment(
    env_name: str, start_server: Callable[..., ServerThread], faulty_llm: FakeInferenceServer, tmp_path: Path
) -> None:
    server = start_server(vllm_base_url=faulty_llm.base_url)
    out = tmp_path / "eval.json"
    args = ["eval", "--base-url", server.base_url, "--env", env_name, "--model", MODEL, "--episodes", "1"]
    result = runner.invoke(app, [*args, "--max-turns", "1", "--json", str(out)])
    # 1: the episode ran but did not complete (the fake's reply may not be a valid action here).
    assert result.exit_code in (0, 1), result.output
    report = json.loads(out.read_text())
    aggregate_ = report["aggregate"]  # seed 000's keys, then the environment's own metrics
    assert list(aggregate_)[:5] == [
        "completed",
        "total",
        "avg_turns",
        "avg_achievements",
        "achievements_freq",
    ]
    assert aggregate_["total"] == 1 and aggregate_["scored"] == 1
    assert set(envs.ENVIRONMENTS[env_name].eval_metrics([])) <= set(aggregate_)
