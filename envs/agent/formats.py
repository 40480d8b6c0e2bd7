"""Prompt formats: how the agent lays out a conversation and reads the model's reply.

Two formats, selected by the agent config's ``prompt_format``:

- ``"tool_calls"``: a system prompt; each past turn is the observation (user), the model's
  tool calls (assistant) and the environment's answer (one ``tool`` message per call); then
  the current observation. The reply must call one of the environment's tools.
- ``"agentgym"``: AgentGym's layout. The task instruction is the first user turn, the
  assistant answers "OK. I'll follow your instructions and try my best to solve the task.",
  then each observation is a user turn and each reply an assistant turn, replayed verbatim.
  The reply names its action on a line ``Action: ...`` (exactly one), which becomes the
  canonical tool call ``{"tool": "act", "args": {"action": "..."}}`` (an environment that also
  offers a tool named ``act`` with an ``action`` string argument gets the same call from both
  formats, so it parses one shape).

Parsing never raises: a reply the environment cannot use is a `ParsedReply` with an error
kind (``no_tool_call``, ``invalid_tool_call``, ``invalid_action``, ``no_action``,
``multiple_actions``) and a detail, and the calls as the model wrote them.

An invalid turn stays in the conversation as the model wrote it, and the model is told what was
wrong (`invalid_reply_feedback`), as AgentGym's client does: the feedback answers the invalid
tool calls (``tool_calls`` format, when the reply had calls) or opens the next user message; the
unchanged observation is not repeated while the invalid turn is in the window.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from envs.errors import InvalidAction
from inference.tool_calls import canonical_tool_call, wire_tool_call

PromptFormatName = Literal["tool_calls", "agentgym"]
AGENTGYM_ACK = "OK. I'll follow your instructions and try my best to solve the task."
TEXT_ACTION_TOOL = "act"
# AgentGym's clients read the action with this pattern (the rest of the line after "Action:").
ACTION_LINE = re.compile(r"Action:\s*(.*?)(?=\n|$)", re.DOTALL)

# The kinds of a reply the environment cannot use (the model's mistakes, not the server's).
REPLY_ERRORS = frozenset(
    {"no_tool_call", "invalid_tool_call", "invalid_action", "no_action", "multiple_actions"}
)
# AgentGym's client answers a reply with several ``Action:`` lines with exactly this.
NO_ACTION_FEEDBACK = (
    "Error: your reply has no 'Action: ...' line. End it with one line 'Action: <your action>'."
)
MULTIPLE_ACTIONS_FEEDBACK = "Error: Only one 'Action' is allowed per response. Please adjust your response."

# An environment's check of one canonical tool call: ``(error kind, detail)``, or None if usable.
CallCheck = Callable[[dict[str, Any]], "tuple[str, str] | None"]


class Turn(BaseModel):
    """One completed decision, as replayed to the model."""

    model_config = ConfigDict(extra="forbid")

    observation: str
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    reply: str | None = None  # the reply text, replayed verbatim by the agentgym format
    result: str = ""  # the environment's answer, replayed as tool messages by the tool_calls format
    error: str | None = None  # an invalid turn's kind; ``result`` is then the feedback the model got
    # The turn's reply messages, rendered once and replayed as they are for the rest of the
    # window (a turn does not change once it is in the history). Shared: never mutate them.
    _rendered: tuple[str, list[dict[str, Any]]] | None = PrivateAttr(default=None)
    # The user message before the reply, as last sent: the same object while its text stays the
    # same, so later prompts replay the window's messages as they were (a trace keeps one copy).
    _user: dict[str, Any] | None = PrivateAttr(default=None)

    def rendered(
        self, format_name: str, render: Callable[[Turn], list[dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        # The private dict directly: pydantic's attribute hooks cost more than the lookup.
        private = self.__pydantic_private__
        cached = private.get("_rendered") if private is not None else None
        if cached is None or cached[0] != format_name:
            cached = self._rendered = (format_name, render(self))
        return cached[1]

    def user_message(self, content: str) -> dict[str, Any]:
        """The user message with ``content`` before this turn's reply (shared: never mutate it)."""
        private = self.__pydantic_private__
        cached = private.get("_user") if private is not None else None
        if cached is None or cached["content"] != content:
            cached = self._user = {"role": "user", "content": content}
        return cached

    def adopt_user_message(self, message: Any) -> None:
        """Keep ``message``, the user message the prompt of this turn ended with, for
        `user_message` to give again when its text is the same."""
        if type(message) is dict and message.get("role") == "user" and type(message.get("content")) is str:
            self._user = message

    @model_validator(mode="before")
    @classmethod
    def _one_call_states(cls, data: Any) -> Any:
        # States saved before multi-call turns stored a single ``tool_call``.
        if isinstance(data, dict) and "tool_call" in data and "tool_calls" not in data:
            data = {**data, "tool_calls": [data["tool_call"]]}
            del data["tool_call"]
        return data


