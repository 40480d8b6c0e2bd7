"""Wires the LLM trainers of `training.llm` to the task app: `TaskAppGroups` is the typed
client in the shape the GRPO loop asks for (`training.llm.rl.TaskApp`). The ``rl`` job
(``grpo-service train --type rl`` and ``POST /train``) runs through `train_rl_job`."""

from __future__ import annotations

import os
from typing import Any

from grpo_service.client import AsyncTaskAppClient, TaskAppClient
from grpo_service.models import RolloutGroupRequest
from training.jobs import JobType, register_job_type
from training.llm.config import RLConfig, SFTConfig, confine_paths


class TaskAppGroups:
    """The task app in the shape the GRPO loop asks for (`training.llm.rl.TaskApp`): ``POST
    /rollout/group`` and ``GET /info`` through the typed client, with the API key, a deadline and
    retries on 429/503. One client per call: the trainer runs one event loop per step."""

    def __init__(self, base_url: str, api_key: str | None = None, read_timeout_s: float = 900.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.read_timeout_s = read_timeout_s

    async def rollout_group(self, body: dict[str, Any]) -> dict[str, Any]:
        async with AsyncTaskAppClient(
            self.base_url, self.api_key, timeout_s=self.read_timeout_s, attempts=4
        ) as client:
            return (await client.rollout_group(body)).model_dump(mode="json")

    def info(self) -> dict[str, Any]:
        with TaskAppClient(self.base_url, self.api_key, timeout_s=30) as client:
            return client.info().model_dump(mode="json")

    def open_stream(self, body: dict[str, Any]) -> TaskAppStream:
        """The task app's stream of groups for the async loop (`training.llm.rl_async.GroupStream`)."""
        client = TaskAppClient(self.base_url, self.api_key, timeout_s=60, attempts=4)
        try:
            info = client.open_stream(body)
        except BaseException:
            client.close()
            raise
        return TaskAppStream(client, info.stream_id)


class TaskAppStream:
    """One open ``/rollout/stream`` through the sync typed client (`training.llm.rl_async.GroupStream`)."""

    def __init__(self, client: TaskAppClient, stream_id: str) -> None:
        self.client, self.stream_id = client, stream_id

    def take(self, count: int, wait_s: float) -> dict[str, Any]:
        batch = self.client.take_groups(self.stream_id, max_groups=count, wait_s=wait_s)
        return batch.model_dump(mode="json")

    def set_version(self, version: int) -> dict[str, Any]:
        return self.client.set_stream_version(self.stream_id, version).model_dump(mode="json")

    def close(self) -> dict[str, Any]:
        try:
            return self.client.close_stream(self.stream_id).model_dump(mode="json")
        finally:
            self.client.close()


def _job_config(config: Any, ctx: Any) -> Any:
    """Under the job API (a context is given) a run is written to the job's models directory,
    never to a path the request names."""
    return config.model_copy(update={"out": None}) if ctx is not None else config


def _job_summary(summary: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Under the job API, the runner's summary shape: why the run ended, where the weights are,
    its numbers as metrics; a run that ended on an error fails the job with that error."""
    if ctx is None:
        return summary
    if summary.get("error"):
        raise RuntimeError(summary["error"])
    numbers = {k: v for k, v in summary.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    return {"reason": ctx.stop_reason() or "completed", "model_path": summary["final"], "metrics": numbers}


def train_sft_job(config: SFTConfig, ctx: Any = None) -> dict[str, Any]:
    """The ``sft`` job (``POST /train`` and ``grpo-service train --type sft``)."""
    from training.llm.sft import train_sft

    return _job_summary(train_sft(_job_config(config, ctx), ctx), ctx)


def train_rl_job(config: RLConfig, ctx: Any = None) -> dict[str, Any]:
    """The ``rl`` job: GRPO against the task app named in the config (key: config, else env)."""
    from training.llm.rl import group_request, train_rl

    config = _job_config(config, ctx)
    # Under the job API the task app's URL is the caller's: it never receives the server's key.
    key = config.task_app_api_key or (os.environ.get("ENVIRONMENT_API_KEY") if ctx is None else None)
    task_app = TaskAppGroups(config.task_app_url, key, read_timeout_s=config.rollout_timeout_s + 60)
    check_groups_fit(task_app, group_request(config, 0, "model", 0, 0, 0))
    return _job_summary(train_rl(config, ctx, task_app=task_app), ctx)


def check_groups_fit(task_app: TaskAppGroups, body: dict[str, Any]) -> None:
    """Fail at once, naming the numbers, when the task app would refuse every group the run sends
    (more turns than its ``max_request_turns``), not after loading the model and failed steps."""
    try:
        budget = task_app.info()["limits"].get("max_request_turns")
        turns = RolloutGroupRequest.model_validate(body).turns_at_most()
    except Exception:  # no limit to read, or a body the task app will answer with its own 422
        return
    if budget is not None and turns > budget:
        raise ValueError(
            f"each group may play up to {turns:,} turns (group_size {body['group_size']} × max_turns "
            f"{body['max_turns']}{', with its fork plan' if 'fork' in body else ''}); the task app "
            f"refuses more than {budget:,} (its MAX_REQUEST_TURNS): lower group_size or max_turns"
        )


# The LLM jobs of `POST /train` (``type: "sft"`` / ``"rl"``) beside the ``gymnasium`` job.
register_job_type(
    JobType(
        "sft",
        SFTConfig,
        "grpo_service.training_api.llm_jobs:train_sft_job",
        "Supervised fine-tuning of a causal LM on chat JSONL, loss on assistant tokens.",
        confine=confine_paths,
    )
)
register_job_type(
    JobType(
        "rl",
        RLConfig,
        "grpo_service.training_api.llm_jobs:train_rl_job",
        "GRPO of a causal LM on rollout groups from a task app, served by serve-model or vLLM.",
        confine=confine_paths,
    )
)
