"""The floor: a bare uvicorn + FastAPI app doing the service's work per request with nothing of
ours but the env, measured in the same run as the service (`http_vs_floor`,
`decision_cpu_vs_floor`).

- ``POST /env/step`` (and ``/env/create``, ``/env/reset``, ``/env/terminate``): parse the same
  body with orjson, step the same `CrafterEnv` in-process, answer the same fields
  (``EnvStepResponse``'s) encoded by orjson. No validation models, no registry, no locks, no
  error handling beyond a missing env.
- ``POST /floor/group``: a GRPO group's decisions with nothing around them: ``group_size``
  concurrent episodes of ``turns`` decisions; each decision is one raw aiohttp request (the
  crafter-react request: its system prompt and tool schema, the current observation, token ids
  and logprobs asked) to the same fake LLM, the reply parsed by orjson, its tool call's actions
  stepped, and the turn (observation text, actions, reward, token ids, logprobs) kept; the
  answer is every member's turns, orjson-encoded. No history window, no validation of the reply
  beyond what indexing needs, no records, no tracing. An episode that ends stops its member, or
  with ``"on_done": "reset"`` starts the next one (the LLM-bound load's rule).

What the service does beyond this is what it costs over the floor.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
from fastapi import FastAPI, Request, Response

from envs.crafter.env import CrafterConfig, CrafterEnv

JSON = "application/json"


def _answer(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type=JSON)


def _step_fields(env_id: str, result: Any) -> dict[str, Any]:
    return {
        "env_id": env_id,
        "observation": result.observation,
        "reward": result.reward,
        "done": result.done,
        "truncated": result.truncated,
        "info": result.info,
        "step_idx": result.step_idx,
    }


def _request_template(model: str) -> dict[str, Any]:
    """The crafter-react request of a first observation (built once; each decision swaps in its
    observation): the same size and shape as the service's requests."""
    from envs.base import PolicyContext
    from envs.crafter.policy import CrafterReActConfig, CrafterReActPolicy

    observation = CrafterEnv(CrafterConfig(), 101).reset().observation
    context = PolicyContext(inference_url="http://127.0.0.1:9", model=model)
    request = CrafterReActPolicy(CrafterReActConfig(), context).build_request(observation)
    extra_body = request.pop("extra_body", None) or {}
    return {**request, **extra_body, "logprobs": True, "return_token_ids": True}


def create_floor_app(model: str = "fake-model") -> FastAPI:
    envs: dict[str, CrafterEnv] = {}
    ids = itertools.count()
    template = _request_template(model)
    session: aiohttp.ClientSession | None = None

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        nonlocal session
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1024))
        try:
            yield
        finally:
            await session.close()

    app = FastAPI(title="floor", lifespan=lifespan)

    @app.get("/health")
    async def health() -> Response:
        return _answer({"status": "ok"})

    @app.post("/env/create")
    async def create(request: Request) -> Response:
        body = orjson.loads(await request.body())
        env = CrafterEnv(CrafterConfig(), body.get("seed"))
        env_id = f"env-{next(ids)}"
        envs[env_id] = env
        return _answer(_step_fields(env_id, env.reset()))

    @app.post("/env/step")
    async def step(request: Request) -> Response:
        body = orjson.loads(await request.body())
        env = envs.get(body["env_id"])
        if env is None:
            return _answer({"detail": "no such env"}, 404)
        action = body.get("action")
        return _answer(_step_fields(body["env_id"], env.step([action] if action else body["actions"])))

    @app.post("/env/reset")
    async def reset(request: Request) -> Response:
        body = orjson.loads(await request.body())
        return _answer(_step_fields(body["env_id"], envs[body["env_id"]].reset(body.get("seed"))))

    @app.post("/env/terminate")
    async def terminate(request: Request) -> Response:
        body = orjson.loads(await request.body())
        envs.pop(body["env_id"], None)
        return _answer({"env_id": body["env_id"], "terminated": True})

    async def episode(url: str, seed: int, member: int, turns: int, reset: bool) -> dict[str, Any]:
        assert session is not None
        env = CrafterEnv(CrafterConfig(), seed)
        observation = env.reset().observation
        kept, steps = [], 0
        for _ in range(turns):
            messages = [*template["messages"][:-1], {"role": "user", "content": observation["text"]}]
            content = orjson.dumps({**template, "messages": messages, "seed": member})
            async with session.post(url, data=content, headers={"Content-Type": JSON}) as reply:
                data = orjson.loads(await reply.read())
            choice = data["choices"][0]
            arguments = orjson.loads(choice["message"]["tool_calls"][0]["function"]["arguments"])
            result = env.step(arguments["actions"])
            kept.append(
                {
                    "observation": observation["text"],
                    "actions": arguments["actions"],
                    "reward": result.reward,
                    "prompt_token_ids": data.get("prompt_token_ids"),
                    "token_ids": choice.get("token_ids"),
                    "logprobs": [e["logprob"] for e in choice["logprobs"]["content"]],
                }
            )
            steps += result.info.get("actions_executed", len(arguments["actions"]))
            observation = result.observation
            if result.done:
                if not reset:
                    break
                observation = env.reset().observation
        return {"member": member, "decisions": len(kept), "steps": steps, "turns": kept}

    @app.post("/floor/group")
    async def group(request: Request) -> Response:
        body = orjson.loads(await request.body())
        url = body["inference_url"].rstrip("/") + "/v1/chat/completions"
        reset = body.get("on_done") == "reset"
        members = await asyncio.gather(
            *(episode(url, body["seed"], i, body["turns"], reset) for i in range(body["group_size"]))
        )
        return _answer({"members": members})

    return app


