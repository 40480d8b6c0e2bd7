"""What a finished rollout hands to tracing: every decision with its observation, the policy's
decision (LLM call included) and the env's result, plus the request and the response."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from envs.base import PolicyDecision, StepResult
from grpo_service.models import RolloutRequest, RolloutResponse

IMAGE_KEYS = ("image_png_base64", "image")  # observation fields never stored in traces


def strip_images(observation: dict[str, Any]) -> dict[str, Any]:
    """``observation`` without its images (itself when it has none)."""
    if not any(k in observation for k in IMAGE_KEYS):
        return observation
    return {k: v for k, v in observation.items() if k not in IMAGE_KEYS}


@dataclass
class DecisionTrace:
    """One agent decision with everything the trace DB and SFT export need."""

    turn: int
    observation: dict[str, Any]
    decision: PolicyDecision
    result: StepResult | None = None
    env_ms: float = 0.0
    feedback: str | None = None  # an answered invalid decision: what its model is told next


@dataclass
class RolloutTrace:
    request: RolloutRequest
    response: RolloutResponse
    env_name: str
    policy_name: str
    policy_config: dict[str, Any]
    seed: int | None
    started_at: float
    finished_at: float
    decisions: list[DecisionTrace] = field(default_factory=list)
    # The config the env was built with (a group member's request only names an adopted env).
    env_config: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A compact JSON form: per turn, the messages sent and the reply (for ``return_trace``)."""
        turns = []
        for d in self.decisions:
            call = d.decision.llm_call
            turns.append(
                {
                    "turn": d.turn,
                    "messages": (call.request.get("messages") if call else None),
                    "response": call.response if call else None,
                    "tool_calls": d.decision.tool_calls,
                    "error": d.decision.error,
                    "reward": d.result.reward if d.result else None,
                    "done": d.result.done if d.result else None,
                    "achievements_unlocked": (
                        d.result.info.get("achievements_unlocked") if d.result else None
                    ),
                }
            )
        return {
            "run_id": self.response.run_id,
            "group_id": self.response.group_id,
            "group_index": self.response.group_index,
            "env_name": self.env_name,
            "policy_name": self.policy_name,
            "seed": self.seed,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "stop_reason": self.response.stop_reason,
            "turns": turns,
        }


class TraceSink(Protocol):
    """Receives every finished rollout. ``submit`` must not block (enqueue and return)."""

    def submit(self, trace: RolloutTrace) -> None: ...
