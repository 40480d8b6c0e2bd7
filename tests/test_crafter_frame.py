"""`CrafterEnv.render_frame`, the viewer's frame hook: a picture of the current state that never
changes the game (no state, no RNG draws), by day, by night and right after a restore."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from envs.base import Frame
from envs.crafter.env import FRAME_SIZE, CrafterEnv

SEED = 3  # survives to the first night


def _pixels(frame: Frame) -> np.ndarray:
    assert frame.png is not None and frame.text is None
    image = Image.open(io.BytesIO(frame.png))
    assert image.format == "PNG"
    return np.asarray(image.convert("RGB"))


def _to_night(env: CrafterEnv, render_every: int = 0) -> int:
    """Wait, then sleep, until it is dark (rendering every ``render_every`` ticks); return the ticks."""
    ticks = 0
    while env._sim._world.daylight >= 0.35:  # noqa: SLF001 - the test needs the clock
        env.step(["noop" if ticks < 100 else "sleep"])
        ticks += 1
        if render_every and ticks % render_every == 0:
            env.render_frame()
        assert not env.done and ticks < 1000
    return ticks


def test_frame_is_a_png_of_the_frame_size() -> None:
    env = CrafterEnv.create({}, SEED)
    env.reset()
    pixels = _pixels(env.render_frame())
    assert pixels.shape == (FRAME_SIZE, FRAME_SIZE, 3)
    assert pixels.std() > 10  # a drawn world, not a blank canvas


def test_rendering_never_changes_the_game_by_day_or_night() -> None:
    rendering, plain = CrafterEnv.create({}, SEED), CrafterEnv.create({}, SEED)
    rendering.reset(), plain.reset()
    ticks = _to_night(rendering, render_every=5)
    assert _to_night(plain) == ticks
    for _ in range(12):  # at night every tick draws noise from the world RNG: renders must not
        a, b = rendering.step(["noop"]), plain.step(["noop"])
        night = _pixels(rendering.render_frame())
        assert a.observation == b.observation
    assert rendering.get_state() == plain.get_state()
    day = CrafterEnv.create({}, SEED)
    day.reset()
    grass = slice(0, FRAME_SIZE * 7 // 9)  # the local view; the inventory is below it
    assert night[grass, :, 1].mean() < 0.75 * _pixels(day.render_frame())[grass, :, 1].mean()


def test_a_night_frame_right_after_restore_renders_and_changes_nothing() -> None:
    env = CrafterEnv.create({}, SEED)
    env.reset()
    _to_night(env)
    restored = CrafterEnv.from_state(env.get_state())
    assert _pixels(restored.render_frame()).shape == (FRAME_SIZE, FRAME_SIZE, 3)
    assert restored.step(["noop"]).observation == env.step(["noop"]).observation
    assert restored.get_state() == env.get_state()
    # After a tick the frame uses that tick's noise again: identical in both envs.
    assert np.array_equal(_pixels(restored.render_frame()), _pixels(env.render_frame()))
