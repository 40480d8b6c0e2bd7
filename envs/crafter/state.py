"""The Crafter snapshot codec: capture, install, encode and (validating) decode.

A snapshot holds the full live state and nothing constant (no textures): the material map,
every object with its index and per-type fields, the player's stats and hidden counters, the
world RNG state, the order in which chunk keys were created (it fixes the order of chunk
balancing, which draws from the RNG), and the episode counters. Layout::

    b"CRFTSNAP" | format version (u16, big-endian) | zlib(body)
    body = json length (u32, little-endian) | JSON | material map (u8, x-major) | RNG keys
           (624 × u32, little-endian) | PNG of the current frame (image envs only)

Snapshots come back from disk and the network, so they are never pickled, and ``decode``
checks every field (types, ranges, shapes, consistency) before anything is built from it.
"""

from __future__ import annotations

import collections
import io
import json
import math
import struct
import zlib
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
from crafter import constants, objects
from PIL import Image

from envs.crafter.actions import ACHIEVEMENTS
from envs.crafter.sim import OBJECT_NAMES, DeterministicCrafter
from envs.errors import InvalidState

FORMAT_VERSION = 1
MAGIC = b"CRFTSNAP"
_PREFIX = struct.Struct(">8sH")
_U32 = struct.Struct("<I")
_MAX_BODY = 8 * 1024 * 1024
_MAX_SLOTS = 1_000_000  # World._objects never shrinks; a real 10,000-step episode stays far below
_MAX_PNG = 64 * 1024
_RNG_WORDS = 624
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

AREA = (64, 64)
CHUNK = (12, 12)
DIRECTIONS = frozenset({(-1, 0), (1, 0), (0, -1), (0, 1)})
_N_MATERIALS = len(constants.materials)
_ITEM_MAX = {name: int(info["max"]) for name, info in constants.items.items()}
# Per kind of object (the player aside): the most health it can have, and its extra fields
# with their ranges ("step" means 0..the episode's step count).
_KINDS: dict[str, tuple[int, tuple[tuple[str, int, int | str], ...]]] = {
    "cow": (3, ()),
    "zombie": (5, (("cooldown", 0, 5),)),
    "skeleton": (3, (("reload", 0, 4),)),
    "arrow": (0, (("dx", -1, 1), ("dy", -1, 1))),
    "plant": (1, (("grown", 0, "step"),)),
}
_HEADER_KEYS = (
    "format",
    "crafter",
    "config",
    "seed",
    "episode",
    "step",
    "last_health",
    "unlocked",
    "world",
    "png_len",
)
_WORLD_KEYS = ("area", "daylight", "rng", "n_slots", "player", "objects", "chunks")
_PLAYER_KEYS = (
    "index",
    "pos",
    "facing",
    "inventory",
    "achievements",
    "sleeping",
    "action",
    "last_health",
    "hunger",
    "thirst",
    "fatigue",
    "recover",
)
# Ranges the hidden counters keep between steps (each resets to 0 when it passes a bound).
_COUNTERS = {"hunger": (0, 25), "thirst": (0, 20), "fatigue": (-10, 30), "recover": (-15, 25)}


@dataclass(frozen=True, slots=True)
class WorldState:
    """The world and everything in it (player included): what a world cache shares."""

    mat_map: bytes  # AREA uint8, x-major
    rng_keys: bytes  # 624 uint32, little-endian
    rng: tuple[int, int, float]  # MT19937 pos, has_gauss, cached_gaussian
    daylight: float
    n_slots: int  # len(World._objects), removed objects' empty slots included
    player: dict[str, Any]
    objects: tuple[tuple[Any, ...], ...]  # (kind, index, x, y, health, *extra), index order
    chunk_keys: tuple[tuple[int, int, int, int], ...]  # World._chunks, in creation order


@dataclass(frozen=True, slots=True)
class EpisodeState:
    seed: int
    episode: int
    step: int
    last_health: int
    unlocked: tuple[str, ...]  # in ACHIEVEMENTS order


@dataclass(frozen=True, slots=True)
class Snapshot:
    config: dict[str, Any]  # unvalidated: the env validates it with its config model
    episode: EpisodeState
    world: WorldState
    png: bytes | None
    crafter_version: str


# --------------------------------------------------------------------------------------------
# Capture and install (trusted data)
# --------------------------------------------------------------------------------------------


