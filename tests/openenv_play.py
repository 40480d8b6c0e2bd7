"""Plays the task app's envs with OpenEnv 0.10's own, unmodified clients; run by the tests with
the OpenEnv venv's Python (`tools/openenv_venv.py`), never imported by pytest.

``python openenv_play.py SPEC_JSON`` prints one JSON report; with ``--serve`` it reads one SPEC
per line and answers each with a line. SPEC: ``base`` (the server's URL), ``scenario`` (one of
`SCENARIOS`), ``envs`` (name → ``seed`` and reset ``config``), ``headers`` (sent on every
connection, e.g. the API key) and, for ``code``, the ``code`` to run."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import sys
import traceback
from typing import Any

from openenv import AutoEnv
from openenv.core import EnvClient, GenericEnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.mcp_client import MCPToolClient
from pydantic import ConfigDict

MAX_STEPS = 80
CRAFTER_ACTIONS = ("move_left", "do", "noop")


def choose(obs: dict[str, Any], i: int) -> str:
    """The scripted solver's action when the env shows one, else Crafter's next in a cycle."""
    return obs.get("oracle_action") or CRAFTER_ACTIONS[i % len(CRAFTER_ACTIONS)]


def url(spec: dict[str, Any], name: str) -> str:
    return f"{spec['base']}/openenv/{name}"


def generic_episode(spec: dict[str, Any], name: str) -> dict[str, Any]:
    """GenericEnvClient through `.sync()`: reset with a seed, an episode id and the env's config,
    then step until done."""
    env_spec = spec["envs"][name]
    client = GenericEnvClient(base_url=url(spec, name), headers=spec["headers"])
    with client.sync() as env:
        result = env.reset(seed=env_spec["seed"], episode_id=f"generic-{name}", **env_spec["config"])
        first_state = env.state()
        rewards, texts = [], [result.observation["text"]]
        while not result.done and len(rewards) < MAX_STEPS:
            result = env.step({"action": choose(result.observation, len(rewards))})
            rewards.append(result.reward)
            texts.append(result.observation["text"])
        return {
            "reset_state": first_state,
            "state": env.state(),
            "steps": len(rewards),
            "done": result.done,
            "rewards": rewards,
            "metadata": result.metadata,
            "texts": texts,
        }


class TextAction(Action):
    action: str


class TextObservation(Observation):
    model_config = ConfigDict(extra="allow")

    text: str


class TextGameClient(EnvClient[TextAction, TextObservation, State]):
    """A typed client, as an OpenEnv env package ships one."""

    def _step_payload(self, action: TextAction) -> dict[str, Any]:
        return action.model_dump()

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[TextObservation]:
        observation = TextObservation(**payload["observation"])
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload["done"])

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(**payload)


async def typed_episode(spec: dict[str, Any], name: str) -> dict[str, Any]:
    env_spec = spec["envs"][name]
    async with TextGameClient(base_url=url(spec, name), headers=spec["headers"]) as env:
        result = await env.reset(seed=env_spec["seed"], **env_spec["config"])
        steps = 0
        while not result.done and steps < MAX_STEPS:
            result = await env.step(TextAction(action=choose(result.observation.model_dump(), steps)))
            steps += 1
        state = await env.state()
        return {
            "steps": steps,
            "done": result.done,
            "reward": result.reward,
            "observation_type": type(result.observation).__name__,
            "state": state.model_dump(),
        }


def autoenv_episode(spec: dict[str, Any], name: str) -> dict[str, Any]:
    env_spec = spec["envs"][name]
    client = AutoEnv.from_env(name, base_url=url(spec, name), skip_install=True, headers=spec["headers"])
    with client.sync() as env:
        result = env.reset(seed=env_spec["seed"], **env_spec["config"])
        steps = 0
        while not result.done and steps < MAX_STEPS:
            result = env.step({"action": choose(result.observation, steps)})
            steps += 1
        return {"client": type(client).__name__, "steps": steps, "done": result.done, "reward": result.reward}


async def mcp_episode(spec: dict[str, Any], name: str) -> dict[str, Any]:
    """MCPToolClient: the env's tools over MCP, each call one step of the session's env."""
    env_spec = spec["envs"][name]
    async with MCPToolClient(base_url=url(spec, name), headers=spec["headers"]) as env:
        first = await env.reset(seed=env_spec["seed"], **env_spec["config"])
        tools = await env.list_tools()
        tool = tools[0]
        observation = first.observation.model_dump()
        data: dict[str, Any] = {"done": False}
        steps = 0
        while not data["done"] and steps < MAX_STEPS:
            action = choose(observation, steps)
            arguments = {"actions": [action]} if tool.name == "interact_many" else {"action": action}
            data = await env.call_tool(tool.name, **arguments)
            observation = data["observation"]
            steps += 1
        state = await env.state()
        return {
            "tools": [t.name for t in tools],
            "input_schema": tool.input_schema,
            "steps": steps,
            "done": data["done"],
            "reward": data.get("reward"),
            "state": state.model_dump(),
        }


async def concurrent_sessions(spec: dict[str, Any], name: str) -> dict[str, Any]:
    """Two sessions of one env at once, stepped in turn: each sees only its own episode."""
    headers = spec["headers"]
    actions = ["inventory", "get 1 oak log", "inventory"]
    async with (
        GenericEnvClient(base_url=url(spec, name), headers=headers) as a,
        GenericEnvClient(base_url=url(spec, name), headers=headers) as b,
    ):
        texts: dict[str, list[str]] = {"a": [], "b": []}
        for client, key, seed in ((a, "a", 1), (b, "b", 2)):
            texts[key].append((await client.reset(seed=seed, episode_id=f"ep-{key}")).observation["text"])
        for action in actions:
            for client, key in ((a, "a"), (b, "b")):
                texts[key].append((await client.step({"action": action})).observation["text"])
        states = {"a": (await a.state()), "b": (await b.state())}
    async with GenericEnvClient(base_url=url(spec, name), headers=headers) as solo:
        alone = [(await solo.reset(seed=1)).observation["text"]]
        for action in actions:
            alone.append((await solo.step({"action": action})).observation["text"])
    return {"texts": texts, "states": states, "alone": alone}


async def episodes(spec: dict[str, Any]) -> dict[str, Any]:
    names = sorted(spec["envs"])
    report: dict[str, Any] = {"generic": {}, "mcp": {}}
    for name in names:
        report["generic"][name] = await asyncio.to_thread(generic_episode, spec, name)
        report["mcp"][name] = await mcp_episode(spec, name)
    report["typed"] = {name: await typed_episode(spec, name) for name in names}
    report["autoenv"] = {name: await asyncio.to_thread(autoenv_episode, spec, name) for name in names}
    report["concurrent"] = await concurrent_sessions(spec, "textcraft")
    return report


async def capacity(spec: dict[str, Any]) -> dict[str, Any]:
    name = sorted(spec["envs"])[0]
    try:
        async with GenericEnvClient(base_url=url(spec, name), headers=spec["headers"]) as env:
            await env.reset()
    except RuntimeError as exc:
        return {"error": str(exc)}
    return {"error": None}


async def auth(spec: dict[str, Any]) -> dict[str, Any]:
    """One step with the spec's headers (the API key), and a connection without them."""
    target = url(spec, "textcraft")
    async with GenericEnvClient(base_url=target, headers=spec["headers"]) as env:
        await env.reset(seed=1)
        stepped = await env.step({"action": "inventory"})
    try:
        async with GenericEnvClient(base_url=target) as env:
            await env.reset(seed=1)
        refused = None
    except ConnectionError as exc:
        refused = str(exc)
    return {"with_key": stepped.observation["text"], "without_key": refused}


