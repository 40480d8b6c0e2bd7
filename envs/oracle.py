"""``oracle``: the baseline policy of the text games, which plays each game's own scripted solver.

A game created with ``config.oracle: true`` puts its solver's next action in every observation
(``oracle_action``: TextCraft's recipe planner, minigrid's BabyAI bot, SciWorld's gold path);
this policy plays it through the ordinary tool call. It shows a game is solvable through the
API and gives the baselines' success rates (bench, docs/environments.md); it needs no LLM.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from envs.base import (
    InvalidState,
    PluginConfig,
    Policy,
    PolicyContext,
    PolicyDecision,
    register_policy,
)
from envs.text_game import TOOL_NAME


@register_policy
class OraclePolicy(Policy[PluginConfig]):
    name = "oracle"
    version = "1"
    config_model = PluginConfig
    description = (
        "Plays a text game's scripted solver (the env's `oracle_action`; create the env with "
        "config oracle: true). No LLM."
    )

    def __init__(self, config: PluginConfig, context: PolicyContext) -> None:
        self.config = config
        self.turn_index = 0

    async def step(
        self,
        observation: dict[str, Any],
        *,
        dry_run: bool = False,
        record_logprobs: bool = False,
        timeout_s: float | None = None,
    ) -> PolicyDecision:
        action = observation.get("oracle_action")
        if action is None:
            return PolicyDecision(
                tool_calls=[],
                error="no_oracle_action",
                error_detail="the observation has no oracle_action: create the env with config "
                "{'oracle': true} (the solver may also have given up on this task)",
            )
        call = {"id": f"oracle_{self.turn_index}", "tool": TOOL_NAME, "args": {"action": action}}
        if not dry_run:
            self.turn_index += 1
        return PolicyDecision(tool_calls=[call], meta={"oracle_action": action})

    def reset(self) -> None:
        self.turn_index = 0

    def get_state(self) -> dict[str, Any]:
        return {"policy": self.name, "config": self.config.model_dump(), "turn_index": self.turn_index}

    @classmethod
    def from_state(cls, state: dict[str, Any], context: PolicyContext) -> Policy:
        turn = state.get("turn_index") if isinstance(state, dict) else None
        if (
            not isinstance(state, dict)
            or state.get("policy") != cls.name
            or type(turn) is not int
            or turn < 0
        ):
            raise InvalidState(f"invalid {cls.name} policy state")
        try:
            config = cls.config_model.model_validate(state.get("config") or {})
        except ValidationError as exc:
            raise InvalidState(f"invalid {cls.name} policy state: {exc.errors()[0]['msg']}") from None
        policy = cls(config, context)
        policy.turn_index = turn
        return policy
