"""AgentGym-compatible environment servers, one per game, mounted at ``/agentgym/<env>``.

AgentGym's client (``agentenv``) talks to one FastAPI server per environment: ``POST /create``,
``POST /reset {id, data_idx}``, ``POST /step {id, action}``, ``GET /observation?id=``,
``POST /close {id}`` and a few per-game routes, with integer ids and its own JSON shapes. Each
mount here is such a server, field by field, so that the unmodified client given
``env_server_base=http://host:8000/agentgym/textcraft`` runs its evaluation against us.

The games underneath are the service's own envs (created through the `EnvManager`, so they
count against capacity, are reaped when idle and run in worker threads). The error style is
AgentGym's on these routes: a failed call is HTTP 200 with ``{"error": "..."}``, and a body
that does not validate is FastAPI's default 422. The API key, when the service has one, is
required here too (401 in the service's own shape).

Where AgentGym's servers crash (``/commands`` and ``/goal`` of TextCraft call methods its
wrapper lacks; closing an unknown SciWorld id is a 500), these answer sensibly instead.
Ids are per process: serve with one worker (``--workers 1``) when AgentGym's client is used.
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from envs.base import PluginError, StepResult
from grpo_service.auth import require_api_key
from grpo_service.deps import Services
from grpo_service.errors import ServiceError, error_body

GAMES = ("textcraft", "babyai", "sciworld")
RL_RUN_ID = "agentgym"


# ------------------------------------------------------------------ AgentGym's request bodies


class Body(BaseModel):
    """AgentGym's client sends JSON integers and strings: anything else (``false`` for an id,
    ``1.5`` for a task) is a 422 here rather than being read as some other id or task."""

    model_config = ConfigDict(strict=True)


class StepBody(Body):
    id: int
    action: str


class ResetBody(Body):
    id: int
    data_idx: int


class TextCraftResetBody(Body):
    id: int
    data_idx: int | None = 0


class CloseBody(Body):
    id: int


class TextCraftCreateBody(Body):
    commands: str | None = None
    goal: str | None = None


# ----------------------------------------------------------------------------- sessions


class AgentGymError(Exception):
    """Reported as ``{"error": message}`` with HTTP 200, as AgentGym's servers do."""


@dataclass
class Session:
    """One AgentGym id: the service env behind it (none before the first reset) and AgentGym's
    ``info`` record (what ``/detail`` shows)."""

    env_id: str | None = None
    info: dict[str, Any] = field(default_factory=lambda: {"deleted": False, "done": False})


class Game:
    """One mounted game: AgentGym's integer ids over the service's envs."""

    def __init__(self, name: str, services: Services) -> None:
        self.name = name
        self.services = services
        self.sessions: dict[int, Session] = {}
        self._ids = itertools.count()

    def new(self) -> tuple[int, Session]:
        idx = next(self._ids)
        self.sessions[idx] = session = Session()
        return idx, session

    def session(self, idx: int, *, allow_done: bool = False) -> Session:
        """AgentGym's ``_check_id``: the id exists, is not closed, and (unless allowed) not finished."""
        session = self.sessions.get(idx)
        if session is None:
            raise AgentGymError(f"The id {idx} is not valid.")
        if session.info["deleted"]:
            raise AgentGymError(f"The task with environment {idx} has been deleted.")
        if not allow_done and session.info["done"]:
            raise AgentGymError(f"The task with environment {idx} has finished.")
        return session

    def env_id(self, idx: int, session: Session) -> str:
        if session.env_id is None:
            raise AgentGymError(f"Environment {idx} has no task yet: call /reset with a data_idx first.")
        return session.env_id

    async def start(
        self, session: Session, data_idx: int, config: dict[str, Any] | None = None
    ) -> StepResult:
        """Play task ``data_idx`` in a new env (the previous one is released)."""
        await self.release(session)
        handle = await self.services.envs.create(self.name, config, data_idx, RL_RUN_ID)
        session.env_id = handle.id
        assert handle.last is not None
        return handle.last

    async def step(self, idx: int, session: Session, action: str) -> StepResult:
        return await self.services.envs.step(self.env_id(idx, session), actions=[action])

    async def observe(self, idx: int, session: Session) -> StepResult:
        return await self.services.envs.query(self.env_id(idx, session), lambda env: env.observe())

    async def query(self, idx: int, session: Session, fn: Callable[[Any], Any]) -> Any:
        return await self.services.envs.query(self.env_id(idx, session), fn)

    async def release(self, session: Session) -> None:
        if session.env_id is not None:
            await self.services.envs.terminate(session.env_id)
            session.env_id = None


