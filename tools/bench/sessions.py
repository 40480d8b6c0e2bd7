"""Thousands of live sessions: how many the service holds, each stepping at a set rate.

One asyncio load generator (this process) opens OpenEnv WebSocket sessions on
``/openenv/textcraft/ws`` in steps (``levels``: 256, 1,024, 2,048, 4,096 ... at once), each
session resetting once and then stepping one random TextCraft command every ``period_s``
seconds (phases spread evenly), and holds each level for ``hold_s``. Per level: sessions
opened / asked for, steps answered / sent, p50 and p99 step latency (send to reply), and the
server's RSS growth per session. The first level at which a session is refused, a step fails,
or p99 passes 1 s is where the service stops holding. Then every socket is dropped at once
(aborted, no close frame), and the server's live envs are counted until they are back to what
they were (``leaked``: how many are not, after ``drain_s``).

The same with registry envs over HTTP: ``N`` envs created with ``POST /env/create`` and stepped
at the same rate over a pool of keep-alive connections.
"""

from __future__ import annotations

import asyncio
import json
import random
import resource
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
from websockets.asyncio.client import ClientConnection, connect

from tools.bench.http import RawClient
from tools.bench.peers import TEXTCRAFT_ACTIONS
from tools.bench.procs import HOST, ChildServer

P99_LIMIT_S = 1.0
OPEN_CONCURRENCY = 64  # handshakes in flight while a level opens
HTTP_CONNECTIONS = 64
STEP_FRAMES = [json.dumps({"type": "step", "data": {"action": action}}) for action in TEXTCRAFT_ACTIONS]


@dataclass(frozen=True)
class SessionsPlan:
    levels: tuple[int, ...]
    period_s: float  # one step per session per period
    hold_s: float  # measured per level, after every session of the level is open
    drain_s: float  # after dropping every socket: how long the envs may take to go
    open_s: float = 120.0  # a level's sessions not open by then are refused (a level that slow failed)


SESSION_PLANS = {
    "smoke": SessionsPlan((16,), 0.3, 0.8, 10.0),  # levels one on another: tests/test_bench_parts.py
    "quick": SessionsPlan((256, 1024, 4096), 2.0, 8.0, 30.0),
    "full": SessionsPlan((256, 1024, 2048, 4096), 2.0, 12.0, 60.0),
}


@dataclass
class Level:
    sessions: int
    opened: int = 0
    refused: int = 0
    steps: int = 0
    failed_steps: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    rss_per_session_kb: float | None = None
    open_s: float | None = None  # how long the level took to open
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def success_rate(self) -> float:
        asked = self.sessions + self.steps + self.failed_steps
        return (self.opened + self.steps) / asked if asked else 0.0

    @property
    def held(self) -> bool:
        return (
            self.refused == 0
            and self.failed_steps == 0
            and self.p99_ms is not None
            and self.p99_ms <= P99_LIMIT_S * 1000
        )


