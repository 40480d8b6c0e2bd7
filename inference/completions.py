"""The pieces of vLLM's chat-completion answer, built in one place for the servers that answer in
its shape (``serve-model`` and the fake)."""

from __future__ import annotations

from typing import Any


def chat_choice(
    index: int,
    content: str | None,
    tool_calls: list[dict[str, Any]],
    finish_reason: str,
    reasoning: str | None = None,
) -> dict[str, Any]:
    """One ``choices[i]`` without logprobs or token ids (the caller adds those when asked);
    ``reasoning`` is the ``<think>`` text a reasoning parser split off the content."""
    return {
        "index": index,
        "message": {
            "role": "assistant",
            "content": content,
            "tool_calls": tool_calls,
            "reasoning_content": reasoning,
        },
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
    }


def error_body(message: str, kind: str, code: int) -> dict[str, Any]:
    """OpenAI's error body, as vLLM sends it."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
