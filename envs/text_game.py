"""What AgentGym's text environments (TextCraft, BabyAI, SciWorld) share: actions are free text,
one tool carries them, replies in AgentGym's ReAct layout end in ``Action: ...``, and the
state of an episode is a small JSON document.

A text game answers every string (an action it does not know gets the game's own "could not
execute" message, exactly as AgentGym's servers do), so the only `InvalidAction` here is an
action that is not a string at all, or one longer than any real command.
"""

from __future__ import annotations

import abc
import json
import re
import zlib
from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import Field, ValidationError

from envs.agent import TEXT_ACTION_TOOL, text_action_tool, text_actions
from envs.base import ConfigT, Environment, Frame, ObservationFields, PluginConfig, StepResult
from envs.errors import EpisodeOver, InvalidAction, InvalidConfig, InvalidState

MAX_ACTION_CHARS = 512

# The one tool an LLM acts through (the generic agent's ``act``; its AgentGym format yields it too).
TOOL_NAME = TEXT_ACTION_TOOL


def check_text_actions(actions: Sequence[Any]) -> list[str]:
    """Validate a list of text actions (nothing is executed if one is not a string)."""
    if isinstance(actions, (str, bytes)) or not isinstance(actions, Sequence):
        raise InvalidAction(f"actions must be a list of strings, got {type(actions).__name__}")
    if not actions:
        raise InvalidAction("no actions to execute")
    for i, action in enumerate(actions):
        if not isinstance(action, str):
            raise InvalidAction(f"action {i} must be a string, got {type(action).__name__}")
        if len(action) > MAX_ACTION_CHARS:
            raise InvalidAction(f"action {i} is longer than {MAX_ACTION_CHARS} characters")
    return list(actions)


def game_actions(tool_calls: Sequence[dict[str, Any]]) -> list[str | int]:
    """The actions of ``act`` calls (`envs.agent.text_actions`), with an integer ``action`` kept
    as an integer (a primitive action, for the games that have them; the game checks it)."""
    actions: list[str | int] = []
    for call in tool_calls:
        args = call.get("args") if isinstance(call, dict) else None
        primitive = args.get("action") if isinstance(args, dict) else None
        if type(primitive) is int and call.get("tool") == TOOL_NAME:
            actions.append(primitive)
        else:
            actions.extend(text_actions([call]))
    if not actions:
        raise InvalidAction("no tool calls to execute")
    return actions


# ------------------------------------------------------------------ AgentGym's reply parsing

_ACTION_LINE = re.compile(r"Action:\s*(.*?)(?=\n|$)", re.DOTALL)
_NOT_ACTION_CHARS = re.compile(r"[^A-Za-z0-9, ]+")


def parse_action_line(reply: str) -> str | None:
    """TextCraft's and BabyAI's client parsing: the text after the one ``Action:``, reduced to
    letters, digits, commas and single spaces; ``""`` when there is none; ``None`` when the
    reply has more than one ``Action:`` (AgentGym's client then answers an error itself)."""
    matches = _ACTION_LINE.findall(reply)
    if len(matches) > 1:
        return None
    return clean_action(matches[-1] if matches else "")


def clean_action(text: str) -> str:
    """TextCraft's and BabyAI's clients keep letters, digits, commas and single spaces."""
    return " ".join(_NOT_ACTION_CHARS.sub("", text).split())


def parse_react_action(reply: str) -> str:
    """SciWorld's client parsing (AgentGym's ReAct adapter): everything after the last
    ``Action:``, stripped; the whole reply is taken as a thought (no action) when there is none."""
    if reply.endswith("</s>"):
        reply = reply[:-5]
    parts = reply.rsplit("Action:", 1)
    return parts[1].strip() if len(parts) == 2 else ""


# --------------------------------------------------------------------------- JSON states


def encode_state(magic: bytes, body: dict[str, Any]) -> bytes:
    """``magic | zlib(JSON)``: a versioned, pickle-free snapshot payload."""
    return magic + zlib.compress(json.dumps(body, separators=(",", ":"), sort_keys=True).encode())


def decode_state(magic: bytes, data: bytes, what: str) -> dict[str, Any]:
    """The JSON body of `encode_state` output, or `InvalidState` naming what is wrong."""
    if not isinstance(data, bytes) or not data.startswith(magic):
        raise InvalidState(f"invalid {what} snapshot: not a {what} state (format {magic!r})")
    try:
        body = json.loads(zlib.decompress(data[len(magic) :]))
    except (zlib.error, ValueError, UnicodeDecodeError) as exc:
        raise InvalidState(f"invalid {what} snapshot: corrupt payload ({exc})") from None
    if not isinstance(body, dict):
        raise InvalidState(f"invalid {what} snapshot: the body is not an object")
    return body


