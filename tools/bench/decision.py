"""The cost of one decision: the task app's CPU per LLM decision, embedded and over HTTP.

    python -m tools.bench.decision                  # over HTTP and embedded, 3 repeats each
    python -m tools.bench.decision --mode http --traced --profile docs/decision-http
    python -m tools.bench.decision --mode http --server-path /path/to/other/checkout

The load is the bench's rollout load, smaller: ``groups`` GRPO groups of ``group_size``
crafter-react rollouts (``turns`` decisions each, ``on_done: terminate``, the service's default
recording: ``mode: rl``, token ids and logprobs) against the zero-latency fake LLM, which runs in
its own process (pinned to the last CPU with ``--pin``, as is the load generator). The figure
is the service's process CPU time (user + system, psutil) over the measured load divided by
the decisions it made: robust to a busy machine where wall-clock rates are not.

- ``http``: the task app in its own process (one worker, pinned to CPU 0 with ``--pin``), driven
  through ``POST /rollout/group`` by the bench's raw HTTP client. ``--server-path`` runs the
  service from another checkout (the harness stays this one): how regressions are bisected.
- ``embedded``: the coordinator called in this process (``build_services``, no HTTP).

With ``--traced`` the window closes once the load's traces are written (a rollout's trace is
written after it ends): embedded by `TraceWriter.flush`, over HTTP by polling the service's
``/health`` tracing counts.

``--profile PREFIX`` also samples the measured window with py-spy (``pip install -e '.[profile]'``) and
writes ``PREFIX.txt`` (collapsed stacks), ``PREFIX.png`` and ``PREFIX.svg`` (a flame graph) and
``PREFIX.json`` (the CPU budget per part: `tools.bench.flame.PARTS`, in microseconds per
decision). A profiled run's own CPU figure is inflated by the sampling; take budgets as shares
of an unprofiled run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from tools.bench.procs import HOST, ChildServer, bind, pin
from tools.bench.served import warm_worlds

FAKE_MODEL = "fake-model"
SEEDS = (101, 102, 103, 104)
# Started with the settings as environment variables, the one interface every version of the
# service has read them from (`--server-path` runs old checkouts).
SERVER_LAUNCHER = """
import socket, sys, uvicorn
from grpo_service import create_app
sock = socket.socket(fileno=int(sys.argv[1]))
config = uvicorn.Config(create_app(), log_level="warning", access_log=False)
uvicorn.Server(config).run(sockets=[sock])
"""


@dataclass(frozen=True)
class Load:
    groups: int = 4
    group_size: int = 16
    turns: int = 30
    traced: bool = False
    tokens: bool | None = True  # record.logprobs; None: the service's default recording

    def body(self, i: int, inference_url: str) -> dict[str, Any]:
        return {
            "group_size": self.group_size,
            "env": {"env_name": "crafter", "seed": SEEDS[i % len(SEEDS)]},
            "policy": {"policy_name": "crafter-react", "config": {"inference_url": inference_url, "seed": i}},
            "max_turns": self.turns,
            "on_done": "terminate",
            "safety": {"max_time_s": 600},
            # Token ids and logprobs, as mode "rl" records by default now (said explicitly, so that
            # old versions, which recorded none by default, do the same work).
            **({"record": {"logprobs": self.tokens}} if self.tokens is not None else {}),
        }


@dataclass
class Measured:
    mode: str
    decisions: int
    steps: int
    wall_s: float
    cpu_s: float
    trace_cpu_s: float | None = None  # embedded and traced: the trace writer's thread, in cpu_s

    @property
    def cpu_us_per_decision(self) -> float:
        return self.cpu_s / max(1, self.decisions) * 1e6

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cpu_us_per_decision": round(self.cpu_us_per_decision, 1)}


def _counts(groups: list[dict[str, Any]]) -> tuple[int, int]:
    decisions = steps = 0
    for group in groups:
        for member in group["members"]:
            result = member.get("result")
            if member["status"] == "failed" or result is None:
                raise RuntimeError(f"a member failed: {member.get('error')}")
            decisions += result["metrics"]["num_decisions"]
            steps += result["metrics"]["num_steps"]
    return decisions, steps


def _cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


@contextlib.contextmanager
def sampled(pid: int, prefix: Path | None, rate: int = 250) -> Iterator[None]:
    """py-spy sampling ``pid`` while the block runs (nothing when ``prefix`` is None)."""
    if prefix is None:
        yield
        return
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("--profile needs py-spy: pip install -e '.[profile]' (or pip install py-spy)")
    out = prefix.with_suffix(".txt")
    cmd = [spy, "record", "--pid", str(pid), "-r", str(rate), "-f", "raw", "--full-filenames", "-o", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.5)  # attached
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        if not out.exists():
            raise RuntimeError(f"py-spy wrote nothing: {err.decode()[-500:]}")


# ------------------------------------------------------------------------------------ HTTP


async def _http_load(base_url: str, load: Load, inference_url: str) -> tuple[list[dict[str, Any]], float]:
    from tools.bench.http import HTTPError, RawClient

    port = int(base_url.rsplit(":", 1)[1])
    conns = [await RawClient(HOST, port).connect() for _ in range(load.groups)]

    async def one(i: int) -> bytes:
        status, data = await conns[i].request(
            "POST", "/rollout/group", json.dumps(load.body(i, inference_url)).encode()
        )
        if status != 200:
            raise HTTPError(status, data)
        return data

    try:
        t0 = time.perf_counter()
        answers = await asyncio.gather(*(one(i) for i in range(load.groups)))
        wall = time.perf_counter() - t0
    finally:
        for conn in conns:
            await conn.close()
    return [json.loads(a) for a in answers], wall


async def _traces_written(base_url: str, deadline_s: float = 60.0) -> None:
    """Wait until the served task app has written (or dropped, or failed) every rollout it was
    given to trace, as its ``/health`` counts them: a rollout's trace is written after it ends."""
    from tools.bench.http import RawClient

    port = int(base_url.rsplit(":", 1)[1])
    async with await RawClient(HOST, port).connect() as client:
        async with asyncio.timeout(deadline_s):
            while True:
                counts = (await client.get_json("/health"))["tracing"]
                if (
                    counts is None
                    or counts["written"] + counts["dropped"] + counts["failed"] >= counts["submitted"]
                ):
                    return
                await asyncio.sleep(0.02)  # each look costs the service a /health request


