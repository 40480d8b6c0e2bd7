"""``grpo-service view [DB]``: the trace viewer alone, over any trace DB (no task app needed)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from rich.console import Console


def newest_db(root: Path, console: Console) -> Path:
    from grpo_service.cli.export import find_trace_dbs

    dbs = find_trace_dbs(root)
    if not dbs:
        console.print(f"[red]no trace DB under {root}[/]: pass the trace DB to view")
        raise typer.Exit(2)
    if len(dbs) > 1:
        console.print(f"{len(dbs)} trace DBs here; viewing the newest (pass another as an argument)")
    return dbs[0]


def view_command(
    db: Annotated[
        Path | None,
        typer.Argument(dir_okay=False, help="Trace DB [default: the newest trace DB below here]."),
    ] = None,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8765,
    api_key: Annotated[
        str | None,
        typer.Option(help="Require this key (needed to listen beyond loopback).", show_default=False),
    ] = None,
    open_browser: Annotated[bool, typer.Option("--open", help="Open the viewer in a browser.")] = False,
) -> None:
    """Browse the rollouts of a trace DB: run list, step-by-step replay with frames, GRPO groups."""
    import webbrowser

    import uvicorn
    from rich.console import Console

    from grpo_service.api.auth import check_bind_safety
    from grpo_service.api.routes.viewer import create_viewer_app
    from grpo_service.errors import ServiceError
    from grpo_service.reporting.viewer import queries as runs
    from grpo_service.serving import uvicorn_config

    console = Console()
    path = db if db is not None else newest_db(Path.cwd(), console)
    try:
        with runs.open_trace_db(path) as conn:
            count = conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
    except ServiceError as exc:
        console.print(f"[red]cannot view {path}:[/] {exc.message}")
        raise typer.Exit(2) from None
    check_bind_safety(host, api_key is not None, allow_insecure=False)
    url = f"http://{host}:{port}/viewer"
    console.print(
        f"[bold]Viewing[/] [cyan]{path}[/] ({count:,} rollouts) at [link={url}]{url}[/link]  (Ctrl-C stops)"
    )
    if open_browser:
        webbrowser.open(url)
    app = create_viewer_app(path, api_key)
    uvicorn.Server(uvicorn_config(app, host, port, keyed=api_key is not None, log_level="warning")).run()
