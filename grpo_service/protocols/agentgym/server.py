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
Ids are per process: served through Ray, every AgentGym session lives on one host (the first).
"""

from __future__ import annotations

import base64
import functools
import itertools
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from envs.base import StepResult
from envs.errors import EpisodeOver, InvalidAction, PluginError
from grpo_service.api.auth import require_api_key
from grpo_service.api.fast_paths import FastRoute
from grpo_service.api.limits import StrictJSONRoute, strict_json
from grpo_service.api.services import Services
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
class AgentGymId:
    """One AgentGym id: the service env behind it (none before the first reset) and AgentGym's
    ``info`` record (what ``/detail`` shows)."""

    env_id: str | None = None
    info: dict[str, Any] = field(default_factory=lambda: {"deleted": False, "done": False})


class Game:
    """One mounted game: AgentGym's integer ids over the service's envs."""

    def __init__(self, name: str, services: Services) -> None:
        self.name = name
        self.services = services
        self.sessions: dict[int, AgentGymId] = {}
        self._ids = itertools.count()

    def new(self) -> tuple[int, AgentGymId]:
        idx = next(self._ids)
        self.sessions[idx] = session = AgentGymId()
        return idx, session

    def session(self, idx: int, *, allow_done: bool = False) -> AgentGymId:
        """AgentGym's ``_check_id``: the id exists, is not closed, and (unless allowed) not finished."""
        session = self.sessions.get(idx)
        if session is None:
            raise AgentGymError(f"The id {idx} is not valid.")
        if session.info["deleted"]:
            raise AgentGymError(f"The task with environment {idx} has been deleted.")
        if not allow_done and session.info["done"]:
            raise AgentGymError(f"The task with environment {idx} has finished.")
        return session

    def env_id(self, idx: int, session: AgentGymId) -> str:
        if session.env_id is None:
            raise AgentGymError(f"Environment {idx} has no task yet: call /reset with a data_idx first.")
        return session.env_id

    async def start(
        self, session: AgentGymId, data_idx: int, config: dict[str, Any] | None = None
    ) -> StepResult:
        """Play task ``data_idx`` in a new env (the previous one is released)."""
        await self.release(session)
        handle = await self.services.envs.create(self.name, config, data_idx, RL_RUN_ID)
        session.env_id = handle.id
        assert handle.last is not None
        return handle.last

    async def step(self, idx: int, session: AgentGymId, action: str) -> StepResult:
        """One action. AgentGym's servers answer every string; one the env refuses (longer than
        any command) is answered so too: the game as it stands with the env's message as the
        observation, reward 0, the score kept (`StepResult.refusal`, as OpenEnv's socket answers it)."""
        env_id = self.env_id(idx, session)
        try:
            return await self.services.envs.step(env_id, actions=[action])
        except InvalidAction as exc:
            now = await self.observe(idx, session)
            if now.done:  # after the episode's end every step is refused alike
                raise EpisodeOver("the episode is over: reset first") from None
            refused = now.refusal(str(exc))
            refused.info["score"] = now.info.get("score", 0)
            return refused

    async def begin(
        self, idx: int, data_idx: int, reply: Callable[[StepResult], dict[str, Any]]
    ) -> dict[str, Any]:
        """Task ``data_idx`` in session ``idx``: the game's reply to its start (which also
        becomes the session's ``/detail``)."""
        session = self.session(idx, allow_done=True)
        payload = reply(await self.start(session, data_idx))
        session.info.update(payload)
        return payload

    async def play(
        self,
        idx: int,
        action: str,
        reply: Callable[[StepResult], dict[str, Any]],
        *,
        allow_done: bool = False,
    ) -> tuple[AgentGymId, dict[str, Any]]:
        """One action in session ``idx``: the session and the game's reply to it (which also
        becomes the session's ``/detail``)."""
        session = self.session(idx, allow_done=allow_done)
        payload = reply(await self.step(idx, session, action))
        session.info.update(payload)
        return session, payload

    async def observe(self, idx: int, session: AgentGymId) -> StepResult:
        return await self.services.envs.query(self.env_id(idx, session), lambda env: env.observe())

    async def query(self, idx: int, session: AgentGymId, fn: Callable[[Any], Any]) -> Any:
        return await self.services.envs.query(self.env_id(idx, session), fn)

    async def release(self, session: AgentGymId) -> None:
        if session.env_id is not None:
            await self.services.envs.terminate(session.env_id)
            session.env_id = None