@dataclass(slots=True)
class ParsedReply:
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    detail: str | None = None


def _first_error(problems: list[tuple[str, str]]) -> tuple[str | None, str | None]:
    if not problems:
        return None, None
    kinds = [k for k, _ in problems]
    return ("invalid_action" if "invalid_action" in kinds else kinds[0]), "; ".join(d for _, d in problems)


def invalid_reply_feedback(kind: str, detail: str | None, tools: list[str]) -> str:
    """What the model is told about its invalid reply, in the next prompt."""
    if kind == "multiple_actions":
        return MULTIPLE_ACTIONS_FEEDBACK
    if kind == "no_action":
        return NO_ACTION_FEEDBACK
    if kind == "no_tool_call":
        return f"Error: you called no tool. Reply by calling {' or '.join(tools) or 'a tool'}."
    return f"Error: {(detail or kind)[:500]}. Please adjust your response."


def _user_content(previous: Turn | None, observation: str, answered_by_tools: bool) -> str | None:
    """The text of the user message before a reply: the observation, led by the feedback on an
    invalid previous turn (unless its tool messages carried it); an observation the invalid turn
    already showed is not repeated. None when there is nothing new to say."""
    if previous is None or previous.error is None:
        return observation
    parts = [] if answered_by_tools else [previous.result]
    if observation != previous.observation:
        parts.append(observation)
    return "\n\n".join(parts) if parts else None


@functools.lru_cache(maxsize=256)
def _head(*messages: tuple[str, str]) -> tuple[dict[str, Any], ...]:
    """The conversation's opening messages, ``(role, content)`` each: the same objects for every
    prompt with the same text (shared: never mutate them)."""
    return tuple({"role": role, "content": content} for role, content in messages)


def _conversation(
    head: tuple[dict[str, Any], ...],
    history: Iterable[Turn],
    observation: str,
    reply: Callable[[Turn], list[dict[str, Any]]],
    answered_by_tools: Callable[[Turn], bool],
    format_name: str,
) -> list[dict[str, Any]]:
    messages = list(head)
    previous: Turn | None = None
    for turn in history:
        answered = previous is not None and answered_by_tools(previous)
        content = _user_content(previous, turn.observation, answered)
        if content is not None:
            messages.append(turn.user_message(content))
        messages.extend(turn.rendered(format_name, reply))
        previous = turn
    content = _user_content(previous, observation, previous is not None and answered_by_tools(previous))
    if content is not None:
        messages.append({"role": "user", "content": content})
    return messages


