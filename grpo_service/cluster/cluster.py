"""`Cluster`: a front's view of the Ray hosts, found through Ray itself.

The front keeps no routing table: an id's host is the actor named ``grpo-host-{tag}`` in the
front's Ray namespace, where ``tag`` is the id's prefix, and Ray's name service answers for
every front alike. What the front keeps is a cache of actor handles, the hosts it saw die, and
the requests it has in flight to each host (to place new work on the least loaded one).

A host that dies (its process or its node) makes Ray raise at the next call: `ActorDiedError`
once Ray knows it is dead (410 ``host_lost`` from then on), `ActorUnavailableError` while it is
only unreachable (503 ``host_unavailable``); placement avoids such a host meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from grpo_service.cluster.host import (
    HOST_PREFIX,
    TRACE_SINK_NAME,
    AppFactory,
    Host,
    TraceSinkActor,
    host_name,
)
from grpo_service.cluster.step_link import StepLink
from grpo_service.config import Settings
from grpo_service.core.registry import INSTANCE_ENV_VAR
from grpo_service.errors import HostLost, HostUnavailable, ServiceError, WrongInstance

log = logging.getLogger(__name__)

SUSPECT_S = 10.0  # a host that did not answer is not given new work for this long
CALL_TIMEOUT_S = 30.0  # control calls (counts, listings, lifecycle)
LOCAL_OBJECT_STORE_BYTES = 256 * 2**20  # a local cluster's object store: requests, answers, traces
RAY_WORKER_NICENESS = "RAY_worker_niceness"  # the niceness Ray starts a worker at (its env, default 15)

# Local clusters this process started (their GCS addresses), whose workers run at its priority.
_STARTED_AT_FRONT_PRIORITY: set[str] = set()


class HostError(ServiceError, status=502, code="host_error"):
    """A host failed in an unexpected way (a bug): named, never a bare 500."""


@dataclass(eq=False)
class HostRef:
    tag: str
    actor: Any
    node_id: str = ""
    hostname: str = ""
    training: bool = False  # serves the training API
    inflight: int = 0  # rollouts this front runs on it now
    suspect_until: float = 0.0
    link: StepLink | None = None  # its step link, if it has one and this front uses them

    @property
    def name(self) -> str:
        return host_name(self.tag)

    def describe(self) -> str:
        where = f" on node {self.node_id[:12]} ({self.hostname})" if self.node_id else ""
        return f"host {self.tag}{where}"


@dataclass
class Lost:
    host: HostRef
    reason: str
    at: float = field(default_factory=time.time)


def share(total: int, index: int, count: int) -> int:
    """Host ``index``'s part of a cluster-wide limit ``total`` (at least 1 each)."""
    return max(1, total // count + (1 if index < total % count else 0))


def host_settings(settings: Settings, index: int, count: int, *, training: bool) -> Settings:
    """A host's settings: the front's, with its share of the cluster-wide limits. Tracing goes
    to the cluster's trace writer, the key is checked at the front, and the host is embedded."""
    return settings.model_copy(
        update={
            "ray_address": None,
            "trace_db": None,
            "environment_api_key": None,
            "cors_allow_origins": [],
            "training_enabled": settings.training_enabled and training,
            "max_envs": share(settings.max_envs, index, count),
            "max_policies": share(settings.max_policies, index, count),
            "max_active_runs": share(settings.max_active_runs, index, count),
            "max_finished_runs": share(settings.max_finished_runs, index, count),
            "max_finished_result_bytes": share(settings.max_finished_result_bytes, index, count),
        }
    )


def connect(settings: Settings) -> bool:
    """Join or start the Ray cluster ``settings.ray_address`` names; True if started here."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no reports to the network
    import ray

    if ray.is_initialized():
        return False
    address = settings.ray_address
    if address in ("auto", "local"):
        if address == "auto":
            try:
                ray.init(address="auto", log_to_driver=False, configure_logging=False)
                return False
            except ConnectionError:
                pass
        cpus = settings.ray_hosts * settings.ray_host_cpus if settings.ray_hosts else None
        start_local_cluster(cpus)
        return True
    ray.init(address=address, log_to_driver=False, configure_logging=False)
    return False


def start_local_cluster(
    num_cpus: float | None, object_store_bytes: int = LOCAL_OBJECT_STORE_BYTES, **init: Any
) -> None:
    """Start a Ray cluster in this process whose workers run at its priority (Ray's default is
    nice 15): the hosts and the trace writer then take Ray's prestarted workers, where a cluster
    someone else started needs each of them given a runtime env of its own (`Cluster._options`)."""
    import ray

    ray.init(
        num_cpus=num_cpus,
        object_store_memory=object_store_bytes,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _system_config={"worker_niceness": 0},
        **init,
    )
    _STARTED_AT_FRONT_PRIORITY.add(ray.get_runtime_context().gcs_address)


class Cluster:
    """The hosts of one namespace, as one front sees them."""

    def __init__(self, settings: Settings, app_factory: AppFactory) -> None:
        self.settings = settings
        self.app_factory = app_factory  # each host builds its app with it (pickled by reference)
        self.namespace = settings.ray_namespace
        self.hosts: dict[str, HostRef] = {}
        self.lost: dict[str, Lost] = {}
        self.trace_sink: Any = None
        self._created: list[Any] = []  # actors this front started (ended with it unless kept)
        self._started_ray = False
        self._workers_at_front_priority = False
        self._turn = itertools.count()
        self._refreshed = 0.0

    # ------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        timeout = self.settings.ray_start_timeout_s
        self._started_ray = await asyncio.wait_for(asyncio.to_thread(connect, self.settings), timeout)
        import ray

        self._workers_at_front_priority = ray.get_runtime_context().gcs_address in _STARTED_AT_FRONT_PRIORITY
        if self.settings.trace_db is not None:
            self.trace_sink = await self._trace_sink()
        await self.refresh()
        wanted = self.settings.ray_hosts or self._hosts_the_cluster_fits(ray.cluster_resources())
        missing = max(0, wanted - len(self.hosts))
        if missing:
            try:
                await asyncio.wait_for(self._start_hosts(missing, wanted), timeout)
            except TimeoutError:
                free = ray.available_resources().get("CPU", 0.0)
                raise RuntimeError(
                    f"Ray could not place {missing} hosts of {self.settings.ray_host_cpus} CPUs within "
                    f"{timeout:.0f} s ({free:g} CPUs free in the cluster): lower --ray-hosts or "
                    "RAY_HOST_CPUS, or add nodes"
                ) from None
        log.info("serving through Ray: %s", ", ".join(h.describe() for h in self.live()))

    def _hosts_the_cluster_fits(self, resources: dict[str, float]) -> int:
        cpus = resources.get("CPU", 1.0)
        return max(1, int(cpus // self.settings.ray_host_cpus)) if self.settings.ray_host_cpus else 1

    def _options(self, name: str, env: dict[str, str] | None = None) -> dict[str, Any]:
        options: dict[str, Any] = {
            "name": name,
            "namespace": self.namespace,
            "lifetime": "detached" if self.settings.ray_keep_hosts else None,
            "max_restarts": 0,
        }
        if not self._workers_at_front_priority:
            # Ray starts its workers at nice 15 (its `worker_niceness`), below the front: a host
            # then waits for a core behind the front and the clients, and under load every frame
            # and step took seconds at a low CPU. The cluster's actors serve requests: nice 0, as
            # Ray's own job supervisor is started. A worker with an env of its own is started for
            # the actor (about half a second more than a prestarted one).
            options["runtime_env"] = {"env_vars": {RAY_WORKER_NICENESS: "0", **(env or {})}}
        return options

    async def _trace_sink(self) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        assert self.settings.trace_db is not None
        here = ray.get_runtime_context().get_node_id()
        sink = (
            ray.remote(TraceSinkActor)
            .options(
                **self._options(TRACE_SINK_NAME),
                get_if_exists=True,
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
            )
            .remote(str(self.settings.trace_db.resolve()), self.settings.trace_queue_size)
        )
        path = await asyncio.wait_for(sink.start.remote(), CALL_TIMEOUT_S)
        if path != str(self.settings.trace_db.resolve()):
            log.warning("the cluster's trace writer (another front's) writes to %s", path)
        else:
            self._created.append(sink)
        return sink

    async def _start_hosts(self, count: int, total: int) -> None:
        import ray

        tags = [secrets.token_hex(4) for _ in range(count)]
        first = len(self.hosts)
        actors = []
        for i, tag in enumerate(tags):
            index = first + i
            actor = (
                ray.remote(Host)
                .options(
                    # given a runtime env, the host names its tag in it too, as a replica
                    # started with GRPO_INSTANCE_ID does (`ps e`, /proc/<pid>/environ)
                    **self._options(host_name(tag), {INSTANCE_ENV_VAR: tag}),
                    num_cpus=self.settings.ray_host_cpus,
                    max_concurrency=100_000,
                    scheduling_strategy="SPREAD",
                )
                .remote(
                    tag,
                    host_settings(self.settings, index, total, training=index == 0),
                    self.app_factory,
                    self.trace_sink,
                )
            )
            self._created.append(actor)
            actors.append(actor)
        try:
            infos = await asyncio.gather(*(a.start.remote() for a in actors))
        except BaseException:
            for actor in actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
            raise
        for actor, info in zip(actors, infos, strict=True):
            host = HostRef(info["tag"], actor)
            self._met(host, info)
            self.hosts[host.tag] = host

    async def refresh(self) -> None:
        """Learn the hosts of the namespace that Ray knows (other fronts may have started some)."""
        import ray

        self._refreshed = time.monotonic()
        named = await asyncio.to_thread(ray.util.list_named_actors, all_namespaces=True)
        tags = [
            a["name"][len(HOST_PREFIX) :]
            for a in named
            if a["namespace"] == self.namespace and a["name"].startswith(HOST_PREFIX)
        ]
        for tag in tags:
            if tag not in self.hosts and tag not in self.lost:
                with contextlib.suppress(ServiceError):
                    await self._adopt(tag)

    async def _adopt(self, tag: str) -> HostRef:
        import ray

        try:
            actor = await asyncio.to_thread(ray.get_actor, host_name(tag), namespace=self.namespace)
        except ValueError:
            raise WrongInstance(
                f"no host {tag} in this Ray cluster: the id was issued by another deployment of the "
                "service, or by a host that ended before this front started",
                code="wrong_instance",
            ) from None
        host = HostRef(tag, actor)
        self._met(host, await self.call(host, "start", timeout=CALL_TIMEOUT_S))
        self.hosts[tag] = host
        return host

    def _met(self, host: HostRef, info: dict[str, Any]) -> None:
        """What a host's ``start`` told of it: where it runs, and its step link."""
        import ray

        host.node_id, host.hostname, host.training = info["node_id"], info["hostname"], info["training"]
        if self.settings.ray_step_link:
            same_node = host.node_id == ray.get_runtime_context().get_node_id()
            host.link = StepLink.of(info.get("link"), host.describe(), same_node=same_node)

    async def close(self) -> None:
        import ray

        if not self.settings.ray_keep_hosts:
            hosts = [h for h in self.hosts.values() if h.actor in self._created]
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    asyncio.gather(*(h.actor.stop.remote() for h in hosts), return_exceptions=True),
                    CALL_TIMEOUT_S,
                )
            if self.trace_sink is not None and self.trace_sink in self._created:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.trace_sink.close.remote(), CALL_TIMEOUT_S)
            for actor in self._created:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
        for host in self.hosts.values():
            if host.link is not None:
                await host.link.close()
        self.hosts.clear()
        if self._started_ray:
            await asyncio.to_thread(ray.shutdown)

    # ----------------------------------------------------------------------------- lookups

    def live(self) -> list[HostRef]:
        """The hosts not known to be lost, in tag order (every front agrees on it)."""
        return [self.hosts[t] for t in sorted(self.hosts)]

    def home(self) -> HostRef:
        """The host of what is not spread: training jobs and AgentGym's integer-id sessions
        (the first live host that serves training, in tag order: every front picks the same)."""
        live = self.live()
        if not live:
            raise self._none_left()
        return next((h for h in live if h.training), live[0])

    async def owner(self, tag: str) -> HostRef:
        """The host of ids tagged ``tag``: 410 if it is lost, 421 if this cluster never had it."""
        if tag in self.lost:
            lost = self.lost[tag]
            raise HostLost(
                f"{lost.host.describe()} is lost ({lost.reason}); the envs, policies and runs it "
                "held are gone: restore them from snapshots (any host restores them)"
            )
        host = self.hosts.get(tag)
        return host if host is not None else await self._adopt(tag)

    def by_load(self) -> list[HostRef]:
        """Live hosts, the least loaded first (ties taken in turn), hosts that just failed last."""
        live = self.live()
        if not live:
            raise self._none_left()
        now, turn = time.monotonic(), next(self._turn)
        ranked = sorted(
            enumerate(live),
            key=lambda p: (p[1].suspect_until > now, p[1].inflight, (p[0] - turn) % len(live)),
        )
        return [h for _, h in ranked]

    def by_key(self, key: str) -> list[HostRef]:
        """Live hosts in the order a key always maps to (rendezvous hashing): the same
        client-chosen run id lands on the same host, which sees its duplicates."""
        live = self.live()
        if not live:
            raise self._none_left()
        return sorted(live, key=lambda h: hashlib.blake2b(f"{h.tag}/{key}".encode(), digest_size=8).digest())

    def _none_left(self) -> HostUnavailable:
        lost = ", ".join(sorted(self.lost)) or "none"
        return HostUnavailable(f"no live Ray host to serve this (lost hosts: {lost})", code="no_host")

    async def maybe_refresh(self, every_s: float = 5.0) -> None:
        """Look for hosts other fronts started, at most every ``every_s`` (a failure waits too)."""
        if time.monotonic() - self._refreshed > every_s:
            try:
                await asyncio.wait_for(self.refresh(), CALL_TIMEOUT_S)
            except Exception:  # the hosts known so far keep serving
                log.exception("could not list the Ray hosts of namespace %s", self.namespace)

    def answering(self) -> list[HostRef]:
        """Live hosts that have not just failed to answer (all live ones if every host has)."""
        now = time.monotonic()
        ranked = self.by_load()
        return [h for h in ranked if h.suspect_until <= now] or ranked

    # ------------------------------------------------------------------------------- calls

    async def call(self, host: HostRef, method: str, *args: Any, timeout: float | None = None) -> Any:
        """``host.method(*args)`` over Ray within a deadline; a failure of the host becomes
        a 410/503/504 naming it, never a hang or a 500."""
        import ray
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayError

        ref = getattr(host.actor, method).remote(*args)
        try:
            return await asyncio.wait_for(ref, timeout or self.settings.host_timeout_s)
        except ActorDiedError as exc:
            self._lose(host, _death_reason(exc))
            raise HostLost(
                f"{host.describe()} is lost ({_death_reason(exc)}); the envs, policies and runs it held "
                "are gone: restore them from snapshots (any host restores them)"
            ) from None
        except (ActorUnavailableError, RayActorError):
            host.suspect_until = time.monotonic() + SUSPECT_S
            raise HostUnavailable(
                f"{host.describe()} does not answer (its node may be lost); retry later, or restore "
                "what it held from snapshots on another host"
            ) from None
        except TimeoutError:
            ray.cancel(ref)
            raise HostUnavailable(f"{host.describe()} did not answer in time", code="host_timeout") from None
        except asyncio.CancelledError:
            ray.cancel(ref)
            raise
        except RayError as exc:
            raise HostError(f"{host.describe()} failed: {type(exc).__name__}: {str(exc)[:300]}") from None

    def _lose(self, host: HostRef, reason: str) -> None:
        if self.hosts.pop(host.tag, None) is not None:
            log.warning("%s is lost: %s", host.describe(), reason)
        self.lost.setdefault(host.tag, Lost(host, reason))


def _death_reason(exc: Exception) -> str:
    text = str(exc)
    for hint in ("node", "killed", "exit", "crash"):
        for line in text.splitlines():
            if hint in line.lower() and "actor" in line.lower():
                return line.strip()[:200]
    return "its actor died"
