"""``grpo-service rollout``: one traced rollout through the service, saved as ``<run_id>_trace.json``."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from grpo_service.client import ServiceCallError, TaskAppClient, build_policy_config, policy_uses_inference
from grpo_service.tracing.codec import redact

console = Console()


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


def summary_table(response: dict[str, Any], path: Path) -> Table:
    m = response.get("metrics") or {}
    table = Table(title=f"rollout {response.get('run_id')}", show_header=False)
    rows = [
        ("status", f"{response.get('status')} ({response.get('stop_reason')})"),
        ("decisions / env steps", f"{m.get('num_decisions')} / {m.get('num_steps')}"),
        ("return", f"{m.get('mean_return')}"),
        ("achievements", ", ".join(m.get("achievements") or []) or "none"),
        (
            "LLM calls",
            f"{m.get('llm_calls')} ({m.get('prompt_tokens')} prompt + {m.get('completion_tokens')} "
            f"completion tokens, {m.get('llm_time_s')}s)",
        ),
        ("wall time", f"{m.get('wall_time_s')}s"),
        ("trace", str(path)),
    ]
    if response.get("error"):
        rows.insert(1, ("error", str(response["error"])))
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
) -> None:
    """Run one traced rollout and write <run_id>_trace.json in the current directory."""
    run_id = run_id or f"rollout-{uuid.uuid4().hex[:8]}"
    with TaskAppClient(base_url, api_key, timeout_s=30.0) as client:
        try:
            info = client.info()
        except ServiceCallError as exc:
            if exc.status in (401, 403):
                raise _fail(f"{base_url}: {exc.detail} (pass --api-key or set ENVIRONMENT_API_KEY)") from None
            if exc.status is None:
                raise _fail(f"cannot reach the task app at {base_url}: {exc.detail}") from None
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
        with console.status(f"running rollout {run_id} ({max_llm_calls} decisions max)…"):
            try:
                # Retried only when the service refused it outright (busy, unreachable).
                response = client.rollout(body).model_dump(mode="json")
            except ServiceCallError as exc:
                raise _fail(f"rollout failed: {exc}") from None
    path = Path.cwd() / f"{run_id}_trace.json"
    snapshot = {"request": redact(body), **response}
    path.write_text(json.dumps(snapshot, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    console.print(summary_table(response, path))
    if response.get("status") != "completed":
        raise typer.Exit(1)


def _fail(message: str) -> typer.Exit:
    console.print(f"[red]error:[/] {message}")
    return typer.Exit(2)
