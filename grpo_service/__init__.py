"""grpo-service: a rollout task app for GRPO training of LLM agents.

The package is built in floors; a module imports its own folder or a floor below it, never one
above, and two folders on one floor never import each other (tests/test_layers.py checks every
import, inside functions and under ``TYPE_CHECKING`` too). Lowest first:

- ``version``, ``config``, ``gc_tuning``, ``models/``: the ground floor: the version, the
  settings, GC thresholds, and the wire types (every request and response model).
- ``errors``: the service's errors and their JSON bodies.
- ``client/``: what a trainer imports from another process (typed client, Modal sessions, TRL's
  environment, evaluation); it knows only the wire types, never the server.
- ``core/``: the live objects: registry, snapshots, env and policy managers, branching.
- ``tracing/``: every finished rollout into SQLite; reading, exporting.
- ``rollout/``, ``training_api/``, ``reporting/``: rollouts and groups (coordinator → forks →
  player → episode loop → records), the training job service, the viewer and eval reports.
- ``api/``: the HTTP API: services, auth, limits, listing, an in-process ASGI call, routes.
- ``protocols/``: AgentGym's and OpenEnv's wire formats over the same core.
- ``cluster/``: serving through Ray; handed the app factory, it never imports the app.
- ``app``: ``create_app`` wires the floors into one FastAPI app.
- ``serving``, this package: uvicorn around the app; ``create_app`` and ``Settings`` re-exported.
- ``cli/``: the ``grpo-service`` command.

docs/architecture.md draws the same floors with the packages beside this one (``envs``,
``training``, ``inference``, ``storage``, ``tools``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grpo_service.version import __version__

if TYPE_CHECKING:
    from grpo_service.app import create_app
    from grpo_service.config import Settings

__all__ = ["Settings", "__version__", "create_app"]


def __getattr__(name: str) -> Any:
    """``create_app`` and ``Settings`` are imported on first use, so that a light user of the
    package (``grpo-service --help``, the trace reader) does not pay for the whole app."""
    if name == "create_app":
        from grpo_service.app import create_app

        return create_app
    if name == "Settings":
        from grpo_service.config import Settings

        return Settings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