def start_service(
    workdir: Path, fake_url: str, load: Load, server_path: Path | None, cpus: set[int] | None
) -> ChildServer:
    """The task app in its own process, configured through environment variables."""
    server = ChildServer("service", {}, cpus=cpus, log=workdir / "service.log")
    sock = bind(HOST, 0)
    server.port = sock.getsockname()[1]
    os.set_inheritable(sock.fileno(), True)
    env = {
        **os.environ,
        "PYTHONPATH": str(server_path or Path.cwd()),
        "VLLM_BASE_URL": fake_url,
        "DEFAULT_MODEL": FAKE_MODEL,
        "STATE_DIR": str(workdir / "state"),
        "SNAPSHOT_SECRET": "decision-bench-" + "x" * 32,
    }
    if load.traced:
        env["TRACE_DB"] = str(workdir / "traces.db")
    with open(workdir / "service.log", "ab") as log:
        server.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER_LAUNCHER, str(sock.fileno())],
            pass_fds=[sock.fileno()],
            stdout=log,
            stderr=log,
            env=env,
            cwd=str(server_path or Path.cwd()),
        )
    sock.close()
    pin(server.proc.pid, cpus)
    return server


def measure_http(
    load: Load,
    fake_url: str,
    workdir: Path,
    *,
    server_path: Path | None,
    cpus: set[int] | None,
    profile: Path | None,
) -> Measured:
    server = start_service(workdir, fake_url, load, server_path, cpus)
    try:
        server.wait_ready()
        asyncio.run(warm_worlds(server.base_url, list(SEEDS)))
        asyncio.run(_http_load(server.base_url, Load(groups=1, group_size=4, turns=5), fake_url))  # warm-up
        if load.traced:
            asyncio.run(_traces_written(server.base_url))  # the warm-up's traces, before the window
        before = _cpu_s(server.pid)
        with sampled(server.pid, profile):
            groups, wall = asyncio.run(_http_load(server.base_url, load, fake_url))
            if load.traced:  # the load's traces written inside the window, as embedded
                asyncio.run(_traces_written(server.base_url))
        cpu = _cpu_s(server.pid) - before
    finally:
        server.stop()
    decisions, steps = _counts(groups)
    return Measured("http", decisions, steps, wall, cpu)


# -------------------------------------------------------------------------------- embedded


