"""`grpo-service bench train --smoke`: both trainers run briefly, the report is written (no timing)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from grpo_service.cli import app


def test_bench_train_smoke_writes_both_algorithms(tmp_path: Path) -> None:
    out = tmp_path / "train.json"
    result = CliRunner().invoke(app, ["bench", "train", "--smoke", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert {r["algo"] for r in report["runs"]} == {"grpo", "sb3_ppo"}
    assert report["budget_env_steps"] == 1000 and set(report["summary"]) >= {"grpo", "sb3_ppo"}
    assert all(r["env_steps"] >= 1000 or r["reached"] for r in report["runs"])
    assert "PPO wall / GRPO wall" in result.output
