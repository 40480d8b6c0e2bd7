"""Evaluating a policy/model on any registered environment through the task app's ``/rollout``.

N episodes (one per seed) run with bounded concurrency. The aggregate keeps the reference's
keys (``completed``, ``total``, ``avg_turns``, ``avg_achievements``, ``achievements_freq``), adds
the mean return and failures by cause, and the environment's own metrics
(`Environment.eval_metrics`: Crafter's per-achievement success rates and Crafter score; a task's
success rate and mean score).

Which episodes count where:
- ``total``: episodes attempted. ``completed``: the service returned the rollout and it ended
  normally (``completed``: all turns played, or ``episode_done``: the agent died / ran out of time).
- Averages, success rates and the score are over every episode the service returned
  (``scored``), including those a policy error cut short: a model that stops calling its tool
  has earned its low score. An episode with no response (HTTP error, timeout) has no data; it is
  left out of the averages and counted in ``failures`` under its cause.
- ``failures``: every episode that did not complete, by stop reason (``policy_error:*``,
  ``time_limit``, ``error``, ...) or HTTP cause (``http_500``, ``timeout``, ``connect_error``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from envs.base import Environment, EpisodeOutcome
from grpo_service.client.task_app import (
    AsyncTaskAppClient,
    ServiceCallError,
    build_policy_config,
    policy_uses_inference,
    rollout_failure,
)
from grpo_service.models import RolloutResponse, ServiceInfo


def environment_metrics(env_name: str) -> type[Environment]:
    """The class whose ``eval_metrics``/``achievements`` apply (the base's for an env this
    process does not have: the service may host more than the client installs)."""
    import envs  # registers the built-in environments

    return envs.ENVIRONMENTS.get(env_name, Environment)


def parse_seeds(spec: str | list[int] | None) -> list[int] | None:
    """``"0-19"``, ``"1,5,9"``, ``"0-4,10"`` or a list of ints → seeds in order."""
    if spec is None:
        return None
    if isinstance(spec, list):
        return [int(s) for s in spec]
    seeds: list[int] = []
    for part in spec.replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                start, end = int(lo), int(hi)
                if end < start:
                    raise ValueError
                seeds.extend(range(start, end + 1))
            else:
                seeds.append(int(part))
        except ValueError:
            raise ValueError(f"invalid seed spec {part!r}: use N, A-B or a comma-separated list") from None
    if not seeds:
        raise ValueError("no seeds given")
    return seeds


class EvalConfig(BaseModel):
    """The keys of ``--config FILE.toml`` (and of the CLI flags of the same names)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = "http://localhost:8000"
    api_key: str | None = None
    inference_url: str | None = None
    inference_api_key: str | None = None
    model: str | None = None
    policy: str | None = Field(default=None, description="Default: the environment's LLM policy.")
    env_name: str = "crafter"
    episodes: int | None = Field(default=None, ge=1)
    max_turns: int = Field(default=10, ge=1)
    concurrency: int = Field(default=4, ge=1, le=256)
    seeds: list[int] | None = None
    timeout_s: float = Field(default=600.0, gt=0, description="Per episode.")
    policy_config: dict[str, Any] = Field(default_factory=dict, description="Extra policy config.")
    env_config: dict[str, Any] = Field(default_factory=dict)
    logprobs: bool = Field(
        default=False,
        description="Record token ids and logprobs (the rollouts' `record.logprobs`): a policy whose "
        "config names a `tokenizer` then plays each episode as one token stream, as a GRPO trainer "
        "samples it; otherwise one chat completion per decision.",
    )

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds(cls, value: Any) -> list[int] | None:
        return parse_seeds(value)

    def episode_seeds(self) -> list[int]:
        if self.seeds is None:
            return list(range(self.episodes or 10))
        if self.episodes is None:
            return list(self.seeds)
        if self.episodes > len(self.seeds):
            raise ValueError(f"episodes={self.episodes} but only {len(self.seeds)} seeds given")
        return list(self.seeds[: self.episodes])


class EpisodeResult(BaseModel):
    index: int
    seed: int
    run_id: str
    returned: bool = Field(description="The service returned the rollout (it is scored).")
    status: str | None = None
    stop_reason: str | None = None
    failure: str | None = Field(default=None, description="Cause, when the episode did not complete.")
    error: str | None = None
    turns: int = 0
    invalid_turns: int = Field(default=0, description="Replies the env could not use (answered).")
    steps: int = 0
    achievements: list[str] = Field(default_factory=list)
    total_return: float = 0.0
    wall_s: float = 0.0


