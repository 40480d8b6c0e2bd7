"""Shared fixtures: a real task-app server and a vLLM-shaped fake, both on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from grpo_service import Settings, create_app
from inference.fake_server import FakeConfig, FakeInferenceServer
from inference.server_thread import ServerThread

MODEL = "fake-qwen3"


def make_settings(tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "state_dir": tmp_path / "state",
        "snapshot_secret": "test-secret-" + "x" * 32,
        "default_model": MODEL,
        "reaper_interval_s": 3600.0,
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)


@pytest.fixture(scope="session")
def fake_llm() -> Iterator[FakeInferenceServer]:
    """One fake inference server for the session; tests that change its config restore it."""
    with FakeInferenceServer(FakeConfig(model=MODEL)) as server:
        yield server


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., ServerThread]]:
    """Factory: start a task-app server with settings overrides; all are stopped at teardown."""
    servers: list[ServerThread] = []

    def start(**overrides: Any) -> ServerThread:
        settings = make_settings(tmp_path, **overrides)
        server = ServerThread(create_app(settings), name="task-app").start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def server(start_server: Callable[..., ServerThread], fake_llm: FakeInferenceServer) -> ServerThread:
    return start_server(vllm_base_url=fake_llm.base_url)


@pytest.fixture
def client(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        yield c
