"""Entry point: `uvicorn main:app`, `python main.py`, and `modal deploy main.py`.

Locally, ``app`` is the task app configured from the environment (built on first access, so
importing this module creates nothing). On Modal, two entry points serve the same app: the
``TaskAppSessions`` Server (sticky sessions: a client's live envs, policies and runs stay on the
container its session token names) and ``fastapi_app`` (any container: self-contained
rollouts). In both, state is on the ``synth-env-state`` Volume at ``/data/state``, secrets come
from the ``grpo-service-secrets`` Modal secret, traces are on local disk and copied to the Volume
at shutdown. Defining the Modal objects needs no token and no network. See docs/modal.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import modal
from fastapi import FastAPI

from grpo_service import Settings, create_app
from storage.modal_volume import ModalVolumeSnapshotStore, VolumeLike, export_sqlite

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent
PYPROJECT = ROOT / "pyproject.toml"
LOCAL_PACKAGES = ("grpo_service", "envs", "storage", "inference", "training", "tools")
# What of them the image gets: Python sources, and the trace viewer's page (HTML, CSS, JS).
SHIPPED_FILES = modal.FilePatternMatcher("**/*.py", "**/viewer/static/*")

APP_NAME = "grpo-service"
VOLUME_NAME = "synth-env-state"
VOLUME_PATH = "/data/state"
SECRET_NAME = "grpo-service-secrets"
LOCAL_TRACE_DB = Path("/tmp/grpo-service/traces.db")

# Containers of each entry point. Live objects stay on the container of their session (the
# Server's sticky sessions); self-contained rollouts need no affinity. docs/modal.md, "Scaling out".
MAX_CONTAINERS = 16
SESSION_SERVER = "TaskAppSessions"
SESSION_PORT = 8000
SESSION_STARTUP_S = 300  # an image with the environments imports in about 10 s; a cold Volume is slower
# Requests mostly wait on the LLM; env work is bound by one core (the GIL), not by requests.
MAX_INPUTS = 1024  # = the default MAX_ACTIVE_RUNS
TARGET_INPUTS = 256
# Matches the default IDLE_TTL_S: an idle container is kept as long as its envs would be.
SCALEDOWN_WINDOW_S = 30 * 60
# Per request; with Modal's 303 redirects a blocking /rollout can run this long.
TIMEOUT_S = 60 * 60

# pyproject.toml is read at deploy time (it is not shipped). Its `modal` entry is inert in the
# container, where Modal mounts its own client ahead of site-packages.
image = (
    modal.Image.debian_slim(python_version="3.11")
    .pip_install_from_pyproject(str(PYPROJECT))
    .add_local_python_source(*LOCAL_PACKAGES, ignore=~SHIPPED_FILES)
)
volume = modal.Volume.from_name(VOLUME_NAME, create_if_missing=True)
modal_app = modal.App(APP_NAME, image=image)

# Where the container's state lives; tests point it at a temporary directory.
STATE_ROOT = Path(VOLUME_PATH)


def container_settings(state_root: Path) -> Settings:
    """Settings inside a Modal container: everything from the environment (the Modal secret),
    but state on the Volume and the live trace DB on local disk."""
    settings = Settings(state_dir=state_root, trace_db=_local_trace_db())
    if settings.snapshot_secret is None:
        raise RuntimeError(
            f"SNAPSHOT_SECRET is not set: add it to the Modal secret {SECRET_NAME!r}. Containers "
            "must share one signing key, or snapshots written by one are refused by the others"
        )
    if settings.environment_api_key is None and not settings.allow_insecure:
        raise RuntimeError(
            f"ENVIRONMENT_API_KEY is not set: add it to the Modal secret {SECRET_NAME!r} (a Modal "
            "URL is public), or set ALLOW_INSECURE=1 to serve without a key"
        )
    if settings.trace_db is not None and settings.trace_db.resolve().is_relative_to(state_root.resolve()):
        raise RuntimeError(
            f"TRACE_DB {settings.trace_db} is on the Volume: a live SQLite file must stay on local "
            "disk (it is copied to the Volume at shutdown)"
        )
    return settings


def _local_trace_db() -> Path | None:
    value = os.environ.get("TRACE_DB", "").strip()
    if value.lower() in ("0", "off", "none", "false"):
        return None
    return Path(value) if value else LOCAL_TRACE_DB


def build_container_app(state_root: Path, vol: VolumeLike) -> FastAPI:
    settings = container_settings(state_root)
    store = ModalVolumeSnapshotStore(state_root, vol, volume_name=VOLUME_NAME)
    web = create_app(settings, store=store)
    if settings.trace_db is not None:
        _export_trace_on_shutdown(web, settings.trace_db, state_root / "traces", vol)
    return web


def _export_trace_on_shutdown(web: FastAPI, trace_db: Path, dest_dir: Path, vol: VolumeLike) -> None:
    """Wrap the app's lifespan: once it has closed the tracer, copy the DB to the Volume."""
    inner = web.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        async with inner(app) as state:
            yield state
        if not trace_db.is_file():
            return
        container = os.environ.get("MODAL_TASK_ID") or f"{socket.gethostname()}-{os.getpid()}"
        name = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{container}.db"
        try:
            path = await anyio.to_thread.run_sync(lambda: export_sqlite(trace_db, dest_dir, vol, name=name))
            log.info("trace DB copied to %s", path)
        except Exception:
            log.exception("could not copy the trace DB %s to the Volume", trace_db)

    web.router.lifespan_context = lifespan