async def answer(work: Awaitable[Any]) -> Any:
    """AgentGym's error style: any failure becomes ``{"error": message}``."""
    try:
        return await work
    except AgentGymError as exc:
        return {"error": str(exc)}
    except ServiceError as exc:
        return {"error": exc.message}
    except PluginError as exc:
        return {"error": str(exc)}


# --------------------------------------------------------------------------------- TextCraft


def textcraft_routes(game: Game) -> APIRouter:
    router = APIRouter()

    @router.get("/")
    async def hello() -> str:
        return "This is environment TextCraft."

    @router.post("/create")
    async def create(body: TextCraftCreateBody) -> Any:
        async def run() -> dict[str, Any]:
            idx, session = game.new()
            custom = body.commands is not None and body.goal is not None
            config = {"commands": body.commands, "goal": body.goal} if custom else None
            try:
                first = await game.start(session, idx % _num_tasks(game), config)
            except BaseException:
                game.sessions.pop(idx, None)
                raise
            payload = {"id": idx, "observation": first.observation["text"], "done": False, "reward": 0}
            session.info = {
                "observation": payload["observation"],
                "done": False,
                "reward": 0,
                "deleted": False,
            }
            return payload

        return await answer(run())

    @router.post("/step")
    async def step(body: StepBody) -> Any:
        async def run() -> dict[str, Any]:
            session = game.session(body.id, allow_done=True)
            result = await game.step(body.id, session, body.action)
            payload = {
                "observation": result.observation["text"],
                "reward": int(result.reward),
                "done": result.done,
            }
            session.info.update(payload)
            return payload

        return await answer(run())

    @router.post("/reset")
    async def reset(body: TextCraftResetBody) -> Any:
        async def run() -> dict[str, Any]:
            session = game.session(body.id, allow_done=True)
            first = await game.start(session, (body.data_idx or 0) % _num_tasks(game))
            payload = {"id": body.id, "observation": first.observation["text"], "done": False, "reward": 0}
            session.info.update(
                {"observation": payload["observation"], "done": False, "reward": 0, "deleted": False}
            )
            return payload

        return await answer(run())

    @router.get("/observation")
    async def observation(id: int) -> Any:
        async def run() -> Any:
            return game.session(id, allow_done=True).info["observation"]

        return await answer(run())

    @router.get("/commands")
    async def commands(id: int) -> Any:
        async def run() -> Any:
            return await game.query(id, game.session(id, allow_done=True), lambda env: env.commands)

        return await answer(run())

    @router.get("/goal")
    async def goal(id: int) -> Any:
        async def run() -> Any:
            return await game.query(id, game.session(id, allow_done=True), lambda env: env.goal)

        return await answer(run())

    @router.get("/detail")
    async def detail(id: int) -> Any:
        async def run() -> Any:
            return game.session(id, allow_done=True).info

        return await answer(run())

    @router.post("/close")
    async def close(body: CloseBody) -> bool:
        session = game.sessions.pop(body.id, None)
        if session is None:
            return False
        await game.release(session)
        return True

    return router


def _num_tasks(game: Game) -> int:
    from envs import environment_class

    return environment_class(game.name).num_tasks()  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------ BabyAI