def agentgym_answer(handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """A route answering in AgentGym's error style (see `answer`)."""

    @functools.wraps(handler)
    async def route(*args: Any, **kwargs: Any) -> Any:
        return await answer(handler(*args, **kwargs))

    return route


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


# How a game's server answers a start or a step (AgentGym's clients read exactly these shapes).
Reply = Callable[[StepResult], dict[str, Any]]


def greeting_router(greeting: str) -> APIRouter:
    """A game's router, answering ``GET /`` with its AgentGym server's greeting. Its bodies are
    standard JSON (``NaN`` is a 422, as in the service's API)."""
    router = APIRouter(route_class=StrictJSONRoute)

    @router.get("/")
    async def hello() -> str:
        return greeting

    return router


def session_router(game: Game, greeting: str, start_reply: Reply) -> APIRouter:
    """The routes BabyAI's and SciWorld's servers share: ``/create`` only opens a session, the
    task comes with ``/reset``; each answers in the game's own shape (``start_reply``, `STEPS`)."""
    router = greeting_router(greeting)

    @router.post("/create")
    async def create() -> dict[str, int]:
        idx, _ = game.new()
        return {"id": idx}

    @router.post("/reset")
    @agentgym_answer
    async def reset(body: ResetBody) -> Any:
        return await game.begin(body.id, body.data_idx, start_reply)

    add_step_route(router, game)
    return router


def add_step_route(router: APIRouter, game: Game) -> None:
    """``POST /step``: one action, answered in the game's own shape (`STEPS`). `fast_step`
    answers the well-formed ones; this route documents it and answers the rest (401, 422)."""

    @router.post("/step")
    @agentgym_answer
    async def step(body: StepBody) -> Any:
        return await play_step(game, body)


async def play_step(game: Game, body: StepBody) -> dict[str, Any]:
    reply, allow_done = STEPS[game.name]
    return (await game.play(body.id, body.action, reply, allow_done=allow_done))[1]


# --------------------------------------------------------------------------------- TextCraft


def textcraft_routes(game: Game) -> APIRouter:
    router = greeting_router("This is environment TextCraft.")

    @router.post("/create")
    @agentgym_answer
    async def create(body: TextCraftCreateBody) -> Any:
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

    add_step_route(router, game)

    @router.post("/reset")
    @agentgym_answer
    async def reset(body: TextCraftResetBody) -> Any:
        session = game.session(body.id, allow_done=True)
        first = await game.start(session, (body.data_idx or 0) % _num_tasks(game))
        payload = {"id": body.id, "observation": first.observation["text"], "done": False, "reward": 0}
        session.info.update(
            {"observation": payload["observation"], "done": False, "reward": 0, "deleted": False}
        )
        return payload

    @router.get("/observation")
    @agentgym_answer
    async def observation(id: int) -> Any:
        return game.session(id, allow_done=True).info["observation"]

    @router.get("/commands")
    @agentgym_answer
    async def commands(id: int) -> Any:
        return await game.query(id, game.session(id, allow_done=True), lambda env: env.commands)

    @router.get("/goal")
    @agentgym_answer
    async def goal(id: int) -> Any:
        return await game.query(id, game.session(id, allow_done=True), lambda env: env.goal)

    @router.get("/detail")
    @agentgym_answer
    async def detail(id: int) -> Any:
        return game.session(id, allow_done=True).info

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
    router = session_router(game, "This is environment BabyAI.", _babyai_start)

    @router.get("/observation")
    @agentgym_answer
    async def observation(id: int) -> Any:
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

    @router.post("/close")
    async def close(body: CloseBody) -> bool:
        session = game.sessions.pop(body.id, None)
        if session is None or session.env_id is None:
            return False
        await game.release(session)
        return True

    @router.post("/render")
    @agentgym_answer
    async def render(body: CloseBody) -> Any:
        session = game.session(body.id)
        png = await game.query(body.id, session, lambda env: env.frame_png(32))
        return "data:image/png;base64," + base64.b64encode(png).decode("ascii")

    return router


# ---------------------------------------------------------------------------------- SciWorld


def sciworld_routes(game: Game) -> APIRouter:
    router = session_router(game, "This is environment ScienceWorld.", _sciworld_start)

    @router.post("/step_visual")
    @agentgym_answer
    async def step_visual(body: StepBody) -> Any:
        action = body.action[:-4] if body.action.endswith("</s>") else body.action
        if "Action:" in action:
            action = action.split("Action:")[1].strip()
        session, payload = await game.play(body.id, action, _sciworld_reply)
        extra = await game.query(body.id, session, _visual_details)
        payload.update(extra)
        session.info.update(payload)
        return payload

    @router.post("/close")
    @agentgym_answer
    async def close(body: CloseBody) -> Any:
        session = game.session(body.id, allow_done=True)
        await game.release(session)
        session.info["deleted"] = True
        return True

    @router.get("/observation")
    @agentgym_answer
    async def observation(id: int) -> Any:
        return game.session(id).info["observation"]

    @router.get("/detail")
    @agentgym_answer
    async def detail(id: int) -> Any:
        return game.session(id).info

    def simulator_get(path: str, build: Callable[[Any], Any]) -> None:
        @agentgym_answer
        async def route(id: int) -> Any:
            return await game.query(id, game.session(id), build)

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


def _textcraft_reply(result: StepResult) -> dict[str, Any]:
    return {"observation": result.observation["text"], "reward": int(result.reward), "done": result.done}


def _babyai_reply(result: StepResult) -> dict[str, Any]:
    score = result.info["score"]
    return {
        "observation": result.observation["text"],
        "reward": result.reward,
        "score": score,
        "done": result.done,
    }


def _sciworld_reply(result: StepResult) -> dict[str, Any]:
    observation = result.info.get("invalid_action", result.observation["observation"])
    score = int(result.info["score"])
    return {"observation": observation, "reward": int(result.reward), "score": score, "done": result.done}


def _babyai_start(first: StepResult) -> dict[str, Any]:
    text = first.observation["text"]
    return {"observation": text, "reward": 0.0, "score": 0.0, "deleted": False, "done": first.done}


def _sciworld_start(first: StepResult) -> dict[str, Any]:
    observation, score = first.observation, int(first.observation["score"])
    return {
        "task_name": observation["task_name"],
        "var_num": observation["variation"],
        "task_description": observation["task_description"],
        "observation": observation["observation"],
        "reward": score,
        "score": score,
        "deleted": False,
        "done": False,
    }


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

# Each game's answer to ``/step`` and whether a finished episode may still be stepped (TextCraft's
# server lets it: the env refuses the action, answered as AgentGym's does).
STEPS: dict[str, tuple[Reply, bool]] = {
    "textcraft": (_textcraft_reply, True),
    "babyai": (_babyai_reply, False),
    "sciworld": (_sciworld_reply, False),
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


def mount(app: FastAPI, services: Services) -> dict[str, FastRoute]:
    """Mount one AgentGym-compatible server per game at ``/agentgym/<game>``; their ``/step``
    fast paths, by path (for `FastPaths`)."""
    steps = {}
    for name in GAMES:
        server = agentgym_server(name, services)
        app.mount(f"/agentgym/{name}", server)
        steps[f"/agentgym/{name}/step"] = fast_step(server.state.game)
    return steps


def fast_step(game: Game) -> FastRoute:
    """``POST /step`` answered ahead of FastAPI's routing (`FastPaths`): an evaluation is nearly
    all steps, and the mounted app's middleware, routing and dependency solving cost several
    times the game's step. The route's own function and FastAPI's response bytes; a body that is
    not a `StepBody` goes on to the route (its 422)."""

    async def step(body: bytes) -> Response | None:
        try:
            parsed = StepBody.model_validate(strict_json(body))
        except ValueError:
            return None
        payload = await answer(play_step(game, parsed))
        try:
            content = _dumps(payload)
        except TypeError:
            content = _dumps(jsonable_encoder(payload))
        return Response(content, media_type="application/json")

    return step


def _dumps(content: Any) -> bytes:
    """As Starlette's `JSONResponse` renders."""
    text = json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))
    return text.encode()
