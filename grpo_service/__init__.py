"""grpo-service: a rollout task app for GRPO training of LLM agents."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

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