CONTAINER = {
    "volumes": {VOLUME_PATH: volume},
    "secrets": [modal.Secret.from_name(SECRET_NAME)],
    "cpu": 2.0,
    "memory": 4096,
    "min_containers": 0,
    "max_containers": MAX_CONTAINERS,
    "scaledown_window": SCALEDOWN_WINDOW_S,
}


@modal_app.function(**CONTAINER, timeout=TIMEOUT_S)
@modal.concurrent(max_inputs=MAX_INPUTS, target_inputs=TARGET_INPUTS)
@modal.asgi_app()
def fastapi_app() -> FastAPI:
    """Any container: ``/rollout/group``, ``/rollouts`` and ``/rollout`` with an inline env and
    policy (live ids answer 421 on a container that did not create them)."""
    return build_container_app(STATE_ROOT, volume)


@modal_app.server(
    **CONTAINER,
    port=SESSION_PORT,
    target_concurrency=TARGET_INPUTS,
    startup_timeout=SESSION_STARTUP_S,
    exit_grace_period=30,
)
@modal.sessioned()
class TaskAppSessions:
    """The task app behind Modal's sticky sessions: every request carries a session token
    (``Modal-Authorization: Bearer <token>``, `grpo_service.client.modal_sessions`), and all requests of
    a session reach the container that holds its live envs, policies and runs."""

    @modal.enter()
    def start(self) -> None:
        from tools.server_thread import ServerThread

        web = build_container_app(STATE_ROOT, volume)
        self.server = ServerThread(web, host="0.0.0.0", port=SESSION_PORT, name="task-app").start(
            timeout_s=SESSION_STARTUP_S
        )

    @modal.exit()
    def stop(self) -> None:
        self.server.stop()


def _run_by_modal_cli() -> bool:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return Path(sys.argv[0]).name == "modal" or (spec is not None and spec.name.startswith("modal."))


def __getattr__(name: str) -> Any:
    """``app`` is resolved on first access, not at import, so that importing this module (a
    Modal container, a test) builds nothing. For the ``modal`` CLI, which looks for a Modal
    App named ``app`` (`modal deploy main.py`), it is ``modal_app``; for everyone else
    (`uvicorn main:app`, `from main import app`) it is the FastAPI task app."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _run_by_modal_cli():
        return modal_app
    globals()["app"] = create_app()
    return globals()["app"]


if __name__ == "__main__":
    from grpo_service.serving import serve

    serve(Settings())