def aggregate(results: list[EpisodeResult], env: type[Environment]) -> dict[str, Any]:
    scored = [r for r in results if r.returned]
    n = len(scored)
    freq = Counter(a for r in scored for a in set(r.achievements))
    declared = [a for a in env.achievements if freq[a]]
    outcomes = [EpisodeOutcome(r.total_return, tuple(r.achievements), r.turns, r.steps) for r in scored]
    return {  # the task-app contract's keys first, in its order
        "completed": sum(1 for r in results if r.failure is None),
        "total": len(results),
        "avg_turns": (sum(r.turns for r in scored) / n) if n else 0.0,
        "avg_achievements": (sum(len(set(r.achievements)) for r in scored) / n) if n else 0.0,
        "achievements_freq": {a: freq[a] for a in [*declared, *sorted(set(freq) - set(declared))]},
        "scored": n,
        "mean_return": (sum(r.total_return for r in scored) / n) if n else 0.0,
        "failures": dict(Counter(r.failure for r in results if r.failure is not None)),
        "invalid_turns": sum(r.invalid_turns for r in scored),
        # The first episode's words for each cause, e.g. "Cannot connect to host ...".
        "failure_details": {
            cause: next(r.error for r in results if r.failure == cause and r.error)
            for cause in {r.failure for r in results if r.failure is not None and r.error}
        },
        **env.eval_metrics(outcomes),
    }


def default_policy(info: ServiceInfo | None, env_name: str) -> str:
    """The service's first LLM policy for ``env_name`` (else its first policy for it)."""
    mine = [p for p in (info.policies if info else []) if p.env_name == env_name]
    for plugin in sorted(mine, key=lambda p: not p.uses_inference):
        return plugin.name
    if info is None:
        return "crafter-react" if env_name == "crafter" else f"{env_name}-react"
    raise ValueError(f"the service has no policy for environment {env_name!r}; name one with --policy")


def _episode_request(
    config: EvalConfig, policy: str, policy_config: dict[str, Any], run_id: str, seed: int
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "env": {"env_name": config.env_name, "seed": seed, "config": config.env_config},
        "policy": {"policy_name": policy, "config": policy_config},
        "max_turns": config.max_turns,
        "on_done": "terminate",
        "mode": "eval",
        # Trajectories without observations: small, and the last step names a policy error's cause.
        "record": {"trajectories": True, "observations": False, "logprobs": config.logprobs},
        "safety": {"max_time_s": config.timeout_s},
    }


def _result(
    index: int, seed: int, run_id: str, started: float, outcome: RolloutResponse | ServiceCallError
) -> EpisodeResult:
    common: dict[str, Any] = {"index": index, "seed": seed, "run_id": run_id}
    common["wall_s"] = round(time.monotonic() - started, 3)
    if isinstance(outcome, ServiceCallError):  # no response: nothing to score
        return EpisodeResult(**common, returned=False, failure=outcome.cause, error=outcome.detail)
    metrics = outcome.metrics
    failure, detail = rollout_failure(outcome)
    return EpisodeResult(
        **common,
        returned=True,
        status=outcome.status,
        stop_reason=outcome.stop_reason,
        failure=failure,
        error=detail,
        turns=metrics.num_decisions,
        invalid_turns=metrics.invalid_decisions,
        steps=metrics.num_steps,
        achievements=list(metrics.achievements),
        total_return=float(sum(metrics.episode_returns)),
    )


async def run_eval(
    config: EvalConfig, on_result: Callable[[EpisodeResult], None] | None = None
) -> list[EpisodeResult]:
    """Play every episode; an episode that fails is recorded as such, never raised."""
    seeds = config.episode_seeds()
    tag = uuid.uuid4().hex[:6]
    async with AsyncTaskAppClient(
        config.base_url, config.api_key, timeout_s=30.0, max_connections=config.concurrency
    ) as client:
        try:
            info: ServiceInfo | None = await client.info()
        except ServiceCallError as exc:
            if exc.status is None or exc.status in (401, 403):
                raise
            info = None
        policy = config.policy or default_policy(info, config.env_name)
        policy_config = build_policy_config(
            policy_uses_inference(info, policy),
            model=config.model,
            inference_url=config.inference_url,
            inference_api_key=config.inference_api_key,
            extra=config.policy_config,
        )
        gate = asyncio.Semaphore(config.concurrency)

        async def episode(index: int, seed: int) -> EpisodeResult:
            run_id = f"eval-{tag}-{index:04d}-s{seed}"
            async with gate:
                started = time.monotonic()
                outcome: RolloutResponse | ServiceCallError
                try:
                    outcome = await client.rollout(
                        _episode_request(config, policy, policy_config, run_id, seed)
                    )
                except ServiceCallError as exc:
                    outcome = exc
                result = _result(index, seed, run_id, started, outcome)
            if on_result is not None:
                on_result(result)
            return result

        results = await asyncio.gather(*(episode(i, s) for i, s in enumerate(seeds)))
    return sorted(results, key=lambda r: r.index)
