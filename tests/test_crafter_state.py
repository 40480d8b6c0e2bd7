"""Crafter snapshots: exact continuation after restore, size, and refusal of bad input."""

from __future__ import annotations

import json
import pickle
import struct
import time
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from envs.crafter import state
from envs.crafter.env import CRAFTER_VERSION, CrafterEnv
from envs.crafter.worlds import WorldCache
from envs.errors import EpisodeOver, InvalidState
from tests.test_crafter_env import make_env, make_immortal, random_calls

_ENVELOPE = len(state.MAGIC) + 2


@pytest.fixture(scope="module")
def shared_cache() -> WorldCache:
    return WorldCache(16)


def test_restore_continues_bit_identically(shared_cache: WorldCache) -> None:
    for seed in (0, 3):
        original = make_env(seed, shared_cache)
        original.reset()
        calls = random_calls(seed + 7, 700)
        cut = int(np.random.RandomState(seed).randint(50, 400))  # a random call index
        for call in calls[:cut]:
            make_immortal(original._sim)
            original.step(call)
        blob = original.get_state()
        assert len(blob) < 20_000
        restored = CrafterEnv.from_state(blob)
        assert restored.get_state() == blob
        assert restored.observe() == original.observe()
        for call in calls[cut:]:
            make_immortal(original._sim)
            make_immortal(restored._sim)
            a, b = original.step(call), restored.step(call)
            assert a == b, f"seed {seed}: diverged at step {a.step_idx}"
        assert original.get_state() == restored.get_state()


def test_state_stays_small_in_a_long_episode(shared_cache: WorldCache) -> None:
    env = make_env(0, shared_cache)
    env.reset()
    for call in random_calls(3, 2500):
        make_immortal(env._sim)
        if env.step(call).done:
            break
    blob = env.get_state()
    assert env.step_idx > 2000 and len(blob) < 20_000
    start = time.perf_counter()
    CrafterEnv.from_state(blob)
    assert time.perf_counter() - start < 0.5  # generous; about 1 ms in practice


def test_image_env_and_finished_episode_round_trip(shared_cache: WorldCache) -> None:
    env = make_env(1, shared_cache, image=True, max_steps=200)
    env.reset()
    for _ in range(170):  # into the night: the frame carries darkness noise
        make_immortal(env._sim)
        env.step(["noop"])
    assert env.observe().observation["daylight"] < 0.5
    restored = CrafterEnv.from_state(env.get_state())
    assert restored.observe() == env.observe()
    assert restored.step(["move_left", "do"]) == env.step(["move_left", "do"])

    while not env.done:
        make_immortal(env._sim)
        env.step(["noop"])
    assert env.step_idx == 200
    finished = CrafterEnv.from_state(env.get_state())
    assert finished.done and finished.observe().truncated
    with pytest.raises(EpisodeOver):
        finished.step(["noop"])
    assert finished.reset() == env.reset()


def test_metadata_and_unstarted_env(shared_cache: WorldCache) -> None:
    env = make_env(5, shared_cache)
    with pytest.raises(EpisodeOver):
        env.get_state()
    env.reset()
    env.step(["noop", "noop"])
    meta = env.state_metadata()
    assert meta["crafter_version"] == CRAFTER_VERSION == "1.8.3"
    assert meta["wrapper_version"] == CrafterEnv.version and meta["state_format"] == state.FORMAT_VERSION
    assert (meta["seed"], meta["episode"], meta["step"], meta["env_name"]) == (5, 1, 2, "crafter")
    json.dumps(meta)


# --------------------------------------------------------------------------------------------
# Refusing bad snapshots
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def blob(shared_cache: WorldCache) -> bytes:
    env = make_env(2, shared_cache)
    env.reset()
    env.step(["noop"] * 20)
    assert any(row[0] == "cow" for row in state.decode(env.get_state()).world.objects)
    return env.get_state()


def unpack(data: bytes) -> tuple[dict[str, Any], bytes]:
    body = zlib.decompress(data[_ENVELOPE:])
    (n,) = struct.unpack_from("<I", body)
    return json.loads(body[4 : 4 + n]), body[4 + n :]


def repack(data: bytes, header: dict[str, Any], rest: bytes) -> bytes:
    text = json.dumps(header).encode()
    return data[:_ENVELOPE] + zlib.compress(struct.pack("<I", len(text)) + text + rest)


