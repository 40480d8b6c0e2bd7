"""Training metrics as JSON lines and their curves as a PNG, next to the model."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class MetricsLog:
    """Appends one JSON object per line; flushed per line so a reader (or a crash) sees whole lines."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("w", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a kill
            break
    return rows


def plot_curves(
    rows: Sequence[dict[str, Any]], path: Path, keys: Sequence[str], x: str = "timesteps"
) -> bool:
    """One panel per metric in ``keys`` that the rows carry, against ``x``; False when nothing to draw."""
    keys = [k for k in keys if any(isinstance(r.get(k), int | float) for r in rows)]
    if not rows or not keys:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(keys), 1, figsize=(7, 2.2 * len(keys)), sharex=True, squeeze=False)
    for ax, key in zip(axes[:, 0], keys, strict=True):
        pts = [(r[x], r[key]) for r in rows if isinstance(r.get(key), int | float) and x in r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], linewidth=1.2)
        ax.set_ylabel(key.replace("_", " "), fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel(x.replace("_", " "))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    tmp.replace(path)
    return True
