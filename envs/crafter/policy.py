"""``crafter-react``: the generic LLM agent configured for Crafter, with one tool, ``interact_many``.

Each decision sends the system prompt, a bounded window of recent turns (observation, the
tool call, the tool's result) and the current observation; the model must call the tool
with 1..N actions. Everything but Crafter's prompt, tool and texts is `envs.agent.LLMAgent`'s.
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any, ClassVar

from pydantic import Field

from envs.agent import LLMAgent, LLMAgentConfig
from envs.base import PluginConfig, StepResult, register_policy
from envs.crafter.actions import (
    ACHIEVEMENTS,
    ACTION_INDEX,
    MAX_ACTIONS_PER_CALL,
    TOOL_NAME,
    TOOL_SCHEMA,
)

# --------------------------------------------------------------------------------------------
# Prompt
# --------------------------------------------------------------------------------------------

# Stated in the prompt exactly as Crafter 1.8.3's data.yaml has them (a test compares).
PLACE_COSTS: dict[str, dict[str, int]] = {
    "table": {"wood": 2},
    "furnace": {"stone": 4},
    "stone": {"stone": 1},
    "plant": {"sapling": 1},
}
MAKE_COSTS: dict[str, dict[str, int]] = {
    "wood_pickaxe": {"wood": 1},
    "wood_sword": {"wood": 1},
    "stone_pickaxe": {"wood": 1, "stone": 1},
    "stone_sword": {"wood": 1, "stone": 1},
    "iron_pickaxe": {"wood": 1, "coal": 1, "iron": 1},
    "iron_sword": {"wood": 1, "coal": 1, "iron": 1},
}


def _cost(name: str, table: dict[str, dict[str, int]]) -> str:
    return " + ".join(f"{n} {item}" for item, n in table[name].items())


_SYSTEM_PROMPT = f"""\
You play Crafter, a 2D survival game. Goal: unlock as many of the 22 achievements as you can \
and stay alive.

World: each turn shows your status, inventory, achievements and the tiles around you. You face \
one neighbouring tile. Moving toward a blocked tile only turns you to face it. Grass, sand and \
path are walkable; tree, stone, coal, iron, diamond, water, table and furnace block. Lava is \
walkable and kills you: never step on it.

do acts on the faced tile: tree gives wood; grass gives a sapling (10% chance); water gives \
drink; stone and coal need a wood_pickaxe; iron needs a stone_pickaxe; diamond needs an \
iron_pickaxe. do also hits creatures (a killed cow gives food) and eats ripe plants.

Place on the faced tile: table {_cost("table", PLACE_COSTS)} and furnace \
{_cost("furnace", PLACE_COSTS)} (on grass, sand or path); stone {_cost("stone", PLACE_COSTS)} \
(grass, sand, path, water or lava); plant {_cost("plant", PLACE_COSTS)} (grass).
Crafting needs a table within 1 tile (diagonals count); iron tools also need a furnace within \
1 tile. Wood pickaxe or sword: {_cost("wood_pickaxe", MAKE_COSTS)}. Stone pickaxe or sword: \
{_cost("stone_pickaxe", MAKE_COSTS)}. Iron pickaxe or sword: {_cost("iron_pickaxe", MAKE_COSTS)}.

Survival: health, food, drink and energy range 0-9. Food, drink and energy drop over time; \
at 0 you lose health, which recovers while all three are above 0. Eat cows or ripe plants, \
drink water, sleep when energy is low (you wake when it is full, or when hurt). Zombies roam \
grass, more at night; skeletons shoot in dark tunnels. Fight with do; swords hit harder.

Achievements: {", ".join(ACHIEVEMENTS)}.

Actions:
- noop: wait one tick
- move_left, move_right, move_up, move_down: step to x-1, x+1, y-1, y+1 (turn only, if blocked)
- do: use the faced tile (collect, drink, attack, eat)
- sleep: sleep until energy is full
- place_stone, place_table, place_furnace, place_plant: place on the faced tile
- make_wood_pickaxe, make_stone_pickaxe, make_iron_pickaxe, make_wood_sword, make_stone_sword, \
make_iron_sword: craft

