"""Crafter's creature dynamics on Python integers (`envs.crafter.creatures`) against stock
Crafter's own code: one update, or one balance pass, on twin copies of a world, in situations a
random walk seldom reaches (a skeleton in range, a zombie at the player's side, a plant among
cows, a creature already dead, night). Each twin is compared in full: every object, the chunks'
members, the player, the RNG's state."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import numpy as np
import pytest
from crafter import constants, objects

from envs.crafter import state
from envs.crafter.creatures import UPDATES, balance_chunks
from envs.crafter.env import CrafterConfig, CrafterEnv
from envs.crafter.sim import DeterministicCrafter
from envs.crafter.worlds import WorldCache


def _world(seed: int) -> DeterministicCrafter:
    env = CrafterEnv(CrafterConfig(), seed, world_cache=WorldCache(2))
    env.reset()
    return env._sim


def _twins(sim: DeterministicCrafter) -> tuple[DeterministicCrafter, DeterministicCrafter]:
    memo = {id(sim._textures): sim._textures}
    return copy.deepcopy(sim, dict(memo)), copy.deepcopy(sim, dict(memo))


def _everything(sim: DeterministicCrafter) -> tuple[Any, ...]:
    chunks = {
        tuple(int(v) for v in key): sorted((type(obj).__name__, *obj.pos.tolist()) for obj in members)
        for key, members in sim._world._chunks.items()
    }
    arrows = [
        (obj.pos.dtype, np.asarray(obj.facing).dtype)
        for obj in sim._world.objects
        if isinstance(obj, objects.Arrow)
    ]
    return state.capture_world(sim), chunks, arrows


def _free_cells_near(
    sim: DeterministicCrafter, rng: np.random.RandomState, radius: int
) -> list[tuple[int, int]]:
    world, (px, py) = sim._world, sim._player.pos.tolist()
    cells = []
    for x in range(px - radius, px + radius + 1):
        for y in range(py - radius, py + radius + 1):
            material, obj = world[(x, y)]
            if obj is None and material in constants.walkable:
                cells.append((x, y))
    rng.shuffle(cells)
    return cells


def _add(sim: DeterministicCrafter, kind: type, pos: tuple[int, int], rng: np.random.RandomState) -> Any:
    world, player = sim._world, sim._player
    obj = kind(world, pos, player) if kind in (objects.Zombie, objects.Skeleton) else kind(world, pos)
    world.add(obj)
    obj.health = int(rng.choice([0, 1, 3, 5]))
    if kind is objects.Zombie:
        obj.cooldown = int(rng.choice([0, 0, 2]))
    if kind is objects.Skeleton:
        obj.reload = int(rng.choice([0, 0, 1, 3]))
    if kind is objects.Plant:
        obj.grown = int(rng.choice([0, 299, 300, 400]))
    return obj


@pytest.mark.slow  # a sweep: 600 situations, each world copied three times
def test_each_creature_update_is_stocks() -> None:
    seen: Counter[str] = Counter()
    for seed in range(4):
        base = _world(seed)
        rng = np.random.RandomState(seed)
        for trial in range(150):
            kind = (objects.Cow, objects.Zombie, objects.Skeleton, objects.Plant)[trial % 4]
            sim = copy.deepcopy(base, {id(base._textures): base._textures})
            sim._player.sleeping = bool(rng.rand() < 0.3)
            cells = _free_cells_near(sim, rng, radius=9)
            subject = _add(sim, kind, cells[0], rng)
            for pos in cells[1:4]:  # company: neighbours that block moves and harm plants
                _add(sim, (objects.Cow, objects.Zombie, objects.Plant)[int(rng.randint(3))], pos, rng)
            if kind is objects.Plant:  # a cow next to the plant in half the trials
                x, y = subject.pos.tolist()
                for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                    material, obj = sim._world[(x + dx, y + dy)]
                    if obj is None and material in constants.walkable and rng.rand() < 0.5:
                        sim._world.add(objects.Cow(sim._world, (x + dx, y + dy)))
                        break
            sim._world.random.seed(seed * 1000 + trial)
            stock, ours = _twins(sim)
            index = sim._world._obj_map[tuple(subject.pos)]
            before = _everything(stock)
            stock._world._objects[index].update()
            UPDATES[kind](ours._world, ours._world._objects[index])
            after = _everything(stock)
            assert _everything(ours) == after, f"seed {seed} trial {trial} {kind.__name__}"
            seen[kind.__name__] += 1
            seen["moved" if before[0].objects != after[0].objects else "stayed"] += 1
            seen["player hurt"] += (
                after[0].player["inventory"]["health"] < before[0].player["inventory"]["health"]
            )
            seen["arrow shot"] += len(after[2]) > len(before[2])
            seen["removed"] += len(after[0].objects) < len(before[0].objects)
    assert seen["player hurt"] and seen["arrow shot"] and seen["removed"] and seen["moved"], seen


@pytest.mark.slow  # a sweep, as above
def test_balance_pass_is_stocks() -> None:
    changes: Counter[str] = Counter()
    for seed in range(3):
        sim = _world(seed)
        rng = np.random.RandomState(seed)
        for _ in range(40):  # crowd some chunks so that the pass despawns
            cells = _free_cells_near(sim, rng, radius=20)
            _add(sim, (objects.Cow, objects.Zombie)[int(rng.randint(2))], cells[0], rng).health = 3
        for trial in range(60):
            sim._world.daylight = float(rng.choice([0.0, 0.3, 0.8, 1.0]))
            stock, ours = _twins(sim)
            for chunk, members in stock._world.chunks.items():
                stock._balance_chunk(chunk, members)
            balance_chunks(ours._world, ours._player)
            after = _everything(stock)
            assert _everything(ours) == after, f"seed {seed} pass {trial}"
            before_n, after_n = len(sim._world.objects), len(stock._world.objects)
            changes["spawned" if after_n > before_n else "despawned" if after_n < before_n else "same"] += 1
            sim = stock
    assert changes["spawned"] and changes["despawned"], changes
