"""The service objects one app instance owns, and the dependency that hands them to routes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request

from grpo_service.config import Settings
from grpo_service.core.env_manager import EnvManager
from grpo_service.core.policy_manager import PolicyManager
from grpo_service.core.registry import Registry
from grpo_service.core.snapshots import SnapshotService
from grpo_service.rollout import RolloutCoordinator
from grpo_service.rollout.group_stream import GroupStreams


@dataclass
class Services:
    settings: Settings
    registry: Registry
    snapshots: SnapshotService
    envs: EnvManager
    policies: PolicyManager
    coordinator: RolloutCoordinator
    streams: GroupStreams
    tracer: Any = None
    client_pool: Any = None
    training: Any = None
    """`TrainingService` when the training API is on (settings.training_enabled)."""
    started_at: float = field(default_factory=time.monotonic)


async def get_services(request: Request) -> Services:
    # async on purpose: FastAPI runs a sync dependency in its threadpool, a thread hop per request.
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]
