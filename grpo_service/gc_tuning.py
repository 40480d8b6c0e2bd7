"""Garbage-collector thresholds for a serving process.

A rollout allocates many short-lived dicts (observations, chat messages, JSON), so CPython's
default thresholds (700, 10, 10) run a young collection every few hundred allocations and a
full one, which walks every live object (finished runs keep their results), every 100 young
ones. Measured with `grpo-service bench` (128 rollouts, 200 ms fake LLM): (20000, 50, 1000)
gave about 20% more decisions per second. Reference cycles are still collected, only less often.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

SERVING_THRESHOLDS = (20_000, 50, 1_000)
_PYTHON_DEFAULTS = (700, 10, 10)


@contextlib.contextmanager
def serving_gc() -> Iterator[None]:
    """Raise the thresholds while serving, unless someone already chose their own; restore after."""
    before = gc.get_threshold()
    tune = before == _PYTHON_DEFAULTS
    if tune:
        gc.set_threshold(*SERVING_THRESHOLDS)
    try:
        yield
    finally:
        if tune and gc.get_threshold() == SERVING_THRESHOLDS:
            gc.set_threshold(*before)