def capture_world(sim: DeterministicCrafter) -> WorldState:
    world = sim._world
    _, keys, pos, has_gauss, gauss = world.random.get_state()
    player = sim._player
    rows: list[tuple[Any, ...]] = []
    player_index = 0
    for index, obj in enumerate(world._objects):
        if obj is None:
            continue
        if obj is player:
            player_index = index
        else:
            rows.append(_object_row(obj, index))
    p = {
        "index": player_index,
        "pos": [int(player.pos[0]), int(player.pos[1])],
        "facing": [int(player.facing[0]), int(player.facing[1])],
        "inventory": {name: int(v) for name, v in player.inventory.items()},
        "achievements": {name: int(v) for name, v in player.achievements.items()},
        "sleeping": bool(player.sleeping),
        "action": player.action,
        "last_health": int(player._last_health),
        "hunger": player._hunger,
        "thirst": player._thirst,
        "fatigue": player._fatigue,
        "recover": player._recover,
    }
    return WorldState(
        mat_map=world._mat_map.tobytes(),
        rng_keys=keys.astype("<u4").tobytes(),
        rng=(int(pos), int(has_gauss), float(gauss)),
        daylight=float(world.daylight),
        n_slots=len(world._objects),
        player=p,
        objects=tuple(rows),
        chunk_keys=tuple(tuple(int(v) for v in key) for key in world._chunks),
    )


def _object_row(obj: objects.Object, index: int) -> tuple[Any, ...]:
    kind = OBJECT_NAMES.get(type(obj))
    if kind not in _KINDS:
        raise TypeError(f"cannot snapshot a crafter object of type {type(obj).__name__}")
    row = (kind, index, int(obj.pos[0]), int(obj.pos[1]), int(obj.health))
    if kind == "zombie":
        return (*row, int(obj.cooldown))
    if kind == "skeleton":
        return (*row, int(obj.reload))
    if kind == "arrow":
        return (*row, int(obj.facing[0]), int(obj.facing[1]))
    if kind == "plant":
        return (*row, int(obj.grown))
    return row


def capture_episode(sim: DeterministicCrafter) -> EpisodeState:
    return EpisodeState(
        seed=int(sim._seed),
        episode=int(sim._episode),
        step=int(sim._step),
        last_health=int(sim._last_health),
        unlocked=tuple(name for name in ACHIEVEMENTS if name in sim._unlocked),
    )


def install_world(sim: DeterministicCrafter, state: WorldState) -> None:
    """Make ``sim``'s world a copy of ``state`` (which must be valid)."""
    world = sim._world
    # The world's own generator is reset in place: building a new one seeds a Mersenne Twister
    # first (a third of a cached reset). Nothing else holds it: each sim has its own world.
    if not isinstance(getattr(world, "random", None), np.random.RandomState):
        world.random = np.random.RandomState(0)
    keys = np.frombuffer(state.rng_keys, "<u4").astype(np.uint32)
    world.random.set_state(("MT19937", keys, *state.rng))
    world.daylight = state.daylight
    world._mat_map = np.frombuffer(state.mat_map, np.uint8).reshape(AREA).copy()
    world._obj_map = np.zeros(AREA, np.uint32)
    world._objects = [None] * state.n_slots
    world._chunks = collections.defaultdict(set)
    for key in state.chunk_keys:
        world._chunks[key] = set()

    p = state.player
    player = objects.Player(world, p["pos"])
    player.facing = (p["facing"][0], p["facing"][1])
    player.inventory = {name: p["inventory"][name] for name in constants.items}
    player.achievements = {name: p["achievements"][name] for name in constants.achievements}
    player.sleeping = p["sleeping"]
    player.action = p["action"]
    player._last_health = p["last_health"]
    player._hunger, player._thirst = p["hunger"], p["thirst"]
    player._fatigue, player._recover = p["fatigue"], p["recover"]
    sim._player = player
    _place(world, player, p["index"])
    for kind, index, x, y, health, *extra in state.objects:
        obj: objects.Object
        if kind == "cow":
            obj = objects.Cow(world, (x, y))
        elif kind == "zombie":
            obj = objects.Zombie(world, (x, y), player)
            obj.cooldown = extra[0]
        elif kind == "skeleton":
            obj = objects.Skeleton(world, (x, y), player)
            obj.reload = extra[0]
        elif kind == "arrow":
            obj = objects.Arrow(world, (x, y), np.array(extra, np.int64))
        else:
            obj = objects.Plant(world, (x, y))
            obj.grown = extra[0]
        obj.inventory["health"] = health
        _place(world, obj, index)


def _place(world: Any, obj: objects.Object, index: int) -> None:
    x, y = int(obj.pos[0]), int(obj.pos[1])
    world._objects[index] = obj
    world._obj_map[x, y] = index
    (csx, csy), (w, h) = world._chunk_size, world.area  # World.chunk_key on Python ints
    xmin, ymin = x // csx * csx, y // csy * csy
    world._chunks[(xmin, min(xmin + csx, w), ymin, min(ymin + csy, h))].add(obj)