# ------------------------------------------------------------------------ driving it


async def _groups(
    base_url: str,
    inference_url: str,
    seeds: list[int],
    group_size: int,
    turns: int,
    on_done: str = "terminate",
) -> tuple[list[bytes], float]:
    """One ``/floor/group`` per seed, all at once: the answers and the wall time from the first
    request to the last answer (parsing them is the caller's, after the clock)."""
    from tools.bench.http import HTTPError, RawClient
    from tools.bench.procs import HOST

    port = int(base_url.rsplit(":", 1)[1])
    conns = [await RawClient(HOST, port).connect() for _ in seeds]

    async def one(conn: RawClient, seed: int) -> bytes:
        body = {
            "inference_url": inference_url,
            "seed": seed,
            "group_size": group_size,
            "turns": turns,
            "on_done": on_done,
        }
        status, data = await conn.request("POST", "/floor/group", orjson.dumps(body))
        if status != 200:
            raise HTTPError(status, data)
        return data

    try:
        started = time.perf_counter()
        answers = await asyncio.gather(*(one(c, s) for c, s in zip(conns, seeds, strict=True)))
        return answers, time.perf_counter() - started
    finally:
        for conn in conns:
            await conn.close()


def floor_decisions(
    base_url: str, pid: int, inference_url: str, seeds: list[int], group_size: int, turns: int
) -> tuple[int, int, float]:
    """One group per seed against the floor at ``base_url`` (process ``pid``), after an untimed
    warm-up that caches the worlds: (decisions, env steps, the floor's CPU seconds)."""
    import psutil

    def cpu() -> float:
        times = psutil.Process(pid).cpu_times()
        return times.user + times.system

    asyncio.run(_groups(base_url, inference_url, seeds, 2, 2))
    before = cpu()
    answers, _ = asyncio.run(_groups(base_url, inference_url, seeds, group_size, turns))
    used = cpu() - before
    decisions = steps = 0
    for answer in answers:
        for member in orjson.loads(answer)["members"]:
            decisions += member["decisions"]
            steps += member["steps"]
    return decisions, steps, used


def llm_bound_decisions_per_s(
    base_url: str, inference_url: str, seeds: list[int], group_size: int, turns: int
) -> float:
    """The LLM-bound load played by the floor at ``base_url``: one group per seed of
    ``group_size`` members × ``turns`` decisions (an ended episode starts the next, as the
    service's load does), against ``inference_url`` (the 200 ms fake); decisions/s from the
    first request to the last answer, after an untimed warm-up that caches the worlds."""
    asyncio.run(_groups(base_url, inference_url, seeds, group_size, 2, "reset"))
    answers, wall_s = asyncio.run(_groups(base_url, inference_url, seeds, group_size, turns, "reset"))
    decisions = sum(member["decisions"] for answer in answers for member in orjson.loads(answer)["members"])
    return decisions / wall_s