def field(body: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    """``body[name]`` checked to be of ``kind`` (bools are not ints), else `InvalidState`."""
    value = body.get(name)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise InvalidState(f"invalid {what} snapshot: field {name!r} must be {kind}, got {value!r:.60}")
    return value


# ------------------------------------------------------------------- the shared env skeleton


class TextGameConfig(PluginConfig):
    max_steps: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="End (truncate) the episode after this many actions; none by default.",
    )
    oracle: bool = Field(
        False,
        description="Add `oracle_action` to each observation: the game's scripted solver's next action "
        "(for baselines and tests; never show it to a model you evaluate).",
    )


class TextGameObservation(ObservationFields):
    """An AgentGym text game's observation: the game's text, its task, and its own fields."""

    data_idx: int = Field(description="The task (AgentGym's data_idx; the seed).")
    oracle_action: str | int | None = Field(
        default=None, description="The scripted solver's next action (config `oracle` only)."
    )


class TextGameEnv(Environment[ConfigT]):
    """An AgentGym text game as an `Environment`: the seed is the task index (AgentGym's ``data_idx``).

    Subclasses supply the game: `_start` (build task ``data_idx``, return its first observation
    text), `_act` (one action → observation text, reward, game over) and their state
    (`_game_state` / `_restore_game`). This class keeps the episode's bookkeeping (steps,
    score on the game's own scale, done/truncated, the last observation text) and the
    snapshot envelope, so the three games share one definition of the contract.
    """

    inline_step_max_actions = 0
    state_magic: ClassVar[bytes]
    # What the ``act`` tool's description says an action is in this game.
    action_help: ClassVar[str]

    def __init__(self, config: ConfigT, seed: int | None) -> None:
        self.config = config
        self.seed = check_data_idx(seed, self.num_tasks())
        self._started = False
        self._closed = False
        self._steps = 0
        self._score = 0.0
        self._success = False
        self._over = False
        self._text = ""

    # -- hooks -------------------------------------------------------------------------------

    @abc.abstractmethod
    def _start(self, data_idx: int) -> str: ...

    @abc.abstractmethod
    def _act(self, action: Any) -> tuple[str, float, bool]: ...

    @abc.abstractmethod
    def _game_state(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    def _restore_game(self, state: dict[str, Any]) -> None: ...

    def _fields(self) -> dict[str, Any]:
        """Structured observation fields beside ``text``."""
        return {}

    def _oracle_action(self) -> str | int | None:
        """The scripted solver's next action (asked only when ``config.oracle`` is on)."""
        return None

    def _check_actions(self, actions: Sequence[Any]) -> list[Any]:
        return check_text_actions(actions)

    def _score_after(self, reward: float) -> float:
        """The game's score after a step with ``reward`` (default: the sum of rewards)."""
        return self._score + reward

    def _is_success(self, reward: float, done: bool) -> bool:
        return done and reward > 0

    @classmethod
    def num_tasks(cls) -> int | None:
        """How many tasks the game numbers (``data_idx`` runs from 0 to this minus one)."""
        return None

    # -- the contract ------------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> StepResult:
        self._open()
        if seed is not None:
            self.seed = check_data_idx(seed, self.num_tasks())
        self._text = self._start(self.seed)
        self._started, self._steps, self._score, self._success, self._over = True, 0, 0.0, False, False
        return self._result(0.0, [], [])

    def step(self, actions: Sequence[Any]) -> StepResult:
        self._running()
        todo = self._check_actions(actions)
        done_actions: list[Any] = []
        rewards: list[float] = []
        for action in todo:
            text, reward, game_over = self._act(action)
            self._text, self._steps = text, self._steps + 1
            self._score = self._score_after(reward)
            self._success = self._success or self._is_success(reward, game_over)
            done_actions.append(action)
            rewards.append(reward)
            if game_over:
                self._over = True
            if self.done:
                break
        return self._result(sum(rewards), done_actions, rewards)

    def observe(self) -> StepResult:
        self._started_check()
        return self._result(0.0, [], [])

    def actions_from_tool_calls(self, tool_calls: Sequence[dict[str, Any]]) -> list[str | int]:
        return self._check_actions(game_actions(tool_calls))

    @classmethod
    def tools(cls) -> list[dict[str, Any]]:
        return [text_action_tool(cls.action_help)]

    @property
    def step_idx(self) -> int:
        return self._steps

    def render_frame(self) -> Frame:
        """The viewer's frame: the last observation text (games with a picture add it)."""
        self._started_check()
        return Frame(text=self._text)

    @property
    def truncated(self) -> bool:
        cap = self.config.max_steps  # type: ignore[attr-defined]
        return not self._over and cap is not None and self._steps >= cap

    @property
    def done(self) -> bool:
        return self._started and (self._over or self.truncated)

    @property
    def score(self) -> float:
        return self._score

    @property
    def text(self) -> str:
        """The last observation text, as AgentGym's server returns it."""
        return self._text

    def close(self) -> None:
        self._closed = True

    # -- snapshots ---------------------------------------------------------------------------

    def get_state(self) -> bytes:
        self._started_check()
        return encode_state(
            self.state_magic,
            {
                "env": self.name,
                "version": self.version,
                "config": self.config.model_dump(),
                "seed": self.seed,
                "steps": self._steps,
                "score": self._score,
                "success": self._success,
                "over": self._over,
                "text": self._text,
                "game": self._game_state(),
            },
        )

    @classmethod
    def from_state(cls, data: bytes) -> Environment:
        what = cls.name
        body = decode_state(cls.state_magic, data, what)
        if body.get("env") != cls.name or body.get("version") != cls.version:
            raise InvalidState(
                f"invalid {what} snapshot: made by {body.get('env')!r} version {body.get('version')!r}, "
                f"this server runs {cls.name!r} version {cls.version!r}"
            )
        try:
            config = cls.config_model.model_validate(field(body, "config", dict, what))
        except ValidationError as exc:
            raise InvalidState(f"invalid {what} snapshot: config: {exc.errors()[0]['msg']}") from None
        env = cls(config, field(body, "seed", int, what))  # type: ignore[arg-type]
        steps = field(body, "steps", int, what)
        if steps < 0:
            raise InvalidState(f"invalid {what} snapshot: negative step count")
        env._restore_game(field(body, "game", dict, what))
        env._started = True
        env._steps = steps
        env._score = float(field(body, "score", (int, float), what))
        env._success = field(body, "success", bool, what)
        env._over = field(body, "over", bool, what)
        env._text = field(body, "text", str, what)
        return env

    def state_metadata(self) -> dict[str, Any]:
        return {**super().state_metadata(), "data_idx": self.seed, "step": self._steps}

    # -- helpers -----------------------------------------------------------------------------

    def _open(self) -> None:
        if self._closed:
            raise EpisodeOver("this environment is closed")

    def _started_check(self) -> None:
        self._open()
        if not self._started:
            raise EpisodeOver("no episode in progress: call reset() first")

    def _running(self) -> None:
        self._started_check()
        if self.done:
            why = "the task is over" if self._over else f"it reached max_steps={self.config.max_steps}"  # type: ignore[attr-defined]
            raise EpisodeOver(f"the episode is over ({why}) at step {self._steps}: call reset()")

    def _result(self, reward: float, actions: list[Any], rewards: list[float]) -> StepResult:
        observation = {"text": self._text, "data_idx": self.seed, **self._fields()}
        if self.config.oracle and not self.done:  # type: ignore[attr-defined]
            observation["oracle_action"] = self._oracle_action()
        info = {
            "actions_executed": len(actions),
            "actions": actions,
            "rewards": rewards,
            "score": self._score,
            "success": self._success,
            "data_idx": self.seed,
        }
        return StepResult(
            observation=observation,
            reward=reward,
            done=self.done,
            truncated=self.done and not self._over,
            info=info,
            step_idx=self._steps,
        )


def check_data_idx(seed: Any, count: int | None) -> int:
    """A task index: a non-negative int, below ``count`` when the game numbers its tasks."""
    if seed is None:
        return 0
    if type(seed) is not int or seed < 0 or seed > 2**63 - 1:
        raise InvalidConfig(
            f"the seed is the task index (data_idx) and must be an integer >= 0, got {seed!r:.40}"
        )
    if count is not None and seed >= count:
        raise InvalidConfig(
            f"task index (data_idx) {seed} is out of range: this game has tasks 0..{count - 1}"
        )
    return seed
