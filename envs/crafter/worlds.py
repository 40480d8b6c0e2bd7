"""A bounded, thread-safe LRU cache of freshly generated Crafter worlds.

Generating a world takes about a second of pure-Python noise; GRPO resets the same seed once
per rollout of a group. Entries are immutable `WorldState` values (a few KB each), installed
into an env by copying, so a cached reset costs about a millisecond and is bit-identical to a
fresh one. Concurrent resets of one uncached seed generate it once: the others wait for it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

CACHE_SIZE_ENV = "GRPO_WORLD_CACHE_SIZE"
DEFAULT_CACHE_SIZE = 64

V = TypeVar("V")


@dataclass(slots=True)
class _Pending(Generic[V]):
    done: threading.Event = field(default_factory=threading.Event)
    value: V | None = None


class WorldCache(Generic[V]):
    """LRU of ``max_entries`` values (0 disables caching) with single-flight creation."""

    def __init__(self, max_entries: int = DEFAULT_CACHE_SIZE) -> None:
        if max_entries < 0:
            raise ValueError(f"max_entries must be >= 0, got {max_entries}")
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[Hashable, V] = OrderedDict()
        self._pending: dict[Hashable, _Pending[V]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key: Hashable, value: V) -> None:
        if self.max_entries == 0:
            return
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def get_or_create(self, key: Hashable, create: Callable[[], V]) -> tuple[V, bool]:
        """The cached value for ``key``, or ``create()``'s; the flag is true if this call created it.

        While one thread creates a key, other callers for that key wait for its result.
        """
        if self.max_entries == 0:
            return create(), True
        while True:
            with self._lock:
                value = self._entries.get(key)
                if value is not None:
                    self._entries.move_to_end(key)
                    self.hits += 1
                    return value, False
                pending = self._pending.get(key)
                owner = pending is None
                if owner:
                    pending = self._pending[key] = _Pending()
                    self.misses += 1
            assert pending is not None
            if not owner:
                pending.done.wait()
                if pending.value is not None:
                    return pending.value, False
                continue  # the creator failed: try again (and maybe create it ourselves)
            try:
                value = create()
                pending.value = value
                self.put(key, value)
                return value, True
            finally:
                with self._lock:
                    del self._pending[key]
                pending.done.set()


def cache_size_from_env() -> int:
    raw = os.environ.get(CACHE_SIZE_ENV, "").strip()
    if not raw:
        return DEFAULT_CACHE_SIZE
    try:
        size = int(raw)
        if size < 0:
            raise ValueError
    except ValueError:
        log.warning("ignoring %s=%r (not an integer >= 0); using %d", CACHE_SIZE_ENV, raw, DEFAULT_CACHE_SIZE)
        return DEFAULT_CACHE_SIZE
    return size


_default_lock = threading.Lock()
_default_cache: WorldCache | None = None


def default_world_cache() -> WorldCache:
    """The process-wide cache, sized by ``GRPO_WORLD_CACHE_SIZE`` when first used."""
    global _default_cache
    if _default_cache is None:
        with _default_lock:
            if _default_cache is None:
                _default_cache = WorldCache(cache_size_from_env())
    return _default_cache
