"""What the agent sees in BabyAI, in AgentGym's words, and the high-level actions it may take.

`describe(env, image, direction)` reads minigrid's egocentric 7×7 view and returns AgentGym's
description ("In front of you in this room, you can see several objects: There is a red ball 1
...") and its action table: each text action ("go to red ball 1", "pickup red ball 1",
"toggle and go through blue closed door 1", ...) with the primitive minigrid steps that carry
it out, found by a breadth-first search over (cell, heading) inside the view, plus the message
for each action that is known but not possible now.

The text, the names, the numbering and the path search follow AgentGym's BabyAI server
(agentenv-babyai/environment.py) exactly, including its quirks, because models trained on
AgentGym's trajectories expect them: the pick-up actions are spelled ``pickup`` although the
instructions say "pick up"; doors never block the search; the search marks states visited
when it expands them, so a later discovery of a queued state replaces its parent; a failed
toggle-through reports the door counter as a dict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# minigrid's encodings (minigrid.core.constants), by index.
OBJECTS = ("unseen", "empty", "wall", "floor", "door", "key", "ball", "box", "goal", "lava", "agent")
COLORS = ("red", "green", "blue", "purple", "yellow", "grey")
DOOR_STATES = ("open", "closed", "locked")
DIR_TO_VEC = ((1, 0), (0, 1), (-1, 0), (0, -1))

LEFT, RIGHT, FORWARD, PICKUP, DROP, TOGGLE, DONE = range(7)
PRIMITIVES = ("left", "right", "forward", "pickup", "drop", "toggle", "done")

_INTERESTING = ("door", "key", "ball", "box", "goal", "lava", "wall")
_BLOCKING = ("wall", "box", "lava", "ball", "key")  # what the path search walks around

CHECK = "check available actions"


@dataclass(slots=True)
class Seen:
    name: str  # "red ball", "blue closed door", "wall"
    pos: tuple[int, int]  # absolute grid cell
    dis: int  # Manhattan distance (objects) or distance straight ahead (barriers)


@dataclass(slots=True)
class View:
    description: str
    actions: dict[str, list[int]]  # text action → primitive steps, in AgentGym's order
    errors: dict[str, str] = field(default_factory=dict)  # known but impossible action → why


def describe(env: Any, image: np.ndarray, direction: int) -> View:
    """The description and action table of the current state of a minigrid BabyAI env."""
    grid = env.unwrapped
    size = grid.agent_view_size
    pos = (int(grid.agent_pos[0]), int(grid.agent_pos[1]))
    f_vec, r_vec = np.asarray(grid.dir_vec), np.asarray(grid.right_vec)
    top_left = np.asarray(pos) + f_vec * (size - 1) - r_vec * (size // 2)
    corner = top_left + size * (-f_vec + r_vec)
    xs = _span(int(corner[0]), int(top_left[0]))
    ys = _span(int(corner[1]), int(top_left[1]))
    heading = DIR_TO_VEC[direction]

    objects: list[Seen] = []
    barriers: list[Seen] = []
    for vis_j in range(size):
        for vis_i in range(size):
            x, y = (int(v) for v in top_left - f_vec * vis_j + r_vec * vis_i)
            if x < 0 or y < 0:
                continue
            distance = abs(pos[0] - x) + abs(pos[1] - y)
            if distance == 0:
                continue
            kind_idx, color_idx, state_idx = (int(v) for v in image[vis_i, vis_j])
            kind = OBJECTS[kind_idx]
            if kind in _INTERESTING:
                color = COLORS[color_idx]
                name = f"{color} {DOOR_STATES[state_idx]} door" if kind == "door" else f"{color} {kind}"
                objects.append(Seen(name, (x, y), distance))
            if kind in ("box", "wall"):
                rel = (x - pos[0], y - pos[1])
                if heading[0] * rel[1] - heading[1] * rel[0] == 0:  # on the line the agent faces
                    barriers.append(Seen(kind, (x, y), heading[0] * rel[0] + heading[1] * rel[1]))
    objects.sort(key=lambda seen: seen.dis)
    barriers.sort(key=lambda seen: seen.dis)
    carrying = grid.carrying
    description = _objects_text(objects, pos, direction) + _barrier_text(barriers) + _carrying_text(carrying)
    search = _PathSearch(pos, direction, objects + barriers, xs, ys)
    actions, errors = _action_table(objects, barriers, carrying, pos, direction, search)
    return View(description, actions, errors)


def _span(border: int, start: int) -> range:
    return range(border, start + 1) if border < start else range(start, border)


def _objects_text(objects: list[Seen], pos: tuple[int, int], direction: int) -> str:
    if not objects:
        return "You cannot see any objects within sight."
    text = "In front of you in this room, you can see several objects: "
    counts: dict[str, int] = {}
    ahead, right = DIR_TO_VEC[direction], DIR_TO_VEC[(direction + 1) % 4]
    for seen in objects:
        if "wall" in seen.name:
            continue
        rel = (seen.pos[0] - pos[0], seen.pos[1] - pos[1])
        front = ahead[0] * rel[0] + ahead[1] * rel[1]
        side = right[0] * rel[0] + right[1] * rel[1]
        if side == 0:
            where = f"right in front of you {front} steps away. "
        elif side > 0:
            where = f"{front} steps in front of you and {side} steps to your right. "
        else:
            where = f"{front} steps in front of you and {-side} steps to your left. "
        counts[seen.name] = counts.get(seen.name, 0) + 1
        text += f"There is a {seen.name} {counts[seen.name]} {where} "
    return text


def _barrier_text(barriers: list[Seen]) -> str:
    text = "The room has walls around you. "
    if barriers:
        text += f"You are facing a {barriers[0].name} {barriers[0].dis} steps away. "
    return text


def _carrying_text(carrying: Any) -> str:
    if carrying is None:
        return "You are not carrying anything."
    return f"You are carrying a {carrying.color} {carrying.type}."


class _PathSearch:
    """AgentGym's breadth-first search over (cell, heading) within the view's bounds."""

    def __init__(
        self, pos: tuple[int, int], direction: int, things: list[Seen], xs: range, ys: range
    ) -> None:
        self.start = (pos, direction)
        self.blocked = {seen.pos for seen in things if any(b in seen.name for b in _BLOCKING)}
        self.has_things = bool(things)
        self.xs, self.ys = xs, ys

    def path(self, goal: tuple[int, int], arrive: bool) -> list[int] | None:
        """Primitive steps that end on ``goal`` (``arrive``) or facing it; None if there is no way."""
        queue: list[tuple[tuple[int, int], int]] = [self.start]
        parent: dict[tuple[tuple[int, int], int], tuple[tuple[tuple[int, int], int], int]] = {}
        expanded: set[tuple[tuple[int, int], int]] = set()
        head = 0
        while head < len(queue):
            state = queue[head]
            head += 1
            expanded.add(state)
            (x, y), direction = state
            step = DIR_TO_VEC[direction]
            reached = (x, y) == goal if arrive else (goal[0] - x, goal[1] - y) == step
            if reached:
                return self._unwind(parent, state)
            for action in (FORWARD, LEFT, RIGHT):
                if action == FORWARD:
                    nxt = ((x + step[0], y + step[1]), direction)
                elif action == LEFT:
                    nxt = ((x, y), (direction - 1) % 4)
                else:
                    nxt = ((x, y), (direction + 1) % 4)
                if self.has_things and (
                    nxt[0][0] not in self.xs
                    or nxt[0][1] not in self.ys
                    or nxt in expanded
                    or nxt[0] in self.blocked
                ):
                    continue
                queue.append(nxt)
                parent[nxt] = (state, action)
        return None

    def _unwind(self, parent: dict[Any, Any], state: Any) -> list[int]:
        steps = []
        while state != self.start:
            state, action = parent[state]
            steps.append(action)
        return steps[::-1]


def _numbered(
    actions: dict[str, list[int]],
    errors: dict[str, str],
    counts: dict[str, int],
    verb: str,
    name: str,
    path: list[int] | None,
    why: str,
) -> None:
    """AgentGym's numbering: the i-th reachable ``name`` is ``{verb} {name} i``; an unreachable
    one gets an error under the number the next reachable one would take."""
    first = f"{verb} {name} 1"
    if path is not None:
        if first not in actions:
            counts[name] = 1
            actions[first] = path
        else:
            counts[name] += 1
            actions[f"{verb} {name} {counts[name]}"] = path
    elif first not in actions:
        errors[first] = f"You cannot {verb} {name} 1, {why}"
    else:
        errors[f"{verb} {name} {counts[name] + 1}"] = f"You cannot {verb} {name} {counts[name] + 1}, {why}"


def _action_table(
    objects: list[Seen],
    barriers: list[Seen],
    carrying: Any,
    pos: tuple[int, int],
    direction: int,
    search: _PathSearch,
) -> tuple[dict[str, list[int]], dict[str, str]]:
    actions: dict[str, list[int]] = {"turn left": [LEFT], "turn right": [RIGHT]}
    errors: dict[str, str] = {}
    no_path = "as there is no path leading to it."

    if not barriers or barriers[0].dis > 1:
        actions["move forward"] = [FORWARD]
    else:
        errors["move forward"] = "There is a barrier in front of you, you can't move forward."

    if carrying is None:
        picked: dict[str, int] = {}
        for seen in objects:
            if any(skip in seen.name for skip in ("wall", "door", "goal")):
                continue
            path = search.path(seen.pos, arrive=False)
            _numbered(
                actions,
                errors,
                picked,
                "pickup",
                seen.name,
                None if path is None else [*path, PICKUP],
                no_path,
            )

    if carrying is not None:
        step = DIR_TO_VEC[direction]
        ahead = (pos[0] + step[0], pos[1] + step[1])
        occupied = any(s.pos == ahead and any(b in s.name for b in _BLOCKING) for s in objects)
        if occupied:
            errors["drop"] = "You cannot drop the object, as there is already an object in front of you."
        else:
            actions["drop"] = [DROP]
    else:
        errors["drop"] = "You cannot drop the object, as you are not carrying anything."

    doors: dict[str, int] = {}
    for seen in objects:
        name = seen.name
        if "door" in name:
            doors[name] = doors.get(name, 0) + 1
        through = f"go through {name} {doors.get(name)}"
        toggle_through = f"toggle and go through {name} {doors.get(name)}"
        if "open door" in name:
            path = search.path(seen.pos, arrive=True)
            if path is not None:
                actions[through] = path
            else:
                errors[through] = f"You cannot go through {name} {doors[name]}, {no_path}"
        if "closed door" in name or "locked door" in name:
            if "locked door" in name:
                if carrying is None or carrying.type != "key":
                    errors[toggle_through] = (
                        f"You cannot toggle and go through {name} {doors[name]}, "
                        "as you are not carrying a key."
                    )
                    continue
                if carrying.color != name.split(" ")[0]:
                    errors[toggle_through] = (
                        f"You cannot toggle and go through {name} {doors[name]}, as the color of the key "
                        "you are carrying does not match the color of door."
                    )
                    continue
            path = search.path(seen.pos, arrive=False)
            if path is not None:
                actions[toggle_through] = [*path, TOGGLE, FORWARD]
            else:  # AgentGym prints the whole counter here
                errors[toggle_through] = f"You cannot toggle and go through {name} {doors}, {no_path}"
            if path == []:
                actions["toggle"] = [TOGGLE]
            if "closed door" in name:
                errors[through] = (
                    f"You cannot go through {name} {doors[name]}, as it is closed. "
                    "You should toggle it first."
                )

    for seen in objects:
        if "goal" not in seen.name:
            continue
        path = search.path(seen.pos, arrive=True)
        if path is not None:
            actions["go to goal"] = path
        else:
            errors["go to goal"] = f"You cannot go to the goal, {no_path}"

    reached: dict[str, int] = {}
    for seen in objects:
        if "wall" in seen.name or "goal" in seen.name:
            continue
        _numbered(actions, errors, reached, "go to", seen.name, search.path(seen.pos, arrive=False), no_path)

    actions[CHECK] = []
    return actions, errors


def available_actions_text(actions: Sequence[str]) -> str:
    """AgentGym's suffix: ``\\nAvailable actions: ["turn left", ...]``."""
    return "\nAvailable actions: [" + ", ".join(f'"{a}"' for a in actions) + "]"
