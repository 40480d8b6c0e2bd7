"""Serving the app with uvicorn (`server`): one embedded process, or the front of a Ray cluster
(`grpo_service.cluster`) when RAY_ADDRESS is set."""
