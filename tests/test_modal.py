"""The Modal deployment (main.py, modal_vllm.py), checked offline: no token, no network.

Nothing here reaches Modal's servers: the Volume is a fake with ``commit``/``reload``, and the
function configurations are read by recording the arguments given to Modal's decorators.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sqlite3
import subprocess
import sys
import tomllib
import warnings
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import modal
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

import main
from grpo_service import create_app
from tests.conftest import make_settings

ROOT = Path(__file__).resolve().parents[1]
KEY = "modal-test-key"
SECRET = "modal-test-secret-" + "s" * 32


class FakeVolume:
    def __init__(self) -> None:
        self.commits = 0
        self.reloads = 0

    def commit(self) -> None:
        self.commits += 1

    def reload(self) -> None:
        self.reloads += 1


def offline_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODAL_", "GRPO_VLLM_"))}
    # An unreachable server and an empty config: any call to Modal would fail at once.
    env.update(
        MODAL_SERVER_URL="http://127.0.0.1:9", MODAL_CONFIG_PATH=str(home / ".modal.toml"), HOME=str(home)
    )
    return env


@pytest.fixture
def container(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, FakeVolume]]:
    """What `fastapi_app` sees in a container: the secret's variables, and the Volume (faked)."""
    state, vol = tmp_path / "volume", FakeVolume()
    monkeypatch.setattr(main, "STATE_ROOT", state)
    monkeypatch.setattr(main, "volume", vol)
    for name in ("ALLOW_INSECURE", "DEFAULT_MODEL", "STATE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ENVIRONMENT_API_KEY", KEY)
    monkeypatch.setenv("SNAPSHOT_SECRET", SECRET)
    monkeypatch.setenv("TRACE_DB", str(tmp_path / "local-disk" / "traces.db"))
    yield state, vol


def local_app() -> FastAPI:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "executing locally ... no access to the mounted Volume"
        return main.fastapi_app.local()


def operations(app: FastAPI) -> set[tuple[str, str]]:
    return {(path, method) for path, item in app.openapi()["paths"].items() for method in item}


