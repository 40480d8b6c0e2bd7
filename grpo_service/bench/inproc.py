"""In-process figures: stock Crafter versus our Crafter env, on the current (pinned) core."""

from __future__ import annotations

import gc
import random
import time

N_ACTIONS = 17  # crafter's action space


def raw_crafter_steps_per_s(seconds: float, seed: int) -> float:
    """Stock ``crafter.Env().step`` (it renders its 64x64 frame) with random actions.

    Only ``step`` calls are timed: a death's ``reset`` (a fresh world) is excluded.
    """
    import crafter

    rng = random.Random(seed)
    env = crafter.Env(seed=seed)
    env.reset()
    steps, busy = 0, 0.0
    while busy < seconds:
        batch_start = time.perf_counter()
        done = False
        for _ in range(50):
            _, _, done, _ = env.step(rng.randrange(N_ACTIONS))
            steps += 1
            if done:
                break
        busy += time.perf_counter() - batch_start
        if done:
            env.reset()
    return steps / busy


def env_steps_per_s(seconds: float, seed: int) -> float:
    """Our `CrafterEnv.step([action])` (text observation built, no pixels), random actions.

    Timed like the raw figure: ``step`` calls only; a death's reset (to the same seed, so a
    cached world) is excluded.
    """
    from envs.crafter.env import CrafterConfig, CrafterEnv

    rng = random.Random(seed)
    env = CrafterEnv(CrafterConfig(), seed)
    env.reset()
    steps, busy = 0, 0.0
    while busy < seconds:
        batch_start = time.perf_counter()
        done = False
        for _ in range(50):
            done = env.step([rng.randrange(N_ACTIONS)]).done
            steps += 1
            if done:
                break
        busy += time.perf_counter() - batch_start
        if done:
            env.reset(seed)
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
