"""Garbage-collector thresholds for a serving process.

A rollout allocates many containers (observations, chat messages, parsed replies) that live until
its answer is sent, so CPython's default thresholds (700, 10, 10) scan them young again and again
and run full collections, which walk every live object. In the decision load (decisions.md, "A
serving process collects garbage less often") the collector took 2.1 s of a 5.9 s window with the
defaults, its longest pause 0.46 s, and 0.36–0.43 s with (20000, 50, 1000), the longest 22 ms.
Reference cycles are still collected, only less often.
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
