"""``grpo-service bench``: the service against the physical limit, on this machine, in one run.

Absolute numbers drift on shared machines; ratios measured in the same run do not (much).
See docs/benchmark.md for what each figure means and how it is measured.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = ["FIGURE_KEYS", "RATIO_KEYS", "bench_main", "render_table", "run_bench"]

# `grpo-service bench SECTION`: the module tools/bench/SECTION.py, its runner and its renderer.
SECTIONS: dict[str, tuple[str, str]] = {
    "train": ("run_train_bench", "render_train_report"),
    "scale": ("run_scale_bench", "render_scale_report"),
    "samplers": ("run_samplers_bench", "render_samplers_report"),
}


def __getattr__(name: str) -> Any:
    """The runner's names, imported on first use: ``grpo-service --help`` must not load the bench."""
    if name in ("FIGURE_KEYS", "RATIO_KEYS", "run_bench"):
        from tools.bench import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def rich_table(*columns: tuple[str, Literal["left", "right"]]) -> Table:
    from rich.table import Table

    table = Table()
    for name, justify in columns:
        table.add_column(name, justify=justify)
    return table


def render_table(report: dict[str, Any], console: Console) -> None:
    from tools.bench.run import FIGURES, RATIOS, _fmt

    machine = report["machine"]
    console.print(
        f"[bold]grpo-service bench[/] ({report['mode']}, {report['duration_s']} s) on "
        f"{machine['nproc']} x {machine['cpu_model']}, Python {machine['python']}, {machine['server_stack']}"
    )
    console.print(report["layout"])
    table = rich_table(
        ("figure", "left"), ("median", "right"), ("spread (min-max)", "right"), ("unit", "left")
    )
    for fig in FIGURES:
        entry = report["figures"][fig.key]
        if entry["median"] is None:
            table.add_row(fig.key, "skipped", entry.get("skipped", "")[:60], fig.unit)
            continue
        lo, hi = entry["spread"]
        table.add_row(fig.key, _fmt(entry["median"]), f"{_fmt(lo)} - {_fmt(hi)}", fig.unit)
    console.print(table)
    ratios = rich_table(
        ("ratio", "left"), ("value", "right"), ("spread", "right"), ("goal", "right"), ("met", "left")
    )
    for ratio in RATIOS:
        entry = report["ratios"][ratio.key]
        goal = f"{'<=' if ratio.at_most else '>='} {ratio.goal:g}"
        if entry["value"] is None:
            ratios.add_row(ratio.key, "skipped", "", goal, "-")
            continue
        lo, hi = entry["spread"]
        met = "[green]yes[/]" if entry["met"] else "[red]no[/]"
        ratios.add_row(ratio.key, f"{entry['value']:.2f}", f"{lo:.2f} - {hi:.2f}", goal, met)
    for key, entry in report.get("info_ratios", {}).items():
        if entry["value"] is not None:
            lo, hi = entry["spread"]
            ratios.add_row(f"[dim]{key}[/]", f"{entry['value']:.2f}", f"{lo:.2f} - {hi:.2f}", "(info)", "")
    console.print(ratios)
    for note in report["notes"]:
        console.print(f"[yellow]note:[/] {note}")


def bench_main(
    section: Annotated[
        str | None,
        typer.Argument(
            help="`train`: our GRPO against SB3's PPO on CartPole (tools/bench/train.py); `scale`: "
            "embedded against served through Ray with 1 and N hosts (tools/bench/scale.py); `samplers`: "
            "GRPO groups against real vLLM, serve-model and the fake (tools/bench/samplers.py)."
        ),
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="3 short repeats (about 5 minutes on 2 cores).")
    ] = False,
    json_path: Annotated[
        Path | None, typer.Option("--json", dir_okay=False, help="Also write the results to this JSON file.")
    ] = None,
    pin: Annotated[
        bool,
        typer.Option(
            "--pin/--no-pin",
            help="Pin the service to one CPU and the fake LLM + load generator to the others (if >= 2).",
        ),
    ] = True,
    smoke: Annotated[
        bool, typer.Option("--smoke", hidden=True, help="Tiny run for tests (seconds).")
    ] = False,
    envs: Annotated[
        bool,
        typer.Option(
            "--envs/--no-envs", help="Also measure every environment: steps/s, restores, oracle baselines."
        ),
    ] = True,
    envs_only: Annotated[bool, typer.Option("--envs-only", help="Measure the environments only.")] = False,
) -> None:
    """Benchmark the task app against raw Crafter and the LLM's own limit; print ratios."""
    from rich.console import Console

    from tools.bench import envs as env_bench
    from tools.bench.run import run_bench

    mode = "smoke" if smoke else ("quick" if quick else "full")
    console = Console()

    def save(report: dict[str, Any]) -> None:
        if json_path is not None:
            json_path.write_text(json.dumps(report, indent=2) + "\n")
            console.print(f"wrote {json_path}")

    def log(line: str) -> None:
        # markup=False: a progress line such as "spread [1.2, 3.4]" is text, not a rich tag.
        console.print(line, style="dim", highlight=False, markup=False)

    if section is not None:
        if section not in SECTIONS:
            console.print(f"[red]unknown bench section {section!r}[/]: {', '.join(map(repr, SECTIONS))}")
            raise typer.Exit(2)
        module = importlib.import_module(f"tools.bench.{section}")
        run_name, render_name = SECTIONS[section]
        section_report = getattr(module, run_name)(mode, log=log)
        getattr(module, render_name)(section_report, console)
        save(section_report)
        return

    report: dict[str, Any] = {"mode": mode}
    if not envs_only:
        report = run_bench(mode, pinning=pin, log=log)
        render_table(report, console)
    if envs or envs_only:
        report["environments"] = env_bench.run_env_bench(mode, log)
        env_bench.render(report["environments"], console)
    save(report)
