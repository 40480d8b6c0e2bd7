"""The benchmark run: servers, repeats, figures, ratios, the table and the JSON."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tools.bench import floor, inproc, served
from tools.bench.procs import ChildServer, cpu_count, pinned

FAKE_MODEL = "fake-model"
LLM_LATENCY_S = 0.2


@dataclass(frozen=True)
class Plan:
    """How long and how big each measurement is."""

    mode: str
    repeats: int
    step_seconds: float  # in-process stepping, per figure and repeat
    raw_resets: int  # fresh worlds per repeat
    cached_resets: int
    http_seconds: float
    http_clients: int
    rollouts: int  # concurrent rollouts, zero-latency fake
    group_size: int
    rollout_turns: int
    llm_rollouts: int  # concurrent rollouts, 200 ms fake
    llm_turns: int
    snapshots: int
    branches: int
    live_envs: int
    actions_per_call: tuple[int, int] = (1, 4)
    warm_episodes: int = 4  # worlds cached per group seed before timing (a death's reset finds one)
    # The cost of one decision (service embedded against the floor): groups x size x turns.
    decision_groups: int = 4
    decision_group_size: int = 16
    decision_turns: int = 30


PLANS = {
    "smoke": Plan(
        "smoke",
        1,
        0.15,
        1,
        10,
        0.4,
        4,
        4,
        2,
        2,
        8,
        2,
        3,
        2,
        40,
        warm_episodes=1,
        decision_groups=1,
        decision_group_size=4,
        decision_turns=3,
    ),
    "quick": Plan("quick", 3, 1.5, 2, 100, 2.5, 16, 64, 16, 60, 128, 30, 40, 8, 1000),
    "full": Plan("full", 5, 4.0, 4, 300, 6.0, 16, 64, 16, 60, 128, 30, 200, 30, 1000),
}


@dataclass(frozen=True)
class Figure:
    key: str
    unit: str
    meaning: str
    higher_is_better: bool = True


WORKERS_NOTE = (
    "server: a front and one Ray host per CPU (serve --workers 0: a local Ray cluster), sharing the "
    "CPUs with the harness"
)
ONE_WORKER_NOTE = "one server process pinned to one CPU, the harness on the others"

FIGURES: tuple[Figure, ...] = (
    Figure(
        "raw_crafter_steps_per_s",
        "steps/s",
        "stock crafter.Env().step, random actions, its own 64x64 rendering on; in-process, one core; "
        "equal time in each world the rollouts play (seeds 101-108)",
    ),
    Figure(
        "env_steps_per_s",
        "steps/s",
        "our CrafterEnv.step([a]), random actions, text observation built, no pixels; in-process, one "
        "core; the same worlds",
    ),
    Figure(
        "raw_reset_s", "s", "stock crafter.Env(seed).reset() of a never-seen seed (world generation)", False
    ),
    Figure("env_reset_cached_s", "s", "CrafterEnv.reset(seed) of a seed seen before (world cache)", False),
    Figure(
        "http_steps_per_s",
        "steps/s",
        f"POST /env/step, one action per request, 16 keep-alive clients each on its own env; {WORKERS_NOTE}",
    ),
    Figure(
        "rollout_steps_per_s",
        "steps/s",
        "env steps/s through /rollout/group, 64 concurrent rollouts (4 groups of 16), zero-latency "
        f"fake LLM; {WORKERS_NOTE}",
    ),
    Figure(
        "rollout_decisions_per_s", "decisions/s", "LLM decisions/s in the same run as rollout_steps_per_s"
    ),
    Figure(
        "rollout_traced_steps_per_s",
        "steps/s",
        "as rollout_steps_per_s, with tracing on (Settings.trace_db: every host sends every rollout "
        "to the cluster's one SQLite writer)",
    ),
    Figure(
        "llm_bound",
        "decisions/s",
        "decisions/s with a fake answering in 200 ms, 128 concurrent rollouts (8 groups of 16); "
        + WORKERS_NOTE,
    ),
    Figure("llm_bound_ideal", "decisions/s", "128 rollouts / 0.2 s: the LLM's own limit"),
    Figure(
        "llm_bound_turn_ms",
        "ms",
        "in the llm_bound load, a rollout's own wall time per decision (its metrics.wall_time_s / "
        "its decisions, over all rollouts): 200 ms plus what the service adds inside the rollout",
        False,
    ),
    Figure(
        "llm_bound_call_ms",
        "ms",
        "in the same load, the mean time of one LLM call, from sending it to its reply handled "
        "(metrics.llm_time_s / decisions): 200 ms plus the wait for the event loop",
        False,
    ),
    Figure(
        "llm_bound_outside_turns_s",
        "s",
        "the load's wall time less the mean rollout's own wall time: starting the groups (envs, "
        "policies) and answering them",
        False,
    ),
    Figure(
        "llm_bound_fake_alone",
        "decisions/s",
        "the same 200 ms fake driven directly by 128 bare clients (same request): the harness's own ceiling",
    ),
    Figure("http_steps_per_s_1worker", "steps/s", f"as http_steps_per_s; {ONE_WORKER_NOTE}"),
    Figure("rollout_steps_per_s_1worker", "steps/s", f"as rollout_steps_per_s; {ONE_WORKER_NOTE}"),
    Figure("llm_bound_1worker", "decisions/s", f"as llm_bound; {ONE_WORKER_NOTE}"),
    Figure(
        "llm_bound_floor",
        "decisions/s",
        "the floor (tools/bench/floor.py, nothing of ours but the env) playing the same LLM-bound load, "
        "pinned like the one-process server, after it: what these cores allow that load",
    ),
    Figure("snapshot_p50_ms", "ms", "POST /env/snapshot (state encoded, signed, stored), median", False),
    Figure("snapshot_p99_ms", "ms", "POST /env/snapshot, 99th percentile", False),
    Figure("restore_p50_ms", "ms", "POST /env/restore (load, verify, decode, new live env), median", False),
    Figure("restore_p99_ms", "ms", "POST /env/restore, 99th percentile", False),
    Figure("snapshot_bytes", "bytes", "stored size of one env snapshot (zlib-compressed, signed)", False),
    Figure("branch16_p50_ms", "ms", "POST /branch of one env into 16 children, median", False),
    Figure("branch16_p99_ms", "ms", "POST /branch into 16 children, 99th percentile", False),
    Figure("rss_per_env_kb", "KiB", "server RSS growth per live env, 1,000 envs created over HTTP", False),
    Figure(
        "forks_per_s",
        "forks/s",
        "fork points per second of fork work (env and policy states read, copies restored and "
        "registered) in a forking /rollout/group: 4 Crafter roots, 8 turns, a fork every turn into 4, "
        "200 ms fake LLM; " + ONE_WORKER_NOTE,
    ),
    Figure("fork_copies_per_s", "copies/s", "env+policy copies per second of fork work, the same group"),
    Figure(
        "rss_per_live_fork_kb",
        "KiB",
        "server RSS growth per member alive (roots and copies) at the most members alive at once, "
        "the same group",
        False,
    ),
    # The cost of one decision, against the floor (tools/bench/floor.py).
    Figure(
        "floor_http_steps_per_s",
        "steps/s",
        "as http_steps_per_s against the floor (a bare uvicorn + FastAPI app stepping the same env, "
        f"orjson in and out, nothing of ours); {ONE_WORKER_NOTE}",
    ),
    Figure(
        "env_cpu_us_per_step",
        "us",
        "our CrafterEnv.step([a]) in the rollouts' worlds, CPU time (process_time) per step, one "
        "core: the env's share taken out of the CPU-per-decision figures",
        False,
    ),
    Figure(
        "service_cpu_us_per_decision",
        "us",
        "the task app's CPU per LLM decision, embedded (coordinator in-process, answers encoded as "
        "the route would), mode rl with token ids and logprobs recorded, tracing on, zero-latency "
        "fake; 4 groups of 16 crafter-react rollouts x 30 turns; one CPU",
        False,
    ),
    Figure(
        "task_app_cpu_us_per_decision",
        "us",
        "service_cpu_us_per_decision less the env's share (env steps per decision x "
        "env_cpu_us_per_step): the task app's own CPU",
        False,
    ),
    Figure(
        "trace_cpu_us_per_decision",
        "us",
        "the same load traced less untraced, CPU per decision, the two played side by side (two "
        "processes on the one CPU at once: both see the host's speed of the moment)",
        False,
    ),
    Figure(
        "side_by_side_traced_cpu_us_per_decision",
        "us",
        "the traced load's CPU per decision when played side by side with the untraced one (the "
        "two share the CPU: higher than service_cpu_us_per_decision)",
        False,
    ),
    Figure(
        "trace_share_of_decision_cpu",
        "fraction",
        "trace_cpu_us_per_decision / side_by_side_traced_cpu_us_per_decision",
        False,
    ),
    Figure(
        "trace_writer_cpu_us_per_decision",
        "us",
        "the trace writer's own thread (encoding a batch of rollouts, writing it), CPU time per "
        "decision in the traced loads of service_cpu_us_per_decision",
        False,
    ),
    Figure(
        "floor_cpu_us_per_decision",
        "us",
        "the floor's CPU per decision on the same load: one raw aiohttp request per decision to the "
        "same fake (the crafter-react request), the reply parsed by orjson, its actions stepped, "
        "each turn kept and the group answered by orjson; one CPU",
        False,
    ),
    Figure(
        "floor_own_cpu_us_per_decision",
        "us",
        "floor_cpu_us_per_decision less the env's share, computed as for task_app_cpu_us_per_decision",
        False,
    ),
)
PEER_NOTE = (
    "TextCraft steps/s, the service's server and the peer's both pinned to the service CPU, in "
    "interleaved rounds (tools/bench/peers.py)"
)
PEER_FIGURES: tuple[Figure, ...] = tuple(
    Figure(f"{side}_steps_per_s_{n}", "steps/s", f"{what}, {n} client{'s' if n > 1 else ''}; {PEER_NOTE}")
    for proto, counts, ours, theirs in (
        ("openenv", (1, 16), "/openenv/textcraft under OpenEnv's own client", "OpenEnv 0.10's own server"),
        ("agentgym", (1, 8), "/agentgym/textcraft, lean keep-alive clients", "agentenv-textcraft's server"),
    )
    for n in counts
    for side, what in ((proto, ours), (f"{proto}_peer", f"{theirs} under the same clients"))
)
# Where a step's time goes with OpenEnv's client: a round trip is the client's CPU, then the
# server's, so with one client the client's share bounds what a faster server can gain.
PEER_CPU_FIGURES: tuple[Figure, ...] = tuple(
    Figure(
        f"{side}_{part}_cpu_us_per_step_{n}",
        "us",
        f"{what} CPU per step, {n} client{'s' if n > 1 else ''}: {how}",
        False,
    )
    for n in (1, 16)
    for side, server in (("openenv", "our server"), ("openenv_peer", "OpenEnv's own server"))
    for part, what, how in (
        ("server", f"{server}'s", "its process CPU time (psutil) over the rounds / the steps"),
        ("client", f"OpenEnv's client's, against {server},", "its process CPU time over the timed steps"),
    )
)
SESSION_FIGURES: tuple[Figure, ...] = (
    Figure(
        "sessions_held",
        "sessions",
        "OpenEnv WebSocket sessions held at once, each stepping TextCraft once per 2 s, with every "
        "session opened, every step answered and p99 <= 1 s (the last level of 256, 1,024, 2,048, "
        "4,096 that passed; tools/bench/sessions.py); one-worker service",
    ),
    Figure("sessions_p99_step_ms", "ms", "p99 step latency (send to reply) at sessions_held", False),
    Figure("sessions_success_rate", "fraction", "sessions opened and steps answered / asked, last level"),
    Figure(
        "sessions_rss_per_session_kb", "KiB", "server RSS growth per open session at sessions_held", False
    ),
    Figure("sessions_leaked", "envs", "envs still live 60 s after every socket dropped at once", False),
    Figure(
        "http_sessions_held",
        "envs",
        "the same with registry envs over HTTP (POST /env/create, /env/step over 64 keep-alive connections)",
    ),
    Figure("http_sessions_p99_step_ms", "ms", "p99 /env/step latency at http_sessions_held", False),
    Figure(
        "sessions_held_ray",
        "sessions",
        "as sessions_held, through a Ray front with 2 hosts (serve --ray, unpinned)",
    ),
    Figure("sessions_p99_step_ms_ray", "ms", "p99 step latency at sessions_held_ray", False),
    Figure("sessions_leaked_ray", "envs", "as sessions_leaked, through Ray", False),
)
FIGURES = FIGURES + PEER_FIGURES + PEER_CPU_FIGURES + SESSION_FIGURES
FIGURE_KEYS = tuple(f.key for f in FIGURES)


@dataclass(frozen=True)
class Ratio:
    key: str
    numerator: str
    denominator: str
    goal: float
    meaning: str
    at_most: bool = False  # the goal is a ceiling (a cost), not a floor

    def met(self, value: float) -> bool:
        return value <= self.goal if self.at_most else value >= self.goal


RATIOS: tuple[Ratio, ...] = (
    Ratio("step_vs_raw", "env_steps_per_s", "raw_crafter_steps_per_s", 4.0, "env / raw step rate"),
    Ratio("reset_cached_vs_raw", "raw_reset_s", "env_reset_cached_s", 500.0, "raw reset / cached reset"),
    Ratio("llm_bound_efficiency", "llm_bound", "llm_bound_ideal", 0.9, "achieved / ideal decisions/s"),
    Ratio(
        "http_vs_floor",
        "http_steps_per_s_1worker",
        "floor_http_steps_per_s",
        0.7,
        "one-process HTTP step rate / the floor's, same CPU",
    ),
    Ratio(
        "decision_cpu_vs_floor",
        "service_cpu_us_per_decision",
        "floor_cpu_us_per_decision",
        1.5,
        "service CPU per decision / the floor's (at most)",
        at_most=True,
    ),
    Ratio(
        "trace_share_of_decision_cpu",
        "trace_cpu_us_per_decision",
        "side_by_side_traced_cpu_us_per_decision",
        0.05,
        "tracing's share of the service's CPU per decision (at most)",
        at_most=True,
    ),
)
RATIOS = RATIOS + tuple(
    Ratio(
        f"{proto}_vs_peer_{n}",
        f"{proto}_steps_per_s_{n}",
        f"{proto}_peer_steps_per_s_{n}",
        1.5,
        f"{proto} steps/s: the service / the peer's own server, {n} client{'s' if n > 1 else ''}",
    )
    for proto, counts in (("openenv", (1, 16)), ("agentgym", (1, 8)))
    for n in counts
)
RATIO_KEYS = tuple(r.key for r in RATIOS)

# Not goals: what serving costs over a bare in-process step (the floor is the goal's denominator),
# what tracing costs in throughput through Ray (its goal is its share of the CPU per decision),
# what more cores buy and what the harness costs.
INFO_RATIOS: tuple[Ratio, ...] = (
    Ratio("http_vs_inproc", "http_steps_per_s", "env_steps_per_s", 0.0, "HTTP step rate / in-process"),
    Ratio(
        "rollout_vs_inproc", "rollout_steps_per_s", "env_steps_per_s", 0.0, "rollout step rate / in-process"
    ),
    Ratio("trace_on_vs_off", "rollout_traced_steps_per_s", "rollout_steps_per_s", 0.0, "traced / untraced"),
    Ratio(
        "trace_writer_share_of_decision_cpu",
        "trace_writer_cpu_us_per_decision",
        "service_cpu_us_per_decision",
        0.0,
        "the trace writer thread's CPU / the service's, in the same traced loads",
    ),
    Ratio(
        "http_1worker_vs_inproc",
        "http_steps_per_s_1worker",
        "env_steps_per_s",
        0.0,
        "one-process HTTP step rate / in-process",
    ),
    Ratio(
        "rollout_1worker_vs_inproc",
        "rollout_steps_per_s_1worker",
        "env_steps_per_s",
        0.0,
        "one-process rollout step rate / in-process",
    ),
    Ratio(
        "llm_bound_1worker_efficiency",
        "llm_bound_1worker",
        "llm_bound_ideal",
        0.0,
        "one-process achieved / ideal decisions/s",
    ),
    Ratio(
        "llm_bound_vs_fake_alone",
        "llm_bound",
        "llm_bound_fake_alone",
        0.0,
        "service decisions/s / what the fake sustains alone",
    ),
    Ratio("fake_alone_efficiency", "llm_bound_fake_alone", "llm_bound_ideal", 0.0, "fake alone / ideal"),
    Ratio(
        "llm_bound_floor_efficiency",
        "llm_bound_floor",
        "llm_bound_ideal",
        0.0,
        "the floor's achieved / ideal decisions/s, pinned like the one-process server",
    ),
    Ratio(
        "llm_bound_1worker_vs_floor",
        "llm_bound_1worker",
        "llm_bound_floor",
        0.0,
        "one-process LLM-bound decisions/s / the floor's, same CPU",
    ),
)


@dataclass
class Layout:
    """Which CPUs the measured service and the harness (fake LLM, load generator) use."""

    service: set[int] | None
    harness: set[int] | None

    @classmethod
    def choose(cls, pinning: bool) -> Layout:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if not pinning or len(cpus) < 2:
            return cls(None, None)
        return cls({cpus[0]}, set(cpus[1:]))

    @property
    def everything(self) -> set[int] | None:
        """Every CPU of the layout: what an unpinned server started from the pinned harness is
        given (it would inherit the harness's CPUs)."""
        return None if self.service is None else self.service | (self.harness or set())

    def describe(self) -> str:
        if self.service is None:
            return "not pinned: service, fake LLM and load generator share all cores"
        return (
            f"one-worker service and in-process figures pinned to CPU {sorted(self.service)}; "
            f"fake LLM and load generator (the harness) on CPU {sorted(self.harness or [])}"
        )


@dataclass
class Samples:
    values: dict[str, list[float]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, key: str, value: float) -> None:
        self.values.setdefault(key, []).append(float(value))


def _tracing_available() -> str | None:
    """None if the tracing writer imports, else why not."""
    try:
        from grpo_service.tracing import TraceWriter  # noqa: F401
    except Exception as exc:  # not written yet, or broken: the figure is skipped, not the run
        return f"grpo_service.tracing.TraceWriter is not importable ({type(exc).__name__}: {exc})"
    return None


def _server_stack() -> str:
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return f"uvicorn {importlib.metadata.version('uvicorn')} ({loop} + {http})"


def machine_info() -> dict[str, Any]:
    model = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = None
    with contextlib.suppress(Exception):
        import psutil

        mem = round(psutil.virtual_memory().total / 2**30, 1)
    versions = {}
    for dist in ("crafter", "opensimplex", "numpy", "fastapi", "pydantic", "uvicorn", "openai"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[dist] = importlib.metadata.version(dist)
    return {
        "nproc": cpu_count(),
        "cpu_model": model,
        "memory_gib": mem,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_avg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "server_stack": _server_stack(),
        "versions": versions,
    }


# ----------------------------------------------------------------------------------- run


class Bench:
    def __init__(self, plan: Plan, *, pinning: bool, log: Callable[[str], None], workdir: Path):
        self.plan = plan
        self.layout = Layout.choose(pinning)
        self.log = log
        self.workdir = workdir
        self.samples = Samples()
        self.servers: list[ChildServer] = []
        self.notes: list[str] = []
        # Ray hosts of each multi-host server (serve --workers 0); the smoke run serves those as one
        # process each (0 here): a local Ray cluster takes longer to start than the smoke run measures.
        self.workers = cpu_count() if plan.mode != "smoke" else 0

    def _service(self, name: str, fake_url: str, *, workers: int = 1, **settings: Any) -> ChildServer:
        """A task-app server: one process pinned to the service CPU, or ``workers=0``: the front
        of a local Ray cluster of one host per CPU, unpinned, as ``serve --workers 0`` runs."""
        payload = {
            "state_dir": str(self.workdir / name / "state"),
            "snapshot_secret": "bench-secret-" + "x" * 32,
            "default_model": FAKE_MODEL,
            "vllm_base_url": fake_url,
            "reaper_interval_s": 3600.0,
            "inference_max_retries": 0,
            **({} if workers == 1 else {"ray_address": "local", "ray_hosts": workers or self.workers}),
            **settings,
        }
        cpus = self.layout.service if workers == 1 else None
        return self._start(ChildServer("service", payload, cpus=cpus, log=self._logfile(name)))

    def _multi_host(self) -> str:
        if not self.workers:
            return "one process each, pinned like the one-worker server (the smoke run starts no Ray cluster)"
        return f"{self.workers} Ray hosts each (serve --workers 0), unpinned"

    def _fake(self, name: str, latency_s: float) -> ChildServer:
        payload = {
            "model": FAKE_MODEL,
            "latency_s": latency_s,
            "actions_per_call": self.plan.actions_per_call,
        }
        return self._start(ChildServer("fake", payload, cpus=self.layout.harness, log=self._logfile(name)))

    def _logfile(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def _start(self, server: ChildServer) -> ChildServer:
        self.servers.append(server.start())
        return server

    def stop_all(self) -> None:
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.stop()
        self.servers.clear()

    def _timed(self, key: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        value = fn()
        self.log(f"  {key}{_shown(value)} ({time.perf_counter() - t0:.1f} s)")
        return value

    # ------------------------------------------------------------------------------ phases

    def run(self) -> dict[str, Any]:
        plan = self.plan
        started = time.time()
        trace_problem = _tracing_available()
        if trace_problem:
            self.samples.skipped["rollout_traced_steps_per_s"] = trace_problem
            self.notes.append(f"rollout_traced_steps_per_s skipped: {trace_problem}")
        self.log(f"layout: {self.layout.describe()}; multi-host servers: {self._multi_host()}")
        try:
            fake0 = self._fake("fake-0ms", 0.0)
            fake200 = self._fake("fake-200ms", LLM_LATENCY_S)
            for fake in (fake0, fake200):
                fake.wait_ready()
            one = self._service("service-1worker", fake0.base_url)
            multi = 0 if self.workers else 1  # serve --workers 0, or one process
            many = self._service("service", fake0.base_url, workers=multi)
            traced = None
            if not trace_problem:
                traced = self._service(
                    "service-traced", fake0.base_url, workers=multi, trace_db=str(self.workdir / "trace.db")
                )
            floor_server = self._start(
                ChildServer(
                    "floor", {"model": FAKE_MODEL}, cpus=self.layout.service, log=self._logfile("floor")
                )
            )
            servers = [server for server in (one, many, traced) if server is not None]
            floor_server.wait_ready()
            for server in servers:
                server.wait_ready()
            group_seeds = list(range(101, 101 + max(1, plan.llm_rollouts // plan.group_size)))
            with pinned(self.layout.harness):
                for server in servers:  # every host caches the worlds it will play
                    hosts = self.workers if server is not one and self.workers else 1
                    asyncio.run(served.warm_worlds(server.base_url, [7], hosts=hosts))
                    asyncio.run(
                        served.warm_worlds(server.base_url, group_seeds, plan.warm_episodes, hosts=hosts)
                    )
                    self._warm_up_groups(server, (fake0, fake200), group_seeds)
                asyncio.run(served.warm_worlds(floor_server.base_url, [7]))
            for rep in range(plan.repeats):
                self.log(f"repeat {rep + 1}/{plan.repeats}")
                self._inproc(rep, group_seeds)
                with pinned(self.layout.harness):
                    self._served(many, fake0, fake200, group_seeds, traced=traced)
                    self._served(one, fake0, fake200, group_seeds, suffix="_1worker", http_steps=False)
                    self._llm_bound_floor(floor_server, fake200, group_seeds)
                    self._fake_alone(fake200)
                    self._latencies(one, fake200)
                    self._floor(rep, floor_server, one, fake0)
            self.log("live-env memory (fresh server)")
            self._memory(fake0.base_url)
            self.stop_all()
            self.log("the peers' own servers, side by side")
            self._peers()
            self.log("live sessions")
            self._sessions()
        finally:
            self.stop_all()
        return self._report(started)

    def _warm_up_groups(self, server: ChildServer, fakes: tuple[ChildServer, ...], seeds: list[int]) -> None:
        """A short untimed group load per fake: each worker builds its inference client for
        that URL (an SSL context, 20-40 ms) and the fake fills its caches before any timing."""
        plan = self.plan
        for fake in fakes:
            asyncio.run(
                served.rollout_groups(
                    server.base_url,
                    inference_url=fake.base_url,
                    rollouts=plan.llm_rollouts,
                    group_size=plan.group_size,
                    turns=2,
                    seeds=seeds,
                    on_done="reset",
                )
            )

    def _inproc(self, rep: int, seeds: list[int]) -> None:
        """Stepping figures in the worlds the rollouts play (``seeds``), actions seeded by ``rep``."""
        plan, add = self.plan, self.samples.add
        with pinned(self.layout.service):
            add(
                "raw_crafter_steps_per_s",
                self._timed(
                    "raw_crafter_steps_per_s",
                    lambda: inproc.raw_crafter_steps_per_s(plan.step_seconds, seeds, rep),
                ),
            )
            add(
                "env_steps_per_s",
                self._timed("env_steps_per_s", lambda: inproc.env_steps_per_s(plan.step_seconds, seeds, rep)),
            )
            first = 1_000_000 + rep * 1000
            add("raw_reset_s", self._timed("raw_reset_s", lambda: inproc.raw_reset_s(plan.raw_resets, first)))
            add(
                "env_reset_cached_s",
                self._timed("env_reset_cached_s", lambda: inproc.env_reset_cached_s(plan.cached_resets, 7)),
            )

    def _served(
        self,
        svc: ChildServer,
        fake0: ChildServer,
        fake200: ChildServer,
        group_seeds: list[int],
        *,
        suffix: str = "",
        traced: ChildServer | None = None,
        http_steps: bool = True,
    ) -> None:
        """The HTTP (unless ``http_steps`` is off: the one-worker server's are measured in turns
        with the floor's, in `_floor`), rollout and LLM-bound loads against ``svc`` (figures
        named with ``suffix``)."""
        plan, add = self.plan, self.samples.add

        def http() -> float:
            return asyncio.run(served.http_steps_per_s(svc.base_url, plan.http_clients, plan.http_seconds, 7))

        if http_steps:
            add(f"http_steps_per_s{suffix}", self._timed(f"http_steps_per_s{suffix}", http))

        def rollouts(key: str, server: ChildServer) -> None:
            run = self._timed(key, lambda: self._groups(server.base_url, fake0.base_url, group_seeds))
            self._check_run(key, run)
            add(key, run.steps_per_s)
            self.log(f"    {run.steps} steps, {run.decisions} decisions in {run.wall_s:.2f} s")
            if key == "rollout_steps_per_s":
                add("rollout_decisions_per_s", run.decisions_per_s)
                self.samples.extra.setdefault("rollout_steps_per_decision", []).append(
                    run.steps / max(1, run.decisions)
                )

        loads = [(f"rollout_steps_per_s{suffix}", svc)]
        if traced is not None:  # traced and untraced alternate which goes first (ABBA order)
            loads.append(("rollout_traced_steps_per_s", traced))
            if len(self.samples.values.get("rollout_traced_steps_per_s", [])) % 2:
                loads.reverse()
        for key, server in loads:
            rollouts(key, server)

        run = self._timed(
            f"llm_bound{suffix}",
            lambda: self._groups(svc.base_url, fake200.base_url, group_seeds, llm_bound=True),
        )
        self._check_run(f"llm_bound{suffix}", run)
        add(f"llm_bound{suffix}", run.decisions_per_s)
        self.log(f"    {run.decisions} decisions in {run.wall_s:.2f} s: {run.decisions_per_s:.0f}/s")
        if not suffix:  # where the LLM-bound load's time goes (see docs/benchmark.md)
            add("llm_bound_turn_ms", run.turn_ms)
            add("llm_bound_call_ms", run.call_ms)
            members = plan.llm_rollouts
            add("llm_bound_outside_turns_s", max(0.0, run.wall_s - run.member_wall_s / max(1, members)))

    def _floor(self, rep: int, floor_server: ChildServer, one: ChildServer, fake0: ChildServer) -> None:
        """The one-worker server's HTTP step rate against the floor's, and the cost of one
        decision: service against floor. The host's speed drifts within a repeat, so the two
        step rates are taken in turns, half the time each, twice (ABBA, alternating which goes
        first between repeats)."""
        plan, add = self.plan, self.samples.add

        def http(url: str) -> float:
            return asyncio.run(served.http_steps_per_s(url, plan.http_clients, plan.http_seconds / 2, 7))

        order = [("http_steps_per_s_1worker", one), ("floor_http_steps_per_s", floor_server)]
        if rep % 2:
            order.reverse()
        rates: dict[str, list[float]] = {key: [] for key, _ in order}
        for key, server in (*order, *reversed(order)):
            rates[key].append(self._timed(key, lambda url=server.base_url: http(url)))
        for key, values in rates.items():
            add(key, statistics.fmean(values))
        costs = self._timed(
            "decision costs",
            lambda: floor.decision_costs(
                fake_url=fake0.base_url,
                floor=floor_server,
                workdir=self.workdir / "decision",
                service_cpus=self.layout.service,
                groups=plan.decision_groups,
                group_size=plan.decision_group_size,
                turns=plan.decision_turns,
            ),
        )
        for key, value in costs.items():
            add(key, value)

    def _llm_bound_floor(self, floor_server: ChildServer, fake200: ChildServer, seeds: list[int]) -> None:
        """The LLM-bound load played by the floor, on the one-process server's CPU, right after
        that server played it: the same work with nothing of ours, on the same cores."""
        plan = self.plan
        rate = self._timed(
            "llm_bound_floor",
            lambda: floor.llm_bound_decisions_per_s(
                floor_server.base_url, fake200.base_url, seeds, plan.group_size, plan.llm_turns
            ),
        )
        self.samples.add("llm_bound_floor", rate)

    def _fake_alone(self, fake200: ChildServer) -> None:
        plan = self.plan

        def alone() -> float:
            body = served.crafter_request_body(FAKE_MODEL)
            return asyncio.run(served.fake_alone(fake200.base_url, body, plan.llm_rollouts, plan.llm_turns))

        self.samples.add("llm_bound_ideal", plan.llm_rollouts / LLM_LATENCY_S)
        self.samples.add("llm_bound_fake_alone", self._timed("llm_bound_fake_alone", alone))

    def _latencies(self, svc: ChildServer, fake200: ChildServer) -> None:
        plan, add = self.plan, self.samples.add
        snap = self._timed(
            "snapshot/restore", lambda: asyncio.run(served.snapshot_restore(svc.base_url, plan.snapshots, 11))
        )
        for key, value in snap.items():
            add(key, value)
        branch = self._timed(
            "branch16", lambda: asyncio.run(served.branch16(svc.base_url, plan.branches, 11))
        )
        for key, value in branch.items():
            add(key, value)
        fork = served.fork_group(svc.base_url, fake200.base_url, svc.rss_bytes, 11)
        forks = self._timed("fork_group", lambda: asyncio.run(fork))
        for key, value in forks.items():
            add(key, value)

    def _groups(
        self, url: str, inference_url: str, seeds: list[int], *, llm_bound: bool = False
    ) -> served.GroupRun:
        """One load of GRPO groups: the rollout load (zero-latency fake, terminate at episode end)
        or, with ``llm_bound``, the LLM-bound load (200 ms fake, longer-lived groups)."""
        plan = self.plan
        return asyncio.run(
            served.rollout_groups(
                url,
                inference_url=inference_url,
                rollouts=plan.llm_rollouts if llm_bound else plan.rollouts,
                group_size=plan.group_size,
                turns=plan.llm_turns if llm_bound else plan.rollout_turns,
                seeds=seeds,
                on_done="reset" if llm_bound else "terminate",
            )
        )

    def _check_run(self, what: str, run: served.GroupRun) -> None:
        if run.failed:
            self.notes.append(f"{what}: {run.failed} rollouts failed ({run.stop_reasons})")
        odd = {k: v for k, v in run.stop_reasons.items() if k not in ("completed", "done", "episode_done")}
        if odd:
            self.notes.append(f"{what}: unexpected stop reasons {odd}")

    def _memory(self, fake_url: str) -> None:
        """A fresh server per repeat: RSS before and after creating ``live_envs`` envs."""
        seeds = list(range(201, 209))
        for _ in range(self.plan.repeats):
            server = self._service("service-mem", fake_url)
            try:
                server.wait_ready()
                with pinned(self.layout.harness):
                    asyncio.run(served.warm_worlds(server.base_url, seeds))
                    time.sleep(0.2)
                    before = server.rss_bytes()
                    asyncio.run(served.create_many(server.base_url, self.plan.live_envs, seeds))
                    time.sleep(0.2)
                    after = server.rss_bytes()
                self.samples.add("rss_per_env_kb", (after - before) / self.plan.live_envs / 1024)
                self.log(f"  rss_per_env_kb: {(after - before) / self.plan.live_envs / 1024:.0f}")
            finally:
                server.stop()
                self.servers.remove(server)

    def _peers(self) -> None:
        from tools.bench.peers import run_peers

        with pinned(self.layout.harness):
            values, notes = run_peers(
                self.plan.mode,
                self.workdir,
                server_cpus=self.layout.service,
                harness_cpus=self.layout.harness,
                log=self.log,
            )
        for key, rounds in values.items():
            for value in rounds:
                self.samples.add(key, value)
        self.notes.extend(notes)

    def _sessions(self) -> None:
        from tools.bench.sessions import run_sessions, summary

        with pinned(self.layout.harness):
            reports = run_sessions(
                self.plan.mode, self.workdir, server_cpus=self.layout.service, log=self.log
            )
        for report in reports:
            prefix = "sessions" if report["transport"] == "openenv" else "http_sessions"
            self.samples.add(f"{prefix}_held", report["sessions_held"])
            if report["p99_step_ms"] is not None:
                self.samples.add(f"{prefix}_p99_step_ms", report["p99_step_ms"])
            if prefix == "sessions":
                self.samples.add("sessions_success_rate", report["success_rate"] or 0.0)
                self.samples.add("sessions_leaked", report["leaked_after_drop"])
                if report["rss_per_session_kb"] is not None:
                    self.samples.add("sessions_rss_per_session_kb", report["rss_per_session_kb"])
        self.log(f"  {summary(reports)}")
        if self.plan.mode == "smoke":  # it would start a Ray cluster of its own: --quick and full only
            for key in ("sessions_held_ray", "sessions_p99_step_ms_ray", "sessions_leaked_ray"):
                self.samples.skipped[key] = "the smoke run holds sessions embedded only"
            self.samples.extra["sessions"] = reports
            return
        self.log("live sessions through Ray (2 hosts, unpinned)")
        ray = {"ray_address": "local", "ray_hosts": 2, "ray_host_cpus": 0.0}
        with pinned(self.layout.harness):
            through_ray = run_sessions(
                self.plan.mode,
                self.workdir,
                server_cpus=self.layout.everything,
                log=self.log,
                serving=ray,
                transports=("openenv",),
            )
        for report in through_ray:
            report["serving"] = "ray_2hosts"
            self.samples.add("sessions_held_ray", report["sessions_held"])
            if report["p99_step_ms"] is not None:
                self.samples.add("sessions_p99_step_ms_ray", report["p99_step_ms"])
            self.samples.add("sessions_leaked_ray", report["leaked_after_drop"])
        self.log(f"  {summary(through_ray)}")
        self.samples.extra["sessions"] = [*reports, *through_ray]

    # ------------------------------------------------------------------------------ report

    def _per_repeat(self, ratio: Ratio) -> list[float]:
        """The ratio in each repeat, numerator and denominator from the same repeat."""
        num = self.samples.values.get(ratio.numerator, [])
        den = self.samples.values.get(ratio.denominator, [])
        return [n / d for n, d in zip(num, den, strict=False) if d]

    def _report(self, started: float) -> dict[str, Any]:
        figures: dict[str, Any] = {}
        for fig in FIGURES:
            values = self.samples.values.get(fig.key, [])
            entry: dict[str, Any] = {"unit": fig.unit, "meaning": fig.meaning}
            if values:
                entry.update(
                    median=statistics.median(values),
                    spread=[min(values), max(values)],
                    spread_pct=_spread_pct(values),
                    n=len(values),
                    values=values,
                )
            else:
                entry.update(median=None, spread=None, spread_pct=None, n=0, values=[])
                entry["skipped"] = self.samples.skipped.get(fig.key, "not measured")
            figures[fig.key] = entry
        ratios: dict[str, Any] = {}
        for ratio in RATIOS:
            per_repeat = self._per_repeat(ratio)
            entry = {
                "numerator": ratio.numerator,
                "denominator": ratio.denominator,
                "goal": ratio.goal,
                "meaning": ratio.meaning,
            }
            if per_repeat:
                value = statistics.median(per_repeat)
                entry.update(
                    value=value,
                    spread=[min(per_repeat), max(per_repeat)],
                    per_repeat=per_repeat,
                    met=ratio.met(value),
                    at_most=ratio.at_most,
                )
            else:
                entry.update(value=None, spread=None, per_repeat=[], met=None)
                entry["skipped"] = self.samples.skipped.get(ratio.numerator) or self.samples.skipped.get(
                    ratio.denominator, "not measured"
                )
            ratios[ratio.key] = entry
        info: dict[str, Any] = {}
        for ratio in INFO_RATIOS:
            per_repeat = self._per_repeat(ratio)
            info[ratio.key] = {
                "numerator": ratio.numerator,
                "denominator": ratio.denominator,
                "meaning": ratio.meaning,
                "value": statistics.median(per_repeat) if per_repeat else None,
                "spread": [min(per_repeat), max(per_repeat)] if per_repeat else None,
            }
        spd = self.samples.extra.get("rollout_steps_per_decision", [])
        return {
            "schema": 1,
            "mode": self.plan.mode,
            "started_at": started,
            "duration_s": round(time.time() - started, 1),
            "machine": machine_info(),
            "layout": self.layout.describe(),
            "plan": asdict(self.plan),
            "measurement": {
                "fake_llm": "separate process (python -m tools.bench.child fake), no access log",
                "fake_actions_per_call": list(self.plan.actions_per_call),
                "rollout_steps_per_decision": statistics.median(spd) if spd else None,
                "load_generator": "this process, asyncio + raw HTTP/1.1 keep-alive sockets",
                "multi_host_servers": self._multi_host(),
                "http_request": '{"env_id": ..., "action": "<random name>"}; full response parsed',
                "statistic": "median over repeats; spread = [min, max]; ratios = median of per-repeat ratios",
            },
            "figures": figures,
            "ratios": ratios,
            "info_ratios": info,
            "sessions": self.samples.extra.get("sessions", []),
            "notes": self.notes,
        }


def _spread_pct(values: list[float]) -> float:
    med = statistics.median(values)
    return round(100 * (max(values) - min(values)) / med, 1) if med else 0.0


def _shown(value: Any) -> str:
    """A timed step's value for its progress line: a number, a dict's numbers, or nothing (a run's
    figures are logged on the next line)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f": {_fmt(float(value))}"
    if isinstance(value, dict):
        return ": " + ", ".join(f"{k} {_fmt(v)}" for k, v in value.items() if isinstance(v, int | float))
    return ""


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    if abs(value) >= 0.01:
        return f"{value:.3f}"
    return f"{value:.2e}"


def run_bench(mode: str, *, pinning: bool = True, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    plan = PLANS[mode]
    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as tmp:
        bench = Bench(
            plan, pinning=pinning, log=log or (lambda s: print(s, file=sys.stderr)), workdir=Path(tmp)
        )
        return bench.run()
