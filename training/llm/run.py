"""A training run's directory: TOML config, metrics JSONL, PNG curves, checkpoints and resume.

OUT/metrics.jsonl          one JSON object per optimizer step
OUT/curves.png             the metrics over steps
OUT/checkpoints/step-N/    model + tokenizer (a servable checkpoint) + trainer_state.pt
OUT/final/                 the last weights, model + tokenizer
"""

from __future__ import annotations

import json
import math
import shutil
import time
import tomllib
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ValidationError


class ConfigError(ValueError):
    """A training config that cannot be used (the message names the file and the fields)."""


def load_config(model: type[BaseModel], path: Path | None, section: str, **overrides: Any) -> Any:
    """``model`` from a TOML file's top level (or its ``[section]`` table), flags overriding keys."""
    values: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
        values = dict(data.get(section, data))
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors(include_input=False)
        )
        raise ConfigError(f"{path or 'config'}: {problems}") from None


class RunDir:
    def __init__(self, out: str | Path) -> None:
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.out / "metrics.jsonl"
        self.curves_path = self.out / "curves.png"
        self.checkpoints = self.out / "checkpoints"
        self.final = self.out / "final"
        self.started = time.monotonic()

    # ---- metrics ----------------------------------------------------------------------------

    def log(self, record: dict[str, Any]) -> None:
        record = {"time": round(time.time(), 3), **record}
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def metrics(self) -> list[dict[str, Any]]:
        if not self.metrics_path.exists():
            return []
        with open(self.metrics_path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    def truncate_metrics(self, after_step: int) -> None:
        """On resume: drop lines of steps after the checkpoint (they will be logged again)."""
        kept = [m for m in self.metrics() if m.get("step", 0) <= after_step]
        self.metrics_path.write_text("".join(json.dumps(m) + "\n" for m in kept), encoding="utf-8")

    def plot(self, keys: list[str], title: str) -> Path | None:
        """One panel per metric key over steps; written to ``curves.png``."""
        rows = self.metrics()
        keys = [k for k in keys if any(_finite(r.get(k)) for r in rows)]
        if not rows or not keys:
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(len(keys), 1, figsize=(7, 2.2 * len(keys)), sharex=True, squeeze=False)
        for ax, key in zip(axes[:, 0], keys, strict=True):
            points = [(r["step"], r[key]) for r in rows if _finite(r.get(key))]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 50 else None)
            ax.set_ylabel(key)
            ax.grid(alpha=0.3)
        axes[-1, 0].set_xlabel("step")
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(self.curves_path, dpi=100)
        plt.close(fig)
        return self.curves_path

    # ---- checkpoints ------------------------------------------------------------------------

    def latest_checkpoint(self) -> Path | None:
        found = sorted(
            (p for p in self.checkpoints.glob("step-*") if (p / "trainer_state.pt").is_file()),
            key=lambda p: int(p.name.removeprefix("step-")),
        )
        return found[-1] if found else None

    def save_checkpoint(
        self, step: int, model: Any, tokenizer: Any, state: dict[str, Any], keep: int
    ) -> Path:
        """Write atomically (a temporary directory renamed into place); keep the last ``keep``."""
        target = self.checkpoints / f"step-{step}"
        tmp = self.checkpoints / f".step-{step}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        save_weights(tmp, model, tokenizer)
        torch.save(state, tmp / "trainer_state.pt")
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        old = sorted(self.checkpoints.glob("step-*"), key=lambda p: int(p.name.removeprefix("step-")))
        for path in old[:-keep] if keep > 0 else []:
            shutil.rmtree(path, ignore_errors=True)
        return target

    @staticmethod
    def load_state(checkpoint: Path) -> dict[str, Any]:
        return torch.load(checkpoint / "trainer_state.pt", weights_only=False)


TIED_OUTPUT_FILE = "lm_head.safetensors"


def save_weights(path: Path, model: Any, tokenizer: Any) -> Path:
    """``model`` and ``tokenizer`` as transformers saves them, plus, for a model whose output layer
    is tied to its embeddings (Qwen3-0.6B's and init-model's are), that layer written out as
    ``lm_head.weight`` in ``lm_head.safetensors``.

    transformers leaves a tied output layer out of the checkpoint; vLLM 0.32's in-place reload
    (``reload_weights``: the trainer's weight sync) then fails to load it ("ParallelLMHead: Failed
    to load weights") and serves a model that is neither the old nor the new one. transformers
    reads only the checkpoint's own files and ignores this one; vLLM loads every file.
    """
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if getattr(model.config, "tie_word_embeddings", False):
        weight = model.get_output_embeddings().weight.detach().contiguous().clone()
        save_file({"lm_head.weight": weight}, str(path / TIED_OUTPUT_FILE), metadata={"format": "pt"})
        index = path / "model.safetensors.index.json"
        if index.is_file():  # a sharded checkpoint: vLLM reads the files its index names
            data = json.loads(index.read_text())
            data["weight_map"]["lm_head.weight"] = TIED_OUTPUT_FILE
            index.write_text(json.dumps(data, indent=2))
    return path


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