Reply only by calling {TOOL_NAME} with 1 to <N> actions; they run in order, one tick each. \
Plan a few steps, then look again."""


def system_prompt(max_actions: int) -> str:
    return _SYSTEM_PROMPT.replace("<N>", str(max_actions))


@functools.cache  # one per max_actions (1..8); a deepcopy per decision cost ~2%
def tool_schema(max_actions: int) -> dict[str, Any]:
    """TOOL_SCHEMA with ``maxItems`` (and its description) set to ``max_actions``. Shared: do
    not mutate the returned dict."""
    schema = copy.deepcopy(TOOL_SCHEMA)
    function = schema["function"]
    function["description"] = (
        f"Execute a short sequence of Crafter actions in order (1-{max_actions}). "
        "Each action advances the world one tick."
    )
    function["parameters"]["properties"]["actions"]["maxItems"] = max_actions
    return schema


class CrafterReActConfig(LLMAgentConfig):
    max_actions_per_call: int = Field(default=MAX_ACTIONS_PER_CALL, ge=1, le=MAX_ACTIONS_PER_CALL)


def tool_call_actions(call: dict[str, Any]) -> list[str]:
    actions = call.get("args", {}).get("actions", [])
    return [actions] if isinstance(actions, str) else [str(a) for a in actions]


@register_policy
class CrafterReActPolicy(LLMAgent[CrafterReActConfig]):
    name: ClassVar[str] = "crafter-react"
    version: ClassVar[str] = "1"
    config_model: ClassVar[type[PluginConfig]] = CrafterReActConfig
    env_name: ClassVar[str | None] = "crafter"
    description: ClassVar[str] = "ReAct LLM policy: one interact_many tool call of 1-8 actions per turn."

    def system_prompt(self) -> str:
        return system_prompt(self.config.max_actions_per_call)

    def tools(self) -> list[dict[str, Any]]:
        return [tool_schema(self.config.max_actions_per_call)]

    def check_tool_call(self, call: dict[str, Any]) -> tuple[str, str] | None:
        actions = call["args"].get("actions")
        if isinstance(actions, str):
            actions = [actions]
        if not isinstance(actions, list) or not actions:
            return "invalid_tool_call", "the tool call needs a non-empty 'actions' list"
        bad = [a for a in actions if not isinstance(a, str) or a.strip() not in ACTION_INDEX]
        if bad:
            shown = ", ".join(repr(a)[:40] for a in bad)
            return "invalid_action", f"invalid action(s) {shown}; valid: {', '.join(ACTION_INDEX)}"
        limit = self.config.max_actions_per_call
        if len(actions) > limit:
            return "invalid_tool_call", f"{len(actions)} actions; at most {limit} allowed"
        return None

    def observation_text(self, observation: dict[str, Any]) -> str:
        text = observation.get("text")
        if isinstance(text, str):
            return text
        # No LLM view from the env: fall back to the compact structured fields.
        fields = ("status", "inventory", "achievements", "local_view")
        return json.dumps({k: v for k, v in observation.items() if k in fields}, sort_keys=True)

    def outcome_text(self, tool_calls: list[dict[str, Any]], result: StepResult) -> str:
        actions = [a for call in tool_calls for a in tool_call_actions(call)]
        executed = result.info.get("actions_executed", len(actions))
        if not isinstance(executed, int):
            executed = len(actions)
        ran = ", ".join(actions[:executed]) or "none"
        text = f"Executed {executed}/{len(actions)} actions: {ran}. Reward {result.reward:+.2f}."
        unlocked = result.info.get("achievements_unlocked") or []
        if unlocked:
            text += f" Unlocked: {', '.join(map(str, unlocked))}."
        if result.done:
            text += " The episode ended."
        return text
