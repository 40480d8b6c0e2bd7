"""A deterministic, render-free `crafter.Env` with the exact dynamics of a rendering one.

Three changes to stock Crafter 1.8.3, none of which alters its distribution of games:

* ``_balance_object`` sees each chunk's creatures sorted by position. Stock Crafter iterates a
  ``set`` there (memory-address order) before drawing an index from the world RNG, so the
  same seed and actions diverged between runs, processes and restored copies.
* ``_obs`` does not render. At night a render draws ``world.random.uniform(32, 127, shape)``
  for its darkness noise; we make that same draw, so the RNG stream (hence every later
  creature move and spawn) matches a rendering env. When a frame is wanted, ``render_png``
  renders with the noise drawn by the last tick instead of drawing new noise.
* The semantic map crafter builds in every ``step`` is skipped (we read the maps directly).

And one change of speed only: cows, zombies, skeletons and plants update, and the chunks
balance, with stock's logic on Python integers (`envs.crafter.creatures`).

The audit of other id- or hash-ordered iteration: ``World.nearby`` returns a set of objects
but its only caller (``Player._make``) discards it, and its materials are only tested for
membership; ``World.objects`` is in index order; ``World.chunks`` is in key-creation order,
which the state codec preserves; ``Env._unlocked`` is a set of strings, which we only ever
read sorted.
"""

from __future__ import annotations

import collections
import copy
import functools
import io
import threading
from collections.abc import Callable
from typing import Any

import crafter
import numpy as np
from crafter import constants, engine, objects
from PIL import Image

from envs.crafter.actions import ACHIEVEMENTS
from envs.crafter.creatures import UPDATES, balance_chunks

# What each kind of Crafter object is called in observations and snapshots.
OBJECT_NAMES: dict[type, str] = {
    objects.Player: "player",
    objects.Cow: "cow",
    objects.Zombie: "zombie",
    objects.Skeleton: "skeleton",
    objects.Arrow: "arrow",
    objects.Plant: "plant",
    objects.Fence: "fence",  # defined by crafter but never created by any action
}


def _skip_semantic_view() -> None:
    return None


@functools.lru_cache(maxsize=8)
def _vignette(shape: tuple[int, ...], stddev: float) -> np.ndarray:
    # Stock LocalView caches this per view instance with a class-level lru_cache, which keeps
    # up to 10 envs alive; the value depends only on the arguments.
    return engine.LocalView._vignette.__wrapped__(None, shape, stddev)


class _LocalView(engine.LocalView):
    """Crafter's local view, drawing its night noise from ``noise`` rather than the RNG."""

    noise: np.ndarray | None = None

    def _noise(self, canvas: np.ndarray, amount: float, stddev: float) -> np.ndarray:
        noise = self.noise
        if noise is None:
            raise RuntimeError("a night frame was rendered without the noise of its step")
        if noise.shape != canvas.shape[:2]:  # a larger frame: each drawn value covers a block
            rows = np.arange(canvas.shape[0]) * noise.shape[0] // canvas.shape[0]
            cols = np.arange(canvas.shape[1]) * noise.shape[1] // canvas.shape[1]
            noise = noise[np.ix_(rows, cols)]
        mask = amount * _vignette(canvas.shape, stddev)[..., None]
        return (1 - mask) * canvas + mask * noise[..., None]


class SortedBalanceMixin:
    """Balance chunks over their creatures in position order (see the module docstring)."""

    def _balance_object(self, chunk: Any, objs: Any, *args: Any) -> None:
        ordered = sorted(objs, key=lambda obj: (int(obj.pos[0]), int(obj.pos[1])))
        super()._balance_object(chunk, ordered, *args)  # type: ignore[misc]


