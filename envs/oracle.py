"""``oracle``: the baseline policy of the text games, which plays each game's own scripted solver.

A game created with ``config.oracle: true`` puts its solver's next action in every observation
(``oracle_action``: TextCraft's recipe planner, minigrid's BabyAI bot, SciWorld's gold path);
this policy plays it through the ordinary tool call. It shows a game is solvable through the
API and gives the baselines' success rates (bench, docs/environments.md); it needs no LLM.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from envs.base import PluginConfig, Policy, PolicyContext, PolicyDecision, StepOptions, register_policy
from envs.text_game import TOOL_NAME


class _OracleState(BaseModel):
    policy: str
    config: dict[str, Any] = Field(default_factory=dict)
    turn_index: int = Field(strict=True, ge=0)


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

    async def step(self, observation: dict[str, Any], options: StepOptions = StepOptions()) -> PolicyDecision:
        action = observation.get("oracle_action")
        if action is None:
            return PolicyDecision.no_oracle_action()
        call = {"id": f"oracle_{self.turn_index}", "tool": TOOL_NAME, "args": {"action": action}}
        if not options.dry_run:
            self.turn_index += 1
        return PolicyDecision(tool_calls=[call], meta={"oracle_action": action})

    def reset(self) -> None:
        self.turn_index = 0

    def get_state(self) -> dict[str, Any]:
        return {"policy": self.name, "config": self.config.model_dump(), "turn_index": self.turn_index}

    @classmethod
    def from_state(cls, state: dict[str, Any], context: PolicyContext) -> Policy:
        parsed, config = cls.validated_state(_OracleState, state)
        policy = cls(config, context)
        policy.turn_index = parsed.turn_index
        return policy