def babyai_routes(game: Game) -> APIRouter:
    router = APIRouter()

    @router.get("/")
    async def hello() -> str:
        return "This is environment BabyAI."

    @router.post("/create")
    async def create() -> dict[str, int]:
        idx, _ = game.new()
        return {"id": idx}

    @router.post("/reset")
    async def reset(body: ResetBody) -> Any:
        async def run() -> dict[str, Any]:
            session = game.session(body.id, allow_done=True)
            first = await game.start(session, body.data_idx)
            payload = {
                "observation": first.observation["text"],
                "reward": 0.0,
                "score": 0.0,
                "deleted": False,
                "done": first.done,
            }
            session.info.update(payload)
            return payload

        return await answer(run())

    @router.post("/step")
    async def step(body: StepBody) -> Any:
        async def run() -> dict[str, Any]:
            session = game.session(body.id)
            result = await game.step(body.id, session, body.action)
            payload = {
                "observation": result.observation["text"],
                "reward": result.reward,
                "score": result.info["score"],
                "done": result.done,
            }
            session.info.update(payload)
            return payload

        return await answer(run())

    @router.get("/observation")
    async def observation(id: int) -> Any:
        async def run() -> dict[str, Any]:
            session = game.session(id)
            if session.env_id is None:
                return {
                    "observation": "Environment not initialized",
                    "reward": 0,
                    "score": 0,
                    "done": False,
                    "deleted": session.info["deleted"],
                }
            now = (await game.observe(id, session)).observation
            actions = now["text"][len(now["state"]) :]  # the "\nAvailable actions: [...]" suffix
            reward = await game.query(id, session, lambda env: env.reward)
            return {
                "observation": f"Your goal: {now['goal']}\n{now['state']}{actions}",
                "reward": reward,
                "score": session.info.get("score", 0),
                "done": session.info["done"],
                "deleted": session.info["deleted"],
            }

        return await answer(run())

    @router.post("/close")
    async def close(body: CloseBody) -> bool:
        session = game.sessions.pop(body.id, None)
        if session is None or session.env_id is None:
            return False
        await game.release(session)
        return True

    @router.post("/render")
    async def render(body: CloseBody) -> Any:
        async def run() -> str:
            session = game.session(body.id)
            png = await game.query(body.id, session, lambda env: env.frame_png(32))
            return "data:image/png;base64," + base64.b64encode(png).decode("ascii")

        return await answer(run())

    return router


# ---------------------------------------------------------------------------------- SciWorld


