"""Reasoning in a chat reply: Qwen3's ``<think>...</think>`` block, and the field a reasoning
parser moves it to.

A model may emit the block or not, and a server may split it off (vLLM with ``--reasoning-parser
qwen3``, ``serve-model``) or leave it in the content: `reply_reasoning` reads every case the same.
"""

from __future__ import annotations

from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# vLLM names the field ``reasoning``; older vLLM and the chat templates say ``reasoning_content``.
REASONING_FIELDS = ("reasoning", "reasoning_content")


def split_reasoning(text: str) -> tuple[str | None, str]:
    """``(reasoning, content)`` of a completion: the text before ``</think>`` (a leading ``<think>``
    dropped) and the text after it. Without ``</think>`` there is no reasoning and the whole text is
    content, as vLLM's ``qwen3`` reasoning parser answers."""
    if THINK_CLOSE not in text:
        return None, text
    reasoning, _, content = text.partition(THINK_CLOSE)
    return reasoning.strip().removeprefix(THINK_OPEN).strip(), content.lstrip("\n")


def reply_reasoning(message: dict[str, Any]) -> tuple[str | None, str | None]:
    """``(reasoning, content)`` of an assistant message, whether the server split the reasoning
    off (into ``reasoning`` or ``reasoning_content``) or left the block in the content."""
    content = message.get("content")
    reasoning = next((message[f] for f in REASONING_FIELDS if isinstance(message.get(f), str)), None)
    if isinstance(content, str):
        found, content = split_reasoning(content)
        if found is not None:
            reasoning = "\n".join(r for r in (reasoning, found) if r)
    return (reasoning or None), content
