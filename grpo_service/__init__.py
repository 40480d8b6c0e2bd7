"""grpo-service: a rollout task app for GRPO training of LLM agents."""

__version__ = "0.1.0"

from grpo_service.app import create_app  # noqa: E402
from grpo_service.config import Settings  # noqa: E402

__all__ = ["Settings", "__version__", "create_app"]