class ToolCallFormat:
    name: ClassVar[PromptFormatName] = "tool_calls"

    @staticmethod
    def _reply(turn: Turn) -> list[dict[str, Any]]:
        if not turn.tool_calls:  # an invalid reply without calls, as written
            return [{"role": "assistant", "content": turn.reply or ""}]
        messages: list[dict[str, Any]] = [
            {
                "role": "assistant",
                "content": turn.reply if turn.error else None,
                "tool_calls": [wire_tool_call(c) for c in turn.tool_calls],
            }
        ]
        last = len(turn.tool_calls) - 1
        for i, call in enumerate(turn.tool_calls):
            content = turn.result if i == last else "Done; the last call's result follows."
            if turn.error and i != last:
                content = "Not executed; see the last call's result."
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
        return messages

    @staticmethod
    def messages(system: str, history: Iterable[Turn], observation: str) -> list[dict[str, Any]]:
        return _conversation(
            _head(("system", system)),
            history,
            observation,
            ToolCallFormat._reply,
            lambda t: bool(t.tool_calls),
            ToolCallFormat.name,
        )

    @staticmethod
    def request_fields(tools: list[dict[str, Any]]) -> dict[str, Any]:
        names = [t["function"]["name"] for t in tools]
        choice: Any = {"type": "function", "function": {"name": names[0]}} if len(names) == 1 else "required"
        return {"tools": tools, "tool_choice": choice, "parallel_tool_calls": False}

    @staticmethod
    def parse(message: dict[str, Any], tool_names: Iterable[str], check: CallCheck) -> ParsedReply:
        raw_calls = message.get("tool_calls") or []
        if not isinstance(raw_calls, list) or not raw_calls:
            return ParsedReply(error="no_tool_call")
        names = list(tool_names)
        calls: list[dict[str, Any]] = []
        problems: list[tuple[str, str]] = []
        for i, raw in enumerate(raw_calls):
            call, problem = canonical_tool_call(raw, i)
            calls.append(call)
            if problem is not None:
                problems.append(("invalid_tool_call", problem))
            elif call["tool"] not in names:
                expected = ", ".join(map(repr, names))
                problems.append(("invalid_tool_call", f"unknown tool {call['tool']!r}; expected {expected}"))
            elif (found := check(call)) is not None:
                problems.append(found)
        error, detail = _first_error(problems)
        return ParsedReply(calls, error, detail)


class AgentGymFormat:
    name: ClassVar[PromptFormatName] = "agentgym"

    @staticmethod
    def messages(instruction: str, history: Iterable[Turn], observation: str) -> list[dict[str, Any]]:
        return _conversation(
            _head(("user", instruction), ("assistant", AGENTGYM_ACK)),
            history,
            observation,
            lambda turn: [{"role": "assistant", "content": turn.reply or ""}],
            lambda turn: False,
            AgentGymFormat.name,
        )

    @staticmethod
    def parse(reply: str, clean: Callable[[str], str], check: CallCheck, call_id: str) -> ParsedReply:
        found = ACTION_LINE.findall(reply)
        if not found:
            return ParsedReply(error="no_action", detail="the reply has no 'Action: ...' line")
        if len(found) > 1:
            return ParsedReply(
                error="multiple_actions",
                detail=f"the reply has {len(found)} 'Action:' lines; exactly one is allowed",
            )
        call = {"id": call_id, "tool": TEXT_ACTION_TOOL, "args": {"action": clean(found[0])}}
        problem = check(call)
        return ParsedReply([call], *(problem if problem else (None, None)))


def text_action_tool(
    description: str, action_description: str = "The action, as one line of text."
) -> dict[str, Any]:
    """The tool schema of the ``act`` tool: the same action space as the ``Action: ...`` text format."""
    return {
        "type": "function",
        "function": {
            "name": TEXT_ACTION_TOOL,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {"action": {"type": "string", "description": action_description}},
                "required": ["action"],
                "additionalProperties": False,
            },
        },
    }


def text_actions(tool_calls: Iterable[Any]) -> list[str]:
    """The action strings of ``act`` calls in any accepted shape (what an environment with a text
    action space executes); ``InvalidAction`` for anything else: no silent noops."""
    actions: list[str] = []
    for i, raw in enumerate(tool_calls):
        call, problem = canonical_tool_call(raw, i)
        if problem is not None:
            raise InvalidAction(problem)
        if call["tool"] != TEXT_ACTION_TOOL:
            raise InvalidAction(f"unknown tool {call['tool']!r}; expected {TEXT_ACTION_TOOL!r}")
        action = call["args"].get("action")
        if not isinstance(action, str) or not action.strip():
            raise InvalidAction(f"tool call {TEXT_ACTION_TOOL!r} needs arguments {{'action': '<text>'}}")
        actions.append(action.strip())
    if not actions:
        raise InvalidAction("no tool calls to execute")
    return actions