def decision_costs(
    *,
    fake_url: str,
    floor: Any,
    workdir: Any,
    service_cpus: set[int] | None,
    groups: int,
    group_size: int,
    turns: int,
) -> dict[str, float]:
    """The cost of one decision, service against floor, in µs of CPU (and the ratios' parts).

    The service: the coordinator embedded in this process (`tools.bench.decision`), ``rl`` mode
    with token ids and logprobs recorded, traced (each load into a fresh trace database),
    pinned to ``service_cpus``, twice. The floor: ``floor`` (a `ChildServer` of this module's
    app, pinned there too) playing the same groups against the same fake, after each of the
    service's loads (the host's speed drifts within a repeat: the ratio compares loads taken
    together). The env's share (its in-process CPU per step in the same worlds × the steps per
    decision) is taken out of both.

    Tracing's cost: the same load traced and untraced, played side by side (two processes on
    ``service_cpus`` at once, `measure_side_by_side`), twice: a difference of two loads taken
    one after the other moved with the host's speed by more than it measures."""
    from tools.bench.decision import SEEDS, Load, measure_embedded, measure_side_by_side
    from tools.bench.inproc import env_steps_per_s
    from tools.bench.procs import pinned

    seeds = [SEEDS[i % len(SEEDS)] for i in range(groups)]  # as `Load.body` seeds its groups
    with pinned(service_cpus):  # CPU time, not wall time: a busy machine does not inflate it
        env_us_per_step = 1e6 / env_steps_per_s(1.0, list(SEEDS), 0, clock=time.process_time)
    traced = Load(groups=groups, group_size=group_size, turns=turns, traced=True, tokens=True)
    runs: list[Any] = []
    decisions = steps = 0
    floor_cpu = 0.0
    for _ in range(2):
        with pinned(service_cpus):
            runs.append(measure_embedded(traced, fake_url, workdir, cpus=None, profile=None))
        d, s, cpu = floor_decisions(floor.base_url, floor.pid, fake_url, seeds, group_size, turns)
        decisions, steps, floor_cpu = decisions + d, steps + s, floor_cpu + cpu
    untraced = Load(groups=groups, group_size=group_size, turns=turns, traced=False, tokens=True)
    side_traced, side_untraced = measure_side_by_side(
        [traced, untraced], fake_url, workdir, cpus=service_cpus, rounds=2
    )

    def cpu_us_per_decision(measured: list[Any]) -> float:
        return sum(m.cpu_s for m in measured) / max(1, sum(m.decisions for m in measured)) * 1e6

    traced_us = cpu_us_per_decision(runs)
    traced_steps = sum(m.steps for m in runs) / max(1, sum(m.decisions for m in runs))
    env_us = env_us_per_step * traced_steps
    floor_us = floor_cpu / max(1, decisions) * 1e6
    floor_env_us = env_us_per_step * steps / max(1, decisions)
    side_traced_us = cpu_us_per_decision(side_traced)
    trace_us = max(0.0, side_traced_us - cpu_us_per_decision(side_untraced))
    writer_us = sum(m.trace_cpu_s or 0.0 for m in runs) / max(1, sum(m.decisions for m in runs)) * 1e6
    return {
        "env_cpu_us_per_step": env_us_per_step,
        "service_cpu_us_per_decision": traced_us,
        "task_app_cpu_us_per_decision": max(0.0, traced_us - env_us),
        "trace_cpu_us_per_decision": trace_us,
        "side_by_side_traced_cpu_us_per_decision": side_traced_us,
        "trace_share_of_decision_cpu": trace_us / side_traced_us if side_traced_us else 0.0,
        "trace_writer_cpu_us_per_decision": writer_us,
        "floor_cpu_us_per_decision": floor_us,
        "floor_own_cpu_us_per_decision": max(0.0, floor_us - floor_env_us),
    }
