"""The JSON-safe observation of a Crafter env, read straight from its maps (no rendering)."""

from __future__ import annotations

from typing import Any

from crafter import constants
from pydantic import Field

from envs.base import ObservationFields
from envs.crafter.actions import ACHIEVEMENTS
from envs.crafter.sim import OBJECT_NAMES, DeterministicCrafter
from envs.crafter.text import render_text

VITALS: tuple[str, ...] = ("health", "food", "drink", "energy")
ITEMS: tuple[str, ...] = tuple(name for name in constants.items if name not in VITALS)
OUT_OF_BOUNDS = "out_of_bounds"
# Crafter's own local view: 9 columns (dx = -4..4) by 7 rows (dy = -3..3), row 0 at the top.
VIEW_COLS, VIEW_ROWS = 9, 7


class CrafterObservation(ObservationFields):
    """A Crafter observation: the text and what it is rendered from."""

    step_idx: int = Field(description="Ticks since the reset.")
    max_steps: int = Field(description="The episode's cap.")
    status: dict[str, int] = Field(description="Health, food, drink, energy (0-9).")
    inventory: dict[str, int] = Field(description="Count of each item.")
    position: list[int] = Field(description="The player's x, y.")
    facing: list[int] = Field(description="The direction faced, dx, dy.")
    facing_target: str = Field(description="What is on the tile faced.")
    achievements: dict[str, bool] = Field(description="Each of the 22 achievements: unlocked yet.")
    sleeping: bool
    daylight: float = Field(description="0 (night) to 1.")
    local_view: list[list[str]] = Field(description="The 9x7 tiles around the player, row 0 at the top.")
    image_png_base64: str | None = Field(default=None, description="The frame (config `image`).")


def local_view(sim: DeterministicCrafter) -> list[list[str]]:
    """Names of what is on each tile around the player: an object if any, else the material."""
    world = sim._world
    px, py = int(sim._player.pos[0]), int(sim._player.pos[1])
    x0, y0 = px - VIEW_COLS // 2, py - VIEW_ROWS // 2
    cx0, cx1 = max(x0, 0), min(x0 + VIEW_COLS, world.area[0])
    cy0, cy1 = max(y0, 0), min(y0 + VIEW_ROWS, world.area[1])
    grid = [[OUT_OF_BOUNDS] * VIEW_COLS for _ in range(VIEW_ROWS)]
    if cx0 >= cx1 or cy0 >= cy1:
        return grid
    names, objs = world._mat_names, world._objects
    materials = world._mat_map[cx0:cx1, cy0:cy1].tolist()
    indices = world._obj_map[cx0:cx1, cy0:cy1].tolist()
    for i, (mat_column, obj_column) in enumerate(zip(materials, indices, strict=True)):
        col = cx0 - x0 + i
        for j, (mat, index) in enumerate(zip(mat_column, obj_column, strict=True)):
            grid[cy0 - y0 + j][col] = OBJECT_NAMES[type(objs[index])] if index else names[mat]
    return grid


def build_observation(sim: DeterministicCrafter) -> dict[str, Any]:
    player, world = sim._player, sim._world
    inventory = player.inventory
    fx, fy = int(player.facing[0]), int(player.facing[1])
    material, obj = world[(player.pos[0] + fx, player.pos[1] + fy)]
    if obj is not None:
        facing_target = OBJECT_NAMES[type(obj)]
    else:
        facing_target = material if material is not None else OUT_OF_BOUNDS
    observation: dict[str, Any] = {
        "step_idx": int(sim._step),
        "max_steps": int(sim._length),
        "status": {name: int(inventory[name]) for name in VITALS},
        "inventory": {name: int(inventory[name]) for name in ITEMS},
        "position": [int(player.pos[0]), int(player.pos[1])],
        "facing": [fx, fy],
        "facing_target": facing_target,
        "achievements": {name: player.achievements[name] > 0 for name in ACHIEVEMENTS},
        "sleeping": bool(player.sleeping),
        "daylight": round(float(world.daylight), 3),
        "local_view": local_view(sim),
    }
    return {"text": render_text(observation), **observation}
