"""What a trainer gets from whoever runs it (a job process or the CLI): where to write, how to
report progress, when to stop. Trainers depend on this, never on the job runner or the service."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TrainContext:
    models_dir: Path
    """Where the model zip, its metrics (JSONL) and its curves (PNG) are written."""
    model_name: str
    report: Callable[[int, int, dict[str, float]], None] = lambda current, total, metrics: None
    """Called once the first checkpoint is saved, then after every update: (current timesteps,
    total timesteps, metrics)."""
    should_stop: Callable[[], bool] = lambda: False
    """Polled often (at least every few milliseconds of training); True ends the run, saving first."""
    deadline: float | None = None
    """time.monotonic() after which the run stops as if asked to (the job's wall-time limit)."""
    started: float = field(default_factory=time.monotonic)

    @property
    def model_path(self) -> Path:
        return self.models_dir / f"{self.model_name}.zip"

    @property
    def metrics_path(self) -> Path:
        return self.models_dir / f"{self.model_name}.metrics.jsonl"

    @property
    def curves_path(self) -> Path:
        return self.models_dir / f"{self.model_name}.png"

    def stop_reason(self) -> str | None:
        if self.should_stop():
            return "stopped"
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "time_limit"
        return None
