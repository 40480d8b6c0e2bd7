"""`scripts/bench_llm_loop.py --summarize --keep`: an earlier summary's seeds join new runs from
the per-seed figures it holds; the committed summary, kept alone, reproduces itself exactly."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

from tests.conftest import REPO


def _same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15), where
    else:
        assert a == b, where


def test_a_kept_summary_alone_is_reproduced(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("bench_llm_loop", REPO / "scripts" / "bench_llm_loop.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    committed = REPO / "docs" / "bench" / "llm-loop-streams.json"
    summary = script.summarize([], tmp_path, keep=committed)
    _same(summary, json.loads(committed.read_text()))
    assert (tmp_path / "summary.json").exists() and (tmp_path / "summary.png").exists()
