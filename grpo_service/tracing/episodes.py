"""Episodes that a client plays step by step (OpenEnv's WebSocket, TRL through it): each one is
handed to the trace sink as a `RolloutTrace`, so it lands in the trace DB and the viewer like a
rollout the service played itself. The client is the policy: its decisions carry the tool calls
that executed its steps (plain actions as the env's own tool) and no LLM call."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from envs.base import PolicyDecision, StepResult
from grpo_service.core.registry import new_instance_id
from grpo_service.models import (
    MAX_TURNS,
    RolloutMetrics,
    RolloutRequest,
    RolloutResponse,
)
from grpo_service.tracing.traces import DecisionTrace, RolloutTrace


@dataclass
class EpisodeRecorder:
    """The steps of one episode since its reset. ``client`` names the policy in the trace
    (``openenv``); ``client_config`` is recorded as its config (e.g. OpenEnv's ``episode_id``)."""

    env_name: str
    client: str
    rl_run_id: str
    seed: int | None
    env_config: dict[str, Any] | None
    client_config: dict[str, Any] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    decisions: list[DecisionTrace] = field(default_factory=list)

    def record(
        self, observation: dict[str, Any], tool_calls: list[dict[str, Any]], result: StepResult, env_ms: float
    ) -> None:
        """One step: the ``observation`` it was taken from, the ``tool_calls`` that executed it
        (the viewer replays a trace from its tool calls) and the env's ``result``."""
        self.decisions.append(
            DecisionTrace(
                turn=len(self.decisions),
                observation=observation,
                decision=PolicyDecision(tool_calls=tool_calls),
                result=result,
                env_ms=env_ms,
            )
        )

    def record_invalid(
        self, observation: dict[str, Any], tool_calls: list[dict[str, Any]], message: str
    ) -> None:
        """A step the env refused (nothing executed): an invalid turn, ``message`` its feedback."""
        decision = PolicyDecision(tool_calls=tool_calls, error="invalid_action", error_detail=message)
        self.decisions.append(
            DecisionTrace(
                turn=len(self.decisions), observation=observation, decision=decision, feedback=message
            )
        )

    def trace(self, env_id: str, stop_reason: str) -> RolloutTrace | None:
        """The episode as a finished rollout (None if no step was taken)."""
        if not self.decisions:
            return None
        results = [d.result for d in self.decisions if d.result is not None]
        total = round(sum(r.reward for r in results), 6)
        achievements = sorted(
            {a for r in results for a in (r.info.get("achievements_unlocked") or []) if isinstance(a, str)}
        )
        env_s = sum(d.env_ms for d in self.decisions) / 1000
        finished = time.time()
        metrics = RolloutMetrics(
            episode_returns=[total],
            mean_return=total,
            num_steps=sum(int(r.info.get("actions_executed", 1)) for r in results),
            num_decisions=len(self.decisions),
            num_episodes=1,
            achievements=achievements,
            achievements_count=len(achievements),
            llm_calls=0,
            llm_time_s=0.0,
            env_time_s=round(env_s, 6),
            wall_time_s=round(finished - self.started_at, 6),
        )
        request = RolloutRequest(
            env={"env_id": env_id},
            policy={"policy_name": self.client, "config": self.client_config},
            max_turns=min(len(self.decisions), MAX_TURNS),
            rl_run_id=self.rl_run_id,
        )
        response = RolloutResponse(
            run_id=new_instance_id(),
            status="completed",
            trajectories=[],
            metrics=metrics,
            aborted=False,
            ops_executed=2 * len(self.decisions),
            stop_reason=stop_reason,
            env_id=env_id,
        )
        return RolloutTrace(
            request=request,
            response=response,
            env_name=self.env_name,
            policy_name=self.client,
            policy_config=self.client_config,
            seed=self.seed,
            started_at=self.started_at,
            finished_at=finished,
            decisions=self.decisions,
            env_config=self.env_config,
        )