def test_unchanged_repack_is_accepted(blob: bytes) -> None:
    header, rest = unpack(blob)
    assert CrafterEnv.from_state(repack(blob, header, rest)).get_state() == blob


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(header: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = header
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = value

    return mutate


def _first_cow(header: dict[str, Any]) -> list[Any]:
    return next(row for row in header["world"]["objects"] if row[0] == "cow")


HEADER_MUTATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "format": _set("format", 2),
    "crafter version": _set("crafter", "1.8.2"),
    "unknown config key": _set("config.difficulty", 1),
    "step over max_steps": _set("config.max_steps", 3),
    "negative step": _set("step", -1),
    "string seed": _set("seed", "0"),
    "episode 0": _set("episode", 0),
    "unlocked not achieved": lambda h: h["unlocked"].append("collect_diamond"),
    "extra key": _set("pickle", "x"),
    "missing key": lambda h: h.pop("last_health"),
    "image flag without frame": _set("config.image", True),
    "png length": _set("png_len", 10),
    "area": _set("world.area", [32, 32]),
    "daylight mismatch": _set("world.daylight", 0.123),
    "rng pos": _set("world.rng.0", 625),
    "n_slots too small": _set("world.n_slots", 2),
    "n_slots huge": _set("world.n_slots", 10**12),
    "player index taken": lambda h: _first_cow(h).__setitem__(1, h["world"]["player"]["index"]),
    "object off the map": lambda h: _first_cow(h).__setitem__(2, 64),
    "unknown kind": lambda h: _first_cow(h).__setitem__(0, "dragon"),
    "fence kind": lambda h: _first_cow(h).__setitem__(0, "fence"),
    "cow health": lambda h: _first_cow(h).__setitem__(4, 99),
    "float health": lambda h: _first_cow(h).__setitem__(4, 2.0),
    "extra field": lambda h: _first_cow(h).append(1),
    "shared tile": lambda h: _first_cow(h).__setitem__(slice(2, 4), h["world"]["player"]["pos"]),
    "indices out of order": lambda h: h["world"]["objects"].reverse(),
    "no chunks": _set("world.chunks", []),
    "bad chunk key": _set("world.chunks.0", [1, 13, 0, 12]),
    "duplicate chunk": lambda h: h["world"]["chunks"].append(h["world"]["chunks"][0]),
    "inventory over max": _set("world.player.inventory.wood", 10),
    "inventory missing item": lambda h: h["world"]["player"]["inventory"].pop("coal"),
    "diagonal facing": _set("world.player.facing", [1, 1]),
    "bool as int": _set("world.player.sleeping", 1),
    "unknown action": _set("world.player.action", "fly"),
    "counter out of range": _set("world.player.hunger", 1e9),
    "achievement count over step": _set("world.player.achievements.wake_up", 10_000),
    "objects not a list": _set("world.objects", {"0": 1}),
    "header not an object": lambda h: h.clear() or h.update({"format": [1]}),
}


@pytest.mark.parametrize("name", sorted(HEADER_MUTATIONS))
def test_tampered_header_is_refused(blob: bytes, name: str) -> None:
    header, rest = unpack(blob)
    HEADER_MUTATIONS[name](header)
    with pytest.raises(InvalidState, match="snapshot|crafter"):
        CrafterEnv.from_state(repack(blob, header, rest))


def _with_body(blob: bytes, edit: Callable[[bytearray], None]) -> bytes:
    header, rest = unpack(blob)
    body = bytearray(rest)
    edit(body)
    return repack(blob, header, bytes(body))


def _zeros(start: int, stop: int) -> Callable[[bytearray], None]:
    def edit(body: bytearray) -> None:
        body[start:stop] = bytes(stop - start)

    return edit


RAW_MUTATIONS: dict[str, Callable[[bytes], bytes]] = {
    "empty": lambda b: b"",
    "magic only": lambda b: state.MAGIC,
    "truncated by one byte": lambda b: b[:-1],
    "truncated to 20 bytes": lambda b: b[:20],
    "trailing garbage": lambda b: b + b"\x00",
    "wrong magic": lambda b: b"PICKLE!!" + b[8:],
    "future version": lambda b: b[:8] + struct.pack(">H", 99) + b[10:],
    "flipped byte": lambda b: b[:40] + bytes([b[40] ^ 0xFF]) + b[41:],
    "random bytes": lambda b: np.random.RandomState(0).bytes(len(b)),
    "a pickle": lambda b: pickle.dumps({"step": 1}),
    "compression bomb": lambda b: b[:_ENVELOPE] + zlib.compress(bytes(64 * 1024 * 1024), 9),
    "header not json": lambda b: (
        b[:_ENVELOPE] + zlib.compress(struct.pack("<I", 3) + b"\xff{[" + bytes(6592))
    ),
    "header with NaN": lambda b: repack(b, {**unpack(b)[0], "step": float("nan")}, unpack(b)[1]),
    "body one byte short": lambda b: _with_body(b, lambda body: body.pop()),
    "material id 0": lambda b: _with_body(b, _zeros(0, 1)),
    "material id 200": lambda b: _with_body(b, lambda body: body.__setitem__(5, 200)),
    "all-zero rng": lambda b: _with_body(b, _zeros(4096, 4096 + 2496)),
}


@pytest.mark.parametrize("name", sorted(RAW_MUTATIONS))
def test_corrupt_bytes_are_refused(blob: bytes, name: str) -> None:
    with pytest.raises(InvalidState):
        CrafterEnv.from_state(RAW_MUTATIONS[name](blob))
