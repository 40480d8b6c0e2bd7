"""``grpo-service traces``: what a trace DB holds (counts, server runs, the sessions), and
``traces show RUN_ID``: one rollout turn by turn."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from grpo_service.tracing.reader import TraceReader

traces_app = typer.Typer(
    help="Inspect a trace DB: counts, server runs and sessions; `show RUN_ID` for one rollout.",
    invoke_without_command=True,
    no_args_is_help=False,
    rich_markup_mode=None,
)

InDB = Annotated[
    Path | None, typer.Option("--in", dir_okay=False, help="Trace DB (default: the newest found here).")
]


def _open(in_db: Path | None, console: Console) -> TraceReader:
    from grpo_service.cli.export import choose_db
    from grpo_service.tracing.reader import TraceDBError, TraceReader

    db = in_db if in_db is not None else choose_db(Path.cwd(), console)
    try:
        return TraceReader(db)
    except TraceDBError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None


@traces_app.callback()
def traces_command(
    ctx: typer.Context,
    in_db: InDB = None,
    last: Annotated[int, typer.Option(min=0, help="Sessions listed, newest last (0: all).")] = 20,
) -> None:
    """Summarize a trace DB: table counts, each server run's written/dropped counts, the sessions."""
    if ctx.invoked_subcommand is not None:
        ctx.obj = in_db
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    with _open(in_db, console) as reader:
        counts = Table(title=f"{reader.path} (schema v{reader.version()})", show_header=False)
        tables = ("sessions", "turns", "messages", "llm_calls", "env_steps", "rewards", "rollout_records")
        for table in tables:  # rollout_records: any left could not be derived (opening derived the rest)
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
        sessions = reader.sessions()
        console.print(session_table(sessions[-last:] if last else sessions, len(sessions)))


def session_table(sessions: list[dict[str, Any]], total: int) -> Any:
    from rich.table import Table

    title = f"sessions ({len(sessions)} of {total}, newest last; `traces show RUN_ID` for one)"
    table = Table(title=title)
    for column in ("started", "run id", "mode", "group", "model", "turns", "return", "achievements", "stop"):
        table.add_column(column, overflow="fold")
    for s in sessions:
        group = f"{s['group_id']}[{s['group_index']}]" if s["group_id"] else ""
        table.add_row(
            _time(s["started_at"]),
            s["run_id"],
            s["mode"] or "rl",
            group,
            s["model"] or s["policy_name"],
            str(s["num_turns"]),
            f"{s['total_reward']:.2f}",
            str(s["achievements_count"]),
            s["stop_reason"],
        )
    return table


@traces_app.command("show")
def show_command(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run id (the newest session of that id is shown).")],
    in_db: InDB = None,
    messages: Annotated[
        bool, typer.Option("--messages", help="Also print the observation text the model was sent.")
    ] = False,
) -> None:
    """One rollout turn by turn: the model's actions, reward, unlocks and errors per decision."""
    from rich.console import Console

    console = Console(highlight=False)
    with _open(in_db or ctx.obj, console) as reader:
        ids = reader.session_ids(run_id)
        if not ids:
            console.print(f"[red]no session with run id {run_id!r}[/] in {reader.path}")
            raise typer.Exit(1)
        session = reader.session(ids[-1])
        if len(ids) > 1:
            console.print(f"[yellow]note:[/] {len(ids)} sessions share run id {run_id}; showing the newest")
        for line in session_lines(session, reader.turns(session["session_id"]), messages):
            console.print(line, markup=False)


def session_lines(session: dict[str, Any], turns: list[dict[str, Any]], with_text: bool) -> list[str]:
    """The text view of one session (plain text, no markup)."""
    group = f", group {session['group_id']}[{session['group_index']}]" if session["group_id"] else ""
    lines = [
        f"{session['run_id']} ({session['mode'] or 'rl'}{group}): {session['env_name']} seed "
        f"{session['seed']}, {session['policy_name']} {session['model'] or ''}".rstrip(),
        f"  {_time(session['started_at'])}, {session['num_turns']} turns, {session['num_steps']} env "
        f"steps, return {session['total_reward']:.2f}, stop {session['stop_reason']}",
        f"  achievements: {', '.join(session['achievements'] or []) or 'none'}",
    ]
    for t in turns:
        env, llm = t["env"] or {}, t["llm"] or {}
        actions = env.get("actions") or _called_actions(t["tool_calls"])
        line = f"turn {t['turn']} (episode {t['episode']}): {' '.join(map(str, actions)) or '-'}"
        if env:
            line += f" -> reward {env.get('reward', 0.0):+.2f}"
            if env.get("achievements_unlocked"):
                line += f", unlocked {', '.join(env['achievements_unlocked'])}"
            if env.get("done"):
                line += ", episode over"
        if llm.get("latency_ms") is not None:
            line += f"  [{llm['latency_ms']:.0f} ms]"
        lines.append(line)
        if t["decision_error"]:
            lines.append(f"    error {t['decision_error']}: {t['decision_error_detail'] or ''}".rstrip())
        text = (t["observation"] or {}).get("text") if with_text else None
        if text:
            lines.extend(f"    | {row}" for row in str(text).splitlines())
    return lines


def _called_actions(tool_calls: Any) -> list[Any]:
    actions: list[Any] = []
    for call in tool_calls or []:
        arguments = (call.get("arguments") if isinstance(call, dict) else None) or {}
        if isinstance(arguments, dict):
            actions.extend(arguments.get("actions") or [])
    return actions


def _time(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


@traces_app.command("export-synth")
def export_synth_command(
    ctx: typer.Context,
    out: Annotated[
        Path, typer.Option("--out", dir_okay=False, help="New SQLite file with Synth's v3 tables.")
    ] = Path("traces/v3/synth_ai.db"),
    in_db: InDB = None,
) -> None:
    """Copy a trace DB into Synth's trace schema v3 (session_traces, session_timesteps, events,
    messages, outcome_rewards, event_rewards), for Synth's own exporter and tools."""
    from rich.console import Console

    from grpo_service.tracing.synth import export_synth_db

    console = Console()
    with _open(in_db or ctx.obj, console) as reader:
        source = reader.path
    try:
        counts = export_synth_db(source, out)
    except FileExistsError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    console.print(f"wrote {out}: " + ", ".join(f"{table} {n}" for table, n in counts.items()))


@traces_app.command("synth-views")
def synth_views_command(ctx: typer.Context, in_db: InDB = None) -> None:
    """Add Synth's v3 tables to a trace DB as views named synth_<table> (for SQL; nothing is copied)."""
    import sqlite3

    from rich.console import Console

    from grpo_service.tracing.synth import install_views

    console = Console()
    with _open(in_db or ctx.obj, console) as reader:
        path = reader.path
    conn = sqlite3.connect(path)
    try:
        with conn:
            names = install_views(conn)
    finally:
        conn.close()
    console.print(f"{path}: views {', '.join(names)}")
