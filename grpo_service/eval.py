"""Evaluating a policy/model on Crafter through the task app's ``/rollout``.

N episodes (one per seed) run with bounded concurrency. The aggregate keeps the reference's
keys (``completed``, ``total``, ``avg_turns``, ``avg_achievements``, ``achievements_freq``) and
adds the Crafter score (Hafner 2021: ``exp(mean_i ln(1 + s_i)) - 1`` over the 22 per-achievement
success rates ``s_i`` in percent), the success rates, the mean return and failures by cause.

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
import math
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator

from grpo_service.cli.http import (
    ServiceCallError,
    acall,
    build_policy_config,
    headers,
    policy_uses_inference,
    rollout_failure,
    timeout,
)


def crafter_achievements() -> tuple[str, ...]:
    from envs.crafter.actions import ACHIEVEMENTS

    return ACHIEVEMENTS


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
    policy: str = "crafter-react"
    env_name: str = "crafter"
    episodes: int | None = Field(default=None, ge=1)
    max_turns: int = Field(default=10, ge=1)
    concurrency: int = Field(default=4, ge=1, le=256)
    seeds: list[int] | None = None
    timeout_s: float = Field(default=600.0, gt=0, description="Per episode.")
    policy_config: dict[str, Any] = Field(default_factory=dict, description="Extra policy config.")
    env_config: dict[str, Any] = Field(default_factory=dict)

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
    steps: int = 0
    achievements: list[str] = Field(default_factory=list)
    total_return: float = 0.0
    score: float | None = Field(
        default=None, description="The env's own score (text games), if it keeps one."
    )
    success: bool | None = Field(default=None, description="The task was solved (text games).")
    wall_s: float = 0.0


def crafter_score(success_rates_percent: list[float]) -> float:
    """The Crafter paper's score: the geometric mean of (1 + success rate %) minus 1."""
    if not success_rates_percent:
        return 0.0
    return math.exp(sum(math.log1p(s) for s in success_rates_percent) / len(success_rates_percent)) - 1


def aggregate(results: list[EpisodeResult], achievements: tuple[str, ...]) -> dict[str, Any]:
    scored = [r for r in results if r.returned]
    n = len(scored)
    freq = Counter(a for r in scored for a in set(r.achievements))
    rates = {a: (100.0 * freq[a] / n if n else 0.0) for a in achievements}
    extra = sorted(set(freq) - set(achievements))  # not Crafter's: reported, not scored
    return {
        "completed": sum(1 for r in results if r.failure is None),
        "total": len(results),
        "scored": n,
        "avg_turns": (sum(r.turns for r in scored) / n) if n else 0.0,
        "avg_achievements": (sum(len(set(r.achievements)) for r in scored) / n) if n else 0.0,
        "achievements_freq": {a: freq[a] for a in [*achievements, *extra] if freq[a]},
        "success_rates": rates,
        "crafter_score": crafter_score(list(rates.values())),
        "mean_return": (sum(r.total_return for r in scored) / n) if n else 0.0,
        "failures": dict(Counter(r.failure for r in results if r.failure is not None)),
        # The first episode's words for each cause, e.g. "Cannot connect to host ...".
        "failure_details": {
            cause: next(r.error for r in results if r.failure == cause and r.error)
            for cause in {r.failure for r in results if r.failure is not None and r.error}
        },
        **_task_metrics(scored),
    }


def _task_metrics(scored: list[EpisodeResult]) -> dict[str, Any]:
    """A text game's metrics: the mean of its own score and the success rate (empty for Crafter)."""
    with_score = [r for r in scored if r.score is not None]
    if not with_score:
        return {}
    return {
        "mean_score": sum(r.score or 0.0 for r in with_score) / len(with_score),
        "success_rate": sum(1 for r in with_score if r.success) / len(with_score),
    }


def _episode_request(config: EvalConfig, policy_config: dict[str, Any], run_id: str, seed: int) -> dict:
    return {
        "run_id": run_id,
        "env": {"env_name": config.env_name, "seed": seed, "config": config.env_config},
        "policy": {"policy_name": config.policy, "config": policy_config},
        "max_turns": config.max_turns,
        "on_done": "terminate",
        "mode": "eval",
        # Trajectories without observations: small, and the last step names a policy error's cause.
        "record": {"trajectories": True, "observations": False},
        "safety": {"max_time_s": config.timeout_s},
    }


def _result(index: int, seed: int, run_id: str, response: dict[str, Any], wall_s: float) -> EpisodeResult:
    metrics = response.get("metrics") or {}
    stop_reason = response.get("stop_reason")
    trajectories = response.get("trajectories") or [{}]
    steps = trajectories[-1].get("steps") or [{}]
    last_info = steps[-1].get("info") or {}
    failure, detail = rollout_failure(response)
    return EpisodeResult(
        index=index,
        seed=seed,
        run_id=run_id,
        returned=True,
        status=response.get("status"),
        stop_reason=stop_reason,
        failure=failure,
        error=detail,
        turns=int(metrics.get("num_decisions") or 0),
        steps=int(metrics.get("num_steps") or 0),
        achievements=list(metrics.get("achievements") or []),
        total_return=float(sum(metrics.get("episode_returns") or [0.0])),
        score=float(last_info["score"]) if isinstance(last_info.get("score"), (int, float)) else None,
        success=bool(last_info["success"]) if "success" in last_info else None,
        wall_s=round(wall_s, 3),
    )


async def run_eval(
    config: EvalConfig, on_result: Callable[[EpisodeResult], None] | None = None
) -> list[EpisodeResult]:
    """Play every episode; an episode that fails is recorded as such, never raised."""
    seeds = config.episode_seeds()
    tag = uuid.uuid4().hex[:6]
    limits = httpx.Limits(max_connections=config.concurrency, max_keepalive_connections=config.concurrency)
    async with httpx.AsyncClient(
        base_url=config.base_url, headers=headers(config.api_key), timeout=timeout(30.0), limits=limits
    ) as client:
        try:
            info = await acall(client, "GET", "/info")
        except ServiceCallError as exc:
            if exc.status is None or exc.status in (401, 403):
                raise
            info = None
        policy_config = build_policy_config(
            policy_uses_inference(info, config.policy),
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
                try:
                    response = await acall(
                        client,
                        "POST",
                        "/rollout",
                        json=_episode_request(config, policy_config, run_id, seed),
                        read_timeout_s=config.timeout_s + 30,
                    )
                    result = _result(index, seed, run_id, response, time.monotonic() - started)
                except ServiceCallError as exc:
                    result = EpisodeResult(
                        index=index,
                        seed=seed,
                        run_id=run_id,
                        returned=False,
                        failure=exc.cause,
                        error=exc.detail,
                        wall_s=round(time.monotonic() - started, 3),
                    )
            if on_result is not None:
                on_result(result)
            return result

        results = await asyncio.gather(*(episode(i, s) for i, s in enumerate(seeds)))
    return sorted(results, key=lambda r: r.index)