def raise_fd_limit() -> int:
    """The soft limit on open files raised to the hard one (a socket per session, both ends
    when the server is a child of this process); returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _count(errors: dict[str, int], what: str) -> None:
    errors[what[:120]] = errors.get(what[:120], 0) + 1


class Load:
    """The sessions open now and the latencies of their steps since the last `take`."""

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self.latencies: list[float] = []
        self.failed = 0
        self.errors: dict[str, int] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.stopping = False

    def take(self) -> tuple[list[float], int, dict[str, int]]:
        out = self.latencies, self.failed, self.errors
        self.latencies, self.failed, self.errors = [], 0, {}
        return out

    async def _ask(self, ws: ClientConnection, frame: str) -> str:
        """The reply's text (read no further than needed: the load generator must stay cheap)."""
        await ws.send(frame)
        async with asyncio.timeout(60):
            reply = await ws.recv()
        if reply.startswith('{"type":"error"'):
            raise RuntimeError(f"error frame {json.loads(reply)['data'].get('code')}")
        return str(reply)

    async def open_ws(self, url: str, i: int) -> ClientConnection | None:
        ws: ClientConnection | None = None
        try:
            ws = await connect(url, compression=None, open_timeout=60, max_size=None, ping_interval=None)
            await self._ask(ws, json.dumps({"type": "reset", "data": {"seed": i % 544}}))
        except Exception as exc:
            _count(self.errors, f"open: {type(exc).__name__}: {exc}")
            return None
        except BaseException:  # cancelled at the level's deadline: no half-open socket left behind
            if ws is not None:
                ws.transport.abort()
            raise
        return ws

    async def play_ws(self, ws: ClientConnection, i: int, phase: float) -> None:
        rng = random.Random(i)
        await asyncio.sleep(phase)
        next_at = time.monotonic()
        while not self.stopping:
            frame = rng.choice(STEP_FRAMES)
            started = time.monotonic()
            try:
                reply = await self._ask(ws, frame)
                self.latencies.append(time.monotonic() - started)
                if "true" in reply and json.loads(reply)["data"]["done"]:  # parsed only when it may be
                    await self._ask(ws, json.dumps({"type": "reset", "data": {"seed": i % 544}}))
            except Exception as exc:
                self.failed += 1
                _count(self.errors, f"step: {type(exc).__name__}: {exc}")
                return
            next_at += self.period_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def play_http(self, pool: asyncio.Queue[RawClient], env_id: str, i: int, phase: float) -> None:
        rng = random.Random(i)
        await asyncio.sleep(phase)
        next_at = time.monotonic()
        while not self.stopping:
            body = json.dumps({"env_id": env_id, "action": rng.choice(TEXTCRAFT_ACTIONS)}).encode()
            started = time.monotonic()
            client = await pool.get()
            try:
                async with asyncio.timeout(60):
                    status, data = await client.request("POST", "/env/step", body)
                if status != 200:
                    raise RuntimeError(f"/env/step answered {status}")
                self.latencies.append(time.monotonic() - started)
                if b'"done":true' in data:
                    await client.post_json("/env/reset", {"env_id": env_id})
            except Exception as exc:
                self.failed += 1
                _count(self.errors, f"step: {type(exc).__name__}: {exc}")
                return
            finally:
                pool.put_nowait(client)
            next_at += self.period_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))


async def _live_envs(port: int) -> int:
    async with RawClient(HOST, port) as client:
        return int((await client.get_json("/health"))["envs"])


async def hold_sessions(
    base_url: str, plan: SessionsPlan, pid: int, log: Callable[[str], None], *, transport: str = "openenv"
) -> dict[str, Any]:
    """Levels of ``plan`` over ``transport`` (``openenv``: WebSocket sessions; ``http``: registry
    envs stepped over a connection pool) against the server ``base_url`` (process ``pid``)."""
    port = int(base_url.rsplit(":", 1)[1])
    server = psutil.Process(pid)
    load = Load(plan.period_s)
    sockets: list[ClientConnection] = []
    env_ids: list[str] = []  # registry envs (http): they outlive their client until the idle TTL
    pool: asyncio.Queue[RawClient] = asyncio.Queue()
    if transport == "http":
        for _ in range(HTTP_CONNECTIONS):
            pool.put_nowait(await RawClient(HOST, port).connect())
    levels: list[Level] = []
    envs_before = await _live_envs(port)
    rss_before = server.memory_info().rss
    opened_total = 0
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)
    ws_url = base_url.replace("http", "ws", 1) + "/openenv/textcraft/ws"
    try:
        for target in plan.levels:
            level = Level(sessions=target)

            open_by = asyncio.get_running_loop().time() + plan.open_s

            async def open_one(i: int, open_by: float = open_by) -> bool:
                try:
                    async with asyncio.timeout_at(open_by):
                        return await open_and_play(i)
                except TimeoutError:
                    _count(load.errors, f"open: not open within {plan.open_s:g} s")
                    return False

            async def open_and_play(i: int) -> bool:
                async with gate:
                    if transport == "openenv":
                        ws = await load.open_ws(ws_url, i)
                        if ws is None:
                            return False
                        sockets.append(ws)
                        play = load.play_ws(ws, i, (i * 0.618) % 1.0 * plan.period_s)
                    else:
                        client = await pool.get()
                        try:
                            body = {"env_name": "textcraft", "seed": i % 544}
                            env_id = (await client.post_json("/env/create", body))["env_id"]
                            env_ids.append(env_id)
                        except Exception as exc:
                            _count(load.errors, f"create: {type(exc).__name__}: {exc}")
                            return False
                        finally:
                            pool.put_nowait(client)
                        play = load.play_http(pool, env_id, i, (i * 0.618) % 1.0 * plan.period_s)
                    load.tasks.append(asyncio.create_task(play))
                    return True

            started = time.monotonic()
            results = await asyncio.gather(*(open_one(i) for i in range(opened_total, target)))
            opened_total = target
            open_errors = load.take()[2]  # the latencies while opening are not the level's
            level.opened = (levels[-1].opened if levels else 0) + results.count(True)
            level.refused = results.count(False)
            level.open_s = round(time.monotonic() - started, 2)
            log(f"    {transport}: {level.opened}/{target} open in {level.open_s} s")
            await asyncio.sleep(plan.hold_s)
            latencies, failed, errors = load.take()
            level.steps, level.failed_steps = len(latencies), failed
            level.errors = dict(Counter(open_errors) + Counter(errors))
            level.p50_ms = _ms(_percentile(latencies, 0.5))
            level.p99_ms = _ms(_percentile(latencies, 0.99))
            level.rss_per_session_kb = round(
                (server.memory_info().rss - rss_before) / max(1, level.opened) / 1024, 1
            )
            levels.append(level)
            log(
                f"    {transport} {target}: {level.steps} steps, {level.failed_steps} failed, "
                f"p50 {level.p50_ms} ms, p99 {level.p99_ms} ms, {level.rss_per_session_kb} KiB/session"
            )
            if not level.held:
                break
    finally:
        load.stopping = True
        dropped_at = time.monotonic()
        for ws in sockets:  # all at once, no close frame: as if the clients died
            ws.transport.abort()
        for task in load.tasks:
            task.cancel()
        await asyncio.gather(*load.tasks, return_exceptions=True)
    leaked = await _drain(port, envs_before, plan.drain_s, env_ids)
    drain_s = round(time.monotonic() - dropped_at, 2)
    while not pool.empty():
        await pool.get_nowait().close()
    held = [lv for lv in levels if lv.held]
    first_bad = next((lv.sessions for lv in levels if not lv.held), None)
    return {
        "transport": transport,
        "levels": [
            {**asdict(lv), "success_rate": round(lv.success_rate, 5), "held": lv.held} for lv in levels
        ],
        "sessions_held": held[-1].sessions if held else 0,
        "first_failing_level": first_bad,
        "p99_step_ms": held[-1].p99_ms if held else None,
        "success_rate": levels[-1].success_rate if levels else None,
        "rss_per_session_kb": held[-1].rss_per_session_kb if held else None,
        "leaked_after_drop": leaked,
        "drain_s": drain_s,
    }


