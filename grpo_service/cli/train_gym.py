"""``grpo-service train --type gymnasium``: a gymnasium GRPO job in this process with a progress
bar (the trainer ``POST /train`` runs), and ``grpo-service jobs``: the jobs a running service knows."""

from __future__ import annotations

import json
import signal
import time
import tomllib
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

# Only typer and rich at the top (the CLI's rule: `--help` imports nothing heavy).
console = Console()


def parse_sets(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs; a value that parses as JSON (numbers, true, lists) is taken as such."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--set {pair!r}: use key=value")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


def gym_train(
    job_type: str = "gymnasium",
    config_file: Path | None = None,
    env: str | None = None,
    timesteps: int | None = None,
    lr: float | None = None,
    n_steps: int | None = None,
    batch_size: int | None = None,
    epochs: int | None = None,
    group_size: int | None = None,
    reward: str | None = None,
    seed: int | None = None,
    target_return: float | None = None,
    model_name: str | None = None,
    overwrite: bool = False,
    sets: list[str] | None = None,
    models_dir: Path | None = None,
    threads: int = 1,
) -> None:
    """Train a policy here, with the trainer ``POST /train`` runs, and save it where the service finds
    it. Called by ``grpo-service train --type gymnasium`` (grpo_service/cli/train.py)."""
    from pydantic import ValidationError
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    import training.job_types  # noqa: F401  (registers the job types)
    from grpo_service.config import Settings
    from training.context import TrainContext
    from training.jobs import get_job_type, load_target
    from training.model_store import InvalidModelName, ModelStore

    try:
        kind = get_job_type(job_type)
    except KeyError as exc:
        console.print(f"[red]{exc.args[0]}[/]")
        raise typer.Exit(2) from None
    values: dict[str, Any] = {}
    if config_file is not None:
        data = tomllib.loads(config_file.read_text(encoding="utf-8"))
        values.update(data.get("train", data))
    flags = {
        "env_name": env,
        "total_timesteps": timesteps,
        "learning_rate": lr,
        "n_steps": n_steps,
        "batch_size": batch_size,
        "n_epochs": epochs,
        "group_size": group_size,
        "reward_function_type": reward,
        "seed": seed,
        "target_return": target_return,
        "model_name": model_name,
        "overwrite": overwrite or None,
    }
    values.update({k: v for k, v in flags.items() if v is not None})
    values.update(parse_sets(sets or []))
    values["type"] = job_type
    try:
        config = kind.config_model.model_validate(values)
    except ValidationError as exc:
        console.print(f"[red]invalid {job_type} config:[/]\n{exc}")
        raise typer.Exit(2) from None
    store = ModelStore(models_dir or Settings().state_dir / "models")
    name = getattr(config, "model_name", None) or f"grpo_model_{time.strftime('%Y%m%d_%H%M%S')}"
    try:
        if store.exists(name) and not getattr(config, "overwrite", False):
            console.print(
                f"[red]model {name!r} exists in {store.models_dir}[/]: pass --overwrite to replace it"
            )
            raise typer.Exit(2)
    except InvalidModelName as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    config = config.model_copy(update={"model_name": name})

    import torch

    torch.set_num_threads(threads)
    trainer = load_target(kind.target)
    interrupted = {"stop": False}

    def on_sigint(signum: int, frame: Any) -> None:
        interrupted["stop"] = True  # the trainer saves and returns

    previous = signal.signal(signal.SIGINT, on_sigint)
    total = int(getattr(config, "total_timesteps", 0) or 0)
    try:
        with Progress(
            TextColumn("[bold]train[/] {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            task = progress.add_task("starting", total=total or None, rate="")

            def report(current: int, total_: int, m: dict[str, Any]) -> None:
                desc = f"return {m.get('mean_episode_return', 0):.1f}  loss {m.get('loss', 0):+.4f}"
                rate = f"{m.get('steps_per_s', 0):,.0f} steps/s"
                progress.update(
                    task, completed=min(current, total_), total=total_, description=desc, rate=rate
                )

            ctx = TrainContext(store.models_dir, name, report=report, should_stop=lambda: interrupted["stop"])
            result = trainer(config, ctx)
    finally:
        signal.signal(signal.SIGINT, previous)
    m = result.get("metrics", {})
    console.print(
        f"{result.get('reason')}: {m.get('timesteps', 0)} steps, {m.get('updates', 0)} updates, "
        f"mean return {m.get('mean_episode_return', 0):.1f}; saved {ctx.model_path}"
    )
    if ctx.curves_path.exists():
        console.print(f"curves {ctx.curves_path}, metrics {ctx.metrics_path}")


def jobs_command(
    base_url: Annotated[
        str, typer.Option(envvar="TASK_APP_URL", help="The service.")
    ] = "http://localhost:8000",
    api_key: Annotated[str | None, typer.Option(envvar="ENVIRONMENT_API_KEY", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON the service answered.")] = False,
) -> None:
    """List the training jobs of a running service (GET /training/jobs)."""
    import httpx
    from rich.table import Table

    from grpo_service.client.task_app import ServiceCallError, ServiceRequest, call, headers, timeout

    try:
        with httpx.Client(base_url=base_url, headers=headers(api_key), timeout=timeout(10.0)) as client:
            body = call(client, ServiceRequest("GET", "/training/jobs"))
    except ServiceCallError as exc:
        console.print(f"[red]cannot list jobs at {base_url}:[/] {exc}")
        raise typer.Exit(2) from None
    if as_json:
        console.print_json(json.dumps(body))
        return
    table = Table(title=f"training jobs at {base_url}")
    for col in ("job_id", "type", "status", "progress", "model", "started", "ended"):
        table.add_column(col)
    for job in body["jobs"]:
        table.add_row(
            job["job_id"],
            job["job_type"],
            job["status"],
            f"{job['progress']:.0%}",
            job["model_name"],
            job["start_time"],
            job["end_time"] or "",
        )
    console.print(table)
