"""``grpo-service serve``: run the task app, optionally tracing every rollout to SQLite."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from grpo_service.config import Settings

RELOAD_APP = "grpo_service.cli.reload_app:app"


def trace_db_path(trace_dir: Path | None, trace_db: Path | None, now: float | None = None) -> Path | None:
    """``--trace-db`` names the file; ``--trace DIR`` makes ``DIR/task_app_traces_<timestamp>.db``."""
    if trace_db is not None:
        return trace_db
    if trace_dir is None:
        return None
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(now))
    path = trace_dir / f"task_app_traces_{stamp}.db"
    n = 2
    while path.exists():  # two servers started within the same second each get their own file
        path = trace_dir / f"task_app_traces_{stamp}_{n}.db"
        n += 1
    return path


def build_settings(env_file: Path | None, **overrides: Any) -> Settings:
    """Settings from the environment, the env file (default ``.env``) and the given flags."""
    from grpo_service.config import Settings

    given = {k: v for k, v in overrides.items() if v is not None}
    return Settings(_env_file=env_file if env_file is not None else ".env", **given)  # type: ignore[call-arg]


def serve_command(
    host: Annotated[str | None, typer.Option(help="Bind address (default: HOST or 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: PORT or 8000).")] = None,
    env_file: Annotated[
        Path | None,
        typer.Option(
            "--env-file", exists=True, dir_okay=False, help="Settings file (default: ./.env if any)."
        ),
    ] = None,
    reload: Annotated[bool, typer.Option("--reload", help="Restart on code changes (development).")] = False,
    trace: Annotated[
        Path | None,
        typer.Option(
            "--trace",
            file_okay=False,
            help="Trace every rollout to DIR/task_app_traces_<timestamp>.db (one file per server run).",
        ),
    ] = None,
    trace_db: Annotated[
        Path | None, typer.Option("--trace-db", dir_okay=False, help="Trace to this SQLite file instead.")
    ] = None,
    insecure: Annotated[
        bool, typer.Option("--insecure", help="Allow a non-loopback bind without ENVIRONMENT_API_KEY.")
    ] = False,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            help="Serve through Ray: a cluster ADDRESS to join, 'auto' (join the running cluster, "
            "else start a local one) or 'local' (default: RAY_ADDRESS, else one embedded process).",
        ),
    ] = None,
    ray_hosts: Annotated[
        int | None,
        typer.Option(
            "--ray-hosts",
            min=0,
            help="Ray hosts holding live envs, 0 for one per CPU (default: RAY_HOSTS or 0).",
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Shorthand for --ray local --ray-hosts N: a local Ray cluster of N hosts, 0 for one "
            "per CPU (needs the ray extra); 1 is one embedded process.",
        ),
    ] = None,
) -> None:
    """Serve the task app (FastAPI + uvicorn), with optional SQLite tracing."""
    from rich.console import Console

    console = Console()
    db = trace_db_path(trace, trace_db)
    settings = build_settings(
        env_file,
        host=host,
        port=port,
        trace_db=db,
        allow_insecure=True if insecure else None,
        ray_address="local" if workers not in (None, 1) and ray is None else ray,
        ray_hosts=workers if ray_hosts is None else ray_hosts,
    )
    from grpo_service.api.auth import check_bind_safety

    # Refuse an unsafe bind before announcing anything.
    check_bind_safety(settings.host, settings.environment_api_key is not None, settings.allow_insecure)
    if settings.trace_db is not None:
        settings.trace_db.parent.mkdir(parents=True, exist_ok=True)
        console.print(f"[bold]Tracing[/] every rollout to [cyan]{settings.trace_db}[/]")
    if settings.environment_api_key is not None:
        source = "the environment or " + str(env_file or ".env")
        console.print(
            f"[bold]API key required[/] (ENVIRONMENT_API_KEY from {source}): clients send X-API-Key; "
            "every route but /health answers 401 without it"
        )
    console.print(f"[bold]Serving[/] on http://{settings.host}:{settings.port}  (API docs: /docs)")
    if settings.ray_address is not None:
        hosts = settings.ray_hosts or "one per CPU of the"
        console.print(f"[bold]Ray[/]: {hosts} hosts on the cluster {settings.ray_address!r}")
    from grpo_service.serving import serve

    if reload:
        # The reloader's child rebuilds Settings from the environment, so hand it everything.
        os.environ.update(settings.as_environment())
        serve(settings, reload=True, app_path=RELOAD_APP)
    else:
        serve(settings)