def sciworld_routes(game: Game) -> APIRouter:
    router = APIRouter()

    @router.get("/")
    async def hello() -> str:
        return "This is environment ScienceWorld."

    @router.post("/create")
    async def create() -> dict[str, int]:
        idx, _ = game.new()
        return {"id": idx}

    async def do_step(body: StepBody, action: str) -> tuple[Session, dict[str, Any]]:
        session = game.session(body.id)
        result = await game.step(body.id, session, action)
        payload = {
            "observation": result.observation["observation"],
            "reward": int(result.reward),
            "score": int(result.info["score"]),
            "done": result.done,
        }
        session.info.update(payload)
        return session, payload

    @router.post("/step")
    async def step(body: StepBody) -> Any:
        async def run() -> dict[str, Any]:
            return (await do_step(body, body.action))[1]

        return await answer(run())

    @router.post("/step_visual")
    async def step_visual(body: StepBody) -> Any:
        async def run() -> dict[str, Any]:
            action = body.action[:-4] if body.action.endswith("</s>") else body.action
            if "Action:" in action:
                action = action.split("Action:")[1].strip()
            session, payload = await do_step(body, action)
            extra = await game.query(body.id, session, _visual_details)
            payload.update(extra)
            session.info.update(payload)
            return payload

        return await answer(run())

    @router.post("/reset")
    async def reset(body: ResetBody) -> Any:
        async def run() -> dict[str, Any]:
            session = game.session(body.id, allow_done=True)
            first = (await game.start(session, body.data_idx)).observation
            payload = {
                "task_name": first["task_name"],
                "var_num": first["variation"],
                "task_description": first["task_description"],
                "observation": first["observation"],
                "reward": int(first["score"]),
                "score": int(first["score"]),
                "deleted": False,
                "done": False,
            }
            session.info.update(payload)
            return payload

        return await answer(run())

    @router.post("/close")
    async def close(body: CloseBody) -> Any:
        async def run() -> bool:
            session = game.session(body.id, allow_done=True)
            await game.release(session)
            session.info["deleted"] = True
            return True

        return await answer(run())

    @router.get("/observation")
    async def observation(id: int) -> Any:
        async def run() -> Any:
            return game.session(id).info["observation"]

        return await answer(run())

    @router.get("/detail")
    async def detail(id: int) -> Any:
        async def run() -> Any:
            return game.session(id).info

        return await answer(run())

    def simulator_get(path: str, build: Callable[[Any], Any]) -> None:
        async def route(id: int) -> Any:
            async def run() -> Any:
                return await game.query(id, game.session(id), build)

            return await answer(run())

        router.add_api_route(path, route, methods=["GET"])

    simulator_get(
        "/action_hint",
        lambda env: {
            "possible_actions": env.query("get_possible_actions"),
            "possible_objects": env.query("get_possible_objects"),
        },
    )
    simulator_get("/goals", lambda env: {"goals": env.query("get_goal_progress")})
    simulator_get("/task_description", lambda env: {"task_description": env.query("get_task_description")})
    simulator_get("/object_tree", lambda env: {"object_tree": env.query("getObjectTree")})
    simulator_get("/state", _current_state)
    return router


def _visual_details(env: Any) -> dict[str, Any]:
    observation = env.observe().observation
    return {
        "info": {
            "moves": observation["moves"],
            "score": observation["score"],
            "look": env.query("look"),
            "inv": env.query("inventory"),
            "taskDesc": env.query("taskdescription"),
            "variationIdx": observation["variation"],
            "taskName": observation["task_name"],
            "simplificationStr": "",
        },
        "object_tree": env.query("getObjectTree"),
        "inventory": env.query("inventory"),
        "moves": observation["moves"],
    }


def _current_state(env: Any) -> dict[str, Any]:
    return {
        "observation": env.query("look"),
        "inventory": env.query("inventory"),
        "task_description": env.query("get_task_description"),
        "goal_progress": env.query("get_goal_progress"),
        "possible_actions": env.query("get_possible_actions")[:10],
        "possible_objects": env.query("get_possible_objects")[:10],
        "current_moves": env.query("get_num_moves"),
    }


# ------------------------------------------------------------------------------------ mounting

ROUTES: dict[str, Callable[[Game], APIRouter]] = {
    "textcraft": textcraft_routes,
    "babyai": babyai_routes,
    "sciworld": sciworld_routes,
}


def agentgym_server(name: str, services: Services) -> FastAPI:
    """An AgentGym-shaped server for game ``name``, sharing the service's envs and settings."""
    server = FastAPI(
        title=f"grpo-service: AgentGym-compatible {name} server",
        description=__doc__,
        dependencies=[Depends(require_api_key)],
    )
    server.state.settings = services.settings
    server.state.services = services
    server.state.game = Game(name, services)
    server.include_router(ROUTES[name](server.state.game))

    @server.exception_handler(ServiceError)
    async def _service_error(_: Request, exc: ServiceError) -> JSONResponse:  # the API key check
        return JSONResponse(error_body(exc.code, exc.message), exc.status_code, headers=exc.headers)

    return server


def mount(app: FastAPI, services: Services) -> None:
    """Mount one AgentGym-compatible server per game at ``/agentgym/<game>``."""
    for name in GAMES:
        app.mount(f"/agentgym/{name}", agentgym_server(name, services))
