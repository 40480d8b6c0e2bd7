"""Serving the app with uvicorn (used by `python main.py` and `grpo-service serve`)."""

from __future__ import annotations

import uvicorn

from grpo_service.auth import check_bind_safety
from grpo_service.config import Settings


def serve(settings: Settings, *, reload: bool = False, app_path: str = "main:app") -> None:
    check_bind_safety(settings.host, settings.environment_api_key is not None, settings.allow_insecure)
    if settings.workers != 1:
        if reload:
            raise SystemExit("--reload serves one process: it cannot be combined with --workers")
        from grpo_service.serving.workers import serve_workers

        raise SystemExit(serve_workers(settings))
    if reload:
        # Reload needs an import string; the child process rebuilds Settings from the environment.
        uvicorn.run(app_path, host=settings.host, port=settings.port, reload=True)
        return
    from grpo_service.app import create_app

    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info")
