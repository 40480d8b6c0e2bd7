"""The world cache: LRU bounds, the size setting, and one creation per key under concurrency."""

from __future__ import annotations

import threading
import time

import pytest

from envs.crafter.worlds import CACHE_SIZE_ENV, DEFAULT_CACHE_SIZE, WorldCache, cache_size_from_env


def test_lru_evicts_the_least_recently_used() -> None:
    cache: WorldCache[str] = WorldCache(2)
    cache.put("a", "A")
    cache.put("b", "B")
    assert cache.get("a") == "A"  # "a" is now the most recent
    cache.put("c", "C")
    assert cache.get("b") is None and cache.get("a") == "A" and cache.get("c") == "C"
    assert len(cache) == 2


def test_get_or_create_counts_hits_and_misses() -> None:
    cache: WorldCache[int] = WorldCache(4)
    assert cache.get_or_create("k", lambda: 1) == (1, True)
    assert cache.get_or_create("k", lambda: 2) == (1, False)
    assert (cache.hits, cache.misses) == (1, 1)


def test_size_zero_disables_caching() -> None:
    cache: WorldCache[int] = WorldCache(0)
    calls = []
    for _ in range(3):
        value, created = cache.get_or_create("k", lambda: calls.append(1) or len(calls))
        assert created
    assert len(calls) == 3 and len(cache) == 0


def test_concurrent_misses_create_once() -> None:
    cache: WorldCache[str] = WorldCache(4)
    calls: list[int] = []

    def create() -> str:
        calls.append(1)
        time.sleep(0.2)
        return "world"

    results: list[tuple[str, bool]] = []

    def worker() -> None:
        results.append(cache.get_or_create("k", create))

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert sorted(results) == [("world", False)] * 5 + [("world", True)]


def test_a_failed_creation_lets_waiters_retry() -> None:
    cache: WorldCache[str] = WorldCache(4)
    started = threading.Event()

    def failing() -> str:
        started.set()
        time.sleep(0.1)
        raise RuntimeError("boom")

    errors: list[BaseException] = []

    def first() -> None:
        try:
            cache.get_or_create("k", failing)
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=first)
    thread.start()
    started.wait()
    assert cache.get_or_create("k", lambda: "second") == ("second", True)
    thread.join()
    assert len(errors) == 1 and cache.get("k") == "second"


def test_size_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_SIZE_ENV, raising=False)
    assert cache_size_from_env() == DEFAULT_CACHE_SIZE == 64
    monkeypatch.setenv(CACHE_SIZE_ENV, "0")
    assert cache_size_from_env() == 0
    monkeypatch.setenv(CACHE_SIZE_ENV, "128")
    assert cache_size_from_env() == 128
    monkeypatch.setenv(CACHE_SIZE_ENV, "lots")
    assert cache_size_from_env() == DEFAULT_CACHE_SIZE
    with pytest.raises(ValueError):
        WorldCache(-1)
