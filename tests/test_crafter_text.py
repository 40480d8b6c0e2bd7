"""The LLM text view, from hand-made observations."""

from __future__ import annotations

from typing import Any

from envs.crafter.actions import ACHIEVEMENTS
from envs.crafter.observation import ITEMS
from envs.crafter.text import nearest, offset_words, render_text


def observation(view: list[str], **overrides: Any) -> dict[str, Any]:
    names = {".": "grass", "T": "tree", "~": "water", "C": "cow", "Z": "zombie", "@": "player"}
    names["X"] = "out_of_bounds"
    obs: dict[str, Any] = {
        "step_idx": 12,
        "max_steps": 10000,
        "status": {"health": 7, "food": 9, "drink": 8, "energy": 9},
        "inventory": {name: 0 for name in ITEMS},
        "position": [32, 32],
        "facing": [0, -1],
        "facing_target": "tree",
        "achievements": {name: False for name in ACHIEVEMENTS},
        "sleeping": False,
        "daylight": 0.8,
        "local_view": [[names[c] for c in row] for row in view],
    }
    obs.update(overrides)
    return obs


VIEW = [
    "XXXXXXXXX",
    "..T......",
    "....T....",
    "....@...~",
    ".........",
    "C.......~",
    ".......Z.",
]


def test_offset_words() -> None:
    assert offset_words(-2, 1) == "2 left, 1 down"
    assert offset_words(0, -3) == "3 up"
    assert offset_words(4, 0) == "4 right"


def test_nearest_picks_the_closest_instance_nearest_first() -> None:
    grid = observation(VIEW)["local_view"]
    assert nearest(grid) == [("tree", 0, -1), ("water", 4, 0), ("zombie", 3, 3), ("cow", -4, 2)]


def test_render_text() -> None:
    inventory = {name: 0 for name in ITEMS} | {"wood": 3, "sapling": 1}
    achievements = {name: name == "collect_wood" for name in ACHIEVEMENTS}
    text = render_text(observation(VIEW, inventory=inventory, achievements=achievements))
    lines = text.splitlines()
    assert lines[0] == "Step 12/10000, day. Health 7/9, food 9/9, drink 8/9, energy 9/9."
    assert lines[1] == "Facing up: tree."
    assert lines[2] == "Inventory: sapling 1, wood 3."
    assert lines[3] == "Achievements (1/22): collect_wood."
    assert lines[4] == "Nearby: tree: 1 up; water: 4 right; zombie: 3 right, 3 down; cow: 4 left, 2 down."
    assert lines[6:13] == [row for row in VIEW]
    assert lines[13] == "Legend: . grass, T tree, ~ water, @ you, C cow, Z zombie, X edge of the world."
    assert 300 <= len(text) <= 600


def test_render_text_when_empty_at_night_and_asleep() -> None:
    view = ["." * 9] * 3 + ["....@...."] + ["." * 9] * 3
    text = render_text(observation(view, daylight=0.2, sleeping=True))
    assert "night" in text and "You are asleep." in text
    assert "Inventory: empty." in text and "Achievements (0/22): none." in text
    assert "Nearby: nothing of note." in text
