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
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from envs.errors import InvalidAction
from inference.tool_calls import canonical_tool_call, wire_tool_call

PromptFormatName = Literal["tool_calls", "agentgym"]
AGENTGYM_ACK = "OK. I'll follow your instructions and try my best to solve the task."
TEXT_ACTION_TOOL = "act"
# AgentGym's clients read the action with this pattern (the rest of the line after "Action:").
ACTION_LINE = re.compile(r"Action:\s*(.*?)(?=\n|$)", re.DOTALL)

# An environment's check of one canonical tool call: ``(error kind, detail)``, or None if usable.
CallCheck = Callable[[dict[str, Any]], "tuple[str, str] | None"]


class Turn(BaseModel):
    """One completed decision, as replayed to the model."""

    model_config = ConfigDict(extra="forbid")

    observation: str
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    reply: str | None = None  # the reply text, replayed verbatim by the agentgym format
    result: str = ""  # the environment's answer, replayed as tool messages by the tool_calls format

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


class ToolCallFormat:
    name: ClassVar[PromptFormatName] = "tool_calls"

    @staticmethod
    def messages(system: str, history: Iterable[Turn], observation: str) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        for turn in history:
            messages.append({"role": "user", "content": turn.observation})
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [wire_tool_call(c) for c in turn.tool_calls],
                }
            )
            last = len(turn.tool_calls) - 1
            for i, call in enumerate(turn.tool_calls):
                content = turn.result if i == last else "Done; the last call's result follows."
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
        messages.append({"role": "user", "content": observation})
        return messages

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
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": instruction},
            {"role": "assistant", "content": AGENTGYM_ACK},
        ]
        for turn in history:
            messages.append({"role": "user", "content": turn.observation})
            messages.append({"role": "assistant", "content": turn.reply or ""})
        messages.append({"role": "user", "content": observation})
        return messages

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
