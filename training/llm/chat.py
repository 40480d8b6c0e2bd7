"""The chat format of models made here: ChatML turns with Hermes-style tool calls.

A tool call is written by the model as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
inside its assistant turn: the format of Qwen2.5/Qwen3 and the one vLLM's ``hermes`` tool-call
parser reads, so a checkpoint trained here is served by vLLM with ``--tool-call-parser hermes``
unchanged. Tool results come back in a user turn wrapped in ``<tool_response>``. The template
marks assistant turns with ``{% generation %}`` so that transformers returns the mask of the
tokens SFT trains on (``return_assistant_tokens_mask``).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END)
FORMAT_TOKENS = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE)

CHAT_TEMPLATE = (
    # transformers renders with trim_blocks: a newline right after a tag is written as {{ NL }}.
    "{% set NL = '\\n' %}"
    "{% set sys = messages[0]['content'] if messages and messages[0]['role'] == 'system' else none %}"
    "{% if sys is not none or tools %}"
    "<|im_start|>system\n{{ sys if sys is not none else '' }}"
    '{% if tools %}{{ NL }}\n# Tools\nCall a tool as <tool_call>{"name": ..., "arguments": {...}}'
    "</tool_call>.\n<tools>{% for tool in tools %}{{ NL }}"
    "{{ (tool.function if tool.function is defined else tool) | tojson }}"
    "{% endfor %}{{ NL }}</tools>{% endif %}<|im_end|>{{ NL }}"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'system' and loop.first %}"
    "{% elif m.role == 'assistant' %}"
    "<|im_start|>assistant\n{% generation %}{{ m.content if m.content else '' }}"
    "{% for tc in (m.tool_calls or []) %}"
    "{% set f = tc.function if tc.function is defined else tc %}"
    '<tool_call>{"name": {{ f.name | tojson }}, "arguments": '
    "{{ f.arguments if f.arguments is string else f.arguments | tojson }}}</tool_call>"
    "{% endfor %}<|im_end|>{% endgeneration %}{{ NL }}"
    "{% elif m.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>{{ NL }}"
    "{% else %}"
    "<|im_start|>{{ m.role }}\n{{ m.content if m.content else '' }}<|im_end|>{{ NL }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

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
        except json.JSONDecodeError:
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