GRADED_ACTIONS = {"crafter": ["noop", "move_left", "do"], "textcraft": ["inventory", "get 1 oak log"]}


async def graders(spec: dict[str, Any]) -> dict[str, Any]:
    """OpenEnv 0.10's runtime graders (reward well-formed, observations valid against ``/schema``,
    the state contract) over an episode its own collector plays on ``/ws``."""
    from types import SimpleNamespace

    from openenv.validation.graders.runtime.basic import (
        ObservationSchemaGrader,
        RewardWellFormedGrader,
        StateContractGrader,
    )
    from openenv.validation.runtime.collector import collect_runtime_evidence
    from openenv.validation.runtime.contracts import RuntimePlan, RuntimeReset

    results = {}
    for name, env_spec in sorted(spec["envs"].items()):
        actions = GRADED_ACTIONS.get(name, ["inventory", "look around"])
        plan = RuntimePlan(
            plan_schema_version="1",
            reset=RuntimeReset(
                episode_id=f"graded-{name}", seed=env_spec["seed"], options=env_spec["config"]
            ),
            actions=[{"action": action} for action in actions],
        )
        evidence = await asyncio.to_thread(
            collect_runtime_evidence, url(spec, name), plan, episode_timeout_s=120
        )
        manifest = SimpleNamespace(reward=SimpleNamespace(range=(-1e9, 1e9)))
        subject = SimpleNamespace(manifest=manifest, runtime_evidence=evidence)
        checks = [RewardWellFormedGrader(), ObservationSchemaGrader(), StateContractGrader()]
        results[name] = {
            "failure": evidence.failure_reason,
            "exchanges": len(evidence.exchanges),
            "checks": {g.check_id: (r.status.value, r.evidence) for g in checks for r in [g.run(subject)]},
        }
    return results


async def validate(spec: dict[str, Any]) -> dict[str, Any]:
    """``openenv validate --url <server>/openenv/<env> --json`` for every env, through the CLI's
    own entry point, in this one process (each ``openenv`` process spends seconds on imports)."""
    from openenv.cli.__main__ import app

    reports = {}
    for name in sorted(spec["envs"]):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = app(["validate", "--url", url(spec, name), "--json"], standalone_mode=False)
        reports[name] = {"exit_code": code or 0, "report": json.loads(out.getvalue())}
    return reports


async def run_code(spec: dict[str, Any]) -> dict[str, Any]:
    """Run ``spec["code"]`` (e.g. the README's recipe) and report what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        await asyncio.to_thread(exec, compile(spec["code"], "<recipe>", "exec"), {"__name__": "__recipe__"})
    return {"stdout": out.getvalue()}


SCENARIOS = {
    "episodes": episodes,
    "capacity": capacity,
    "validate": validate,
    "auth": auth,
    "code": run_code,
    "graders": graders,
}


def report(spec: dict[str, Any]) -> str:
    return json.dumps(asyncio.run(SCENARIOS[spec["scenario"]](spec)), default=str)


def main() -> None:
    """``SPEC_JSON``: one report; ``--serve``: a report per line of input until it ends."""
    if sys.argv[1] != "--serve":
        print(report(json.loads(sys.argv[1])))
        return
    for line in sys.stdin:
        try:
            answer = report(json.loads(line))
        except Exception:
            answer = json.dumps({"driver_error": traceback.format_exc()})
        print(answer, flush=True)
    # Every report is written: skip the interpreter's teardown of OpenEnv's imports (seconds on a
    # busy machine, paid by the test module's teardown).
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