class DeterministicCrafter(SortedBalanceMixin, crafter.Env):
    """Stock `crafter.Env` dynamics, deterministic, rendering only on request.

    Build instances with ``DeterministicCrafter.create`` (a copy of a template, ~0.01 ms) rather
    than the constructor (~30 ms).
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._local_view = _LocalView(self._world, self._textures, self._local_view._grid)
        self._sem_view = _skip_semantic_view
        unit = self._size // self._view
        self._noise_shape = tuple(int(n) for n in self._local_view._grid * unit)

    @classmethod
    def create(cls, *, length: int, seed: int) -> DeterministicCrafter:
        """A sim with no world yet (a reset builds or installs one). It shares the template's
        read-only parts (textures, view geometry, the material tables) and owns everything a
        step writes. Its world has no generator until the reset: a reset makes one, where a
        copied one (a deep copy's two thirds) would be overwritten at once."""
        template = _template()
        sim = copy.copy(template)
        world = sim._world = copy.copy(template._world)
        world.random = None
        world.daylight = 0.0
        world._chunks = collections.defaultdict(set)
        world._objects = [None]
        world._mat_map = np.zeros_like(template._world._mat_map)
        world._obj_map = np.zeros_like(template._world._obj_map)
        view = sim._local_view = copy.copy(template._local_view)
        view._world = world
        sim._length = length
        sim._seed = seed
        return sim

    # ---------------------------------------------------------------------------------------

    def _obs(self) -> None:
        if self._world.daylight < 0.5:
            self._local_view.noise = self._world.random.uniform(32, 127, self._noise_shape)
        else:
            self._local_view.noise = None
        return None

    def reset_with(self, install: Callable[[DeterministicCrafter], None]) -> None:
        """Start the next episode as ``reset`` does, with ``install`` building the world."""
        self._episode += 1
        self._step = 0
        install(self)
        self._update_time()
        self._last_health = self._player.health
        self._unlocked = set()
        self._obs()

    def world_seed(self, episode: int) -> int:
        """The seed stock crafter gives the world of ``episode`` (1-based)."""
        return hash((self._seed, episode)) % (2**31 - 1)

    def tick(self, action: int) -> tuple[float, list[str]]:
        """One Crafter step: its reward and the achievements first unlocked by it.

        Stock ``Env.step`` without what we never read (its ``info`` dict of copies), and with
        the player-to-object distance of its update loop in Python integers: numpy's
        ``Object.distance`` on two 2-vectors, once per object of the world, was a third of a
        step. The same objects update in the same order, creatures by `creatures.UPDATES`
        (``test_dynamics_match_a_rendering_env``).
        """
        self._step += 1
        self._update_time()
        player = self._player
        player.action = constants.actions[action]
        reach = 2 * max(self._view)
        world = self._world
        px, py = player.pos.tolist()
        for obj in world.objects:
            ox, oy = obj.pos.tolist()
            if abs(ox - px) + abs(oy - py) < reach:
                update = UPDATES.get(type(obj))
                if update is None:
                    obj.update()
                    if obj is player:  # the player moves during its own update only
                        px, py = player.pos.tolist()
                else:
                    update(world, obj)
        if self._step % 10 == 0:
            balance_chunks(world, player)
        self._obs()
        reward = (player.health - self._last_health) / 10
        self._last_health = player.health
        unlocked = [
            name for name in ACHIEVEMENTS if player.achievements[name] > 0 and name not in self._unlocked
        ]
        if unlocked:
            self._unlocked.update(unlocked)
            reward += 1.0
        return (float(reward) if self._reward else 0.0), unlocked

    @property
    def dead(self) -> bool:
        return self._player.health <= 0

    @property
    def over(self) -> bool:
        """The episode has ended, by death or by reaching ``length`` steps."""
        return self.dead or self._step >= self._length

    def render_png(self, size: int | None = None) -> bytes:
        """The frame a rendering env would show now, PNG-encoded. Consumes no randomness.

        ``size`` (pixels per side, default Crafter's 64) above 64 draws the textures at that
        scale; the night noise drawn for the 64-pixel frame is scaled up with them. A night
        frame needs the noise of the last tick (or reset): an env restored from a snapshot
        has none until it steps, and then renders without it rather than fail.
        """
        view = self._local_view
        if view.noise is None and self._world.daylight < 0.5:
            # Restored at night: the noise was drawn before the snapshot. A fixed substitute,
            # from its own generator: the world RNG is never touched.
            view.noise = np.random.default_rng(int(self._step)).uniform(32, 127, self._noise_shape)
        frame = self.render(None if size is None else (size, size))
        buf = io.BytesIO()
        Image.fromarray(frame).save(buf, format="PNG")
        return buf.getvalue()


_template_lock = threading.Lock()
_template_env: DeterministicCrafter | None = None


def _template() -> DeterministicCrafter:
    global _template_env
    if _template_env is None:
        with _template_lock:
            if _template_env is None:
                _template_env = DeterministicCrafter(seed=0)
    return _template_env
