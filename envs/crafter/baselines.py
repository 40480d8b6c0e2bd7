"""Crafter policies that need no LLM: ``crafter-random`` and ``crafter-heuristic``.

The heuristic reads the observation's structured fields (``status``, ``inventory``,
``facing``, ``facing_target``, ``achievements``, ``sleeping``, ``local_view``: 7 rows for
dy = -3..3 by 9 columns for dx = -4..4) and picks one action per decision by fixed
priorities: fight adjacent enemies, drink/eat/sleep when needed, craft, place, gather,
explore. Its memory (exploration heading, remembered table, counters, RNG) is JSON-safe
state, so a restored copy continues identically.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envs.base import PluginConfig, Policy, PolicyContext, PolicyDecision, StepOptions, register_policy
from envs.crafter.actions import ACTIONS, MAX_ACTIONS_PER_CALL, TOOL_NAME
from envs.errors import InvalidState, validation_problems

STATE_VERSION = 1

# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------


def _tool_call(call_id: str, actions: list[str]) -> dict[str, Any]:
    return {"id": call_id, "tool": TOOL_NAME, "args": {"actions": actions}}


def _rng_to_json(rng: random.Random) -> list[Any]:
    version, internal, gauss_next = rng.getstate()
    return [version, list(internal), gauss_next]


def _rng_from_json(data: Any) -> random.Random:
    try:
        version, internal, gauss_next = data
        rng = random.Random()
        rng.setstate((version, tuple(internal), gauss_next))
    except (TypeError, ValueError) as exc:
        raise InvalidState(f"invalid RNG state: {exc}") from None
    return rng


Point = tuple[int, int]


class _HeuristicMemory(BaseModel):
    """What the heuristic remembers between decisions (validated when restoring)."""

    model_config = ConfigDict(extra="forbid")

    heading: Point | None = None
    heading_left: int = 0
    sapling_tries: int = Field(default=0, ge=0)
    table: Point | None = None
    water: Point | None = None
    cow: Point | None = None
    last_pos: Point | None = None
    last_action: str | None = None


class _BaselineState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1]
    policy: str
    config: dict[str, Any]
    turn_index: int = Field(ge=0)
    rng: list[Any]
    memory: dict[str, Any] = Field(default_factory=dict)


class _SeededBaseline(Policy[Any]):
    """What both baselines share: a seeded RNG, a turn counter, and their snapshot format."""

    env_name: ClassVar[str | None] = "crafter"

    def __init__(self, config: Any, context: PolicyContext) -> None:
        self.config = config
        self.context = context
        self.rng = random.Random(config.seed)
        self.turn_index = 0

    def extra_state(self) -> dict[str, Any]:
        return {}

    def restore_extra(self, parsed: _BaselineState) -> None:
        """Install the policy-specific part of a validated state (``InvalidState`` if bad)."""

    def get_state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "policy": self.name,
            "config": self.config.model_dump(mode="json"),
            "turn_index": self.turn_index,
            "rng": _rng_to_json(self.rng),
            **self.extra_state(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], context: PolicyContext) -> Policy:
        parsed, config = cls.validated_state(_BaselineState, state)
        policy = cls(config, context)
        policy.rng = _rng_from_json(parsed.rng)
        policy.turn_index = parsed.turn_index
        policy.restore_extra(parsed)
        return policy


# --------------------------------------------------------------------------------------------
# crafter-random
# --------------------------------------------------------------------------------------------


class RandomConfig(PluginConfig):
    seed: int | None = None
    actions_per_call: int = Field(default=1, ge=1, le=MAX_ACTIONS_PER_CALL)


@register_policy
class CrafterRandomPolicy(_SeededBaseline):
    name: ClassVar[str] = "crafter-random"
    version: ClassVar[str] = "1"
    config_model: ClassVar[type[PluginConfig]] = RandomConfig
    description: ClassVar[str] = "Uniformly random actions (a baseline; no LLM)."
    config: RandomConfig

    async def step(self, observation: dict[str, Any], options: StepOptions = StepOptions()) -> PolicyDecision:
        meta: dict[str, Any] = {"turn_index": self.turn_index}
        if options.dry_run:  # a preview that leaves the RNG untouched
            preview = random.Random()
            preview.setstate(self.rng.getstate())
            actions = [preview.choice(ACTIONS) for _ in range(self.config.actions_per_call)]
            return PolicyDecision(tool_calls=[], meta={**meta, "dry_run": True, "would_act": actions})
        actions = [self.rng.choice(ACTIONS) for _ in range(self.config.actions_per_call)]
        self.turn_index += 1
        return PolicyDecision(tool_calls=[_tool_call(f"random-{self.turn_index}", actions)], meta=meta)

    def reset(self) -> None:
        self.turn_index = 0  # the RNG keeps going: a new episode gets new actions


# --------------------------------------------------------------------------------------------
# crafter-heuristic
# --------------------------------------------------------------------------------------------

MOVES: dict[tuple[int, int], str] = {
    (-1, 0): "move_left",
    (1, 0): "move_right",
    (0, -1): "move_up",
    (0, 1): "move_down",
}
WALKABLE = frozenset({"grass", "sand", "path"})
PLACEABLE = frozenset({"grass", "sand", "path"})  # where a table, furnace or stone may go
ENEMIES = frozenset({"zombie", "skeleton"})
VIEW_ROWS, VIEW_COLS = 7, 9
CY, CX = VIEW_ROWS // 2, VIEW_COLS // 2  # the player's cell


class HeuristicConfig(PluginConfig):
    seed: int | None = Field(default=0, description="Seeds the exploration choices.")
    thirst_threshold: int = Field(default=5, ge=0, le=9, description="Seek water at or below this drink.")
    hunger_threshold: int = Field(default=5, ge=0, le=9, description="Seek cows at or below this food.")
    sleep_threshold: int = Field(default=2, ge=0, le=9, description="Sleep at or below this energy.")
    sapling_tries: int = Field(default=25, ge=0, description="`do` attempts on grass to get a sapling.")
    explore_steps: int = Field(default=12, ge=1, description="Steps kept in one exploration heading.")


class View:
    """The 7×9 local view, addressed by offsets (dx, dy) from the player."""

    def __init__(self, grid: list[list[str]]) -> None:
        self.grid = grid

    def at(self, dx: int, dy: int) -> str:
        row, col = CY + dy, CX + dx
        if 0 <= row < VIEW_ROWS and 0 <= col < VIEW_COLS:
            return self.grid[row][col]
        return "out_of_bounds"

    def cells(self) -> list[tuple[int, int, str]]:
        return [(c - CX, r - CY, name) for r, row in enumerate(self.grid) for c, name in enumerate(row)]

    def find(self, names: frozenset[str] | set[str]) -> list[tuple[int, int]]:
        found = [(dx, dy) for dx, dy, name in self.cells() if name in names]
        return sorted(found, key=lambda p: (abs(p[0]) + abs(p[1]), p[1], p[0]))

    def near(self, names: frozenset[str] | set[str], radius: int = 1) -> bool:
        """Any of ``names`` within Chebyshev distance ``radius`` (Crafter's "nearby" for crafting)."""
        return any(
            self.at(dx, dy) in names for dx in range(-radius, radius + 1) for dy in range(-radius, radius + 1)
        )


def _valid_view(grid: Any) -> bool:
    return (
        isinstance(grid, list)
        and len(grid) == VIEW_ROWS
        and all(isinstance(row, list) and len(row) == VIEW_COLS for row in grid)
    )


class Heuristic:
    """One decision from one observation, given the policy's memory (mutated in place)."""

    def __init__(self, obs: dict[str, Any], memory: dict[str, Any], cfg: HeuristicConfig, rng: random.Random):
        self.obs, self.memory, self.cfg, self.rng = obs, memory, cfg, rng
        self.view = View(obs["local_view"])
        self.status: dict[str, int] = obs["status"]
        self.inv: dict[str, int] = obs["inventory"]
        self.ach: dict[str, bool] = obs.get("achievements") or {}
        self.facing = tuple(obs.get("facing") or (0, 1))
        self.target = obs.get("facing_target") or self.view.at(*self.facing)
        self.pos = tuple(obs.get("position") or (0, 0))

    def has(self, item: str, n: int = 1) -> bool:
        return self.inv.get(item, 0) >= n

    # ---- movement ------------------------------------------------------------------------

    def approach(self, targets: frozenset[str] | set[str], act: str = "do") -> str | None:
        """Walk (BFS over walkable tiles) next to the nearest target, face it, then ``act``."""
        start = (0, 0)
        parents: dict[tuple[int, int], tuple[int, int] | None] = {start: None}
        queue = deque([start])
        while queue:
            cell = queue.popleft()
            for d in MOVES:
                nxt = (cell[0] + d[0], cell[1] + d[1])
                name = self.view.at(*nxt)
                if name in targets:
                    if cell == start:
                        return act if self.facing == d else MOVES[d]
                    return self._first_move(parents, cell)
                if nxt not in parents and name in WALKABLE:
                    parents[nxt] = cell
                    queue.append(nxt)
        return None

    @staticmethod
    def _first_move(parents: dict[tuple[int, int], tuple[int, int] | None], cell: tuple[int, int]) -> str:
        while parents[cell] != (0, 0):
            parent = parents[cell]
            assert parent is not None
            cell = parent
        return MOVES[cell]

    def walk_to(self, dx: int, dy: int) -> str | None:
        """A step that reduces the distance to an offset (greedy, never onto a non-walkable tile)."""
        options = []
        if dx:
            options.append((1 if dx > 0 else -1, 0))
        if dy:
            options.append((0, 1 if dy > 0 else -1))
        options.sort(key=lambda d: -abs(dx if d[0] else dy))
        for d in options:
            if self.view.at(*d) in WALKABLE:
                return MOVES[d]
        return None

    def explore(self) -> str:
        heading = tuple(self.memory.get("heading") or (0, 0))
        left = int(self.memory.get("heading_left", 0))
        last_action = self.memory.get("last_action") or ""
        stuck = self.memory.get("last_pos") == list(self.pos) and last_action.startswith("move_")
        if heading not in MOVES or left <= 0 or stuck or self.view.at(*heading) not in WALKABLE:
            free = [d for d in MOVES if self.view.at(*d) in WALKABLE]
            # Prefer headings with open ground further out, and not straight back.
            back = (-heading[0], -heading[1]) if heading in MOVES else None
            choices = [d for d in free if d != back] or free
            if not choices:  # boxed in: face something that is not lava, to dig or fight out
                safe = [d for d in MOVES if self.view.at(*d) not in ("lava", "out_of_bounds")]
                return MOVES[self.rng.choice(safe)] if safe else "noop"
            weights = [
                1 + sum(self.view.at(d[0] * k, d[1] * k) in WALKABLE for k in (2, 3, 4)) for d in choices
            ]
            heading = self.rng.choices(choices, weights=weights)[0]
            left = self.cfg.explore_steps
        self.memory["heading"] = list(heading)
        self.memory["heading_left"] = left - 1
        return MOVES[heading]

    # ---- needs ---------------------------------------------------------------------------

    def pending_tools(self) -> list[str]:
        return [t for t in ("wood_pickaxe", "wood_sword", "stone_pickaxe", "stone_sword") if not self.has(t)]

    def table_reachable(self) -> bool:
        """A table in view, or remembered close enough to walk back to."""
        if self.view.find({"table"}):
            return True
        table = self.memory.get("table")
        return bool(table) and abs(table[0] - self.pos[0]) + abs(table[1] - self.pos[1]) <= 8

    def wood_needed(self) -> int:
        need = len(self.pending_tools())
        if need and not self.table_reachable() or not self.ach.get("place_table"):
            need += 2
        return min(need, 9)

    def stone_needed(self) -> int:
        need = sum(0 if self.has(t) else 1 for t in ("stone_pickaxe", "stone_sword"))
        need += 0 if self.ach.get("place_stone") else 1
        need += 0 if self.ach.get("place_furnace") else 4
        return min(need, 9)

    def craftable(self) -> str | None:
        recipes = (
            ("make_wood_pickaxe", "wood_pickaxe", {"wood": 1}),
            ("make_wood_sword", "wood_sword", {"wood": 1}),
            ("make_stone_pickaxe", "stone_pickaxe", {"wood": 1, "stone": 1}),
            ("make_stone_sword", "stone_sword", {"wood": 1, "stone": 1}),
        )
        for action, tool, cost in recipes:
            if not self.has(tool) and all(self.has(k, n) for k, n in cost.items()):
                return action
        return None

    def remember(self) -> None:
        """Absolute positions of the nearest table, water and cow seen, to walk back to later."""
        for name in ("table", "water", "cow"):
            found = self.view.find({name})
            if found:
                dx, dy = found[0]
                self.memory[name] = [self.pos[0] + dx, self.pos[1] + dy]

    def go_back_to(self, name: str, max_distance: int = 30) -> str | None:
        spot = self.memory.get(name)
        if not spot:
            return None
        dx, dy = spot[0] - self.pos[0], spot[1] - self.pos[1]
        if abs(dx) + abs(dy) > max_distance:
            return None
        return self.walk_to(dx, dy)

    def flee(self) -> str | None:
        """When weak, step away from enemies that are near but not yet adjacent."""
        if self.status.get("health", 9) > 4:
            return None
        enemies = [p for p in self.view.find(ENEMIES) if abs(p[0]) + abs(p[1]) <= 4]
        if not enemies or any(abs(x) + abs(y) == 1 for x, y in enemies):
            return None
        ex, ey = enemies[0]
        free = [d for d in MOVES if self.view.at(*d) in WALKABLE]
        if not free:
            return None
        best = max(free, key=lambda d: abs(d[0] - ex) + abs(d[1] - ey))
        return MOVES[best]

    def eat(self) -> str | None:
        if self.status.get("food", 9) > self.cfg.hunger_threshold:
            return None
        return self.approach({"cow"}) or self.go_back_to("cow", max_distance=15)

    def drink(self) -> str | None:
        if self.status.get("drink", 9) > self.cfg.thirst_threshold:
            return None
        return self.approach({"water"}) or self.go_back_to("water")

    # ---- the decision --------------------------------------------------------------------

    def decide(self) -> str:
        if self.obs.get("sleeping"):
            return "noop"
        s, view = self.status, self.view
        self.remember()
        rules: list[Callable[[], str | None]] = [
            self.flee,
            lambda: self.approach(ENEMIES) if any(view.at(*d) in ENEMIES for d in MOVES) else None,
            self.drink,
            self.eat,
            lambda: "sleep" if s.get("energy", 9) <= self.cfg.sleep_threshold else None,
            self.craft_or_place,
            self.nap_for_wake_up,
            self.opportunistic,
            self.gather,
            self.return_to_table,
        ]
        for rule in rules:
            action = rule()
            if action is not None:
                return action
        return self.explore()

    def craft_or_place(self) -> str | None:
        view, target = self.view, self.target
        if view.near({"table"}) and (action := self.craftable()):
            return action
        # A (new) table once there is wood for it and for a tool, or no tree in sight.
        wants_table = not self.ach.get("place_table") or (self.pending_tools() and not self.table_reachable())
        enough_wood = self.has("wood", 3) or (self.has("wood", 2) and not view.find({"tree"}))
        if wants_table and enough_wood and target in PLACEABLE:
            self.memory.pop("table", None)
            return "place_table"
        stone_tools = self.has("stone_pickaxe") and self.has("stone_sword")
        if stone_tools and self.has("stone", 4) and not self.ach.get("place_furnace") and target in PLACEABLE:
            return "place_furnace"
        if self.has("stone") and not self.ach.get("place_stone") and target in PLACEABLE | {"water", "lava"}:
            return "place_stone"
        return None

    def nap_for_wake_up(self) -> str | None:
        """A short daytime sleep (energy below max, no enemy in view) unlocks wake_up cheaply."""
        if self.ach.get("wake_up") or self.status.get("energy", 9) >= 9:
            return None
        if self.obs.get("daylight", 1.0) < 0.6 or self.view.find(ENEMIES):
            return None
        return "sleep"

    def opportunistic(self) -> str | None:
        view, s = self.view, self.status
        thirsty = s.get("drink", 9) < 9 and not self.ach.get("collect_drink")
        if thirsty and view.find({"water"}) and (action := self.approach({"water"})):
            return action
        cows = [c for c in view.find({"cow"}) if abs(c[0]) + abs(c[1]) <= 4]
        hungry = s.get("food", 9) < 9 and not self.ach.get("eat_cow")
        if hungry and cows and (action := self.approach({"cow"})):
            return action
        if self.target == "grass":
            if self.has("sapling") and not self.ach.get("place_plant"):
                return "place_plant"
            tries = int(self.memory.get("sapling_tries", 0))
            if (
                not self.ach.get("collect_sapling")
                and not self.has("sapling")
                and tries < self.cfg.sapling_tries
            ):
                self.memory["sapling_tries"] = tries + 1
                return "do"
        return None

    def gather(self) -> str | None:
        wants: list[str] = []
        if self.has("stone_pickaxe"):
            wants.append("iron")
        if self.has("wood_pickaxe"):
            wants.append("coal")
            if self.inv.get("stone", 0) < self.stone_needed():
                wants.append("stone")
        if self.inv.get("wood", 0) < self.wood_needed():
            wants.append("tree")
        for material in wants:
            if self.view.find({material}) and (action := self.approach({material})):
                return action
        return None

    def return_to_table(self) -> str | None:
        if self.view.find({"table"}) or self.craftable() is None:
            return None
        return self.go_back_to("table", max_distance=8)


@register_policy
class CrafterHeuristicPolicy(_SeededBaseline):
    name: ClassVar[str] = "crafter-heuristic"
    version: ClassVar[str] = "1"
    config_model: ClassVar[type[PluginConfig]] = HeuristicConfig
    description: ClassVar[str] = (
        "Scripted baseline: gather, craft, place, drink, eat, sleep, explore (no LLM)."
    )
    config: HeuristicConfig

    def __init__(self, config: HeuristicConfig, context: PolicyContext) -> None:
        super().__init__(config, context)
        self.memory: dict[str, Any] = {}

    async def step(self, observation: dict[str, Any], options: StepOptions = StepOptions()) -> PolicyDecision:
        return self.decide(observation, dry_run=options.dry_run)

    def decide(self, observation: dict[str, Any], *, dry_run: bool = False) -> PolicyDecision:
        """Synchronous core of ``step`` (handy for scripts and tests)."""
        meta: dict[str, Any] = {"turn_index": self.turn_index}
        missing = [k for k in ("status", "inventory", "local_view") if k not in observation]
        if missing or not _valid_view(observation.get("local_view")):
            detail = f"missing fields {missing}" if missing else "local_view must be 7 rows of 9 names"
            return PolicyDecision(tool_calls=[], meta=meta, error="invalid_observation", error_detail=detail)
        if dry_run:  # decide on copies, so nothing changes
            rng = random.Random()
            rng.setstate(self.rng.getstate())
            action = Heuristic(observation, dict(self.memory), self.config, rng).decide()
            return PolicyDecision(tool_calls=[], meta={**meta, "dry_run": True, "would_act": [action]})
        action = Heuristic(observation, self.memory, self.config, self.rng).decide()
        self.memory["last_pos"] = list(observation.get("position") or [0, 0])
        self.memory["last_action"] = action
        self.turn_index += 1
        return PolicyDecision(tool_calls=[_tool_call(f"heuristic-{self.turn_index}", [action])], meta=meta)

    def reset(self) -> None:
        self.memory = {}
        self.turn_index = 0

    def extra_state(self) -> dict[str, Any]:
        return {"memory": dict(self.memory)}

    def restore_extra(self, parsed: _BaselineState) -> None:
        try:
            memory = _HeuristicMemory.model_validate(parsed.memory)
        except ValidationError as exc:
            raise InvalidState(f"invalid {self.name} memory: {validation_problems(exc)}") from None
        self.memory = memory.model_dump(mode="json", exclude_unset=True)