async def _embedded_load(
    load: Load, fake_url: str, workdir: Path, profile: Path | None, gate: Callable[[], object] | None
) -> Measured:
    from grpo_service.app import build_services
    from grpo_service.config import Settings
    from grpo_service.gc_tuning import serving_gc
    from grpo_service.models import RolloutGroupRequest
    from grpo_service.models.encoding import answer_json

    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        vllm_base_url=fake_url,
        default_model=FAKE_MODEL,
        state_dir=workdir / "state",
        snapshot_secret="decision-bench-" + "x" * 32,
    )
    tracer = None
    if load.traced:
        from grpo_service.tracing import TraceWriter

        # A fresh database per load: one that grew over earlier loads makes each insert dearer,
        # so repeats would not measure the same work.
        workdir.mkdir(parents=True, exist_ok=True)
        trace_dir = Path(tempfile.mkdtemp(prefix="traces-", dir=workdir))
        tracer = TraceWriter(trace_dir / "traces.db")
        await tracer.start()
    services = build_services(settings, tracer=tracer)
    coordinator = services.coordinator
    try:
        with serving_gc():
            warm = Load(groups=1, group_size=4, turns=5)
            for seed in SEEDS:  # the worlds, cached (as in the HTTP mode)
                await coordinator.group(
                    RolloutGroupRequest.model_validate(
                        {**warm.body(0, fake_url), "env": {"env_name": "crafter", "seed": seed}}
                    )
                )
            requests = [
                RolloutGroupRequest.model_validate(load.body(i, fake_url)) for i in range(load.groups)
            ]
            if tracer is not None:
                await tracer.flush()  # the warm-up's traces, before the window
            if gate is not None:
                gate()  # nothing of this load runs meanwhile: it may block the loop
            before = time.process_time()
            trace_before = tracer.stats()["cpu_s"] if tracer is not None else 0.0
            with sampled(os.getpid(), profile):
                t0 = time.perf_counter()
                answers = await asyncio.gather(*(coordinator.group(r) for r in requests))
                wall = time.perf_counter() - t0
                # The answers as the route sends them, and the load's traces written, inside the
                # window (a rollout's trace is written after the rollout has ended).
                for answer in answers:
                    answer_json(answer)
                if tracer is not None:
                    await tracer.flush()
            cpu = time.process_time() - before
            trace_cpu = tracer.stats()["cpu_s"] - trace_before if tracer is not None else None
    finally:
        await services.client_pool.aclose()
        if tracer is not None:
            await tracer.close()
            shutil.rmtree(trace_dir, ignore_errors=True)
    decisions, steps = _counts([a.model_dump(mode="json") for a in answers])
    return Measured("embedded", decisions, steps, wall, cpu, trace_cpu)


def measure_embedded(
    load: Load,
    fake_url: str,
    workdir: Path,
    *,
    cpus: set[int] | None,
    profile: Path | None,
    gate: Callable[[], object] | None = None,
) -> Measured:
    """``load`` played by the coordinator in this process. ``gate``, when given, is called once
    the warm-up is done, right before the measured window opens."""
    if cpus is not None:
        pin(os.getpid(), cpus)
    try:
        import uvloop

        return uvloop.run(_embedded_load(load, fake_url, workdir, profile, gate))
    except ImportError:
        return asyncio.run(_embedded_load(load, fake_url, workdir, profile, gate))


def _play_side(
    index: int,
    load: Load,
    fake_url: str,
    workdir: Path,
    cpus: set[int] | None,
    rounds: int,
    barrier: Any,
    results: Any,
    timeout_s: float,
) -> None:
    """One side of `measure_side_by_side`, in its own process."""
    try:
        measured = [
            measure_embedded(
                load, fake_url, workdir, cpus=cpus, profile=None, gate=lambda: barrier.wait(timeout_s)
            )
            for _ in range(rounds)
        ]
        results.put((index, measured, None))
    except BaseException as exc:
        barrier.abort()  # the other sides stop waiting for this one
        results.put((index, None, f"{type(exc).__name__}: {exc}"))


