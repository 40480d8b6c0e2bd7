"""A recipe planner for TextCraft: the next action that brings the goal closer, from the task's own
crafting commands and the current inventory (the baseline that shows every task is solvable).

It replans from scratch at each call (no memory, so snapshots need nothing from it): expand
the goal through the listed commands depth first, fetch base ingredients with ``get``, and
craft bottom-up. A generic ingredient in a command ("planks") is made from the first listed
command whose output belongs to that tag ("oak planks"), as the task instructions allow.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from envs.textcraft.recipes import RecipeBook

_COMMAND = re.compile(r"craft (\d+) (.+?) using (.+)")
_INGREDIENT = re.compile(r"(\d+) (.+)")


@dataclass(frozen=True)
class Command:
    output: str  # a name as the commands write it: "oak planks"
    count: int
    inputs: tuple[tuple[str, int], ...]


def parse_commands(commands: str) -> list[Command]:
    parsed = []
    for line in commands.splitlines():
        match = _COMMAND.fullmatch(line.strip())
        if not match:
            continue
        inputs = []
        for part in match.group(3).split(","):
            ingredient = _INGREDIENT.fullmatch(part.strip())
            if ingredient:
                inputs.append((ingredient.group(2), int(ingredient.group(1))))
        parsed.append(Command(match.group(2), int(match.group(1)), tuple(inputs)))
    return parsed


def _item_id(name: str) -> str:
    return "minecraft:" + name.replace(" ", "_")


class Planner:
    def __init__(self, book: RecipeBook, commands: str) -> None:
        self.book = book
        self.commands = parse_commands(commands)

    def _is_kind(self, name: str, wanted: str) -> bool:
        """Does an item called ``name`` serve where a command asks for ``wanted`` (itself or its tag)?"""
        return name == wanted or self.book.tree.item_id_to_tag.get(_item_id(name)) == _item_id(wanted)

    def _command_for(self, wanted: str) -> Command | None:
        exact = [c for c in self.commands if c.output == wanted]
        return (exact or [c for c in self.commands if self._is_kind(c.output, wanted)] or [None])[0]

    def next_action(self, goal_name: str, inventory: dict[str, int]) -> str:
        """The first action of a plan that makes ``goal_name`` from ``inventory`` (names as shown)."""
        actions: list[str] = []
        self._obtain(goal_name, 1, dict(inventory), actions, depth=0)
        return actions[0] if actions else "inventory"

    def _obtain(self, wanted: str, count: int, inventory: dict[str, int], out: list[str], depth: int) -> str:
        """Append the actions that put ``count`` of ``wanted`` into ``inventory`` (simulated);
        return the concrete name that was made."""
        for name, have in inventory.items():
            if self._is_kind(name, wanted) and have >= count:
                return name
        command = self._command_for(wanted) if depth < 12 else None
        if command is None:  # a base ingredient
            have = inventory.get(wanted, 0)
            out.append(f"get {count - have} {wanted}")
            inventory[wanted] = count
            return wanted
        have = inventory.get(command.output, 0)
        times = math.ceil((count - have) / command.count)
        used = []
        for ingredient, per_craft in command.inputs:
            made = self._obtain(ingredient, per_craft * times, inventory, out, depth + 1)
            used.append((made, per_craft))
        for _ in range(times):
            out.append(
                f"craft {command.count} {command.output} using "
                + ", ".join(f"{n} {name}" for name, n in used)
            )
            for name, n in used:
                inventory[name] -= n
            inventory[command.output] = inventory.get(command.output, 0) + command.count
        return command.output
