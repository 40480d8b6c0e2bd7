"""TRL's ``environment_factory`` for any environment of a running task app.

    from trl import GRPOTrainer
    from grpo_service.client.trl_env import environment_factory

    factory = environment_factory("http://127.0.0.1:8000", "babyai", config={"max_steps": 20})
    trainer = GRPOTrainer(model=..., train_dataset=dataset, environment_factory=factory, ...)

TRL builds one instance per rollout and reads the instance's public methods as the model's tools:
here they are the environment's own tools (``GET /openenv/{env}/metadata``), each a method with
typed arguments and a Google-style docstring made from the tool's JSON schema, so the schema TRL
renders into the prompt is the environment's. ``reset(**row)`` starts an episode seeded from the
dataset row (its ``seed`` column), so the G rollouts of one prompt start from the same state, and
returns the first observation (TRL appends it to the prompt's last message); a tool call plays
one step and returns the observation text; ``get_reward()`` is the episode's return.

Each instance keeps one WebSocket to ``{server}/openenv/{env}/ws`` (OpenEnv's protocol): a tool
call is one frame each way on an open connection, not an HTTP request. The episodes are live envs
of the service like any other (listed, capacity-limited, reaped when idle) and are traced under
``rl_run_id`` (``trl`` by default), so they show in the viewer. `SERVICE_CLOCK` adds up the time
spent waiting on the service, for the service's share of a training step.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import httpx
from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.sync.client import ClientConnection, connect

OPENENV_PREFIX = "/openenv"
EPISODE_OVER = "The episode is over."
_JSON_TYPES: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool}


class TaskAppError(RuntimeError):
    """The task app refused a frame (OpenEnv's ``error`` frame) or could not be reached. TRL hands
    the message to the model as the tool's ``{"error": ...}`` result."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(f"{message} ({code})" if code else message)
        self.code = code


@dataclass
class ServiceClock:
    """Frames sent to the task app and the seconds spent waiting for their answers (all instances)."""

    frames: int = 0
    seconds: float = 0.0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self.frames += 1
            self.seconds += seconds

    def reset(self) -> None:
        with self._lock:
            self.frames, self.seconds = 0, 0.0


SERVICE_CLOCK = ServiceClock()


class TaskAppEnv:
    """One rollout's environment: an OpenEnv session of the task app, driven by TRL.

    Not used directly: `environment_factory` makes a subclass per environment whose tool methods
    are the environment's tools."""

    server_url: ClassVar[str]
    env_name: ClassVar[str]
    config: ClassVar[dict[str, Any]] = {}
    seed_key: ClassVar[str] = "seed"
    rl_run_id: ClassVar[str] = "trl"
    api_key: ClassVar[str | None] = None
    timeout_s: ClassVar[float] = 60.0

    def __init__(self) -> None:
        self._socket: ClientConnection | None = None
        self._configured = False  # the session's env was built with `config`
        self.reward = 0.0
        self.done = False
        self.steps = 0
        self.episode_id: str | None = None
        self.observation: dict[str, Any] = {}  # the last observation, all its fields

    # ---- what TRL calls -----------------------------------------------------------------------

    def reset(self, **row: Any) -> str | None:
        """Start an episode from the dataset row's seed; the first observation's text."""
        seed = row.get(self.seed_key)
        if seed is not None and not isinstance(seed, int):
            raise TaskAppError(f"the row's {self.seed_key!r} must be an integer, not {seed!r:.60}")
        self.episode_id = f"trl-{uuid.uuid4().hex[:12]}"
        data: dict[str, Any] = {"seed": seed, "episode_id": self.episode_id, "rl_run_id": self.rl_run_id}
        if not self._configured:
            data.update(self.config)
        try:
            answer = self._exchange({"type": "reset", "data": data})
        except TaskAppError as exc:
            if exc.code not in (None, "SESSION_ERROR"):
                raise
            self._close()  # the session is gone (server restarted, env reaped): open a new one
            self._configured = False
            answer = self._exchange({"type": "reset", "data": {**data, **self.config}})
        self._configured = True
        self.reward, self.done, self.steps = 0.0, False, 0
        self.observation = answer["observation"]
        return str(self.observation.get("text", ""))

    def get_reward(self) -> float:
        """The episode's return: the sum of its steps' rewards."""
        return self.reward

    def _close(self) -> None:
        """Close the WebSocket; the service traces the episode and removes its env. (Private: TRL
        would offer a public method to the model as a tool.)"""
        socket, self._socket = self._socket, None
        if socket is not None:
            with contextlib.suppress(OSError, WebSocketException):
                socket.send(json.dumps({"type": "close"}))
            socket.close()

    def __del__(self) -> None:
        try:  # noqa: SIM105 (at interpreter exit, contextlib may be gone already)
            self._close()
        except Exception:
            pass

    # ---- the protocol -------------------------------------------------------------------------

    def _call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        if self.done:
            raise TaskAppError(EPISODE_OVER)
        if self._socket is None:
            raise TaskAppError("the episode has not started (reset first)")
        args = {k: v for k, v in arguments.items() if v is not None}
        answer = self._exchange({"type": "step", "data": {"tool_calls": [{"tool": name, "args": args}]}})
        self.steps += 1
        self.reward += float(answer.get("reward") or 0.0)
        self.done = bool(answer.get("done"))
        self.observation = answer["observation"]
        text = str(self.observation.get("text", ""))
        return f"{text}\n\n{EPISODE_OVER}" if self.done else text

    def _connect(self) -> ClientConnection:
        if self._socket is None:
            url = self.server_url.replace("http", "ws", 1) + f"{OPENENV_PREFIX}/{self.env_name}/ws"
            headers = {"X-API-Key": self.api_key} if self.api_key else None
            try:
                # No proxy (the task app is reached directly), no per-frame compression (small
                # frames: latency is what counts), and the connection kept open across calls.
                self._socket = connect(
                    url,
                    additional_headers=headers,
                    open_timeout=self.timeout_s,
                    max_size=2**24,
                    proxy=None,
                    compression=None,
                    legacy=True,
                )
            except (OSError, TimeoutError, WebSocketException) as exc:
                raise TaskAppError(f"cannot open {url}: {exc}") from None
        return self._socket

    def _exchange(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Send one frame and read its one reply (OpenEnv's lockstep); the reply's ``data``."""
        started = time.perf_counter()
        socket = self._connect()
        try:
            socket.send(json.dumps(frame))
            reply = json.loads(socket.recv(timeout=self.timeout_s))
        except TimeoutError:
            self._close()
            raise TaskAppError(f"no answer from the task app within {self.timeout_s:g} s") from None
        except ConnectionClosed as exc:
            self._socket = None
            raise TaskAppError(f"the task app closed the session: {exc}") from None
        finally:
            SERVICE_CLOCK.add(time.perf_counter() - started)
        data = reply.get("data") or {}
        if reply.get("type") == "error":
            raise TaskAppError(str(data.get("message")), data.get("code"))
        return data


# ------------------------------------------------------------------------------- the tools


def _python_type(schema: dict[str, Any]) -> Any:
    """The type hint TRL (transformers' ``get_json_schema``) turns back into ``schema``."""
    if "enum" in schema and all(isinstance(v, str | int | float | bool) for v in schema["enum"]):
        return Literal[tuple(schema["enum"])]
    kind = schema.get("type")
    if kind == "array":
        return list[_python_type(schema.get("items") or {"type": "string"})]
    if kind == "object":
        return dict[str, Any]
    return _JSON_TYPES.get(kind, str)


def tool_method(tool: dict[str, Any]) -> Callable[..., str]:
    """A method that plays the tool ``tool`` (an OpenAI function schema): its name, typed keyword
    arguments and a Google-style docstring, which is what TRL reads to describe it to the model."""
    function = tool.get("function", tool)
    name = function["name"]
    parameters = function.get("parameters") or {}
    required = set(parameters.get("required") or [])
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    args: list[str] = []
    for arg, schema in (parameters.get("properties") or {}).items():
        hint = _python_type(schema)
        default = inspect.Parameter.empty if arg in required else None
        if default is None:
            hint = hint | None
        params.append(
            inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint)
        )
        annotations[arg] = hint
        description = " ".join(str(schema.get("description") or f"The {arg} argument.").split())
        args.append(f"    {arg}: {description}")
    doc = [function.get("description") or f"The {name} tool.", ""]
    doc += ["Args:", *args, ""] if args else []
    doc += ["Returns:", "    The environment's observation after the step."]
    annotations["return"] = str

    def call(self: TaskAppEnv, **arguments: Any) -> str:
        return self._call_tool(name, arguments)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = "\n".join(doc)
    call.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    call.__annotations__ = annotations
    return call


def environment_tools(server_url: str, env_name: str, *, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """The tools (OpenAI function schemas) of ``env_name`` as the task app describes it."""
    url = f"{server_url.rstrip('/')}{OPENENV_PREFIX}/{env_name}/metadata"
    try:
        answer = httpx.get(url, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise TaskAppError(f"cannot reach the task app at {server_url}: {exc}") from None
    if answer.status_code == 404:
        raise TaskAppError(f"the task app at {server_url} has no environment {env_name!r}")
    answer.raise_for_status()
    tools = answer.json().get("tools") or []
    if not tools:
        raise TaskAppError(f"environment {env_name!r} has no tools for a model to call")
    return tools


def environment_factory(
    server_url: str,
    env_name: str,
    *,
    config: dict[str, Any] | None = None,
    seed_key: str = "seed",
    rl_run_id: str = "trl",
    api_key: str | None = None,
    timeout_s: float = 60.0,
) -> type[TaskAppEnv]:
    """A `TaskAppEnv` class for ``env_name`` of the task app at ``server_url``: pass it as TRL's
    ``environment_factory`` (a class is a zero-argument callable).

    ``config`` is the env's config (e.g. ``{"max_steps": 20}``), ``seed_key`` the dataset column
    holding each prompt's seed, ``rl_run_id`` the owner of the env and its traces, ``api_key`` the
    service's environment API key if it has one, ``timeout_s`` the deadline of every answer."""
    server_url = server_url.rstrip("/")
    methods = {
        tool_method(tool).__name__: tool_method(tool) for tool in environment_tools(server_url, env_name)
    }
    clash = sorted(name for name in methods if name in ("reset", "get_reward") or name.startswith("_"))
    if clash:
        raise TaskAppError(f"environment {env_name!r} has tools named like TRL's own methods: {clash}")
    attributes = {
        "server_url": server_url,
        "env_name": env_name,
        "config": dict(config or {}),
        "seed_key": seed_key,
        "rl_run_id": rl_run_id,
        "api_key": api_key,
        "timeout_s": timeout_s,
        "__doc__": f"The task app's {env_name!r} environment at {server_url}, for TRL.",
        **methods,
    }
    class_name = "".join(part.capitalize() for part in env_name.replace("-", "_").split("_")) + "Env"
    return type(class_name, (TaskAppEnv,), attributes)


# ------------------------------------------------------------------ episodes in TRL's shape

Reply = Callable[[list[dict[str, Any]], list[dict[str, Any]]], dict[str, Any]]


def tool_names(env_class: type[TaskAppEnv]) -> list[str]:
    """The methods TRL offers the model as tools (as TRL lists them)."""
    return [
        name
        for name, _ in inspect.getmembers(env_class, predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]


def tool_schemas(env_class: type[TaskAppEnv]) -> list[dict[str, Any]]:
    """The tools as TRL renders them into the prompt (transformers' ``get_json_schema``)."""
    from transformers.utils import get_json_schema

    return [get_json_schema(getattr(env_class, name)) for name in tool_names(env_class)]


DONE = {"role": "assistant", "content": "Done."}


def assistant_tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """An assistant message calling tool ``name``, in the shape TRL parses a reply into."""
    return {
        "role": "assistant",
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
    }


def solver_reply(env: TaskAppEnv, row: dict[str, Any] | None = None, *, tool: str = "act") -> Reply:
    """A text game's scripted solver (the env's ``oracle`` config shows its next action) as the
    assistant: the action as a call of ``tool``, then Done once the episode is over. A teacher for
    `write_demonstrations` (``row`` is the episode's dataset row, unused)."""

    def reply(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        action = env.observation.get("oracle_action")
        if env.done or action is None:
            return DONE
        return assistant_tool_call(tool, {"action": str(action)})

    return reply


@dataclass
class PlayedConversation:
    """One episode as TRL's GRPOTrainer sees it: the conversation, the tools it offered, the
    reward, and how it ended."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    reward: float
    done: bool
    steps: int


def play_episode(
    env: TaskAppEnv, prompt: list[dict[str, Any]], row: dict[str, Any], reply: Reply, max_turns: int
) -> PlayedConversation:
    """One episode in the conversation TRL's GRPOTrainer builds: ``prompt`` with the reset's text
    appended to its last message, then each assistant turn's tool calls answered by ``tool``
    messages, until a turn calls no tool or after ``max_turns`` turns. ``reply(messages, tools)``
    is the policy (a solver for demonstrations, a served model for an evaluation)."""
    messages = [dict(m) for m in prompt]
    messages[-1]["content"] = str(messages[-1].get("content") or "") + (env.reset(**row) or "")
    tools = tool_schemas(type(env))
    names = set(tool_names(type(env)))
    for _ in range(max_turns):
        message = reply(messages, tools)
        messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            break
        for call in calls:
            function = call["function"]
            try:
                arguments = function.get("arguments") or {}
                arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
                if function["name"] not in names:
                    raise ValueError(f"Tool {function['name']} not found.")
                result: Any = getattr(env, function["name"])(**arguments)
            except Exception as exc:  # TRL answers a failed call with its error, and goes on
                result = {"error": str(exc)}
            messages.append({"role": "tool", "name": function["name"], "content": str(result)})
    return PlayedConversation(messages, tools, env.get_reward(), env.done, env.steps)


def write_demonstrations(
    env_class: type[TaskAppEnv],
    prompt: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    path: Path,
    teacher: Callable[[TaskAppEnv, dict[str, Any]], Reply],
    max_turns: int,
) -> list[PlayedConversation]:
    """A teacher's episodes in TRL's conversation shape as chat JSONL (``train --type sft``
    input: warm-start a model so that it calls the env's tools before TRL trains it)."""
    env = env_class()
    try:
        episodes = [play_episode(env, prompt, row, teacher(env, row), max_turns) for row in rows]
    finally:
        env._close()
    with open(path, "w", encoding="utf-8") as f:
        for episode in episodes:
            f.write(json.dumps({"messages": episode.messages, "tools": episode.tools}) + "\n")
    return episodes
