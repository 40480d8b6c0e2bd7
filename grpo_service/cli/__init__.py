"""The ``grpo-service`` console script: serve → rollout → export-sft → (train) → eval.

Each subcommand lives in its own module as a plain function; registering one is one line
below. ``bench`` is the benchmark in ``tools/bench`` (outside the service), registered by name only
when that package is present, so the service never imports its tools.
"""

from __future__ import annotations

import importlib
import importlib.util

import typer

# Each command module imports only typer at the top (the rest inside the command), so that
# `grpo-service --help` starts in a fraction of a second (tests/test_cli_startup.py).
from grpo_service.cli.eval import eval_command, eval_report_command
from grpo_service.cli.export import export_command
from grpo_service.cli.model import init_model_command, serve_model_command, serve_vllm_command
from grpo_service.cli.rollout import rollout_command
from grpo_service.cli.serve import serve_command
from grpo_service.cli.traces import traces_app
from grpo_service.cli.train import train_command
from grpo_service.cli.train_gym import jobs_command
from grpo_service.cli.view import view_command

app = typer.Typer(
    name="grpo-service",
    help="Task app for GRPO training of LLM agents on Crafter, TextCraft, BabyAI and SciWorld, also over "
    "the OpenEnv and AgentGym protocols: serve it with tracing, collect rollouts, export SFT data, train, "
    "evaluate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

app.command("serve")(serve_command)
app.command("rollout")(rollout_command)
app.command("eval")(eval_command)
app.command("eval-report")(eval_report_command)
app.command("export-sft")(export_command)
app.add_typer(traces_app, name="traces")
app.command("view")(view_command)
app.command("init-model")(init_model_command)
app.command("serve-model")(serve_model_command)
app.command("serve-vllm")(serve_vllm_command)
app.command("train")(train_command)
app.command("jobs")(jobs_command)


def _register_optional(name: str, module: str, attr: str) -> None:
    """Register ``module.attr`` as subcommand ``name`` when that module exists and no command of
    that name is registered yet. A module that fails to import (or lacks ``attr``) shows up as a
    command that reports why, so a half-written plug-in never breaks the other subcommands."""
    if any(c.name == name for c in app.registered_commands) or importlib.util.find_spec(module) is None:
        return
    try:
        command = getattr(importlib.import_module(module), attr)
    except Exception as exc:
        reason = f"{module}.{attr}: {type(exc).__name__}: {exc}"

        def unavailable() -> None:
            typer.echo(f"{name} is unavailable ({reason})", err=True)
            raise typer.Exit(1)

        app.command(name, help=f"Unavailable: {reason}")(unavailable)
        return
    app.command(name)(command)


_register_optional("bench", "tools.bench", "bench_main")


def main() -> None:
    app()
