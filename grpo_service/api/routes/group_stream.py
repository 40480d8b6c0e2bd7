"""``/rollout/stream``: a stream of GRPO groups for an asynchronous trainer (open, take, version,
status, close). The machinery is `grpo_service.rollout.group_stream`."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

from grpo_service.api.routes import service_router
from grpo_service.api.services import ServicesDep
from grpo_service.errors import error_responses
from grpo_service.models import (
    StreamBatch,
    StreamInfo,
    StreamOpenRequest,
    StreamTakeRequest,
    StreamVersionRequest,
)

router = service_router("rollout")

StreamId = Annotated[str, Path(max_length=128, description="The stream's id, from `POST /rollout/stream`.")]


@router.post(
    "/rollout/stream",
    response_model=StreamInfo,
    status_code=201,
    responses=error_responses(400, 404, 413, 422, 429),
)
async def open_stream(req: StreamOpenRequest, services: ServicesDep) -> StreamInfo:
    """Open a stream: groups start at once, up to ``in_flight`` started and not yet taken."""
    return services.streams.open(req).info()


@router.post(
    "/rollout/stream/{stream_id}/take",
    response_model=StreamBatch,
    responses=error_responses(400, 404, 413, 421, 422),
)
async def take_groups(stream_id: StreamId, req: StreamTakeRequest, services: ServicesDep) -> StreamBatch:
    """Finished groups in completion order, waiting up to ``wait_s`` for the first; taking frees
    their in-flight slots. ``done`` once no group will come any more."""
    return await services.streams.get(stream_id).take(req)


@router.post(
    "/rollout/stream/{stream_id}/version",
    response_model=StreamInfo,
    responses=error_responses(400, 404, 409, 413, 421, 422),
)
async def set_stream_version(
    stream_id: StreamId, req: StreamVersionRequest, services: ServicesDep
) -> StreamInfo:
    """The sampler now serves ``weights_version``: calls returning from now on are tagged with it,
    and groups now too stale are dropped or restarted (the stream's ``stale_policy``)."""
    return services.streams.get(stream_id).set_version(req.weights_version)


@router.get(
    "/rollout/stream/{stream_id}/status", response_model=StreamInfo, responses=error_responses(404, 421, 422)
)
async def stream_info(stream_id: StreamId, services: ServicesDep) -> StreamInfo:
    """The stream's status, version, counters and staleness of the groups delivered."""
    return services.streams.get(stream_id).info()


@router.delete(
    "/rollout/stream/{stream_id}", response_model=StreamInfo, responses=error_responses(404, 421, 422)
)
async def close_stream(stream_id: StreamId, services: ServicesDep) -> StreamInfo:
    """Close the stream: its running groups are aborted, groups not taken are let go."""
    return services.streams.close(stream_id)
