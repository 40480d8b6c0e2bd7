"""AgentGym's SciWorld task list: task ``data_idx`` is the ``data_idx``-th (task, variation) pair
of ScienceWorld 1.2.3's tasks in their id order, every variation of each, without the tasks
AgentGym leaves out (5-1, 5-2, 9-x, 10-x).

The variation counts are the simulator's own (``get_max_variations``); they are written here so
that validating an index never needs a JVM, and a test checks them against the jar.
"""

from __future__ import annotations

from typing import NamedTuple

EXCLUDED = frozenset({"5-1", "5-2", "9-1", "9-2", "9-3", "10-1", "10-2"})

# task id → (task name, number of variations), in ScienceWorld's order (scienceworld/tasks.json).
VARIATIONS: dict[str, tuple[str, int]] = {
    "1-1": ("boil", 30),
    "1-2": ("melt", 30),
    "1-3": ("freeze", 30),
    "1-4": ("change-the-state-of-matter-of", 30),
    "2-1": ("use-thermometer", 540),
    "2-2": ("measure-melting-point-known-substance", 436),
    "2-3": ("measure-melting-point-unknown-substance", 300),
    "3-1": ("power-component", 20),
    "3-2": ("power-component-renewable-vs-nonrenewable-energy", 20),
    "3-3": ("test-conductivity", 900),
    "3-4": ("test-conductivity-of-unknown-substances", 600),
    "4-1": ("find-living-thing", 300),
    "4-2": ("find-non-living-thing", 300),
    "4-3": ("find-plant", 300),
    "4-4": ("find-animal", 300),
    "5-1": ("grow-plant", 126),
    "5-2": ("grow-fruit", 126),
    "6-1": ("chemistry-mix", 32),
    "6-2": ("chemistry-mix-paint-secondary-color", 36),
    "6-3": ("chemistry-mix-paint-tertiary-color", 36),
    "7-1": ("lifespan-longest-lived", 125),
    "7-2": ("lifespan-shortest-lived", 125),
    "7-3": ("lifespan-longest-lived-then-shortest-lived", 125),
    "8-1": ("identify-life-stages-1", 14),
    "8-2": ("identify-life-stages-2", 10),
    "9-1": ("inclined-plane-determine-angle", 168),
    "9-2": ("inclined-plane-friction-named-surfaces", 1386),
    "9-3": ("inclined-plane-friction-unnamed-surfaces", 162),
    "10-1": ("mendelian-genetics-known-plant", 120),
    "10-2": ("mendelian-genetics-unknown-plant", 480),
}


class Task(NamedTuple):
    task_id: str
    task_name: str
    variation: int


TASKS: tuple[Task, ...] = tuple(
    Task(task_id, name, variation)
    for task_id, (name, count) in VARIATIONS.items()
    if task_id not in EXCLUDED
    for variation in range(count)
)
