"""``grpo-service export-sft``: OpenAI chat fine-tuning JSONL from a trace DB."""

from __future__ import annotations

import os
import sqlite3
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from grpo_service.tracing.export import ExportReport

DB_SUFFIXES = (".db", ".sqlite", ".sqlite3")
SERVE_PREFIX = "task_app_traces"  # `serve --trace DIR` names its files task_app_traces_<time>.db
SKIP_DIRS = frozenset({"node_modules", "__pycache__", "site-packages"})
TRACE_TABLES = frozenset({"sessions", "turns", "trace_writers"})


class Mode(StrEnum):
    rl = "rl"
    eval = "eval"
    all = "all"


def is_trace_db(path: Path) -> bool:
    """A SQLite file with the trace schema's tables (whatever its name: ``serve --trace-db`` picks any)."""
    try:
        with path.open("rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                return False
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
        try:
            names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            conn.close()
    except (OSError, sqlite3.Error):
        return False
    return names >= TRACE_TABLES


def find_trace_dbs(root: Path) -> list[Path]:
    """Every trace DB under ``root`` (``task_app_traces_*.db`` from ``serve --trace``, and files named
    by ``--trace-db`` or ``TRACE_DB``), newest first; hidden dirs and venvs are skipped."""
    found: set[Path] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS]
        found.update(Path(dirpath) / f for f in filenames if f.endswith(DB_SUFFIXES))
    configured = os.environ.get("TRACE_DB")
    if configured:
        found.add(Path(configured))
    # Times first: opening a WAL-mode DB to look at its tables may touch its -wal/-shm files.
    written = {p: _last_write(p) for p in found if p.is_file()}
    dbs = [p for p in written if p.name.startswith(SERVE_PREFIX) or is_trace_db(p)]
    return sorted(dbs, key=written.__getitem__, reverse=True)


def _last_write(db: Path) -> float:
    # In WAL mode recent commits live in the -wal file until a checkpoint.
    wal = db.with_name(db.name + "-wal")
    return max(db.stat().st_mtime, wal.stat().st_mtime if wal.exists() else 0.0)


def _interactive() -> bool:
    return sys.stdin.isatty()


def choose_db(root: Path, console: Console) -> Path:
    dbs = find_trace_dbs(root)
    if not dbs:
        console.print(f"[red]no trace DB under {root}[/]; pass --in PATH")
        raise typer.Exit(2)
    for i, db in enumerate(dbs, 1):
        marker = "  [green]← most recent[/]" if i == 1 else ""
        console.print(f"  {i}. {db.relative_to(root) if db.is_relative_to(root) else db}{marker}")
    if not _interactive():
        console.print(f"stdin is not a terminal: using the most recent, {dbs[0]}")
        return dbs[0]
    choice = typer.prompt("Which trace DB?", default=1, type=int)
    if not 1 <= choice <= len(dbs):
        console.print(f"[red]choose 1-{len(dbs)}[/]")
        raise typer.Exit(2)
    return dbs[choice - 1]


def report_table(report: ExportReport) -> Table:
    from rich.table import Table

    table = Table(title=f"SFT export → {report.out}", show_header=False)
    table.add_row("sessions kept", f"{report.sessions_kept} / {report.sessions_total}")
    for reason, n in sorted(report.session_skips.items()):
        table.add_row(f"  session skipped: {reason}", str(n))
    table.add_row("examples (turns) written", f"{report.examples} / {report.turns_seen}")
    for reason, n in sorted(report.turn_skips.items()):
        table.add_row(f"  turn skipped: {reason}", str(n))
    return table


def export_command(
    in_db: Annotated[
        Path | None,
        typer.Option("--in", dir_okay=False, help="Trace DB (default: pick from those found here)."),
    ] = None,
    out: Annotated[Path, typer.Option("--out", dir_okay=False, help="JSONL to write.")] = Path(
        "ft_data/crafter_sft.jsonl"
    ),
    mode: Annotated[
        Mode, typer.Option(help="Sessions of this mode: rl (collected rollouts), eval (eval episodes), all.")
    ] = Mode.rl,
    run_id: Annotated[
        list[str] | None, typer.Option("--run-id", help="Only sessions of this run id (repeatable).")
    ] = None,
    model: Annotated[str | None, typer.Option(help="Only sessions played by this model.")] = None,
    min_achievements: Annotated[int, typer.Option(min=0, help="Distinct achievements, at least.")] = 0,
    require_achievement: Annotated[
        list[str] | None, typer.Option("--require-achievement", help="Must be unlocked (repeatable).")
    ] = None,
    min_reward: Annotated[float | None, typer.Option(help="Session total reward, at least.")] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, help="At most this many sessions (oldest first).")
    ] = None,
    streams: Annotated[
        bool,
        typer.Option(
            "--streams",
            help="One line per token stream ({token_ids, sampled, logprobs, spans}: the exact tokens of a "
            "token-in/token-out rollout, every turn) instead of one chat example per successful turn.",
        ),
    ] = False,
) -> None:
    """Export successful turns as OpenAI chat fine-tuning examples (one JSON line per turn).

    Exits 0 when examples were written, 1 when the filters kept none (the reasons are printed),
    2 on a bad DB or an unknown achievement name."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from grpo_service.tracing.export import ExportFilters, UnknownAchievement, export_sft
    from grpo_service.tracing.reader import TraceDBError

    console = Console()
    db = in_db if in_db is not None else choose_db(Path.cwd(), console)
    filters = ExportFilters(
        mode=None if mode is Mode.all else mode.value,
        run_ids=run_id or [],
        model=model,
        min_achievements=min_achievements,
        require_achievements=require_achievement or [],
        min_reward=min_reward,
        limit=limit,
    )
    with Progress(
        TextColumn("[bold]export[/] sessions"), BarColumn(), MofNCompleteColumn(), console=console
    ) as progress:
        task = progress.add_task("", total=None)
        try:
            report = export_sft(
                db,
                out,
                filters,
                on_session=lambda: progress.advance(task),
                on_start=lambda n: progress.update(task, total=n),
                streams=streams,
            )
        except (TraceDBError, UnknownAchievement) as exc:
            console.print(f"[red]error:[/] {exc}")
            raise typer.Exit(2) from None
    console.print(report_table(report))
    if report.writer_drops or report.writer_failures:
        console.print(
            f"[yellow]note:[/] the server dropped {report.writer_drops} and failed to write "
            f"{report.writer_failures} rollouts to this DB (see `grpo-service traces --in {db}`)"
        )
    console.print(f"wrote {report.examples} examples to {out}")
    if report.examples == 0:
        console.print("[red]no examples[/]: every session or turn was filtered out (reasons above)")
        raise typer.Exit(1)
