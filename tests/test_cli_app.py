"""The ``grpo-service`` console script: entry point, subcommands, and the hook for new ones."""

from __future__ import annotations

import importlib
import sys
import tomllib
import types
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import grpo_service.cli as cli
from grpo_service.cli.eval import load_config

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_console_script_entry_point_resolves() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attr = scripts["grpo-service"].partition(":")
    assert getattr(importlib.import_module(module), attr) is cli.main
    result = runner.invoke(cli.app, ["--help"])
    assert result.exit_code == 0
    for command in ("serve", "rollout", "eval", "export-sft", "traces"):
        assert command in result.output


def test_a_new_subcommand_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """``grpo_service/bench.py`` defining ``bench_main`` is picked up; here a stand-in module."""

    def bench_main(requests: int = typer.Option(10)) -> None:
        print(f"bench with {requests} requests")

    module = types.ModuleType("grpo_service.bench_standin")
    module.__spec__ = ModuleSpec("grpo_service.bench_standin", loader=None)
    module.bench_main = bench_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "grpo_service.bench_standin", module)
    registered = list(cli.app.registered_commands)
    try:
        cli._register_optional("bench-standin", "grpo_service.bench_standin", "bench_main")
        result = runner.invoke(cli.app, ["bench-standin", "--requests", "3"])
        assert result.exit_code == 0 and "bench with 3 requests" in result.output
    finally:
        cli.app.registered_commands[:] = registered
    cli._register_optional("nothing", "grpo_service.no_such_module", "main")  # absent: no-op
    cli._register_optional("serve", "grpo_service.bench_standin", "bench_main")  # taken: no-op
    assert len(cli.app.registered_commands) == len(registered)


def test_a_broken_plugin_command_does_not_break_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("grpo_service.half_written")
    module.__spec__ = ModuleSpec("grpo_service.half_written", loader=None)
    monkeypatch.setitem(sys.modules, "grpo_service.half_written", module)
    registered = list(cli.app.registered_commands)
    try:
        cli._register_optional("half", "grpo_service.half_written", "bench_main")
        result = runner.invoke(cli.app, ["half"])
        assert result.exit_code == 1 and "unavailable" in result.output
        assert runner.invoke(cli.app, ["traces", "--help"]).exit_code == 0
    finally:
        cli.app.registered_commands[:] = registered


def test_the_documented_eval_toml_parses(tmp_path: Path) -> None:
    doc = (REPO / "docs" / "workflow.md").read_text()
    toml = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "eval.toml"
    path.write_text(toml)
    config = load_config(path, {"concurrency": 2})
    assert config.seeds == list(range(20)) and config.policy_config == {"temperature": 0.2}
    assert config.concurrency == 2 and config.timeout_s == 600
