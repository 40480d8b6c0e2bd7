"""Serving the app with uvicorn (used by `python main.py` and `grpo-service serve`)."""

from __future__ import annotations

import contextlib

import uvicorn
from uvicorn.config import STARTUP_FAILURE

from grpo_service.api.auth import check_bind_safety
from grpo_service.config import Settings

# Every WebSocket frame deflated and inflated (permessage-deflate, on by default) costs more CPU
# than the frame itself on 127.0.0.1 or a cluster's network: OpenEnv replies are a few KB at most.
UVICORN_OPTIONS: dict[str, object] = {"ws_per_message_deflate": False}

RAY_MISSING = (
    "serving through Ray needs Ray: pip install 'grpo-service[ray]' (or pip install 'ray==2.60.0'); "
    "without it, serve one process (no --ray, no --workers)"
)


def check_ray_installed(settings: Settings) -> None:
    if settings.ray_address is None:
        return
    try:
        import ray  # noqa: F401
    except ImportError:
        raise SystemExit(RAY_MISSING) from None


def serve(settings: Settings, *, reload: bool = False, app_path: str = "main:app") -> None:
    check_bind_safety(settings.host, settings.environment_api_key is not None, settings.allow_insecure)
    check_ray_installed(settings)
    if reload:
        if settings.ray_address is not None:
            raise SystemExit("--reload serves one process: it cannot be combined with --ray or --workers")
        # Reload needs an import string; the child process rebuilds Settings from the environment.
        uvicorn.run(app_path, host=settings.host, port=settings.port, reload=True)
        return
    from grpo_service.app import create_app

    config = uvicorn.Config(
        create_app(settings), host=settings.host, port=settings.port, log_level="info", **UVICORN_OPTIONS
    )
    # Bind before the app's lifespan runs: through Ray, the lifespan starts Ray's processes, which
    # take ports of their own and could otherwise take ours first. A taken port now fails at once.
    try:
        sock = config.bind_socket()  # logs the OS's reason and exits when it cannot bind
    except SystemExit:
        raise SystemExit(f"cannot listen on {settings.host}:{settings.port}: pick another --port") from None
    sock.set_inheritable(False)  # no child (a Ray process) may hold the port after we exit
    server = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl+C (SIGINT) after a graceful shutdown
        server.run(sockets=[sock])
    if not server.started:  # the lifespan failed (e.g. Ray did not start): uvicorn.run's exit code
        raise SystemExit(STARTUP_FAILURE)
