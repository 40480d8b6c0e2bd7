"""`GET /info` and `GET /health`."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends

from envs.base import ENVIRONMENTS, POLICIES
from grpo_service.api.auth import require_api_key
from grpo_service.api.services import ServicesDep
from grpo_service.core.registry import instance_id
from grpo_service.models import Health, InferenceInfo, Limits, PluginInfo, ServiceEndpoints, ServiceInfo
from grpo_service.version import __version__

router = APIRouter(tags=["service"])

ENDPOINTS = {
    "env": "/env/*",
    "policy": "/policy/*",
    "rollout": "/rollout",
    "rollout_group": "/rollout/group",
    "branch": "/branch",
    "run": "/run/*",
    "openenv": "/openenv/{env_name}",
    "docs": "/docs",
}


def _plugin_info(cls: Any) -> PluginInfo:
    return PluginInfo(
        name=cls.name,
        version=cls.version,
        description=cls.description,
        config_schema=cls.config_model.model_json_schema(),
        env_name=getattr(cls, "env_name", None),
        uses_inference=getattr(cls, "uses_inference", False),
    )


@router.get("/info", response_model=ServiceInfo, dependencies=[Depends(require_api_key)])
async def info(services: ServicesDep) -> ServiceInfo:
    """Service configuration, available plug-ins and limits."""
    s = services.settings
    return ServiceInfo(
        service=ServiceEndpoints(base_url=s.service_base_url, version=__version__, endpoints=ENDPOINTS),
        inference=InferenceInfo(
            base_url=s.vllm_base_url,
            endpoints={"chat_completions": "/v1/chat/completions"},
            default_model=s.default_model,
        ),
        environments=[_plugin_info(cls) for _, cls in sorted(ENVIRONMENTS.items())],
        policies=[_plugin_info(cls) for _, cls in sorted(POLICIES.items())],
        limits=Limits.model_validate(s, from_attributes=True),
        auth_required=s.environment_api_key is not None,
        snapshot_store=services.snapshots.store.describe(),
        tracing=str(s.trace_db) if s.trace_db else None,
    )


@router.get(
    "/health",
    response_model=Health,
    responses={503: {"model": Health, "description": "Served through Ray, and no host answers."}},
)
async def health(services: ServicesDep) -> Health:
    """Liveness and load. Open without a key, and carries no secrets."""
    s, counts, training = services.settings, services.registry.counts(), services.training
    return Health(
        status="healthy",
        version=__version__,
        instance=instance_id(),
        workers=1,
        uptime_s=round(time.monotonic() - services.started_at, 3),
        envs=counts["envs"],
        policies=counts["policies"],
        runs_active=counts["runs_active"],
        capacity={
            "max_envs": s.max_envs,
            "max_policies": s.max_policies,
            "max_active_runs": s.max_active_runs,
        },
        tracing=_tracing_counts(services.tracer),
        timestamp=datetime.now(UTC).isoformat(timespec="seconds"),
        active_jobs=len(training.runner.active()) if training else 0,
        loaded_models=training.models.loaded_count() if training else 0,
    )


def _tracing_counts(tracer: object) -> dict[str, int] | None:
    stats = getattr(tracer, "stats", None)
    if stats is None:
        return None
    return {k: v for k, v in stats().items() if isinstance(v, int) and not isinstance(v, bool)}
