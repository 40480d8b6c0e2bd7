"""``grpo-service rollout``: one traced rollout through the service, saved as ``<run_id>_trace.json``.

The rollout is started in the background (``POST /rollout/start``) and polled
(``GET /run/status/{run_id}``), so the command shows turn k/N while it plays and a Ctrl-C
aborts it on the server. Imports beyond typer happen inside the command: ``--help`` stays fast.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from grpo_service.client.task_app import TaskAppClient
    from grpo_service.models import RolloutResponse, RunStatusResponse

POLL_INTERVAL_S = 0.2


def rollout_request(
    *,
    run_id: str,
    env_name: str,
    seed: int,
    policy: str,
    policy_config: dict[str, Any],
    max_llm_calls: int,
    logprobs: bool | None,
    max_time_s: float,
) -> dict[str, Any]:
    record: dict[str, Any] = {"return_trace": True, "trajectories": True}
    if logprobs is not None:  # default: the service's (on in mode "rl")
        record["logprobs"] = logprobs
    return {
        "run_id": run_id,
        "env": {"env_name": env_name, "seed": seed},
        "policy": {"policy_name": policy, "config": policy_config},
        "max_turns": max_llm_calls,
        "on_done": "terminate",
        "record": record,
        "safety": {"max_time_s": max_time_s},
    }


def outcome_text(response: RolloutResponse) -> str:
    """``completed (episode_done)``, or ``failed: <cause>: <detail>``."""
    from grpo_service.client.task_app import rollout_failure

    cause, detail = rollout_failure(response)
    if cause is None:
        return f"completed ({response.stop_reason})"
    return f"failed: {cause}" + (f": {detail}" if detail else "")


def summary_table(response: RolloutResponse, path: Path) -> Table:
    from rich.table import Table

    m = response.metrics
    table = Table(title=f"rollout {response.run_id}", show_header=False)
    rows = [
        ("status", outcome_text(response)),
        ("decisions / env steps", f"{m.num_decisions} / {m.num_steps}"),
        ("return", f"{m.mean_return}"),
        ("achievements", ", ".join(m.achievements) or "none"),
        (
            "LLM calls",
            f"{m.llm_calls} ({m.prompt_tokens} prompt + {m.completion_tokens} "
            f"completion tokens, {m.llm_time_s}s)",
        ),
        ("wall time", f"{m.wall_time_s}s"),
        ("trace", str(path)),
    ]
    for key, value in rows:
        table.add_row(key, value)
    return table


def rollout_command(
    base_url: Annotated[
        str, typer.Option(envvar="TASK_APP_URL", help="The task app.")
    ] = "http://localhost:8000",
    api_key: Annotated[
        str | None, typer.Option(envvar="ENVIRONMENT_API_KEY", help="The task app's key.", show_default=False)
    ] = None,
    inference_url: Annotated[
        str | None, typer.Option(help="OpenAI-compatible base URL (default: the service's).")
    ] = None,
    inference_api_key: Annotated[
        str | None,
        typer.Option(envvar="INFERENCE_API_KEY", help="Key for the inference server.", show_default=False),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model id (default: the service's).")] = None,
    max_llm_calls: Annotated[int, typer.Option(min=1, help="Decisions (LLM calls) to play.")] = 10,
    run_id: Annotated[
        str | None, typer.Option(help="Run id (default: generated); names the JSON file.")
    ] = None,
    seed: Annotated[int, typer.Option(min=0, help="World seed.")] = 0,
    policy: Annotated[str, typer.Option(help="Policy plug-in.")] = "crafter-react",
    env_name: Annotated[str, typer.Option("--env", help="Environment plug-in.")] = "crafter",
    logprobs: Annotated[
        bool | None,
        typer.Option(
            "--logprobs/--no-logprobs", help="Record token ids and logprobs (default: on, as in RL mode)."
        ),
    ] = None,
    timeout_s: Annotated[
        float, typer.Option("--timeout", min=1, help="Seconds the rollout may take.")
    ] = 600.0,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing <run_id>_trace.json (the DB keeps both).")
    ] = False,
) -> None:
    """Run one traced rollout and write <run_id>_trace.json in the current directory.

    Exits 0 only when the rollout completed; 1 when it ran but failed (the cause is printed), 2
    when it could not be run."""
    from rich.console import Console

    from grpo_service.client.task_app import (
        ServiceCallError,
        TaskAppClient,
        build_policy_config,
        policy_uses_inference,
        rollout_failure,
    )
    from grpo_service.models import RolloutResponse
    from grpo_service.tracing.codec import redact

    console = Console()
    run_id = run_id or f"rollout-{uuid.uuid4().hex[:8]}"
    path = Path.cwd() / f"{run_id}_trace.json"
    if path.exists() and not force:
        raise _fail(
            console,
            f"{path.name} already exists (run {run_id!r} was collected before); pass --force to "
            "replace it or choose another --run-id",
        )
    with TaskAppClient(base_url, api_key, timeout_s=30.0) as client:
        try:
            info = client.info()
        except ServiceCallError as exc:
            if exc.status in (401, 403):
                raise _fail(
                    console, f"{base_url}: {exc.detail} (pass --api-key or set ENVIRONMENT_API_KEY)"
                ) from None
            if exc.status is None:
                raise _fail(console, f"cannot reach the task app at {base_url}: {exc.detail}") from None
            info = None
        config = build_policy_config(
            policy_uses_inference(info, policy),
            model=model,
            inference_url=inference_url,
            inference_api_key=inference_api_key,
        )
        body = rollout_request(
            run_id=run_id,
            env_name=env_name,
            seed=seed,
            policy=policy,
            policy_config=config,
            max_llm_calls=max_llm_calls,
            logprobs=logprobs,
            max_time_s=timeout_s,
        )
        try:
            # Retried only when the service refused it outright (busy, unreachable).
            client.start_rollout(body)
            status = _poll(client, console, run_id, max_llm_calls, deadline_s=timeout_s + 30)
        except ServiceCallError as exc:
            raise _fail(console, f"rollout failed: {exc}") from None
    response = status.result
    if not isinstance(response, RolloutResponse):
        raise _fail(console, f"rollout {run_id} {status.status}: {status.error or 'no result'}")
    if force and path.exists():
        note = f"replacing {path.name}; the trace DB now holds two runs named {run_id}"
        console.print(f"[yellow]note:[/] {note}")
    snapshot = {"request": redact(body), **response.model_dump(mode="json")}
    path.write_text(json.dumps(snapshot, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    console.print(summary_table(response, path))
    if rollout_failure(response)[0] is not None:
        raise typer.Exit(1)


def _poll(
    client: TaskAppClient, console: Console, run_id: str, turns: int, *, deadline_s: float
) -> RunStatusResponse:
    """Poll ``/run/status`` until the run has finished, showing turn k/N; Ctrl-C aborts the run."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from grpo_service.client.task_app import ServiceCallError

    deadline = time.monotonic() + deadline_s
    with Progress(
        TextColumn(f"[bold]rollout[/] {run_id} turn"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("", total=turns)
        try:
            while True:
                status = client.run_status(run_id)
                progress.update(task, completed=min(turns, status.ops_executed // 2))
                if status.status != "running":
                    return status
                if time.monotonic() > deadline:
                    client.abort(run_id=run_id)
                    raise ServiceCallError("timeout", f"run {run_id} still running after {deadline_s:.0f}s")
                time.sleep(POLL_INTERVAL_S)
        except KeyboardInterrupt:
            console.print(f"interrupted: aborting {run_id} (its partial trajectory is kept)")
            client.abort(run_id=run_id)
            while (status := client.run_status(run_id)).status == "running":
                time.sleep(POLL_INTERVAL_S)
            return status


def _fail(console: Console, message: str) -> typer.Exit:
    console.print(f"[red]error:[/] {message}")
    return typer.Exit(2)
