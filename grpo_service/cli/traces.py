"""``grpo-service traces``: what a trace DB holds, and what its writers could not write."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from grpo_service.cli.export import choose_db
from grpo_service.tracing.reader import TraceDBError, TraceReader

console = Console()


def traces_command(
    in_db: Annotated[Path | None, typer.Option("--in", dir_okay=False, help="Trace DB.")] = None,
) -> None:
    """Summarize a trace DB: schema, sessions, turns, and each server run's written/dropped counts."""
    db = in_db if in_db is not None else choose_db(Path.cwd())
    try:
        reader = TraceReader(db)
    except TraceDBError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    with reader:
        counts = Table(title=f"{db} (schema v{reader.version()})", show_header=False)
        for table in ("sessions", "turns", "messages", "llm_calls", "env_steps", "rewards"):
            counts.add_row(table, str(reader.count(table)))
        console.print(counts)
        writers = Table(title="server runs (trace writers)")
        for column in ("id", "started", "closed", "written", "dropped", "failed"):
            writers.add_column(column)
        for w in reader.writers():
            closed = _time(w["closed_at"]) if w["closed_at"] else "[yellow]never (crashed or running)[/]"
            writers.add_row(
                str(w["id"]),
                _time(w["started_at"]),
                closed,
                str(w["written"]),
                str(w["dropped"]),
                str(w["failed"]),
            )
        console.print(writers)
        dropped = reader.dropped()
        if dropped:
            shown = ", ".join(f"{d['run_id']} ({d['reason']})" for d in dropped[:20])
            console.print(f"[yellow]not written:[/] {shown}{' …' if len(dropped) > 20 else ''}")


def _time(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
