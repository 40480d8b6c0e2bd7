"""``grpo-service eval``: N episodes of any environment through ``/rollout``, and their aggregate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from rich.table import Table

    from grpo_service.client.eval import EvalConfig


COMMON_KEYS = frozenset(
    {"completed", "total", "scored", "avg_turns", "avg_achievements", "achievements_freq", "mean_return"}
    | {"failures", "failure_details"}
)


def load_config(path: Path | None, overrides: dict[str, Any]) -> EvalConfig:
    """TOML keys (top level, or an ``[eval]`` table) overridden by the flags that were given."""
    import tomllib

    from grpo_service.client.eval import EvalConfig

    values: dict[str, Any] = {}
    if path is not None:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        values = dict(data.get("eval", data))
    values.update({k: v for k, v in overrides.items() if v is not None})
    return EvalConfig.model_validate(values)


def summary_table(summary: dict[str, Any]) -> Table:
    """The common keys, the environment's own numbers, then failures by cause."""
    from rich.table import Table

    table = Table(title="evaluation", show_header=False)
    table.add_row("completed / total", f"{summary['completed']} / {summary['total']}")
    for key in summary.keys() - COMMON_KEYS:  # the environment's metrics (crafter score, success rate)
        if isinstance(summary[key], int | float):
            table.add_row(key.replace("_", " "), f"{summary[key]:.3g}")
    table.add_row("avg achievements", f"{summary['avg_achievements']:.2f}")
    table.add_row("avg turns", f"{summary['avg_turns']:.2f}")
    table.add_row("mean return", f"{summary['mean_return']:.3f}")
    if "success_rates" in summary:
        rates = [(a, r) for a, r in summary["success_rates"].items() if r > 0]
        ranked = sorted(rates, key=lambda x: -x[1])
        table.add_row("success rates", ", ".join(f"{a} {r:.0f}%" for a, r in ranked) or "none")
    else:
        freq = summary["achievements_freq"]
        table.add_row("achievements", ", ".join(f"{a} {n}" for a, n in freq.items()) or "none")
    details = summary.get("failure_details") or {}
    for cause, n in summary["failures"].items():
        table.add_row(f"failed: {cause}", f"{n}" + (f" ({details[cause]})" if cause in details else ""))
    return table


