"""The peers' side of the OpenEnv comparison, run with the OpenEnv venv's Python
(`tools/openenv_venv.py`), never imported by the service or pytest.

    python -P openenv_peer.py serve --fd N --extra-path P     OpenEnv 0.10's own server (``create_app``, as an
                                             env package ships it) hosting the project's
                                             TextCraft game, on the listening socket N
    python -P openenv_peer.py drive SPEC_JSON --extra-path P OpenEnv's own async client driving servers in
                                             interleaved rounds; prints one JSON report

The game is the same `envs.textcraft` logic the service plays (``PYTHONPATH`` names the
project; ``--extra-path``, added after the venv's own packages, the site-packages holding its
game data), wrapped
as an OpenEnv `Environment` the way an env author would: ``reset`` and ``step`` return a typed
observation with the game's text and fields, ``state`` the episode id and step count.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import sys
import time
import uuid
from typing import Any


def serve(fd: int) -> None:
    import uvicorn
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State
    from pydantic import ConfigDict

    from envs import environment_class

    class TextAction(Action):
        action: str

    class TextObservation(Observation):
        model_config = ConfigDict(extra="allow")

        text: str

    class TextCraftGame(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self._game = environment_class("textcraft").create({}, 0)
            self._state = State(episode_id=None, step_count=0)

        def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> TextObservation:
            result = self._game.reset(seed)
            self._state = State(episode_id=episode_id or uuid.uuid4().hex, step_count=0)
            return TextObservation(**result.observation, done=result.done, reward=None)

        def step(self, action: TextAction, timeout_s: float | None = None, **_: Any) -> TextObservation:
            result = self._game.step([action.action])
            self._state.step_count += 1
            return TextObservation(**result.observation, done=result.done, reward=result.reward)

        @property
        def state(self) -> State:
            return self._state

    app = create_app(
        TextCraftGame, TextAction, TextObservation, env_name="textcraft", max_concurrent_envs=10_000
    )
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    uvicorn.Server(config).run(sockets=[socket.socket(fileno=fd)])


def _cpu_s(pid: int) -> float:
    """Process ``pid``'s CPU seconds, user and system (``/proc``: this venv has no psutil)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _round(
    url: str, pid: int, clients: int, steps: int, actions: list[str], seed: int
) -> tuple[float, float, float]:
    """``clients`` sessions on ``url`` (connected and reset outside the timing), each stepping
    ``steps`` times with random ``actions`` (a finished episode is reset, not counted): steps/s,
    and the CPU seconds over the timed steps of this client process and of the server (``pid``)."""
    from openenv.core import GenericEnvClient

    envs = [GenericEnvClient(base_url=url, message_timeout_s=600) for _ in range(clients)]
    for env in envs:
        await env.connect()
    try:
        for i, env in enumerate(envs):
            await env.reset(seed=seed + i)

        async def play(i: int, env: Any) -> None:
            rng = random.Random(seed * 1000 + i)
            for _ in range(steps):
                result = await env.step({"action": rng.choice(actions)})
                if result.done:
                    await env.reset(seed=seed + i)

        started, cpu, server_cpu = time.perf_counter(), time.process_time(), _cpu_s(pid)
        await asyncio.gather(*(play(i, env) for i, env in enumerate(envs)))
        rate = clients * steps / (time.perf_counter() - started)
        return rate, time.process_time() - cpu, _cpu_s(pid) - server_cpu
    finally:
        for env in envs:
            await env.close()


async def drive(spec: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """``spec``: ``urls`` (name → server URL), ``pids`` (name → the server's process), ``clients``,
    ``steps`` (per client and round), ``rounds``, ``actions``, ``seed``. Each round plays every
    server in turn, the order rotating from round to round. Returns, per server and round, its
    steps/s (``rates``) and the CPU µs per step of the client (``client_cpu_us``) and of the
    server (``server_cpu_us``; /proc counts in 10 ms ticks: a round's is within a tick)."""
    names = list(spec["urls"])
    report: dict[str, dict[str, list[float]]] = {
        part: {name: [] for name in names} for part in ("rates", "client_cpu_us", "server_cpu_us")
    }
    steps = spec["clients"] * spec["steps"]
    for rnd in range(spec["rounds"]):
        order = names[rnd % len(names) :] + names[: rnd % len(names)]
        for name in order:
            rate, client_s, server_s = await _round(
                spec["urls"][name],
                spec["pids"][name],
                spec["clients"],
                spec["steps"],
                spec["actions"],
                spec["seed"],
            )
            report["rates"][name].append(rate)
            report["client_cpu_us"][name].append(client_s / steps * 1e6)
            report["server_cpu_us"][name].append(server_s / steps * 1e6)
    return report


def main(argv: list[str]) -> None:
    # --extra-path: the service's site-packages (the game's data package), after this venv's own.
    if "--extra-path" in argv:
        sys.path.append(argv[argv.index("--extra-path") + 1])
    if argv[0] == "serve":
        serve(int(argv[argv.index("--fd") + 1]))
    else:
        print(json.dumps(asyncio.run(drive(json.loads(argv[1])))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
