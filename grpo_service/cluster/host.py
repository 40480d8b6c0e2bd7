"""`Host`: one Ray actor holding live envs, policies and runs: the embedded task app, driven over Ray.

A host builds the same app as ``python main.py`` (its registries, managers and coordinator) and
answers the front's calls in its own event loop. The front sends it whole HTTP requests
(`Host.request`): one actor call per request, so a rollout, a group part or a batch is one
call, never one per step; a per-step client's steps travel several to a batch
(`grpo_service.cluster.step_batcher`), over the host's step link (a kept-open connection,
`grpo_service.cluster.step_link`) or, without one, as one actor call (`Host.requests`). Ids the
host issues carry the tag its front gave it, which is how any front finds the host of an id: the
actor named ``grpo-host-{tag}``.

Finished rollouts are encoded as trace rows here and go to the cluster's one trace writer
(`TraceSinkActor`, on the front's node), which inserts them; a request's answer leaves the
host only once the traces it produced are in the writer's queue, so no rollout already
reported is missing from the trace DB when a host dies afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from grpo_service.api.asgi import Answer, RequestArgs, call_asgi
from grpo_service.api.listing import env_summary, listed_run, policy_summary
from grpo_service.cluster.step_link import StepLinkServer
from grpo_service.config import Settings
from grpo_service.core.registry import adopt_instance_id
from grpo_service.errors import ServiceError
from grpo_service.tracing.traces import RolloutTrace
from grpo_service.tracing.writer import encode_trace

log = logging.getLogger(__name__)

AppFactory = Callable[..., Any]
"""``create_app``: ``(settings, tracer=...) -> app``, handed down by the app that makes the cluster."""

HOST_PREFIX = "grpo-host-"
TRACE_SINK_NAME = "grpo-traces"


def host_name(tag: str) -> str:
    return HOST_PREFIX + tag


class RemoteTraceSink:
    """A host's `TraceSink`: each finished rollout is encoded here, off the event loop, and its
    rows are sent to the cluster's `TraceSinkActor`. Encoding where the rollout ran spreads that
    work over the hosts and leaves the writer only its inserts; the rows (plain tuples) also
    cross processes at a fraction of what the trace's objects cost to pickle."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.writer_id: int | None = None
        self._pending: set[asyncio.Task[None]] = set()

    def submit(self, trace: RolloutTrace) -> None:
        task = asyncio.get_running_loop().create_task(self._send(trace))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _send(self, trace: RolloutTrace) -> None:
        if self.writer_id is None:
            self.writer_id = await self.actor.writer_id.remote()
        try:
            item: Any = await asyncio.to_thread(encode_trace, trace, self.writer_id, time.time())
        except Exception:  # the writer encodes it again, and records why it could not
            log.exception("cannot encode the trace of rollout %s here", trace.response.run_id)
            item = trace
        await self.actor.submit.remote(item)

    async def flush(self) -> None:
        """Wait until every trace submitted so far is queued in the writer."""
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)


class TraceSinkActor:
    """The cluster's trace writer: one SQLite DB, on the node of the front that started it."""

    def __init__(self, path: str, queue_size: int) -> None:
        from grpo_service.tracing import TraceWriter

        self.writer = TraceWriter(path, queue_size=queue_size)

    async def start(self) -> str:
        await self.writer.start()
        return str(self.writer.path)

    async def writer_id(self) -> int | None:
        return self.writer.writer_id

    async def submit(self, trace: Any) -> None:
        """A `RolloutTrace`, or an `EncodedTrace` a host encoded."""
        self.writer.submit(trace)

    async def stats(self) -> dict[str, Any]:
        return self.writer.stats()

    async def close(self) -> None:
        await self.writer.close()


class Host:
    """A Ray actor (async: its requests interleave like an embedded server's)."""

    def __init__(self, tag: str, settings: Settings, app_factory: AppFactory, trace_sink: Any = None) -> None:
        adopt_instance_id(tag)  # before the app issues any id
        self.tag = tag
        self.tracer = RemoteTraceSink(trace_sink) if trace_sink is not None else None
        self.app = app_factory(settings, tracer=self.tracer)
        self.services = self.app.state.services
        self._lifespan: contextlib.AsyncExitStack | None = None
        self._link: StepLinkServer | None = None
        self._link_info: dict[str, Any] | None = None

    async def start(self) -> dict[str, Any]:
        """Run the app's startup (reaper, GC tuning) and open the step link; where this host runs
        and how to reach its link."""
        import ray

        if self._lifespan is None:
            stack = contextlib.AsyncExitStack()
            await stack.enter_async_context(self.app.router.lifespan_context(self.app))
            self._lifespan = stack
        if self._link is None:
            self._link = StepLinkServer(self.requests)
            try:
                self._link_info = await self._link.start(ray.util.get_node_ip_address())
            except OSError:  # the fronts send every batch by actor call
                log.exception("host %s cannot listen for step links", self.tag)
        return {
            "tag": self.tag,
            "node_id": ray.get_runtime_context().get_node_id(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "training": self.services.training is not None,
            "link": self._link_info,
        }

    async def stop(self) -> None:
        if self._link is not None:
            await self._link.close()
        if self._lifespan is not None:
            stack, self._lifespan = self._lifespan, None
            await stack.aclose()

    async def request(
        self, method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> Answer:
        """One HTTP request through this host's app, answered whole."""
        (answer,) = await self.requests([(method, path, query, headers, body)])
        return answer

    async def requests(self, batch: list[RequestArgs]) -> list[Answer]:
        """Requests run through this host's app at once (several: `grpo_service.cluster.step_batcher`),
        answered in order once the traces they produced are queued in the writer."""
        answers = await asyncio.gather(*(call_asgi(self.app, *args) for args in batch))
        if self.tracer is not None:
            await self.tracer.flush()
        return list(answers)

    async def group_part(self, body: bytes, members: Sequence[int], background: bool = False) -> Any:
        """Members ``members`` of the group ``body`` asks for: those members, each written as JSON
        (`EncodedMember`: the front joins them without encoding them again; ``background``:
        started, its run id), or the error the whole group would get, as ``(status, code, detail)``."""
        from pydantic import ValidationError

        from grpo_service.models import RolloutGroupRequest
        from grpo_service.rollout.group_answer import EncodedMember

        try:
            req = RolloutGroupRequest.model_validate_json(body)
            if background:
                return self.services.coordinator.start_group(req, members=list(members)).id
            part = await self.services.coordinator.group(req, members=list(members))
            return [EncodedMember.of(member) for member in part.members]
        except ServiceError as exc:
            return (exc.status_code, exc.code, exc.message)
        except ValidationError as exc:  # the front checked the body: only a version skew gets here
            return (422, "invalid_request", str(exc))
        finally:
            if self.tracer is not None:
                await self.tracer.flush()

    async def summaries(self, kind: str, rl_run_id: str | None) -> list[dict[str, Any]]:
        """Every live env, policy or run of this host as its listing summary (oldest first)."""
        registry = self.services.registry
        table, summary = {
            "env": (registry.envs, env_summary),
            "policy": (registry.policies, policy_summary),
            "run": (registry.runs, listed_run),
        }[kind]
        return [
            summary(h).model_dump(mode="json") for h in table if rl_run_id is None or h.rl_run_id == rl_run_id
        ]

    async def counts(self) -> dict[str, int]:
        """Live envs, policies, active runs and training jobs of this host."""
        training = self.services.training
        return {
            **self.services.registry.counts(),
            "active_jobs": len(training.runner.active()) if training else 0,
            "loaded_models": training.models.loaded_count() if training else 0,
        }
