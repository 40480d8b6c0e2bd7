"""`create_app(settings)`: wires settings, registries, stores, managers and routers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi_offline import FastAPIOffline

import envs  # noqa: F401  (registers the built-in environments and policies)
from envs.base import PolicyContext
from grpo_service.api.auth import APIKeyGate, document_security, redact_query_secrets
from grpo_service.api.fast_paths import FastPaths
from grpo_service.api.limits import BodySizeLimit
from grpo_service.api.routes import batch, env, group_stream, meta, policy, rollout, training, viewer
from grpo_service.api.services import Services
from grpo_service.config import Settings
from grpo_service.core.env_manager import EnvManager
from grpo_service.core.policy_manager import PolicyManager
from grpo_service.core.registry import Registry
from grpo_service.core.snapshots import SnapshotService, load_signing_key
from grpo_service.errors import install_error_handlers
from grpo_service.gc_tuning import serving_gc
from grpo_service.protocols.agentgym import server as agentgym
from grpo_service.protocols.openenv import server as openenv
from grpo_service.rollout import RolloutCoordinator
from grpo_service.rollout.group_stream import GroupStreams
from grpo_service.tracing.traces import TraceSink
from grpo_service.version import __version__
from inference import ClientPool
from storage import LocalSnapshotStore, SnapshotCodec, SnapshotStore

log = logging.getLogger(__name__)

DESCRIPTION = """
A task app for GRPO training of LLM agents: stateful environments (Crafter, TextCraft, BabyAI,
SciWorld) and policy clients in in-memory registries, coordinated rollouts against an
OpenAI-compatible endpoint, GRPO groups, signed snapshots, branching, and tracing. The same
environments are served over OpenEnv's protocol (/openenv/<env>) and AgentGym's (/agentgym/<env>).
"""


def build_services(
    settings: Settings, store: SnapshotStore | None = None, tracer: TraceSink | None = None
) -> Services:
    registry = Registry(
        max_envs=settings.max_envs,
        max_policies=settings.max_policies,
        max_active_runs=settings.max_active_runs,
        max_finished_runs=settings.max_finished_runs,
    )
    store = store or LocalSnapshotStore(settings.state_dir)
    snapshots = SnapshotService(store, SnapshotCodec(load_signing_key(settings)), registry)
    pool = ClientPool(
        max_response_bytes=settings.inference_max_response_bytes, transport=settings.inference_transport
    )
    context = PolicyContext(
        inference_url=settings.vllm_base_url,
        model=settings.default_model,
        api_key=settings.inference_api_key.get_secret_value() if settings.inference_api_key else None,
        key_urls=tuple(settings.inference_key_urls),
        request_timeout_s=settings.inference_timeout_s,
        max_retries=settings.inference_max_retries,
        client_pool=pool,
    )
    env_manager = EnvManager(registry, snapshots, settings.env_threads)
    policy_manager = PolicyManager(registry, snapshots, context)
    coordinator = RolloutCoordinator(env_manager, policy_manager, registry, settings, tracer)
    return Services(
        settings=settings,
        registry=registry,
        snapshots=snapshots,
        envs=env_manager,
        policies=policy_manager,
        coordinator=coordinator,
        streams=GroupStreams(coordinator),
        tracer=tracer,
        client_pool=pool,
    )


async def reap_idle(services: Services) -> int:
    """Terminate envs and policies idle for longer than the TTL; return how many."""
    ttl = services.settings.idle_ttl_s
    reaped = 0
    for handle in services.registry.idle(services.registry.policies, ttl):
        await services.policies.discard(handle)
        reaped += 1
    for handle in services.registry.idle(services.registry.envs, ttl):
        await services.envs.discard(handle)
        reaped += 1
    return reaped


async def _reaper(services: Services) -> None:
    while True:
        await asyncio.sleep(services.settings.reaper_interval_s)
        try:
            reaped = await reap_idle(services)
            if reaped:
                log.info("reaped %d idle envs/policies", reaped)
        except Exception:  # the reaper must outlive any one failure
            log.exception("reaper pass failed")


def create_app(
    settings: Settings | None = None, *, store: SnapshotStore | None = None, tracer: Any = None
) -> FastAPI:
    """Build the task app. ``tracer`` (a `TraceSink` with async ``start``/``close``) overrides
    the one ``settings.trace_db`` would create."""
    settings = settings or Settings()
    cluster = None
    if settings.ray_address is not None:  # the hosts hold the live objects; the cluster traces
        from grpo_service.cluster.cluster import Cluster

        cluster = Cluster(settings, app_factory=create_app)
    elif tracer is None and settings.trace_db is not None:
        from grpo_service.tracing import TraceWriter

        tracer = TraceWriter(settings.trace_db, queue_size=settings.trace_queue_size)
    services = build_services(settings, store, tracer)
    if settings.training_enabled and cluster is None:  # through Ray, jobs run on a host
        from grpo_service.training_api.service import TrainingService

        services.training = TrainingService.from_settings(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if tracer is not None and hasattr(tracer, "start"):
            await tracer.start()
        if cluster is not None:
            await cluster.start()
        reaper = asyncio.create_task(_reaper(services))
        try:
            with serving_gc():
                yield
        finally:
            reaper.cancel()
            services.streams.close_all()
            for run in services.registry.runs:
                run.abort.set()
            await services.client_pool.aclose()
            if services.training is not None:
                await asyncio.to_thread(services.training.close)
            if cluster is not None:
                await cluster.close()
            if tracer is not None and hasattr(tracer, "close"):
                await tracer.close()

    # /docs and /redoc load Swagger UI and ReDoc from the service itself, not a CDN: they work offline.
    app = FastAPIOffline(
        title="grpo-service",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.services = services
    install_error_handlers(app)
    # The protocol servers first: a request to one is then routed by its prefix, without being
    # matched against every route of the service's API (a quarter of an AgentGym step's CPU).
    agentgym_steps = agentgym.mount(app, services)
    openenv_links = openenv.mount(app, services)
    # each route lists the errors it can return
    for module in (meta, env, policy, rollout, group_stream, batch, viewer):
        app.include_router(module.router)
    if settings.training_enabled:
        app.include_router(training.router)
    document_security(app)
    # Outermost last: CORS (preflights answered, every answer labelled), then the key (nothing
    # unauthenticated is read, parsed or forwarded), the body size, the Ray hosts' router, and
    # innermost the hottest steps (AgentGym's, `/env/step`) answered without FastAPI's routing.
    fast_paths = {**agentgym_steps, "/env/step": env.fast_step(services)}
    app.add_middleware(FastPaths, routes=fast_paths, settings=settings, internal=openenv_links)
    if cluster is not None:
        from grpo_service.cluster.router import ClusterRouter

        app.add_middleware(ClusterRouter, cluster=cluster, fastapi_app=app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes)
    app.add_middleware(APIKeyGate, fastapi_app=app)
    if settings.cors_allow_origins:  # none by default: see docs/reliability.md, "CORS"
        origins = settings.cors_allow_origins
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["*"], allow_headers=["*"])
    redact_query_secrets()
    return app
