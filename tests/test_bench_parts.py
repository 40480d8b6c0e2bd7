"""Every part of the benchmark imports and answers ``--help`` (the runs themselves are slow:
tests/test_bench.py, tests/test_bench_train.py)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
from typer.testing import CliRunner

import tools.bench
from grpo_service.cli import app

PARTS = sorted(m.name for m in pkgutil.iter_modules(tools.bench.__path__))


@pytest.mark.parametrize("part", PARTS)
def test_each_bench_module_imports(part: str) -> None:
    importlib.import_module(f"tools.bench.{part}")


def test_bench_help_lists_its_parts() -> None:
    result = CliRunner().invoke(app, ["bench", "--help"])
    assert result.exit_code == 0, result.output
    assert "--quick" in result.output