def load_recorded(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, dict[str, list[Any]]]:
    """Execute ``path`` as a fresh module, recording the arguments of Modal's builders."""
    calls: dict[str, list[Any]] = defaultdict(list)

    def record(owner: Any, name: str) -> None:
        real = getattr(owner, name)

        def spy(*args: Any, **kwargs: Any) -> Any:
            calls[name].append((args, kwargs))
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, spy)

    record(modal.App, "function")
    record(modal.App, "server")
    record(modal.Image, "pip_install_from_pyproject")
    record(modal.Image, "env")
    for decorator in ("concurrent", "asgi_app", "web_server", "sessioned"):
        record(modal, decorator)
    spec = importlib.util.spec_from_file_location(f"_recorded_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, calls


# ------------------------------------------------------------------------------------- imports


def test_modules_import_offline_and_create_nothing(tmp_path: Path) -> None:
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    code = (
        "import main, modal_vllm\n"
        "assert type(main.modal_app).__name__ == 'App' and type(modal_vllm.app).__name__ == 'App'\n"
        "print(main.modal_app.name, modal_vllm.app.name)\n"
    )
    env = offline_env(home) | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["grpo-service", "grpo-vllm"]
    assert list(cwd.iterdir()) == [], "importing main.py must not create STATE_DIR or anything else"


def test_app_attribute_is_the_task_app_for_uvicorn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from uvicorn.importer import import_from_string

    monkeypatch.setenv("STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delitem(main.__dict__, "app", raising=False)
    served = import_from_string("main:app")
    assert isinstance(served, FastAPI)
    assert main.app is served  # built once
    monkeypatch.delitem(main.__dict__, "app")


def test_modal_cli_finds_the_modal_app(monkeypatch: pytest.MonkeyPatch) -> None:
    """`modal deploy main.py` looks up a Modal App named `app` in main.py: it gets `modal_app`."""
    from modal.cli.import_refs import import_app_from_ref, parse_import_ref

    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/modal", "deploy", "main.py"])
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setitem(sys.modules, "main", main)  # the CLI re-imports main.py; restored after
    found = import_app_from_ref(parse_import_ref(str(ROOT / "main.py")))
    assert isinstance(found, modal.App)
    assert found.name == main.APP_NAME
    assert "app" not in sys.modules["main"].__dict__, "the CLI must not build the FastAPI app"


# ------------------------------------------------------------------------------- the container


def test_asgi_function_serves_every_route(container: tuple[Path, FakeVolume], tmp_path: Path) -> None:
    state, _ = container
    web = local_app()
    assert isinstance(web, FastAPI)
    reference = create_app(make_settings(tmp_path / "reference"))
    assert operations(web) == operations(reference)
    assert web.state.settings.state_dir == state
    with TestClient(web) as client:
        assert client.get("/health").status_code == 200
        assert client.get("/info").status_code == 401
        info = client.get("/info", headers={"X-API-Key": KEY}).json()
    assert info["snapshot_store"].startswith(f"modal-volume:{main.VOLUME_NAME}:")
    assert info["auth_required"] is True


def test_trace_db_stays_local_and_is_copied_to_the_volume_at_shutdown(
    container: tuple[Path, FakeVolume], tmp_path: Path
) -> None:
    state, vol = container
    web = local_app()
    live = tmp_path / "local-disk" / "traces.db"
    assert web.state.settings.trace_db == live
    with TestClient(web) as client:
        assert client.get("/health").status_code == 200
        assert live.is_file()
        assert not (state / "traces").exists()
    copies = list((state / "traces").iterdir())
    assert len(copies) == 1 and copies[0].suffix == ".db", copies
    with sqlite3.connect(copies[0]) as db:
        assert db.execute("SELECT count(*) FROM trace_writers").fetchone()[0] == 1
    assert vol.commits == 1


def test_session_server_serves_the_task_app_on_its_port(
    container: tuple[Path, FakeVolume], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``TaskAppSessions``: @modal.enter() serves the container's app over HTTP (Modal's proxy
    routes a session's requests to it); @modal.exit() stops it, draining the trace writer."""
    monkeypatch.setattr(main, "SESSION_PORT", 0)  # a free port here; 8000 in the container
    server_cls = main.TaskAppSessions._get_user_cls()
    instance = server_cls()
    server_cls.__dict__["start"]._get_raw_f()(instance)
    try:
        base = instance.server.base_url
        session = {"Modal-Authorization": "Bearer session-token"}  # Modal's proxy reads it, not the app
        env = httpx.post(
            f"{base}/env/create",
            json={"env_name": "crafter", "seed": 1},
            headers={"X-API-Key": KEY, **session},
        )
        assert env.status_code == 200, env.text
        step = {"env_id": env.json()["env_id"], "action": "noop"}
        assert (
            httpx.post(f"{base}/env/step", json=step, headers={"X-API-Key": KEY, **session}).status_code
            == 200
        )
    finally:
        server_cls.__dict__["stop"]._get_raw_f()(instance)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{base}/health", timeout=2)


def test_the_client_starts_sends_and_ends_a_modal_session(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``ModalSession.start`` asks Modal's Server for a session; the typed client sends its token
    on every request; ``end`` terminates it. Modal's Server is a fake here (no network)."""
    from grpo_service.client.modal_sessions import ModalSession
    from grpo_service.client.task_app import TaskAppClient
    from tools.server_thread import ServerThread

    seen: list[str | None] = []
    web = create_app(make_settings(tmp_path))

    @web.middleware("http")
    async def record(request: Any, call_next: Any) -> Any:
        seen.append(request.headers.get("modal-authorization"))
        return await call_next(request)

    with ServerThread(web, name="modal-session") as served:
        events: list[tuple[str, Any]] = []

        class Sessions:
            def start(self, idle_timeout: int) -> Any:
                events.append(("start", idle_timeout))
                return type("Credentials", (), {"token": "tok-1", "session_id": "ss-1"})()

            def terminate(self, token: str) -> None:
                events.append(("terminate", token))

        class FakeServer:
            sessions = Sessions()

            @staticmethod
            def get_url() -> str:
                return served.base_url + "/"

        names: list[tuple[str, str]] = []
        monkeypatch.setattr(
            modal.Server, "from_name", lambda app, name: names.append((app, name)) or FakeServer()
        )
        with (
            ModalSession.start(idle_timeout_s=120) as session,
            TaskAppClient(session.url, session=session) as app,
        ):
            env = app.create_env(env_name="crafter", seed=2)
            app.step_env(env_id=env.env_id, action="noop")
            assert app.health().envs == 1
    assert names == [(main.APP_NAME, main.SESSION_SERVER)]
    assert events == [("start", 120), ("terminate", "tok-1")]
    assert seen and set(seen) == {"Bearer tok-1"}


@pytest.mark.parametrize(
    ("unset", "message"),
    [("SNAPSHOT_SECRET", "SNAPSHOT_SECRET"), ("ENVIRONMENT_API_KEY", "ENVIRONMENT_API_KEY")],
)
def test_container_refuses_to_start_without_its_secrets(
    container: tuple[Path, FakeVolume], monkeypatch: pytest.MonkeyPatch, unset: str, message: str
) -> None:
    monkeypatch.delenv(unset)
    with pytest.raises(RuntimeError, match=message):
        local_app()


def test_container_refuses_a_trace_db_on_the_volume(
    container: tuple[Path, FakeVolume], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, _ = container
    monkeypatch.setenv("TRACE_DB", str(state / "traces.db"))
    with pytest.raises(RuntimeError, match="local disk"):
        local_app()


def test_tracing_can_be_turned_off(
    container: tuple[Path, FakeVolume], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRACE_DB", "off")
    assert local_app().state.settings.trace_db is None


# ------------------------------------------------------------------------------------ the image


def test_image_ships_every_local_package() -> None:
    with (ROOT / "pyproject.toml").open("rb") as f:
        include = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["include"]
    assert set(main.LOCAL_PACKAGES) == {pattern.rstrip("*") for pattern in include}
    for name in main.LOCAL_PACKAGES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        assert Path(spec.origin).is_relative_to(ROOT), f"{name} is not this repo's package"
        importlib.import_module(name)


def test_image_installs_pyprojects_dependencies_and_configures_the_function(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module, calls = load_recorded(ROOT / "main.py", monkeypatch)
    [(args, kwargs)] = calls["pip_install_from_pyproject"]
    assert Path(args[1]) == ROOT / "pyproject.toml"
    assert not kwargs.get("optional_dependencies") and len(args) == 2, "dev extras stay out of the image"
    with (ROOT / "pyproject.toml").open("rb") as f:
        assert "fastapi" in " ".join(tomllib.load(f)["project"]["dependencies"])

    [(_, function)] = calls["function"]
    [(_, server)] = calls["server"]
    for entry in (function, server):  # the same container: Volume, secret, size, scaling
        assert set(entry["volumes"]) == {"/data/state"}
        assert len(entry["secrets"]) == 1
        assert entry["max_containers"] == module.MAX_CONTAINERS > 1
        assert entry["scaledown_window"] >= 5 * 60
        assert entry["cpu"] >= 1 and entry["memory"] >= 2048
    assert function["timeout"] >= 15 * 60
    assert server["port"] == module.SESSION_PORT and server["startup_timeout"] >= 60
    [(_, concurrency)] = calls["concurrent"]
    assert concurrency == {"max_inputs": module.MAX_INPUTS, "target_inputs": module.TARGET_INPUTS}
    assert len(calls["asgi_app"]) == 1
    assert len(calls["sessioned"]) == 1  # the Server's requests stick to their session's container


# ------------------------------------------------------------------------------------- vLLM app


def test_vllm_app_serves_qwen3_with_tool_calls_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GRPO_VLLM_MODEL", "GRPO_VLLM_REVISION", "GRPO_VLLM_GPU"):
        monkeypatch.delenv(name, raising=False)
    module, calls = load_recorded(ROOT / "modal_vllm.py", monkeypatch)
    [(_, function)] = calls["function"]
    assert function["gpu"] == module.GPU
    assert set(function["volumes"]) == {"/root/.cache/huggingface", "/root/.cache/vllm"}
    assert len(function["secrets"]) == 1
    [(args, server)] = calls["web_server"]
    assert server.get("port", args[0] if args else None) == module.PORT
    assert server["startup_timeout"] >= 10 * 60
    [(_, concurrency)] = calls["concurrent"]
    assert concurrency["max_inputs"] >= 32

    cmd = module.vllm_command()
    assert cmd[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    pairs = dict(zip(cmd, cmd[1:], strict=False))
    assert pairs["--model"] == "Qwen/Qwen3-4B" and pairs["--generation-config"] == "vllm"
    assert pairs["--tool-call-parser"] == "hermes" and "--enable-auto-tool-choice" in cmd
    assert pairs["--port"] == str(module.PORT) and pairs["--host"] == "0.0.0.0"
    assert pairs["--served-model-name"] == "Qwen/Qwen3-4B"
    from inference.vllm_server import VLLM_VERSION

    assert module.VLLM_VERSION == VLLM_VERSION  # the release the suite runs (its CPU build)
    assert server["requires_proxy_auth"] is False  # weight sync off: vLLM's key guards /v1


def test_vllm_app_with_weight_sync_puts_every_route_behind_proxy_auth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GRPO_VLLM_WEIGHT_SYNC", "1")
    module, calls = load_recorded(ROOT / "modal_vllm.py", monkeypatch)
    [(_, server)] = calls["web_server"]
    assert server["requires_proxy_auth"] is True
    [(args, _)] = calls["env"]
    assert args[1]["GRPO_VLLM_WEIGHT_SYNC"] == "1"


def test_vllm_app_config_is_baked_into_its_image(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_VLLM_MODEL", "Qwen/Qwen3-8B")
    monkeypatch.setenv("GRPO_VLLM_REVISION", "abc123")
    module, calls = load_recorded(ROOT / "modal_vllm.py", monkeypatch)
    [(args, _)] = calls["env"]
    assert args[1]["GRPO_VLLM_MODEL"] == "Qwen/Qwen3-8B" and args[1]["GRPO_VLLM_REVISION"] == "abc123"
    cmd = module.vllm_command()
    pairs = dict(zip(cmd, cmd[1:], strict=False))
    assert pairs["--model"] == "Qwen/Qwen3-8B" and pairs["--revision"] == "abc123"
