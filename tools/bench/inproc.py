"""In-process figures: stock Crafter versus our Crafter env, on the current (pinned) core."""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Callable

N_ACTIONS = 17  # crafter's action space


def raw_crafter_steps_per_s(seconds: float, seeds: list[int], action_seed: int) -> float:
    """Stock ``crafter.Env().step`` (it renders its 64x64 frame) with random actions, an equal
    share of ``seconds`` in the world of each seed.

    Only ``step`` calls are timed: world generation and a death's ``reset`` are excluded.
    """
    import crafter

    def stepper(seed: int) -> tuple[Callable[[int], bool], Callable[[], object]]:
        env = crafter.Env(seed=seed)
        env.reset()
        return (lambda action: env.step(action)[2]), env.reset

    return _steps_per_s(stepper, seconds, seeds, action_seed)


def env_steps_per_s(
    seconds: float, seeds: list[int], action_seed: int, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Our `CrafterEnv.step([action])` (text observation built, no pixels), timed like the raw
    figure, in the same worlds (a death resets to the same seed, a cached world). With
    ``clock=time.process_time``: steps per second of this process's CPU."""
    from envs.crafter.env import CrafterConfig, CrafterEnv

    def stepper(seed: int) -> tuple[Callable[[int], bool], Callable[[], object]]:
        env = CrafterEnv(CrafterConfig(), seed)
        env.reset()
        return (lambda action: env.step([action]).done), (lambda: env.reset(seed))

    return _steps_per_s(stepper, seconds, seeds, action_seed, clock)


def _steps_per_s(
    stepper: Callable[[int], tuple[Callable[[int], bool], Callable[[], object]]],
    seconds: float,
    seeds: list[int],
    action_seed: int,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Random actions, ``seconds / len(seeds)`` of stepping per world; steps / stepping time."""
    rng = random.Random(action_seed)
    steps, busy = 0, 0.0
    for seed in seeds:
        step, reset = stepper(seed)
        share = 0.0
        while share < seconds / len(seeds):
            batch_start = clock()
            done = False
            for _ in range(50):
                done = step(rng.randrange(N_ACTIONS))
                steps += 1
                if done:
                    break
            share += clock() - batch_start
            if done:
                reset()
        busy += share
    return steps / busy


def raw_reset_s(count: int, first_seed: int) -> float:
    """Median time of stock ``crafter.Env(seed).reset()`` on never-seen seeds (world generation)."""
    import crafter

    times = []
    for i in range(count):
        env = crafter.Env(seed=first_seed + i)
        t0 = time.perf_counter()
        env.reset()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def env_reset_cached_s(count: int, seed: int) -> float:
    """Median time of `CrafterEnv.reset(seed)` for a seed whose world this process has seen."""
    from envs.crafter.env import CrafterConfig, CrafterEnv

    env = CrafterEnv(CrafterConfig(), seed)
    env.reset(seed)  # generates (or finds) the world
    times = []
    gc.collect()
    for _ in range(count):
        t0 = time.perf_counter()
        env.reset(seed)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]
