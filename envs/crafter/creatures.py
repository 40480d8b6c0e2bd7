"""Stock Crafter's creature dynamics (their updates, the chunks' balance), on Python integers.

Crafter keeps positions in numpy 2-vectors, so a cow's random step (one ``uniform``, one
``randint``, a lookup, a move) spends most of its time building tiny arrays. The functions here
do what ``Cow.update``, ``Zombie.update``, ``Skeleton.update`` and ``Plant.update`` of Crafter 1.8.3
do, statement for statement: the same RNG draws in the same order, the same moves, the same
damage. Only what they compute on is different. An object stores its position as stock does
(a numpy int64 2-vector), so snapshots, rendering and stock code read it unchanged; a kind not
listed here (the player, arrows, fences) runs its own ``update``.

The balance (every tenth step: spawn or despawn zombies, skeletons and cows per chunk) counts
each chunk's grass and path once per pass rather than once per creature kind, and sorts each
chunk's creatures once (the order `SortedBalanceMixin` defines); its draws and outcomes are
stock ``Env._balance_object``'s.

``test_dynamics_match_a_rendering_env`` holds a world stepped with these to stock Crafter's,
object for object and draw for draw.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from crafter import constants, engine, objects

# `Object.all_dirs`, in its order: `random_dir` draws an index into it.
DIRECTIONS: tuple[tuple[int, int], ...] = ((-1, 0), (+1, 0), (0, -1), (0, +1))
_WALKABLE = frozenset(constants.walkable)  # `Object.walkable` of cows, zombies and skeletons
_HARMS_PLANTS = (objects.Zombie, objects.Skeleton, objects.Cow)


def _sign(value: int) -> int:
    return (value > 0) - (value < 0)


def _toward(dx: int, dy: int, long_axis: bool) -> tuple[int, int]:
    """`Object.toward` for the offset ``(dx, dy)`` to the target."""
    if abs(dx) > abs(dy) if long_axis else abs(dx) <= abs(dy):
        return _sign(dx), 0
    return 0, _sign(dy)


def _object_at(world: engine.World, x: int, y: int) -> Any:
    """``world[(x, y)][1]``: the object there, None outside the area."""
    width, height = world.area
    if 0 <= x < width and 0 <= y < height:
        return world._objects[world._obj_map[x, y]]
    return None


def _move(world: engine.World, obj: objects.Object, x: int, y: int) -> bool:
    """`Object.move` to ``(x, y)`` for a creature that walks on `constants.walkable`."""
    width, height = world.area
    if not (0 <= x < width and 0 <= y < height):
        return False
    obj_map = world._obj_map
    if world._objects[obj_map[x, y]] is not None or world._mat_names[world._mat_map[x, y]] not in _WALKABLE:
        return False
    if obj.removed:  # `World.move` leaves a removed object where it was, and says it moved
        return True
    ox, oy = obj.pos.tolist()
    obj_map[x, y] = obj_map[ox, oy]
    obj_map[ox, oy] = 0
    old_chunk, new_chunk = world.chunk_key((ox, oy)), world.chunk_key((x, y))
    if old_chunk != new_chunk:
        world._chunks[old_chunk].remove(obj)
        world._chunks[new_chunk].add(obj)
    obj.pos = np.array((x, y))
    return True


def update_cow(world: engine.World, cow: objects.Cow) -> None:
    if cow.inventory["health"] <= 0:
        world.remove(cow)
    random = cow.random
    if random.uniform() < 0.5:
        dx, dy = DIRECTIONS[random.randint(0, 4)]
        x, y = cow.pos.tolist()
        _move(world, cow, x + dx, y + dy)


def update_zombie(world: engine.World, zombie: objects.Zombie) -> None:
    if zombie.inventory["health"] <= 0:
        world.remove(zombie)
    random, player = zombie.random, zombie.player
    x, y = zombie.pos.tolist()
    px, py = player.pos.tolist()
    if abs(px - x) + abs(py - y) <= 8 and random.uniform() < 0.9:
        dx, dy = _toward(px - x, py - y, random.uniform() < 0.8)
    else:
        dx, dy = DIRECTIONS[random.randint(0, 4)]
    _move(world, zombie, x + dx, y + dy)
    x, y = zombie.pos.tolist()
    if abs(px - x) + abs(py - y) <= 1:
        if zombie.cooldown:
            zombie.cooldown -= 1
        else:
            player.health -= 7 if player.sleeping else 2
            zombie.cooldown = 5


def update_skeleton(world: engine.World, skeleton: objects.Skeleton) -> None:
    if skeleton.inventory["health"] <= 0:
        world.remove(skeleton)
    skeleton.reload = max(0, skeleton.reload - 1)
    random = skeleton.random
    x, y = skeleton.pos.tolist()
    px, py = skeleton.player.pos.tolist()
    dx, dy = px - x, py - y
    dist = abs(dx) + abs(dy)
    if dist <= 3:
        away_x, away_y = _toward(dx, dy, random.uniform() < 0.6)
        if _move(world, skeleton, x - away_x, y - away_y):
            return
    if dist <= 5 and random.uniform() < 0.5:
        # Stock code from here on: a shot adds an arrow facing this numpy direction.
        skeleton._shoot(np.array(_toward(dx, dy, True)))
    elif dist <= 8 and random.uniform() < 0.3:
        step_x, step_y = _toward(dx, dy, random.uniform() < 0.6)
        _move(world, skeleton, x + step_x, y + step_y)
    elif random.uniform() < 0.2:
        step_x, step_y = DIRECTIONS[random.randint(0, 4)]
        _move(world, skeleton, x + step_x, y + step_y)


def update_plant(world: engine.World, plant: objects.Plant) -> None:
    plant.grown += 1
    x, y = plant.pos.tolist()
    if any(isinstance(_object_at(world, x + dx, y + dy), _HARMS_PLANTS) for dx, dy in DIRECTIONS):
        plant.health -= 1
    if plant.inventory["health"] <= 0:
        world.remove(plant)


# By exact type: a subclass may change what its update does.
UPDATES: dict[type, Callable[[engine.World, Any], None]] = {
    objects.Cow: update_cow,
    objects.Zombie: update_zombie,
    objects.Skeleton: update_skeleton,
    objects.Plant: update_plant,
}


def _zombie_target(light: float, space: int) -> tuple[float, float]:
    return (0 if space < 50 else 3.5 - 3 * light), 3.5 - 3 * light


def _skeleton_target(light: float, space: int) -> tuple[float, float]:
    return (0 if space < 6 else 1), 2


def _cow_target(light: float, space: int) -> tuple[float, float]:
    return (0 if space < 30 else 1), 1.5 + light


# Stock `Env._balance_chunk`'s arguments: kind, material, spawn and despawn distances and
# probabilities, and the (min, max) count wanted given the daylight and the material's cells.
_BALANCE: tuple[
    tuple[type, str, int, int, float, float, Callable[[float, int], tuple[float, float]]], ...
] = (
    (objects.Zombie, "grass", 6, 0, 0.3, 0.4, _zombie_target),
    (objects.Skeleton, "path", 7, 7, 0.1, 0.1, _skeleton_target),
    (objects.Cow, "grass", 5, 5, 0.01, 0.1, _cow_target),
)


def _chunk_counts(world: engine.World, material: str) -> np.ndarray:
    """Cells of ``material`` per chunk, indexed by ``(xmin // chunk width, ymin // chunk height)``."""
    (width, height), (chunk_w, chunk_h) = world.area, world._chunk_size
    cells = world._mat_map == world._mat_ids[material]
    per_column = np.add.reduceat(cells, np.arange(0, width, chunk_w), axis=0, dtype=np.int64)
    return np.add.reduceat(per_column, np.arange(0, height, chunk_h), axis=1)


def _position(obj: objects.Object) -> tuple[int, int]:
    return tuple(obj.pos.tolist())  # type: ignore[return-value]


def balance_chunks(world: engine.World, player: objects.Player) -> None:
    """Stock ``Env.step``'s balance pass: ``_balance_chunk`` of every chunk, in chunk order."""
    light = world.daylight
    random = world.random
    chunk_w, chunk_h = world._chunk_size
    counts = {material: _chunk_counts(world, material) for material in ("grass", "path")}
    for chunk, objs in world.chunks.items():
        xmin, xmax, ymin, ymax = chunk
        ordered = sorted(objs, key=_position)
        for kind, material, span_dist, despan_dist, spawn_prob, despawn_prob, target in _BALANCE:
            creatures = [obj for obj in ordered if isinstance(obj, kind)]
            space = counts[material][xmin // chunk_w, ymin // chunk_h]
            target_min, target_max = target(light, space)
            if len(creatures) < int(target_min) and random.uniform() < spawn_prob:
                mask = world.mask(*chunk, material)
                xs = np.tile(np.arange(xmin, xmax)[:, None], [1, ymax - ymin])[mask]
                ys = np.tile(np.arange(ymin, ymax)[None, :], [xmax - xmin, 1])[mask]
                i = random.randint(0, len(xs))
                pos = np.array((xs[i], ys[i]))
                if world[pos][1] is None and player.distance(pos) >= span_dist:
                    world.add(kind(world, pos, player) if kind is not objects.Cow else kind(world, pos))
            elif len(creatures) > int(target_max) and random.uniform() < despawn_prob:
                obj = creatures[random.randint(0, len(creatures))]
                if player.distance(obj.pos) >= despan_dist:
                    world.remove(obj)