def eval_command(
    config_file: Annotated[
        Path | None, typer.Option("--config", exists=True, dir_okay=False, help="TOML with the same keys.")
    ] = None,
    base_url: Annotated[str | None, typer.Option(envvar="TASK_APP_URL", help="The task app.")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="ENVIRONMENT_API_KEY", show_default=False)] = None,
    inference_url: Annotated[str | None, typer.Option(help="Default: the service's.")] = None,
    inference_api_key: Annotated[
        str | None, typer.Option(envvar="INFERENCE_API_KEY", show_default=False)
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model id, e.g. ft:... (default: the service's).")] = None,
    env_name: Annotated[
        str | None, typer.Option("--env", help="Environment plug-in [default: crafter].")
    ] = None,
    policy: Annotated[
        str | None, typer.Option(help="Policy plug-in [default: the environment's LLM policy].")
    ] = None,
    episodes: Annotated[
        int | None, typer.Option(min=1, help="Episodes [default: 10, or one per seed].")
    ] = None,
    max_turns: Annotated[int | None, typer.Option(min=1, help="Decisions per episode [default: 10].")] = None,
    concurrency: Annotated[int | None, typer.Option(min=1, help="Episodes at once [default: 4].")] = None,
    seeds: Annotated[
        str | None, typer.Option(help='World seeds: "0-19" or "1,5,9" [default: 0..N-1].')
    ] = None,
    timeout_s: Annotated[float | None, typer.Option("--timeout", help="Seconds per episode [600].")] = None,
    logprobs: Annotated[
        bool | None,
        typer.Option(
            "--logprobs",
            help="Record token ids: a policy whose config names a tokenizer plays token streams.",
            show_default=False,
        ),
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the aggregate + episodes here.")
    ] = None,
    report_out: Annotated[
        Path | None, typer.Option("--report", dir_okay=False, help="Write an HTML report with charts here.")
    ] = None,
    viewer_url: Annotated[
        str | None, typer.Option(help="Trace viewer the report links to [default: BASE_URL/viewer].")
    ] = None,
) -> None:
    """Evaluate a model/policy over N episodes of an environment through /rollout.

    Exits 0 when at least one episode completed, 1 when none did (the causes are printed), 2 when
    the config is invalid or the task app cannot be used."""
    import asyncio
    import tomllib

    from pydantic import ValidationError
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from grpo_service.client.eval import EpisodeResult, aggregate, environment_metrics, run_eval
    from grpo_service.client.task_app import ServiceCallError
    from grpo_service.tracing.codec import redact

    console = Console()
    try:
        config = load_config(
            config_file,
            {
                "base_url": base_url,
                "api_key": api_key,
                "inference_url": inference_url,
                "inference_api_key": inference_api_key,
                "model": model,
                "env_name": env_name,
                "policy": policy,
                "episodes": episodes,
                "max_turns": max_turns,
                "concurrency": concurrency,
                "seeds": seeds,
                "timeout_s": timeout_s,
                "logprobs": logprobs,
            },
        )
        seeds_list = config.episode_seeds()
    except (ValidationError, ValueError, tomllib.TOMLDecodeError) as exc:
        console.print(f"[red]invalid eval config:[/] {exc}")
        raise typer.Exit(2) from None

    counts = {"completed": 0, "failed": 0}
    with Progress(
        TextColumn("[bold]eval[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("", total=len(seeds_list))

        def on_result(result: EpisodeResult) -> None:
            counts["completed" if result.failure is None else "failed"] += 1
            progress.update(
                task, advance=1, description=f"{counts['completed']} ok, {counts['failed']} failed"
            )

        try:
            results = asyncio.run(run_eval(config, on_result))
        except ServiceCallError as exc:
            console.print(f"[red]cannot use the task app at {config.base_url}:[/] {exc}")
            raise typer.Exit(2) from None
        except ValueError as exc:  # no policy plays this environment
            console.print(f"[red]invalid eval config:[/] {exc}")
            raise typer.Exit(2) from None

    summary = aggregate(results, environment_metrics(config.env_name))
    console.print(summary_table(summary))
    report = {
        "aggregate": summary,
        "config": redact(config.model_dump()),
        "episodes": [r.model_dump() for r in results],
    }
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        console.print(f"wrote {json_out}")
    if report_out is not None:
        from grpo_service.reporting.eval_report import write_report

        viewer = viewer_url or config.base_url.rstrip("/") + "/viewer"
        console.print(f"wrote {write_report(report_out, report, viewer_url=viewer)}")
    if summary["total"] and not summary["completed"]:
        console.print("[red]no episode completed[/]: see the failures above")
        raise typer.Exit(1)


def eval_report_command(
    eval_json: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="What `eval --json` wrote.")],
    out: Annotated[Path, typer.Option("--out", "-o", dir_okay=False, help="HTML file to write.")] = Path(
        "report.html"
    ),
    viewer_url: Annotated[str | None, typer.Option(help="Trace viewer the report links to.")] = None,
) -> None:
    """Turn an `eval --json` result into the HTML report (charts embedded, one file)."""
    from rich.console import Console

    from grpo_service.reporting.eval_report import write_report

    console = Console()
    try:
        result = json.loads(eval_json.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        console.print(f"[red]{eval_json} is not JSON:[/] {exc}")
        raise typer.Exit(2) from None
    aggregate = result.get("aggregate", result.get("summary")) if isinstance(result, dict) else None
    if not isinstance(aggregate, dict):
        console.print(
            f"[red]{eval_json} is not an eval result[/] (no aggregate): write one with `eval --json`"
        )
        raise typer.Exit(2)
    if viewer_url is None and isinstance(result.get("config"), dict) and result["config"].get("base_url"):
        viewer_url = str(result["config"]["base_url"]).rstrip("/") + "/viewer"
    console.print(f"wrote {write_report(out, result, viewer_url=viewer_url)}")