def measure_side_by_side(
    loads: Sequence[Load],
    fake_url: str,
    workdir: Path,
    *,
    cpus: set[int] | None,
    rounds: int = 1,
    timeout_s: float = 600.0,
) -> list[list[Measured]]:
    """Each of ``loads`` played embedded in its own process, all pinned to ``cpus`` at once,
    ``rounds`` times (each round's windows open together): per load, its measurement per round.

    A shared machine's speed drifts by a tenth or more between loads played one after the
    other, so the difference of two figures taken that way (what tracing costs: a load traced
    against the same load untraced) can be larger than what it measures. Played at once on
    the same CPU, both loads see the same speed; each figure is its own process's CPU time."""
    ctx = multiprocessing.get_context("spawn")  # a fork would copy this harness's event loop
    barrier = ctx.Barrier(len(loads))
    results = ctx.Queue()
    sides = [
        ctx.Process(
            target=_play_side,
            args=(i, load, fake_url, workdir / f"side-{i}", cpus, rounds, barrier, results, timeout_s),
            name=f"decision-side-{i}",
        )
        for i, load in enumerate(loads)
    ]
    for side in sides:
        side.start()
    measured: dict[int, list[Measured]] = {}
    errors: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(measured) + len(errors) < len(sides):
            try:
                index, got, error = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"side-by-side loads not done within {timeout_s:.0f} s") from None
            if error is not None:
                errors.append(f"load {index}: {error}")
            else:
                measured[index] = got
    finally:
        for side in sides:
            side.join(timeout=10)
            if side.is_alive():
                side.kill()
                side.join()
    if errors:
        raise RuntimeError("side-by-side loads failed: " + "; ".join(errors))
    return [measured[i] for i in range(len(loads))]


# ------------------------------------------------------------------------------------ main


def _layout(pinning: bool) -> tuple[set[int] | None, set[int] | None]:
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not pinning or len(cpus) < 2:
        return None, None
    return {cpus[0]}, {cpus[-1]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("http", "embedded", "both"), default="both")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--groups", type=int, default=Load.groups)
    parser.add_argument("--group-size", type=int, default=Load.group_size)
    parser.add_argument("--turns", type=int, default=Load.turns)
    parser.add_argument("--traced", action="store_true", help="TRACE_DB on (the service's SQLite writer)")
    parser.add_argument(
        "--record",
        choices=("tokens", "default", "none"),
        default="tokens",
        help="token ids and logprobs recorded (the default), not, or as the service's default says",
    )
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--server-path", type=Path, help="run the HTTP service from this checkout")
    parser.add_argument("--profile", type=Path, help="py-spy: write PREFIX.txt, PREFIX.png, PREFIX.json")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    args = parser.parse_args(argv)
    tokens = {"tokens": True, "none": False, "default": None}[args.record]
    load = Load(args.groups, args.group_size, args.turns, args.traced, tokens)
    service_cpus, harness_cpus = _layout(args.pin)
    modes = ("http", "embedded") if args.mode == "both" else (args.mode,)
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="decision-bench-") as tmp:
        workdir = Path(tmp)
        fake = ChildServer("fake", {"model": FAKE_MODEL}, cpus=harness_cpus, log=workdir / "fake.log").start()
        if harness_cpus is not None:
            pin(os.getpid(), harness_cpus)
        try:
            fake.wait_ready()
            for rep in range(args.repeats):
                for mode in modes:
                    profile = args.profile if args.profile and rep == args.repeats - 1 else None
                    if profile is not None and len(modes) > 1:
                        profile = profile.with_name(f"{profile.name}-{mode}")
                    if mode == "http":
                        m = measure_http(
                            load,
                            fake.base_url,
                            workdir,
                            server_path=args.server_path,
                            cpus=service_cpus,
                            profile=profile,
                        )
                    else:
                        m = measure_embedded(load, fake.base_url, workdir, cpus=service_cpus, profile=profile)
                        if harness_cpus is not None:
                            pin(os.getpid(), harness_cpus)
                    results[mode].append(m.as_dict())
                    print(
                        f"{mode:9s} rep {rep}: {m.decisions} decisions, {m.steps} steps, "
                        f"{m.cpu_us_per_decision:7.0f} us CPU/decision, "
                        f"{m.decisions / m.wall_s:6.0f} decisions/s" + (" (profiled)" if profile else ""),
                        flush=True,
                    )
                    if profile is not None:
                        from tools.bench.flame import budget_report

                        report = budget_report(
                            profile.with_suffix(".txt"), m.cpu_us_per_decision, title=f"one decision, {mode}"
                        )
                        profile.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
                        for part, us in report["us_per_decision"].items():
                            print(f"    {part:34s} {us:7.0f} us")
        finally:
            fake.stop()
    summary = {
        mode: {
            "median_cpu_us_per_decision": statistics.median(r["cpu_us_per_decision"] for r in runs),
            "spread": [
                min(r["cpu_us_per_decision"] for r in runs),
                max(r["cpu_us_per_decision"] for r in runs),
            ],
            "runs": runs,
        }
        for mode, runs in results.items()
        if runs
    }
    for mode, s in summary.items():
        print(f"{mode}: median {s['median_cpu_us_per_decision']:.0f} us CPU/decision, spread {s['spread']}")
    if args.json:
        args.json.write_text(json.dumps({"load": asdict(load), "results": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
