"""CrafterEnv against real Crafter 1.8.3: contract, rewards, determinism, RNG compatibility."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import crafter
import numpy as np
import pytest
from crafter import constants
from PIL import Image

from envs.base import StepResult, environment_class
from envs.crafter import state
from envs.crafter.actions import ACHIEVEMENTS, ACTIONS
from envs.crafter.env import CrafterConfig, CrafterEnv
from envs.crafter.observation import ITEMS, VITALS
from envs.crafter.sim import SortedBalanceMixin
from envs.crafter.worlds import WorldCache
from envs.errors import EpisodeOver, InvalidAction, InvalidConfig

REPO = Path(__file__).resolve().parent.parent
MOVES = {"move_left": (-1, 0), "move_right": (1, 0), "move_up": (0, -1), "move_down": (0, 1)}


class RenderingCrafter(SortedBalanceMixin, crafter.Env):
    """Stock Crafter, rendering every step, with only the determinism patch."""


@pytest.fixture(scope="module")
def shared_cache() -> WorldCache:
    """For tests that need a world but not a freshly generated one."""
    return WorldCache(16)


def make_env(seed: int = 0, cache: WorldCache | None = None, **config: Any) -> CrafterEnv:
    """An env with a private world cache unless ``cache`` is given (fresh worlds by default)."""
    return CrafterEnv(CrafterConfig(**config), seed, world_cache=WorldCache(4) if cache is None else cache)


def result_record(result: StepResult) -> str:
    return json.dumps(
        [result.observation, result.reward, result.done, result.truncated, result.info, result.step_idx],
        sort_keys=True,
    )


def random_calls(seed: int, n_actions: int) -> list[list[int]]:
    """Random action lists of 1-4 actions, ``n_actions`` in all."""
    rng = np.random.RandomState(seed)
    calls: list[list[int]] = []
    while n_actions > 0:
        k = min(n_actions, int(rng.randint(1, 5)))
        calls.append([int(a) for a in rng.randint(0, len(ACTIONS), k)])
        n_actions -= k
    return calls


def trajectory_digest(seed: int, n_actions: int) -> str:
    """SHA-256 over every result (and the final state) of ``n_actions`` random actions."""
    env = make_env(seed)
    digest = hashlib.sha256(result_record(env.reset()).encode())
    for call in random_calls(seed + 1000, n_actions):
        result = env.step(call)
        digest.update(result_record(result).encode())
        if result.done:
            digest.update(result_record(env.reset(seed=seed)).encode())
    digest.update(env.get_state())
    return digest.hexdigest()


def safe_random_action(sim: Any, rng: np.random.RandomState) -> int:
    """A random action, except that walking into lava becomes a noop."""
    action = int(rng.randint(0, len(ACTIONS)))
    move = MOVES.get(ACTIONS[action])
    if move and sim._world[sim._player.pos + np.array(move)][0] == "lava":
        return 0
    return action


def make_immortal(sim: Any) -> None:
    for name in VITALS:
        sim._player.inventory[name] = 9


# --------------------------------------------------------------------------------------------
# Contract
# --------------------------------------------------------------------------------------------


def test_registered_and_matches_crafter_constants() -> None:
    assert environment_class("crafter") is CrafterEnv
    assert tuple(constants.actions) == ACTIONS
    assert tuple(constants.achievements) == ACHIEVEMENTS


def test_config_validation() -> None:
    with pytest.raises(InvalidConfig):
        CrafterEnv.create({"difficulty": "hard"}, 0)
    with pytest.raises(InvalidConfig):
        CrafterEnv.create({"max_steps": 0}, 0)
    with pytest.raises(InvalidConfig):
        CrafterEnv.create({"max_steps": 10_001}, 0)
    with pytest.raises(InvalidConfig):
        CrafterEnv.create({}, "seven")  # type: ignore[arg-type]
    env = CrafterEnv.create(None, None)
    assert env.seed == 0 and env.config.max_steps == 10_000 and env.config.image is False


def test_observation_contract(shared_cache: WorldCache) -> None:
    env = make_env(1, shared_cache)
    result = env.reset()
    assert (result.reward, result.done, result.truncated, result.step_idx) == (0.0, False, False, 0)
    for call in random_calls(5, 40):
        result = env.step(call)
    obs = result.observation
    json.dumps(obs)  # JSON-safe
    assert set(obs) == {
        "text", "step_idx", "max_steps", "status", "inventory", "position", "facing", "facing_target",
        "achievements", "sleeping", "daylight", "local_view",
    }  # fmt: skip
    assert obs["step_idx"] == result.step_idx == 40 and obs["max_steps"] == 10_000
    assert list(obs["status"]) == list(VITALS) and all(0 <= v <= 9 for v in obs["status"].values())
    assert list(obs["inventory"]) == list(ITEMS) and len(ITEMS) == 12
    assert list(obs["achievements"]) == list(ACHIEVEMENTS)
    assert all(type(v) is bool for v in obs["achievements"].values())
    assert isinstance(obs["text"], str) and 150 < len(obs["text"]) < 900

    sim, (x, y) = env._sim, obs["position"]
    view = obs["local_view"]
    assert len(view) == 7 and all(len(row) == 9 for row in view) and view[3][4] == "player"
    for row, dy in enumerate(range(-3, 4)):
        for col, dx in enumerate(range(-4, 5)):
            material, obj = sim._world[(x + dx, y + dy)]
            expected = type(obj).__name__.lower() if obj else (material or "out_of_bounds")
            assert view[row][col] == expected
    dx, dy = obs["facing"]
    assert obs["facing_target"] == view[3 + dy][4 + dx]
    assert env.observe().observation == obs  # observe() does not advance
    assert env.observe().step_idx == 40


def test_local_view_at_the_edge_of_the_world(shared_cache: WorldCache) -> None:
    env = make_env(1, shared_cache)
    env.reset()
    sim = env._sim
    sim._world.move(sim._player, (1, 0))  # teleport next to the north-west corner
    obs = env.observe().observation
    x, y = obs["position"]
    assert (x, y) == (1, 0)
    for row, dy in enumerate(range(-3, 4)):
        for col, dx in enumerate(range(-4, 5)):
            inside = 0 <= x + dx < 64 and 0 <= y + dy < 64
            assert (obs["local_view"][row][col] == "out_of_bounds") == (not inside)


# --------------------------------------------------------------------------------------------
# Hand-checked episodes
# --------------------------------------------------------------------------------------------


def test_collect_wood_rewards(shared_cache: WorldCache) -> None:
    # Seed 1 spawns the player at (32, 32) with a tree 4 tiles to the right.
    env = make_env(1, shared_cache)
    assert env.reset().observation["local_view"][3][8] == "tree"

    walk = env.step(["move_right"] * 3)
    assert (walk.reward, walk.done, walk.step_idx) == (0.0, False, 3)
    assert walk.observation["position"] == [35, 32] and walk.observation["facing_target"] == "tree"

    chop = env.step(["do"])
    assert chop.reward == 1.0 and chop.done is False and chop.truncated is False
    assert chop.info["achievements_unlocked"] == ["collect_wood"]
    assert chop.info["rewards"] == [1.0] and chop.info["actions"] == ["do"] and chop.info["dead"] is False
    assert chop.observation["inventory"]["wood"] == 1 and chop.observation["achievements"]["collect_wood"]
    assert chop.observation["facing_target"] == "grass"  # in Crafter 1.8.3 a chopped tree becomes grass

    env.step(["move_up", "move_right"])  # face the next tree
    again = env.step([ACTIONS.index("do")])
    assert again.reward == 0.0 and again.info["achievements_unlocked"] == []
    assert again.observation["inventory"]["wood"] == 2 and again.step_idx == 7


def test_death_in_lava(shared_cache: WorldCache) -> None:
    env = make_env(1, shared_cache)
    env.reset()
    sim = env._sim
    sim._world[(33, 32)] = "lava"  # the tile to the right of the spawn
    result = env.step(["move_right", "noop", "noop"])
    assert result.done is True and result.truncated is False and result.info["dead"] is True
    assert result.reward == -0.9 and result.info["rewards"] == [result.reward]
    assert result.info["actions_executed"] == 1 and result.info["actions"] == ["move_right"]
    assert result.observation["status"]["health"] == 0 and env.done
    with pytest.raises(EpisodeOver):
        env.step(["noop"])
    assert env.observe().done is True
    assert env.reset().done is False


def test_step_cap_truncates(shared_cache: WorldCache) -> None:
    env = make_env(1, shared_cache, max_steps=5)
    env.reset()
    for i in range(1, 5):
        result = env.step(["noop"])
        assert (result.done, result.truncated, result.step_idx) == (False, False, i)
    result = env.step(["noop"])
    assert (result.done, result.truncated, result.step_idx, result.info["dead"]) == (True, True, 5, False)
    assert result.observation["max_steps"] == 5
    with pytest.raises(EpisodeOver):
        env.step(["noop"])

    env.reset()
    result = env.step(["noop"] * 8)  # stops at the cap
    assert result.info["actions_executed"] == 5 and result.done and result.truncated and result.step_idx == 5


def test_invalid_actions_execute_nothing(shared_cache: WorldCache) -> None:
    env = make_env(1, shared_cache)
    with pytest.raises(EpisodeOver):
        env.step(["noop"])  # not reset yet
    env.reset()
    env.step(["move_up", 2])
    before = env.get_state()
    for bad in (["noop", "fly"], ["noop", 17], [-1], [True], [], "noop", [None]):
        with pytest.raises(InvalidAction):
            env.step(bad)  # type: ignore[arg-type]
        assert env.step_idx == 2
    assert env.get_state() == before
    tool_call = {"tool": "interact_many", "args": {"actions": ["do", "noop"]}}
    assert env.actions_from_tool_calls([tool_call]) == [5, 0]


def test_close_is_idempotent(shared_cache: WorldCache) -> None:
    env = make_env(1, shared_cache)
    env.reset()
    env.close()
    env.close()
    with pytest.raises(EpisodeOver):
        env.step(["noop"])


# --------------------------------------------------------------------------------------------
# Seeding and determinism
# --------------------------------------------------------------------------------------------


def test_reset_seeding_follows_stock_crafter() -> None:
    cache = WorldCache(8)
    env = make_env(11, cache)
    env.reset(seed=7)
    second = env.reset()  # episode 2 of seed 7
    assert second.info["episode"] == 2 and second.info["seed"] == 7
    world_seeds = {key[0] for key in cache._entries}
    assert world_seeds == {hash((7, 1)) % (2**31 - 1), hash((7, 2)) % (2**31 - 1)}

    stock = crafter.Env(seed=7)
    stock._episode = 1
    stock.reset()
    assert np.array_equal(stock._world._mat_map, env._sim._world._mat_map)

    again = env.reset(seed=7)  # back to episode 1, served by the cache
    assert again.info["episode"] == 1 and cache.hits == 1


@pytest.mark.slow
def test_twenty_seeds_two_envs_agree() -> None:
    for seed in range(20):
        cache = WorldCache(4)  # private: the first env generates the world, the second reuses it
        first, second = make_env(seed, cache), make_env(seed, cache)
        assert first.reset() == second.reset()
        assert cache.misses == 1 and cache.hits == 1
        for call in random_calls(seed, 500):
            a, b = first.step(call), second.step(call)
            assert a == b, f"seed {seed} diverged at step {a.step_idx}"
            if a.done:
                assert first.reset(seed=seed) == second.reset(seed=seed)
        assert first.get_state() == second.get_state()


@pytest.mark.slow
def test_same_digest_across_processes_and_hash_seeds() -> None:
    code = "import sys; from test_crafter_env import trajectory_digest; print(trajectory_digest(3, 1000))"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=REPO / "tests",
            env={**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for hash_seed in ("0", "4242")
    ]
    local = trajectory_digest(3, 1000)
    outputs = [proc.communicate(timeout=120)[0].strip() for proc in procs]
    assert all(proc.returncode == 0 for proc in procs)
    assert outputs == [local, local]


@pytest.mark.slow
def test_dynamics_match_a_rendering_env() -> None:
    """650 steps (two nights) per seed; the render-free env draws the RNG exactly as rendering does."""
    for seed in (0, 2, 5):
        ours = make_env(seed)
        reference = RenderingCrafter(seed=seed)
        ours.reset()
        reference.reset()
        assert state.capture_world(ours._sim) == state.capture_world(reference)  # == stock's first world
        rng = np.random.RandomState(seed)
        for step in range(1, 651):
            make_immortal(ours._sim)
            make_immortal(reference)
            action = safe_random_action(reference, rng)
            result = ours.step([action])
            _, reward, done, _ = reference.step(action)
            where = f"seed {seed} step {step}"
            assert (result.reward, result.done) == (reward, done), where
            assert state.capture_world(ours._sim) == state.capture_world(reference), where
        assert reference._step == 650


def test_image_frames_equal_stock_render(shared_cache: WorldCache) -> None:
    env = make_env(2, shared_cache, image=True)
    reference = RenderingCrafter(seed=2)
    frame = reference.reset()
    result = env.reset()
    rng = np.random.RandomState(9)
    nights = 0
    while result.step_idx < 300:
        assert np.array_equal(_decode_png(result.observation["image_png_base64"]), frame)
        make_immortal(env._sim)
        make_immortal(reference)
        call = [safe_random_action(reference, rng) for _ in range(int(rng.randint(1, 4)))]
        result = env.step(call)
        for action in result.info["actions"]:
            frame, *_ = reference.step(ACTIONS.index(action))
        nights += result.observation["daylight"] < 0.5
        assert not result.done
    assert nights > 20  # the comparison covered night frames (darkness noise)
    assert env.observe().observation["image_png_base64"] == result.observation["image_png_base64"]


def _decode_png(data: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB"))


def test_cached_reset_equals_fresh_generation() -> None:
    cache = WorldCache(4)
    donor = make_env(4, cache)
    donor.reset()
    for call in random_calls(1, 100):  # change the donor's copy of the world
        if donor.step(call).done:
            break
    cached = make_env(4, cache)
    fresh = make_env(4, WorldCache(0))
    assert cached.reset() == fresh.reset()
    assert cache.hits == 1
    for call in random_calls(4, 300):
        make_immortal(cached._sim)
        make_immortal(fresh._sim)
        a, b = cached.step(call), fresh.step(call)
        assert a == b and not a.done
    assert a.step_idx == 300 and cached.get_state() == fresh.get_state()
    # a cached world installed over a played one (its generator reset in place)
    assert cached.reset(4) == fresh.reset(4)
    assert cache.hits == 2
    for call in random_calls(5, 100):
        a, b = cached.step(call), fresh.step(call)
        assert a == b
        if a.done:
            break
    assert cached.get_state() == fresh.get_state()
