"""OpenEnv sessions of one environment plug-in, each over a live env of the service's registry.

A session is what OpenEnv calls one env instance: a WebSocket opens one (and closes it when the
socket closes or drops), MCP's ``openenv/session/create`` opens one that a WebSocket may attach
to with ``?session_id=``. Its env is created through the `EnvManager` like any other: counted by
the capacity limits, listed by /env/list, reaped when idle; every call goes through the manager
by env id. A reset that carries a config (or another ``rl_run_id``) replaces the env by a new one.
Each episode is traced when it ends (done, reset, or session closed).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import ValidationError

from envs.base import StepResult, environment_class
from envs.errors import InvalidAction, InvalidConfig, PluginError
from grpo_service.api.services import Services
from grpo_service.core.registry import TAGGED_ID, EnvHandle, instance_id, new_instance_id
from grpo_service.errors import CapacityExceeded, NotFound, ServiceError, Unprocessable, WrongInstance
from grpo_service.protocols.openenv.frames import (
    ErrorCode,
    FrameError,
    ResetOptions,
    State,
    StepData,
    validation_failed,
)
from grpo_service.tracing.episodes import EpisodeRecorder

log = logging.getLogger(__name__)

RL_RUN_ID = "openenv"
T = TypeVar("T")
CLIENT = "openenv"  # the policy name of traced episodes


@dataclass(eq=False)
class OpenEnvSession:
    id: str
    env_id: str | None  # a socket's own session: None until a frame needs an env (reset, step)
    recorder: EpisodeRecorder | None  # the episode under way, once there is an env
    episode_id: str
    step_count: int = 0
    socket_owned: bool = False  # opened by its WebSocket: ends with it
    socket_attached: bool = False
    closed: bool = False


class Sessions:
    """The live OpenEnv sessions of environment ``env_name``."""

    def __init__(self, env_name: str, services: Services) -> None:
        self.env_name = env_name
        self.services = services
        self._sessions: dict[str, OpenEnvSession] = {}
        self._tools = environment_class(env_name).tools()

    def __len__(self) -> int:
        return len(self._sessions)

    # ------------------------------------------------------------------------------- lifecycle

    async def open(self, *, seed: int | None = None, socket_owned: bool = False) -> OpenEnvSession:
        """A new session. MCP's (``openenv/session/create``) comes with its env; a WebSocket's own
        gets one from its first frame that needs it (reset, step, a tool call), so a silent socket
        holds none. Either is refused (``CAPACITY_REACHED``) when the service has no room for an env."""
        self._forget_expired()
        session = OpenEnvSession(
            id=new_instance_id(),
            env_id=None,
            recorder=None,
            episode_id=uuid.uuid4().hex,
            socket_owned=socket_owned,
        )
        if socket_owned:
            try:
                self.services.registry.envs.reserve()
            except CapacityExceeded as exc:
                raise self.capacity_error(exc) from None
        else:
            await self._build(session, None, seed, RL_RUN_ID)
        self._sessions[session.id] = session
        return session

    async def _build(
        self, session: OpenEnvSession, config: dict[str, Any] | None, seed: int | None, rl_run_id: str
    ) -> EnvHandle:
        """The session's first env (``CAPACITY_REACHED`` when the service is full, ``FACTORY_ERROR``
        when it cannot be built)."""
        try:
            handle = await self.services.envs.create(self.env_name, config, seed, rl_run_id)
        except CapacityExceeded as exc:
            raise self.capacity_error(exc) from None
        except (InvalidConfig, Unprocessable) as exc:
            raise FrameError(ErrorCode.VALIDATION_ERROR, _message(exc)) from None
        except (PluginError, ServiceError) as exc:
            raise FrameError(ErrorCode.FACTORY_ERROR, _message(exc), factory_name=self.env_name) from None
        except Exception as exc:  # an env that fails to build must not take the socket down unanswered
            log.exception("OpenEnv session: building %s failed", self.env_name)
            message = f"{type(exc).__name__}: {exc}"
            raise FrameError(ErrorCode.FACTORY_ERROR, message, factory_name=self.env_name) from None
        session.env_id = handle.id
        session.recorder = self._recorder(handle, rl_run_id, session.episode_id)
        return handle

    def capacity_error(self, exc: CapacityExceeded) -> FrameError:
        envs = self.services.registry.envs
        return FrameError(
            ErrorCode.CAPACITY_REACHED,
            exc.message,
            fatal=True,
            active_sessions=len(envs),
            max_sessions=envs.capacity,
        )

    def get(self, session_id: str) -> OpenEnvSession:
        session = self._sessions.get(session_id)
        if session is None or session.closed:
            message = f"unknown session_id {session_id!r:.80}: closed, expired, or never opened"
            tagged = TAGGED_ID.match(session_id)
            if tagged and tagged.group(1) != instance_id():
                message = (
                    f"session {session_id} lives in another replica of this service (instance "
                    f"{tagged.group(1)}; this is {instance_id()}): use sticky routing, or serve through Ray"
                )
            raise FrameError(ErrorCode.SESSION_ERROR, message, fatal=True)
        return session

    def attach(self, session_id: str) -> OpenEnvSession:
        """A WebSocket takes over MCP session ``session_id`` (one socket at a time); a session a
        WebSocket opened is that socket's alone."""
        session = self.unowned(session_id)
        if session.socket_attached:
            raise FrameError(
                ErrorCode.SESSION_ERROR, f"session {session_id} already has a WebSocket attached", fatal=True
            )
        session.socket_attached = True
        return session

    def unowned(self, session_id: str) -> OpenEnvSession:
        """Session ``session_id`` for a caller other than a socket that opened it (an attaching
        socket, MCP by id): ``SESSION_ERROR`` if a WebSocket opened it, which alone plays it."""
        session = self.get(session_id)
        if session.socket_owned:
            raise FrameError(
                ErrorCode.SESSION_ERROR,
                f"session {session_id} belongs to the WebSocket that opened it; only MCP sessions "
                "(openenv/session/create) can be attached to or called by id",
                fatal=True,
            )
        return session

    async def release(self, session: OpenEnvSession, reason: str) -> None:
        """Its WebSocket is gone: a session the socket opened ends, an attached one stays open."""
        if session.socket_owned:
            await self.close(session, reason)
        else:
            session.socket_attached = False

    async def close(self, session: OpenEnvSession, reason: str = "closed") -> bool:
        """Trace the episode under way, terminate the env, forget the session. Idempotent."""
        if session.closed:
            return False
        session.closed = True
        self._sessions.pop(session.id, None)
        self._submit(session, reason)
        if session.env_id is not None:
            await self.services.envs.terminate(session.env_id)
        return True

    async def close_all(self) -> None:
        for session in list(self._sessions.values()):
            await self.close(session, "server_shutdown")

    def _forget_expired(self) -> None:
        """Drop sessions whose env is gone (reaped when idle, or terminated over HTTP)."""
        for session in list(self._sessions.values()):
            if session.env_id is not None and session.env_id not in self.services.registry.envs:
                session.closed = True
                self._sessions.pop(session.id, None)
                self._submit(session, "env_terminated")

    # ------------------------------------------------------------------------------- episodes

    async def reset(self, session: OpenEnvSession, data: dict[str, Any] | None) -> dict[str, Any]:
        try:
            options = ResetOptions.model_validate(data or {})
        except ValidationError as exc:
            raise validation_failed(exc, "reset data") from None
        given = self._config(options.config()) if options.config() else None
        if session.env_id is None:  # the session's first env, built with this reset's config and seed
            handle = await self._build(session, given, options.seed, options.rl_run_id or RL_RUN_ID)
            result = handle.last
        else:
            handle = self._handle(session)
            rl_run_id = options.rl_run_id or handle.rl_run_id
            config = given or self.services.envs.config(handle)
            self._submit(session, "reset")
            if config != self.services.envs.config(handle) or rl_run_id != handle.rl_run_id:
                handle = await self._rebuild(session, handle, config, options.seed, rl_run_id)
                result = handle.last
            else:
                result = await self._call(self.services.envs.reset(handle.id, options.seed))
        assert result is not None
        session.episode_id = options.episode_id or uuid.uuid4().hex
        session.step_count = 0
        session.recorder = self._recorder(handle, handle.rl_run_id, session.episode_id)
        return self.first_observation(session, result)

    async def step(self, session: OpenEnvSession, data: dict[str, Any] | None) -> dict[str, Any]:
        action = data.get("action") if data is not None and len(data) == 1 else None
        if type(action) is str:  # {"action": text}, nearly every frame: valid as it is (`StepData`)
            return await self._step(session, {"actions": [action]})
        data = dict(data or {})
        if isinstance(data.get("metadata"), dict):
            del data["metadata"]  # the field every OpenEnv `Action` has (a typed client's model_dump)
        try:
            action = StepData.model_validate(data)
        except ValidationError as exc:
            raise validation_failed(exc, "step data") from None
        return await self._step(session, action.step_args())

    async def call_tool(
        self, session: OpenEnvSession, name: str, arguments: dict[str, Any]
    ) -> dict[str, Any]:
        """One tool call (one of `tools`): the step's observation data as an MCP tool result."""
        data = await self._step(session, {"tool_calls": [{"tool": name, "args": arguments}]})
        return tool_result(data)

    def state(self, session: OpenEnvSession) -> dict[str, Any]:
        if session.env_id is None:  # no reset or step yet: no env either
            return State(
                episode_id=session.episode_id,
                step_count=session.step_count,
                env_id=None,
                env_name=self.env_name,
                session_id=session.id,
                seed=None,
                step_idx=0,
                done=False,
            ).model_dump()
        handle = self._handle(session)
        last = handle.last
        return State(
            episode_id=session.episode_id,
            step_count=session.step_count,
            env_id=handle.id,
            env_name=self.env_name,
            session_id=session.id,
            seed=self.services.envs.seed(handle),
            step_idx=last.step_idx if last else 0,
            done=bool(last and last.done),
        ).model_dump()

    def tools(self) -> list[dict[str, Any]]:
        """The env's tools in MCP's shape (``name``, ``description``, ``inputSchema``)."""
        return [
            {
                "name": tool["function"]["name"],
                "description": tool["function"].get("description", ""),
                "inputSchema": tool["function"].get("parameters", {"type": "object"}),
            }
            for tool in environment_class(self.env_name).tools()
        ]

    def observation(
        self, session: OpenEnvSession, result: StepResult, reward: float | None
    ) -> dict[str, Any]:
        """An ``observation`` frame's data (OpenEnv's `serialize_observation` shape)."""
        metadata = {
            "env_id": session.env_id,
            "episode_id": session.episode_id,
            "step_idx": result.step_idx,
            "truncated": result.truncated,
            "info": result.info,
        }
        return {
            "observation": {**result.observation, "metadata": metadata},
            "reward": reward,
            "done": result.done,
            "metadata": metadata,
        }

    def first_observation(self, session: OpenEnvSession, result: StepResult) -> dict[str, Any]:
        """A reset's observation frame data: what the model sees first names the env's actions
        (its ``text`` ends with the env's vocabulary, also given as ``vocabulary``)."""
        data = self.observation(session, result, None)
        vocabulary = environment_class(self.env_name).vocabulary()
        observation = data["observation"]
        observation["text"] = f"{observation.get('text', '')}\n\n{vocabulary}"
        observation["vocabulary"] = vocabulary
        return data

    # ------------------------------------------------------------------------------- internals

    async def _step(self, session: OpenEnvSession, args: dict[str, Any]) -> dict[str, Any]:
        """One step; an action or tool call the env refuses is answered, not raised: the env's
        current observation with the env's message as its text, reward 0, counted as a step (as
        AgentGym's servers answer an action their game does not know)."""
        handle = await self._env(session)
        traced = self.services.tracer is not None  # without a tracer the steps would only pile up
        before = handle.last.observation if traced and handle.last is not None else {}
        started = time.perf_counter()
        recorder = session.recorder
        assert recorder is not None  # the session has an env
        try:
            result = await self._call(self.services.envs.step_handle(handle, **args))
        except InvalidAction as exc:
            current = await self.services.envs.current(handle)
            if current.done:  # after the episode's end every step is refused alike
                raise FrameError(ErrorCode.EXECUTION_ERROR, "the episode is over: reset first") from None
            session.step_count += 1
            if traced:
                recorder.record_invalid(before, self._tool_calls(args), str(exc))
            return self.observation(session, current.refusal(str(exc)), 0.0)
        env_ms = (time.perf_counter() - started) * 1000
        session.step_count += 1
        if traced:
            recorder.record(before, self._tool_calls(args), result, env_ms)
        if result.done:
            self._submit(session, "episode_done")
        return self.observation(session, result, result.reward)

    def _tool_calls(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        return args.get("tool_calls") or as_tool_calls(self._tools, args["actions"])

    def _config(self, given: dict[str, Any]) -> dict[str, Any]:
        """``given`` as the env's full config (defaults filled in), or ``VALIDATION_ERROR``."""
        try:
            return environment_class(self.env_name).config_model.model_validate(given).model_dump(mode="json")
        except ValidationError as exc:
            raise validation_failed(exc, f"config for {self.env_name}") from None

    async def _rebuild(
        self,
        session: OpenEnvSession,
        old: EnvHandle,
        config: dict[str, Any] | None,
        seed: int | None,
        rl_run_id: str,
    ) -> EnvHandle:
        """Replace the session's env by a new one built with ``config``. The new env is built
        before the old one goes, so a config or seed the env refuses leaves the session as it
        was; only on a full server is the old env released first to make room."""
        try:
            handle = await self._call(self.services.envs.create(self.env_name, config, seed, rl_run_id))
        except FrameError as exc:
            if exc.code != ErrorCode.CAPACITY_REACHED:
                raise
            await self.services.envs.terminate(old.id)
            try:
                handle = await self._call(self.services.envs.create(self.env_name, config, seed, rl_run_id))
            except FrameError as again:
                await self.close(session, "env_terminated")
                again.fatal = True  # the old env is gone: the session cannot go on
                raise
        else:
            await self.services.envs.terminate(old.id)
        session.env_id = handle.id
        return handle

    def check_alive(self, session: OpenEnvSession) -> None:
        """After an idle spell of its socket: `SESSION_ERROR` (fatal) if the session's env is gone,
        or if it never had one (a silent socket is not kept). Unlike a lookup, this does not count
        as a use of the env (it would never become idle)."""
        if session.env_id is None:
            raise FrameError(
                ErrorCode.SESSION_ERROR,
                f"no frame for the idle TTL ({self.services.settings.idle_ttl_s:g} s) and no env (no "
                "reset or step yet): this socket is closed; reconnect to play",
                fatal=True,
            )
        if session.env_id not in self.services.registry.envs:
            raise self._gone(session)

    async def _env(self, session: OpenEnvSession) -> EnvHandle:
        """The session's env, built now (default config and seed) if it has none yet."""
        if session.env_id is None:
            return await self._build(session, None, None, RL_RUN_ID)
        return self._handle(session)

    def _handle(self, session: OpenEnvSession) -> EnvHandle:
        assert session.env_id is not None
        try:
            return self.services.envs.get(session.env_id)
        except (NotFound, WrongInstance):
            raise self._gone(session) from None

    def _gone(self, session: OpenEnvSession) -> FrameError:
        return FrameError(
            ErrorCode.SESSION_ERROR,
            f"env {session.env_id} of this session is gone: terminated, or idle for longer than "
            f"the idle TTL ({self.services.settings.idle_ttl_s:g} s); open a new session",
            fatal=True,
        )

    async def _call(self, work: Awaitable[T]) -> T:
        """Await an `EnvManager` call, its errors turned into frames."""
        try:
            return await work
        except CapacityExceeded as exc:
            raise self.capacity_error(exc) from None
        except (NotFound, WrongInstance):
            raise FrameError(
                ErrorCode.SESSION_ERROR, "the session's env was terminated meanwhile", fatal=True
            ) from None
        except (InvalidConfig, Unprocessable) as exc:
            raise FrameError(ErrorCode.VALIDATION_ERROR, _message(exc)) from None
        except InvalidAction:
            raise  # a step answers it (`StepResult.refusal`)
        except (PluginError, ServiceError) as exc:
            raise FrameError(ErrorCode.EXECUTION_ERROR, _message(exc)) from None

    def _recorder(self, handle: EnvHandle, rl_run_id: str, episode_id: str) -> EpisodeRecorder:
        return EpisodeRecorder(
            env_name=self.env_name,
            client=CLIENT,
            rl_run_id=rl_run_id,
            seed=self.services.envs.seed(handle),
            env_config=self.services.envs.config(handle),
            client_config={"episode_id": episode_id},
        )

    def _submit(self, session: OpenEnvSession, stop_reason: str) -> None:
        """Trace the episode's steps so far (once: the recorder starts over)."""
        recorder = session.recorder
        if recorder is None or session.env_id is None:
            return
        tracer = self.services.tracer
        trace = recorder.trace(session.env_id, stop_reason)
        recorder.decisions = []
        if trace is not None and tracer is not None:
            tracer.submit(trace)


def as_tool_calls(tools: list[dict[str, Any]], actions: list[Any]) -> list[dict[str, Any]]:
    """Plain actions as calls of the env's tool (``tools``: its `Environment.tools`): one call
    with all of them if its tool takes an ``actions`` list (Crafter's ``interact_many``), else a
    call per action (``act``)."""
    if not tools:
        return []
    function = tools[0]["function"]
    if "actions" in function.get("parameters", {}).get("properties", {}):
        return [{"tool": function["name"], "args": {"actions": list(actions)}}]
    return [{"tool": function["name"], "args": {"action": action}} for action in actions]


def tool_result(data: dict[str, Any]) -> dict[str, Any]:
    """An MCP ``tools/call`` result: the observation's text as content, and OpenEnv's ``data``
    (what `MCPToolClient.call_tool` returns): the step's observation frame data. A call the env
    refused is MCP's tool error (``isError``), its message the content the model reads."""
    text = data["observation"].get("text", "")
    refused = "invalid_action" in data["metadata"]["info"]
    return {"content": [{"type": "text", "text": str(text)}], "isError": refused, "data": data}


def _message(exc: BaseException) -> str:
    return exc.message if isinstance(exc, ServiceError) else str(exc)
