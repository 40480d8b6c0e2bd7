"""Trainers for job-runner tests, imported by the job processes (kept free of heavy imports)."""

from __future__ import annotations

from typing import Any

from training.context import TrainContext


def crashing_trainer(config: Any, ctx: TrainContext) -> dict[str, Any]:
    ctx.report(1, 10, {"updates": 1})
    raise RuntimeError("reward function exploded at step 1")
