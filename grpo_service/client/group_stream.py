"""`GroupStreamClient`: a task app's stream of GRPO groups as an async iterator.

    from grpo_service.client.group_stream import GroupStreamClient
    from grpo_service.client.task_app import AsyncTaskAppClient

    async with AsyncTaskAppClient(url) as app, GroupStreamClient(app, open_request) as stream:
        async for taken in stream:           # a StreamGroup, in completion order
            train_on(taken.group)            # taken.oldest_version, taken.staleness, ...
            if time_to_push:
                push_weights()               # the sampler serves version v (paused)
                await stream.set_version(v)  # before the sampler resumes

Underneath: ``POST /rollout/stream`` (open), ``POST /rollout/stream/{id}/take`` (long-polled with
``wait_s``), ``POST .../version``, ``DELETE`` (closed when the ``async with`` ends, whatever ends
it). The iteration ends when the stream is done (``max_groups`` delivered, failed: `StreamFailed`,
or closed).
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import Any, Self

from grpo_service import models
from grpo_service.client.task_app import AsyncTaskAppClient, ServiceCallError


class StreamFailed(Exception):
    """The stream stopped on its own: its groups kept failing, or it closed after its idle timeout."""

    def __init__(self, info: models.StreamInfo) -> None:
        super().__init__(
            f"stream {info.stream_id} {info.status}: {info.error or 'no call within its idle timeout'}"
        )
        self.info = info


class GroupStreamClient:
    def __init__(
        self,
        app: AsyncTaskAppClient,
        request: models.StreamOpenRequest | dict[str, Any],
        *,
        take: int = 1,
        wait_s: float = 10.0,
    ) -> None:
        self.app = app
        self.request = (
            request
            if isinstance(request, models.StreamOpenRequest)
            else models.StreamOpenRequest.model_validate(request)
        )
        self.take, self.wait_s = take, wait_s
        self.info: models.StreamInfo | None = None
        self._buffer: deque[models.StreamGroup] = deque()
        self._done = False

    @property
    def stream_id(self) -> str:
        if self.info is None:
            raise RuntimeError("the stream is not open: use `async with`")
        return self.info.stream_id

    async def __aenter__(self) -> Self:
        self.info = await self.app.open_stream(self.request)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self.info is None:
            return
        with contextlib.suppress(ServiceCallError):  # already gone (idle timeout, a restart): fine
            self.info = await self.app.close_stream(self.stream_id)
        self._done = True

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> models.StreamGroup:
        while not self._buffer:
            if self._done:
                raise StopAsyncIteration
            batch = await self.app.take_groups(self.stream_id, max_groups=self.take, wait_s=self.wait_s)
            self.info = batch.info
            self._buffer.extend(batch.groups)
            if batch.done and not batch.groups:
                self._done = True
                if batch.info.status in ("failed", "closed"):
                    raise StreamFailed(batch.info)
        return self._buffer.popleft()

    async def take_many(self, count: int) -> list[models.StreamGroup]:
        """The next ``count`` groups (fewer only when the stream ends)."""
        groups: list[models.StreamGroup] = []
        async for group in self:
            groups.append(group)
            if len(groups) >= count:
                break
        return groups

    async def set_version(self, weights_version: int) -> models.StreamInfo:
        self.info = await self.app.set_stream_version(self.stream_id, weights_version)
        return self.info

    async def refresh(self) -> models.StreamInfo:
        self.info = await self.app.stream_info(self.stream_id)
        return self.info
