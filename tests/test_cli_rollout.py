"""``grpo-service rollout`` against a real server tracing to SQLite, with the fake LLM."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grpo_service.cli import app
from grpo_service.tracing import TraceReader
from tests.conftest import MODEL
from tools.fake_server import FakeInferenceServer
from tools.server_thread import ServerThread

runner = CliRunner()


def wait_for_session(db: Path, run_id: str, timeout_s: float = 5.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if db.exists():
            with TraceReader(db) as reader:
                ids = reader.session_ids(run_id)
            if ids:
                return ids[-1]
        time.sleep(0.02)
    raise AssertionError(f"{run_id} never reached {db}")


def test_rollout_writes_the_json_snapshot_and_matches_the_db(
    start_server: Callable[..., ServerThread],
    fake_llm: FakeInferenceServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db = tmp_path / "traces" / "task_app_traces_test.db"
    server = start_server(vllm_base_url="http://127.0.0.1:9", trace_db=db)  # the flag below must win
    monkeypatch.chdir(tmp_path)
    args = ["rollout", "--base-url", server.base_url, "--inference-url", fake_llm.base_url]
    args += ["--inference-api-key", "sk-secret-xyz", "--model", MODEL, "--max-llm-calls", "3"]
    args += ["--run-id", "local-trace", "--seed", "4", "--logprobs"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "local-trace" in result.output and "completed" in result.output

    snapshot = json.loads((tmp_path / "local-trace_trace.json").read_text())
    assert snapshot["request"]["policy"]["config"]["api_key"] == "[redacted]"
    assert snapshot["metrics"]["num_decisions"] == 3 and len(snapshot["trace"]["turns"]) == 3
    (trajectory,) = snapshot["trajectories"]
    llm = trajectory["steps"][0]["llm"]
    assert llm["prompt_token_ids"] and len(llm["completion_token_ids"]) == len(llm["completion_logprobs"])

    session_id = wait_for_session(db, "local-trace")
    with TraceReader(db) as reader:
        assert reader.trace_dict(session_id) == snapshot["trace"]  # the DB and the response agree
        turn = reader.turns(session_id)[0]
        assert turn["llm"]["completion_token_ids"] == llm["completion_token_ids"]
        assert reader.session(session_id)["seed"] == 4
    server.stop()
    assert b"sk-secret-xyz" not in db.read_bytes()


def test_rollout_with_a_scripted_policy_and_auth(
    start_server: Callable[..., ServerThread], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = start_server(environment_api_key="env-key-123")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ENVIRONMENT_API_KEY", raising=False)
    base = ["rollout", "--base-url", server.base_url, "--policy", "crafter-heuristic", "--run-id", "h"]
    denied = runner.invoke(app, base)
    assert denied.exit_code == 2 and "api-key" in denied.output.replace("\n", "").lower()
    # --model is not sent to a policy that calls no LLM (its config would reject it).
    ok = runner.invoke(
        app, [*base, "--api-key", "env-key-123", "--model", "ignored", "--max-llm-calls", "20"]
    )
    assert ok.exit_code == 0, ok.output
    snapshot = json.loads((tmp_path / "h_trace.json").read_text())
    assert snapshot["request"]["policy"]["config"] == {}
    assert snapshot["metrics"]["num_decisions"] == 20 and snapshot["trace"]["turns"][0]["messages"] is None


def test_rollout_reports_an_unreachable_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["rollout", "--base-url", "http://127.0.0.1:9", "--run-id", "x"])
    assert result.exit_code == 2 and "cannot reach" in result.output
    assert not (tmp_path / "x_trace.json").exists()
