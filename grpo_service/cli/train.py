"""``grpo-service train --type sft|rl --config F.toml``: seed 001's two training steps on a model
made here or any local checkpoint (``sft``: on ``export-sft`` JSONL; ``rl``: GRPO against the task
app, sampling from ``serve-model``)."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

console = Console()


class TrainType(StrEnum):
    sft = "sft"
    rl = "rl"


def _summary(title: str, result: dict[str, Any]) -> Table:
    table = Table(title=title, show_header=False)
    for key, value in result.items():
        table.add_row(key, json.dumps(value) if isinstance(value, dict | list) else str(value))
    return table


def train_command(
    type_: Annotated[TrainType, typer.Option("--type", help="sft: supervised on chat JSONL; rl: GRPO.")],
    config_file: Annotated[
        Path,
        typer.Option("--config", exists=True, dir_okay=False, help="TOML: top level or a [sft]/[rl] table."),
    ],
    dataset: Annotated[
        Path | None, typer.Option("--dataset", exists=True, dir_okay=False, help="sft: the chat JSONL.")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", file_okay=False, help="The run directory.")] = None,
) -> None:
    """Train an LLM: SFT on exported traces, or GRPO against the task app through the model server."""
    from training.llm.config import RLConfig, SFTConfig
    from training.llm.run import ConfigError, load_config

    overrides: dict[str, Any] = {"out": str(out) if out else None}
    try:
        if type_ is TrainType.sft:
            overrides["dataset"] = str(dataset) if dataset else None
            config = load_config(SFTConfig, config_file, "sft", **overrides)
        else:
            if dataset is not None:
                raise typer.BadParameter("--dataset is for --type sft")
            config = load_config(RLConfig, config_file, "rl", **overrides)
        if config.out is None:
            raise ConfigError(f"{config_file}: give `out` (the run directory) or --out")
    except ConfigError as exc:
        console.print(f"[red]invalid config[/]: {exc}")
        raise typer.Exit(2) from None
    if type_ is TrainType.sft:
        from training.llm.sft import train_sft

        try:
            result = train_sft(config, console=console)
        except (ValueError, FileNotFoundError) as exc:
            console.print(f"[red]SFT failed[/]: {exc}")
            raise typer.Exit(1) from None
    else:
        from grpo_service.llm_training import train_rl_job

        result = train_rl_job(config)
    console.print(_summary(f"train --type {type_.value}", result))
