"""Tool calls: the one parser from the shapes callers and models use to the canonical one.

The service's canonical tool call is ``{"id": str, "tool": str, "args": dict}``. Accepted
input shapes: the canonical one, its aliases ``tool_name``/``name`` and ``arguments``
(an object or a JSON string), and the OpenAI wire shape ``{"id", "type": "function",
"function": {"name", "arguments"}}`` that models emit.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from inference.nesting import MAX_JSON_DEPTH, too_deep

# Hermes tool calls, as Qwen3 writes them and vLLM's ``hermes`` parser reads them.
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


def canonical_tool_call(raw: Any, index: int = 0) -> tuple[dict[str, Any], str | None]:
    """``raw`` in the canonical shape, and what is wrong with it (``None`` if nothing).

    The call is returned even when malformed (arguments that are not a JSON object are kept
    under ``args["raw"]``), so a trace shows what the model said.
    """
    if not isinstance(raw, dict):
        return {"id": f"call_{index}", "tool": None, "args": {"raw": raw}}, (
            f"a tool call must be an object, got {type(raw).__name__}"
        )
    function = raw.get("function") if isinstance(raw.get("function"), dict) else {}
    name = raw.get("tool", raw.get("tool_name", raw.get("name", function.get("name"))))
    args = raw.get("args", raw.get("arguments", function.get("arguments")))
    problem = None
    if args is None:
        args = {}
    elif isinstance(args, str):
        try:
            parsed = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            args, problem = {"raw": args}, f"the tool call's arguments are not valid JSON ({exc.msg})"
        except RecursionError:
            args, problem = {"raw": args}, "the tool call's arguments nest too deep"
        else:
            # Deeper values would fail later, when a response or trace is serialized (a 500).
            if too_deep(parsed):
                args, problem = (
                    {"raw": args},
                    f"the tool call's arguments nest more than {MAX_JSON_DEPTH} levels",
                )
            else:
                args = parsed
    if not isinstance(args, dict):
        args, problem = {"raw": args}, "the tool call's arguments are not a JSON object"
    call_id = raw.get("id")
    return {
        "id": call_id if isinstance(call_id, str) and call_id else f"call_{index}",
        "tool": name,
        "args": args,
    }, problem


def wire_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """A canonical call in the OpenAI wire shape (to replay it in an assistant message)."""
    return {
        "id": call["id"],
        "type": "function",
        "function": {"name": call["tool"], "arguments": json.dumps(call["args"])},
    }


_TOOL_CALL = re.compile(re.escape(TOOL_CALL_OPEN) + r"\s*(.*?)\s*" + re.escape(TOOL_CALL_CLOSE), re.S)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split a completion into its content and OpenAI-shaped tool calls (as vLLM's hermes parser).

    A ``<tool_call>`` block whose body is not a JSON object with a string ``name`` stays in the
    content, so the caller sees what the model wrote (and records ``no_tool_call``).
    """
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for match in _TOOL_CALL.finditer(text):
        try:
            body = json.loads(match.group(1))
        except (json.JSONDecodeError, RecursionError):
            continue
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            continue
        arguments = body.get("arguments", {})
        calls.append(
            {
                "id": f"chatcmpl-tool-{uuid.uuid4().hex[:16]}",
                "type": "function",
                "function": {
                    "name": body["name"],
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
        kept.append(text[last : match.start()])
        last = match.end()
    kept.append(text[last:])
    content = "".join(kept).strip() if calls else text
    return (content or None), calls
