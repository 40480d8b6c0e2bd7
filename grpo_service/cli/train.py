"""``grpo-service train --type sft|rl --config F.toml``: the two LLM training steps on a model
made here or any local checkpoint (``sft``: on ``export-sft`` JSONL; ``rl``: GRPO against the task
app, sampling from ``serve-model``). ``--type gymnasium``: GRPO of an MLP policy on a gymnasium env,
the trainer of the training job API (grpo_service/cli/train_gym.py)."""

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
    gymnasium = "gymnasium"


def _summary(title: str, result: dict[str, Any]) -> Table:
    table = Table(title=title, show_header=False)
    for key, value in result.items():
        table.add_row(key, json.dumps(value) if isinstance(value, dict | list) else str(value))
    return table


def train_command(
    type_: Annotated[
        TrainType,
        typer.Option("--type", help="sft: supervised on chat JSONL; rl: GRPO; gymnasium: GRPO on a gym env."),
    ] = TrainType.gymnasium,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config", exists=True, dir_okay=False, help="TOML: top level or a [sft]/[rl]/[train] table."
        ),
    ] = None,
    dataset: Annotated[
        Path | None, typer.Option("--dataset", exists=True, dir_okay=False, help="sft: the chat JSONL.")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", file_okay=False, help="The run directory.")] = None,
    env: Annotated[str | None, typer.Option(help="gymnasium: env id [CartPole-v1].")] = None,
    timesteps: Annotated[int | None, typer.Option(help="gymnasium: env-step budget [10000].")] = None,
    lr: Annotated[float | None, typer.Option("--lr", help="gymnasium: Adam learning rate [3e-4].")] = None,
    n_steps: Annotated[int | None, typer.Option(help="gymnasium: episodes per update [32].")] = None,
    batch_size: Annotated[int | None, typer.Option(help="gymnasium: episodes per minibatch [64].")] = None,
    epochs: Annotated[int | None, typer.Option(help="gymnasium: passes over each update [10].")] = None,
    group_size: Annotated[int | None, typer.Option(help="gymnasium: episodes per group [8].")] = None,
    reward: Annotated[
        str | None, typer.Option(help="gymnasium: reward function [optimized_cartpole].")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="gymnasium: random seed [0].")] = None,
    target_return: Annotated[
        float | None, typer.Option(help="gymnasium: stop once the 20-episode mean reaches it.")
    ] = None,
    model_name: Annotated[
        str | None, typer.Option(help="gymnasium: save as <models-dir>/<name>.zip.")
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="gymnasium: replace a model of that name.")] = False,
    sets: Annotated[
        list[str] | None, typer.Option("--set", help="gymnasium: any config field, key=value (repeatable).")
    ] = None,
    models_dir: Annotated[Path | None, typer.Option(help="gymnasium: [STATE_DIR/models].")] = None,
    threads: Annotated[int, typer.Option(min=1, help="gymnasium: torch threads.")] = 1,
) -> None:
    """Train an LLM (SFT on exported traces, or GRPO against the task app through the model server),
    or a gymnasium policy with GRPO (the trainer behind POST /train, with a progress bar)."""
    if type_ is TrainType.gymnasium:
        from grpo_service.cli.train_gym import gym_train

        gym_train(
            type_.value, config_file, env, timesteps, lr, n_steps, batch_size, epochs, group_size, reward,
            seed, target_return, model_name, overwrite, sets, models_dir, threads,
        )  # fmt: skip
        return
    if config_file is None:
        raise typer.BadParameter("--config is required for --type sft and rl")
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
        from grpo_service.training_api.llm_jobs import train_rl_job

        result = train_rl_job(config)
    console.print(_summary(f"train --type {type_.value}", result))
