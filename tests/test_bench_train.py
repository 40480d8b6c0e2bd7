"""`grpo-service bench train --smoke`: both trainers run briefly, the report is written (no timing).
In a subprocess: the bench pins its process to one CPU and loads torch and SB3."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_train_smoke_writes_both_algorithms(tmp_path: Path) -> None:
    out = tmp_path / "train.json"
    cmd = [sys.executable, "-m", "grpo_service.cli", "bench", "train", "--smoke", "--json", str(out)]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {r["algo"] for r in report["runs"]} == {"grpo", "sb3_ppo"}
    assert report["budget_env_steps"] == 1000 and set(report["summary"]) >= {"grpo", "sb3_ppo"}
    assert all(r["env_steps"] >= 1000 or r["reached"] for r in report["runs"])
    assert "PPO wall / GRPO wall" in result.stdout
