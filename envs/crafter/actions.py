"""Crafter's action space, achievements, and the one tool an LLM uses to act.

This module is the single source of truth for action names: the environment validates
against it, the ReAct policy builds its tool schema from it, and tool calls are parsed here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from envs.errors import InvalidAction
from inference.tool_calls import canonical_tool_call

# Crafter 1.8.3's `data.yaml` order; the index is the integer action id.
ACTIONS: tuple[str, ...] = (
    "noop",
    "move_left",
    "move_right",
    "move_up",
    "move_down",
    "do",
    "sleep",
    "place_stone",
    "place_table",
    "place_furnace",
    "place_plant",
    "make_wood_pickaxe",
    "make_stone_pickaxe",
    "make_iron_pickaxe",
    "make_wood_sword",
    "make_stone_sword",
    "make_iron_sword",
)
ACTION_INDEX: dict[str, int] = {name: i for i, name in enumerate(ACTIONS)}

ACHIEVEMENTS: tuple[str, ...] = (
    "collect_coal",
    "collect_diamond",
    "collect_drink",
    "collect_iron",
    "collect_sapling",
    "collect_stone",
    "collect_wood",
    "defeat_skeleton",
    "defeat_zombie",
    "eat_cow",
    "eat_plant",
    "make_iron_pickaxe",
    "make_iron_sword",
    "make_stone_pickaxe",
    "make_stone_sword",
    "make_wood_pickaxe",
    "make_wood_sword",
    "place_furnace",
    "place_plant",
    "place_stone",
    "place_table",
    "wake_up",
)

TOOL_NAME = "interact_many"
MIN_ACTIONS_PER_CALL = 1
MAX_ACTIONS_PER_CALL = 8

TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            f"Execute a short sequence of Crafter actions in order "
            f"({MIN_ACTIONS_PER_CALL}-{MAX_ACTIONS_PER_CALL}). Each action advances the world one tick."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "actions": {
                    "type": "array",
                    "items": {"type": "string", "enum": list(ACTIONS)},
                    "minItems": MIN_ACTIONS_PER_CALL,
                    "maxItems": MAX_ACTIONS_PER_CALL,
                    "description": "Actions to execute, in order.",
                }
            },
            "required": ["actions"],
            "additionalProperties": False,
        },
    },
}


def action_index(action: str | int) -> int:
    """Resolve a canonical action name or an index to the integer id, or raise InvalidAction."""
    if isinstance(action, bool):  # bool is an int subclass; True is not an action
        raise InvalidAction(f"invalid action {action!r}: expected a name or an index 0-{len(ACTIONS) - 1}")
    if isinstance(action, int):
        if 0 <= action < len(ACTIONS):
            return action
        raise InvalidAction(f"invalid action index {action}: expected 0-{len(ACTIONS) - 1}")
    if isinstance(action, str):
        index = ACTION_INDEX.get(action.strip())
        if index is not None:
            return index
        shown = action if len(action) <= 40 else action[:40] + "…"
        raise InvalidAction(f"unknown action {shown!r}; valid actions: {', '.join(ACTIONS)}")
    raise InvalidAction(f"invalid action of type {type(action).__name__}: expected a name or an index")


def actions_from_tool_calls(tool_calls: Sequence[Any]) -> list[int]:
    """Actions named by a list of tool calls, validated, as integer ids.

    Any shape `inference.canonical_tool_call` accepts, calling ``interact_many`` (or
    ``interact``) with ``{"actions": [...]}`` (or ``{"action": ...}``), or a tool named after
    one action (``{"tool": "move_left"}``). Any invalid action rejects the whole list: no
    silent noops.
    """
    if not isinstance(tool_calls, (list, tuple)) or not tool_calls:
        raise InvalidAction("no tool calls to execute")
    actions: list[int] = []
    for i, raw in enumerate(tool_calls):
        call, problem = canonical_tool_call(raw, i)
        if problem is not None:
            raise InvalidAction(problem)
        name, args = call["tool"], call["args"]
        if name == TOOL_NAME or name == "interact":
            raw_actions = args.get("actions", args.get("action"))
            if raw_actions is None:
                raise InvalidAction(f"tool call {name!r} needs arguments {{'actions': [...]}}")
            listed = raw_actions if isinstance(raw_actions, list) else [raw_actions]
            if not listed:
                raise InvalidAction(f"tool call {name!r} has an empty actions list")
            actions.extend(action_index(a) for a in listed)
        elif isinstance(name, str) and name in ACTION_INDEX:
            actions.append(ACTION_INDEX[name])
        else:
            raise InvalidAction(f"unknown tool {name!r}; expected {TOOL_NAME!r}")
    return actions
