"""The compact text an LLM sees for a Crafter observation (built from the observation dict).

Example::

    Step 37/10000, day. Health 9/9, food 8/9, drink 7/9, energy 9/9.
    Facing up: tree.
    Inventory: wood 3, sapling 1.
    Achievements (1/22): collect_wood.
    Nearby: tree: 1 up; water: 2 right, 1 down; cow: 3 left, 2 up.
    Map (top row is up; @ = you):
    ..T......
    ...
    Legend: . grass, T tree, ~ water, C cow, @ you.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Things worth walking to or away from, in the order they are listed at equal distance.
INTERESTING: tuple[str, ...] = (
    "zombie",
    "skeleton",
    "arrow",
    "lava",
    "cow",
    "plant",
    "water",
    "tree",
    "stone",
    "coal",
    "iron",
    "diamond",
    "table",
    "furnace",
)
_RANK = {name: i for i, name in enumerate(INTERESTING)}
SYMBOLS: dict[str, str] = {
    "grass": ".",
    "sand": ":",
    "path": "_",
    "tree": "T",
    "water": "~",
    "stone": "#",
    "coal": "c",
    "iron": "i",
    "diamond": "D",
    "table": "t",
    "furnace": "f",
    "lava": "L",
    "player": "@",
    "cow": "C",
    "zombie": "Z",
    "skeleton": "S",
    "arrow": "*",
    "plant": "p",
    "fence": "F",
    "out_of_bounds": "X",
}
_SYMBOL_RANK = {name: i for i, name in enumerate(SYMBOLS)}
_LEGEND_NAME = {"player": "you", "out_of_bounds": "edge of the world"}
_DIRECTION = {(-1, 0): "left", (1, 0): "right", (0, -1): "up", (0, 1): "down"}


def _symbol_rank(name: str) -> int:
    return _SYMBOL_RANK.get(name, len(_SYMBOL_RANK))


def offset_words(dx: int, dy: int) -> str:
    """``(-2, 1)`` -> ``"2 left, 1 down"``."""
    parts = []
    if dx:
        parts.append(f"{abs(dx)} {'left' if dx < 0 else 'right'}")
    if dy:
        parts.append(f"{abs(dy)} {'up' if dy < 0 else 'down'}")
    return ", ".join(parts) or "here"


def nearest(view: list[list[str]]) -> list[tuple[str, int, int]]:
    """The nearest (Manhattan) instance of each interesting thing in view, nearest first."""
    rows, cols = len(view), len(view[0]) if view else 0
    cy, cx = rows // 2, cols // 2
    best: dict[str, tuple[int, int, int]] = {}
    for y, row in enumerate(view):
        for x, name in enumerate(row):
            if name in _RANK:
                dx, dy = x - cx, y - cy
                dist = abs(dx) + abs(dy)
                if name not in best or dist < best[name][0]:
                    best[name] = (dist, dx, dy)
    ordered = sorted(best.items(), key=lambda item: (item[1][0], _RANK[item[0]]))
    return [(name, dx, dy) for name, (_, dx, dy) in ordered]


def render_text(obs: Mapping[str, Any]) -> str:
    status, view = obs["status"], obs["local_view"]
    phase = "day" if obs["daylight"] >= 0.5 else "night"
    sleeping = " You are asleep." if obs["sleeping"] else ""
    vitals = ", ".join(f"{name} {value}/9" for name, value in status.items())
    held = [f"{name} {count}" for name, count in obs["inventory"].items() if count > 0]
    done = [name for name, unlocked in obs["achievements"].items() if unlocked]
    facing = _DIRECTION.get(tuple(obs["facing"]), "?")
    close = "; ".join(f"{name}: {offset_words(dx, dy)}" for name, dx, dy in nearest(view))

    symbols_seen: dict[str, str] = {}
    map_rows = []
    for row in view:
        line = []
        for name in row:
            symbol = SYMBOLS.get(name, "?")
            symbols_seen.setdefault(name, symbol)
            line.append(symbol)
        map_rows.append("".join(line))
    legend = ", ".join(
        f"{symbols_seen[name]} {_LEGEND_NAME.get(name, name)}"
        for name in sorted(symbols_seen, key=_symbol_rank)
    )

    return "\n".join(
        (
            f"Step {obs['step_idx']}/{obs['max_steps']}, {phase}. {vitals.capitalize()}.{sleeping}",
            f"Facing {facing}: {obs['facing_target']}.",
            f"Inventory: {', '.join(held) or 'empty'}.",
            f"Achievements ({len(done)}/{len(obs['achievements'])}): {', '.join(done) or 'none'}.",
            f"Nearby: {close or 'nothing of note'}.",
            "Map (top row is up; @ = you):",
            *map_rows,
            f"Legend: {legend}.",
        )
    )
