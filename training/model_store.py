"""Saved policies: ``<name>.zip`` files in one folder, loaded on first use and cached in memory
(reloaded when the file changes, e.g. a job's newer checkpoint)."""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Literal

from training.gym.config import MODEL_NAME_PATTERN
from training.gym.policy import MLPPolicy

SIDE_FILES = (".zip", ".metrics.jsonl", ".png")
"""A model's files: the policy, its training metrics and its curves."""
_NAME = re.compile(MODEL_NAME_PATTERN)


class InvalidModelName(ValueError):
    pass


class ModelNotFound(KeyError):
    pass


class ModelStore:
    def __init__(self, models_dir: Path, max_loaded: int = 64) -> None:
        self.models_dir = models_dir
        self.max_loaded = max_loaded
        self._cache: OrderedDict[str, tuple[int, MLPPolicy]] = OrderedDict()
        self._lock = threading.Lock()

    def path(self, name: str) -> Path:
        if not _NAME.fullmatch(name):
            raise InvalidModelName(
                f"model_name {name!r}: letters, digits, '_', '-' and '.' only (no path), at most 100"
            )
        return self.models_dir / f"{name}.zip"

    def exists(self, name: str) -> bool:
        return self.path(name).is_file()

    def names(self) -> list[str]:
        if not self.models_dir.is_dir():
            return []
        return sorted(
            p.name[: -len(".zip")] for p in self.models_dir.glob("*.zip") if _NAME.fullmatch(p.stem)
        )

    def status(self, name: str) -> Literal["loaded", "saved"]:
        return "loaded" if name in self._cache else "saved"

    def loaded_count(self) -> int:
        return len(self._cache)

    def get(self, name: str) -> MLPPolicy:
        """The policy, from memory when its file has not changed since it was loaded."""
        path = self.path(name)
        try:
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:
            with self._lock:
                self._cache.pop(name, None)
            raise ModelNotFound(f"no model {name!r}") from None
        with self._lock:
            hit = self._cache.get(name)
            if hit is not None and hit[0] == mtime:
                self._cache.move_to_end(name)
                return hit[1]
        policy = MLPPolicy.load(path)
        with self._lock:
            self._cache[name] = (mtime, policy)
            self._cache.move_to_end(name)
            while len(self._cache) > self.max_loaded:
                self._cache.popitem(last=False)
        return policy

    def delete(self, name: str) -> None:
        """Forget it in memory and remove its files; ModelNotFound when there was nothing."""
        path = self.path(name)
        with self._lock:
            was_loaded = self._cache.pop(name, None) is not None
        found = was_loaded
        for suffix in SIDE_FILES:
            target = path.with_name(name + suffix)
            if target.exists():
                target.unlink(missing_ok=True)
                found = True
        if not found:
            raise ModelNotFound(f"no model {name!r}")