async def _drain(port: int, before: int, within_s: float, env_ids: list[str]) -> int:
    """Live envs above ``before`` once they are gone or ``within_s`` passed. Registry envs
    outlive their client by design (until the idle TTL): ``env_ids`` are terminated first."""
    async with RawClient(HOST, port) as client:
        for env_id in env_ids:
            await client.post_json("/env/terminate", {"env_id": env_id})
    deadline = time.monotonic() + within_s
    while True:
        left = await _live_envs(port) - before
        if left <= 0 or time.monotonic() > deadline:
            return max(0, left)
        await asyncio.sleep(0.2)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def run_sessions(
    mode: str,
    workdir: Path,
    *,
    server_cpus: set[int] | None,
    log: Callable[[str], None],
    serving: dict[str, Any] | None = None,
    transports: tuple[str, ...] = ("openenv", "http"),
) -> list[dict[str, Any]]:
    """Each of ``transports`` against a fresh server (``serving``: settings overrides, e.g.
    through Ray); the load generator is this process (pin it to the harness's CPUs)."""
    plan = SESSION_PLANS[mode]
    limit = raise_fd_limit()
    needed = 2 * max(plan.levels) + 256
    if limit < needed:
        log(f"  note: the open-file limit is {limit}, {needed} wanted: levels above it will be refused")
    reports = []
    for transport in transports:
        state = workdir / f"sessions-{transport}{'-ray' if serving else ''}"
        state.mkdir(parents=True, exist_ok=True)
        settings = {
            "state_dir": str(state / "state"),
            "snapshot_secret": "bench-secret-" + "x" * 32,
            "reaper_interval_s": 3600.0,
            **(serving or {}),
        }
        server = ChildServer("service", settings, cpus=server_cpus, log=state / "service.log").start()
        try:
            server.wait_ready(180.0)
            report = asyncio.run(hold_sessions(server.base_url, plan, server.pid, log, transport=transport))
        finally:
            server.stop(60.0)
        reports.append(report)
    return reports


def summary(reports: list[dict[str, Any]]) -> str:
    parts = []
    for r in reports:
        parts.append(
            f"{r['transport']}: held {r['sessions_held']} (p99 {r['p99_step_ms']} ms, "
            f"{r['rss_per_session_kb']} KiB/session), leaked {r['leaked_after_drop']}"
        )
    return "; ".join(parts)
