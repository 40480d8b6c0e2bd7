"""The app for ``grpo-service serve --reload``: uvicorn's child imports it, with settings in the
environment (set by the parent)."""

from grpo_service import create_app

app = create_app()