# --------------------------------------------------------------------------------------------
# Encode and decode
# --------------------------------------------------------------------------------------------


def encode(
    sim: DeterministicCrafter, *, config: dict[str, Any], crafter_version: str, png: bytes | None
) -> bytes:
    world, ep = capture_world(sim), capture_episode(sim)
    header = {
        "format": FORMAT_VERSION,
        "crafter": crafter_version,
        "config": config,
        "seed": ep.seed,
        "episode": ep.episode,
        "step": ep.step,
        "last_health": ep.last_health,
        "unlocked": list(ep.unlocked),
        "world": {
            "area": list(AREA),
            "daylight": world.daylight,
            "rng": list(world.rng),
            "n_slots": world.n_slots,
            "player": world.player,
            "objects": [list(row) for row in world.objects],
            "chunks": [list(key) for key in world.chunk_keys],
        },
        "png_len": len(png or b""),
    }
    text = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    body = b"".join((_U32.pack(len(text)), text, world.mat_map, world.rng_keys, png or b""))
    return _PREFIX.pack(MAGIC, FORMAT_VERSION) + zlib.compress(body, 6)


def decode(data: bytes) -> Snapshot:
    """Parse and validate a snapshot; ``InvalidState`` on anything wrong."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        _fail(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < _PREFIX.size or data[: len(MAGIC)] != MAGIC:
        _fail("not a Crafter snapshot (bad magic)")
    _, version = _PREFIX.unpack_from(data)
    if version != FORMAT_VERSION:
        _fail(f"unsupported snapshot format version {version} (this build reads {FORMAT_VERSION})")
    body = _decompress(data[_PREFIX.size :])
    try:
        return _decode_body(body)
    except InvalidState:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RecursionError) as exc:
        _fail(f"malformed snapshot ({type(exc).__name__}: {str(exc)[:80]})")


def _decompress(blob: bytes) -> bytes:
    inflater = zlib.decompressobj()
    try:
        body = inflater.decompress(blob, _MAX_BODY)
    except zlib.error as exc:
        _fail(f"corrupt compressed data ({exc})")
    if inflater.unconsumed_tail:
        _fail(f"snapshot body exceeds {_MAX_BODY} bytes")
    if not inflater.eof:
        _fail("truncated snapshot (compressed stream ends early)")
    if inflater.unused_data:
        _fail("trailing bytes after the compressed snapshot")
    return body


def _decode_body(body: bytes) -> Snapshot:
    if len(body) < _U32.size:
        _fail("truncated snapshot body")
    (json_len,) = _U32.unpack_from(body)
    end = _U32.size + json_len
    if end > len(body):
        _fail("truncated snapshot body (header)")
    try:
        header = json.loads(body[_U32.size : end], parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        _fail(f"snapshot header is not valid JSON ({exc})")
    h = _dict(header, "header", _HEADER_KEYS)
    if h["format"] != FORMAT_VERSION:
        _fail(f"header format {h['format']!r} does not match the envelope version {FORMAT_VERSION}")
    if not isinstance(h["crafter"], str):
        _fail("crafter: expected a version string")
    if not isinstance(h["config"], dict):
        _fail("config: expected an object")

    step = _int(h["step"], "step", 0, 10_000_000)
    png_len = _int(h["png_len"], "png_len", 0, _MAX_PNG)
    n_map = AREA[0] * AREA[1]
    n_rng = _RNG_WORDS * 4
    if len(body) != end + n_map + n_rng + png_len:
        _fail(f"snapshot body is {len(body)} bytes; its header describes {end + n_map + n_rng + png_len}")
    mat_map = body[end : end + n_map]
    rng_keys = body[end + n_map : end + n_map + n_rng]
    png = body[end + n_map + n_rng :] or None

    world = _decode_world(h["world"], mat_map, rng_keys, step)
    achievements = world.player["achievements"]
    unlocked = _list(h["unlocked"], "unlocked", max_len=len(ACHIEVEMENTS))
    achieved = {name for name in ACHIEVEMENTS if achievements[name] > 0}
    if len(set(unlocked)) != len(unlocked) or set(unlocked) != achieved:
        _fail("unlocked: must list exactly the achievements with a count above 0")
    episode = EpisodeState(
        seed=_int(h["seed"], "seed", -(2**63), 2**63 - 1),
        episode=_int(h["episode"], "episode", 1, 2**63 - 1),
        step=step,
        last_health=_int(h["last_health"], "last_health", 0, _ITEM_MAX["health"]),
        unlocked=tuple(name for name in ACHIEVEMENTS if name in unlocked),
    )
    if png is not None:
        _check_png(png)
    return Snapshot(config=h["config"], episode=episode, world=world, png=png, crafter_version=h["crafter"])


def _decode_world(raw: Any, mat_map: bytes, rng_keys: bytes, step: int) -> WorldState:
    w = _dict(raw, "world", _WORLD_KEYS)
    if w["area"] != list(AREA):
        _fail(f"world.area: expected {list(AREA)}, got {_show(w['area'])}")
    materials = np.frombuffer(mat_map, np.uint8)
    if materials.min() < 1 or materials.max() > _N_MATERIALS:
        _fail(f"material map: ids must be in 1..{_N_MATERIALS}")
    keys = np.frombuffer(rng_keys, "<u4")
    if not keys.any():
        _fail("rng: the MT19937 state must not be all zeros")
    rng = _list(w["rng"], "world.rng", length=3)
    rng_state = (
        _int(rng[0], "world.rng[0] (pos)", 0, _RNG_WORDS),
        _int(rng[1], "world.rng[1] (has_gauss)", 0, 1),
        float(_num(rng[2], "world.rng[2] (cached_gaussian)", -1e300, 1e300)),
    )
    daylight = float(_num(w["daylight"], "world.daylight", 0.0, 1.0))
    n_slots = _int(w["n_slots"], "world.n_slots", 2, _MAX_SLOTS)

    player = _decode_player(w["player"], step)
    raw_objects = _list(w["objects"], "world.objects", max_len=AREA[0] * AREA[1] - 1)
    rows = [_decode_object(row, f"world.objects[{i}]", step) for i, row in enumerate(raw_objects)]

    indices = [row[1] for row in rows]
    if any(a >= b for a, b in zip(indices, indices[1:], strict=False)):
        _fail("world.objects: indices must be strictly increasing")
    if player["index"] in indices:
        _fail(f"world.player.index {player['index']} is also an object's index")
    if max([player["index"], *indices]) >= n_slots:
        _fail(f"world.objects: an index is >= n_slots ({n_slots})")
    positions = [tuple(player["pos"])] + [(row[2], row[3]) for row in rows]
    if len(set(positions)) != len(positions):
        _fail("world.objects: two objects share a tile")

    raw_chunks = _list(w["chunks"], "world.chunks", max_len=_n_chunks())
    chunks = tuple(_decode_chunk(key, f"world.chunks[{i}]") for i, key in enumerate(raw_chunks))
    if len(set(chunks)) != len(chunks):
        _fail("world.chunks: duplicate chunk key")
    missing = {_chunk_key(pos) for pos in positions} - set(chunks)
    if missing:
        _fail(f"world.chunks: no key for the chunk {sorted(missing)[0]} that holds an object")
    return WorldState(
        mat_map=mat_map,
        rng_keys=rng_keys,
        rng=rng_state,
        daylight=daylight,
        n_slots=n_slots,
        player=player,
        objects=tuple(rows),
        chunk_keys=chunks,
    )


def _decode_player(raw: Any, step: int) -> dict[str, Any]:
    p = _dict(raw, "world.player", _PLAYER_KEYS)
    out: dict[str, Any] = {"index": _int(p["index"], "world.player.index", 1, _MAX_SLOTS)}
    out["pos"] = _pos(p["pos"], "world.player.pos")
    facing = tuple(_list(p["facing"], "world.player.facing", length=2))
    if facing not in DIRECTIONS or not all(type(v) is int for v in facing):
        _fail(f"world.player.facing: expected a unit direction, got {_show(p['facing'])}")
    out["facing"] = list(facing)
    inventory = _dict(p["inventory"], "world.player.inventory", tuple(constants.items))
    out["inventory"] = {
        name: _int(inventory[name], f"world.player.inventory.{name}", 0, _ITEM_MAX[name])
        for name in constants.items
    }
    achievements = _dict(p["achievements"], "world.player.achievements", tuple(constants.achievements))
    out["achievements"] = {
        name: _int(achievements[name], f"world.player.achievements.{name}", 0, step)
        for name in constants.achievements
    }
    out["sleeping"] = _bool(p["sleeping"], "world.player.sleeping")
    if p["action"] not in constants.actions:
        _fail(f"world.player.action: unknown action {_show(p['action'])}")
    out["action"] = p["action"]
    out["last_health"] = _int(p["last_health"], "world.player.last_health", 0, _ITEM_MAX["health"])
    for name, (lo, hi) in _COUNTERS.items():
        out[name] = _num(p[name], f"world.player.{name}", lo, hi)
    return out


def _decode_object(raw: Any, where: str, step: int) -> tuple[Any, ...]:
    row = _list(raw, where, max_len=8)
    if not row or row[0] not in _KINDS:
        _fail(f"{where}: unknown object kind {_show(row[:1])}")
    kind = row[0]
    max_health, extras = _KINDS[kind]
    if len(row) != 5 + len(extras):
        _fail(f"{where}: a {kind} has {5 + len(extras)} fields, got {len(row)}")
    index = _int(row[1], f"{where}.index", 1, _MAX_SLOTS)
    x, y = _pos(row[2:4], f"{where}.pos")
    health = _int(row[4], f"{where}.health", 0, max_health)
    values = [
        _int(value, f"{where}.{name}", lo, step if hi == "step" else hi)
        for value, (name, lo, hi) in zip(row[5:], extras, strict=True)
    ]
    if kind == "arrow" and tuple(values) not in DIRECTIONS:
        _fail(f"{where}: an arrow must fly in a unit direction, got {values}")
    return (kind, index, x, y, health, *values)


def _decode_chunk(raw: Any, where: str) -> tuple[int, int, int, int]:
    key = _list(raw, where, length=4)
    xmin = _int(key[0], where, 0, AREA[0] - 1)
    ymin = _int(key[2], where, 0, AREA[1] - 1)
    expected = _chunk_key((xmin, ymin))
    if tuple(key) != expected or xmin % CHUNK[0] or ymin % CHUNK[1]:
        _fail(f"{where}: {_show(key)} is not a chunk key")
    return expected


def _chunk_key(pos: tuple[int, int]) -> tuple[int, int, int, int]:
    xmin, ymin = (pos[0] // CHUNK[0]) * CHUNK[0], (pos[1] // CHUNK[1]) * CHUNK[1]
    return (xmin, min(xmin + CHUNK[0], AREA[0]), ymin, min(ymin + CHUNK[1], AREA[1]))


def _n_chunks() -> int:
    return -(-AREA[0] // CHUNK[0]) * -(-AREA[1] // CHUNK[1])


def _check_png(png: bytes) -> None:
    if not png.startswith(_PNG_SIGNATURE):
        _fail("image: not a PNG")
    try:
        with Image.open(io.BytesIO(png)) as image:
            image.load()
            ok = image.size == AREA and image.mode == "RGB"
    except (OSError, ValueError, SyntaxError) as exc:
        _fail(f"image: undecodable PNG ({exc})")
    if not ok:
        _fail(f"image: expected a {AREA[0]}x{AREA[1]} RGB frame")


# --------------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------------


def _fail(message: str) -> NoReturn:
    raise InvalidState(f"invalid Crafter snapshot: {message}")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "…"


def _reject_constant(name: str) -> NoReturn:
    _fail(f"non-finite number {name} in header")


def _dict(value: Any, where: str, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        _fail(f"{where}: expected an object, got {type(value).__name__}")
    if set(value) != set(keys):
        extra, missing = sorted(set(value) - set(keys)), sorted(set(keys) - set(value))
        _fail(f"{where}: unexpected keys {extra[:3]}, missing keys {missing[:3]}")
    return value


def _list(value: Any, where: str, *, length: int | None = None, max_len: int | None = None) -> list[Any]:
    if not isinstance(value, list):
        _fail(f"{where}: expected a list, got {type(value).__name__}")
    if length is not None and len(value) != length:
        _fail(f"{where}: expected {length} items, got {len(value)}")
    if max_len is not None and len(value) > max_len:
        _fail(f"{where}: at most {max_len} items, got {len(value)}")
    return value


def _int(value: Any, where: str, lo: int, hi: int) -> int:
    if type(value) is not int or not lo <= value <= hi:
        _fail(f"{where}: expected an integer in {lo}..{hi}, got {_show(value)}")
    return value


def _num(value: Any, where: str, lo: float, hi: float) -> int | float:
    if type(value) not in (int, float) or not math.isfinite(value) or not lo <= value <= hi:
        _fail(f"{where}: expected a number in {lo}..{hi}, got {_show(value)}")
    return value


def _bool(value: Any, where: str) -> bool:
    if type(value) is not bool:
        _fail(f"{where}: expected true or false, got {_show(value)}")
    return value


def _pos(value: Any, where: str) -> list[int]:
    pos = _list(value, where, length=2)
    return [_int(pos[0], f"{where}[0]", 0, AREA[0] - 1), _int(pos[1], f"{where}[1]", 0, AREA[1] - 1)]
