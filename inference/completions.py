"""The pieces of vLLM's chat-completion answer, built in one place for the servers that answer in
its shape (``serve-model`` and the fake)."""

from __future__ import annotations

from typing import Any


def chat_choice(
    index: int,
    content: str | None,
    tool_calls: list[dict[str, Any]],
    finish_reason: str,
    tool_choice: Any = None,
    reasoning: str | None = None,
) -> dict[str, Any]:
    """One ``choices[i]`` without logprobs or token ids (the caller adds those when asked), laid
    out as vLLM 0.32 lays it out for the request's ``tool_choice``:

    - a named or ``"required"`` tool choice: ``content`` is a string (``""`` when empty) and
      ``tool_calls`` is always there; otherwise ``tool_calls`` appears only when a call was parsed;
    - ``finish_reason`` is ``"tool_calls"`` when an ``auto`` choice parsed calls, or a ``required``
      one stopped; a named choice keeps the sampler's reason (OpenAI's rule, which vLLM follows);
    - ``reasoning``, the ``<think>`` text a reasoning parser split off the content, is
      ``message.reasoning`` (vLLM 0.32's name).
    """
    named, required = isinstance(tool_choice, dict), tool_choice == "required"
    message: dict[str, Any] = {"role": "assistant", "content": content, "reasoning": reasoning}
    if named or required:
        message["content"] = content or ""
        message["tool_calls"] = tool_calls
    elif tool_calls:
        message["tool_calls"] = tool_calls
    if (tool_calls and not named and not required) or (required and finish_reason == "stop"):
        finish_reason = "tool_calls"
    return {
        "index": index,
        "message": message,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
    }


def context_error(prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> str | None:
    """vLLM 0.32's refusal (a 400) of a request that does not fit the context, else None.

    vLLM refuses a ``max_tokens`` above the context and a prompt longer than it; a prompt that
    fits with less room than ``max_tokens`` asks is not refused: the completion is cut at the
    context's end (`completion_budget`, ``finish_reason: "length"``).
    """
    if max_tokens is not None and max_tokens > max_model_len:
        return (
            f"max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens."
        )
    if prompt_tokens > max_model_len:
        return (
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
            f"{prompt_tokens} input tokens, which exceeds this limit even without any output tokens. "
            "Please reduce the length of the input prompt."
        )
    return None


def completion_budget(prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> int:
    """The most tokens vLLM samples: ``max_tokens`` (default: no limit) within the context left."""
    room = max_model_len - prompt_tokens
    return room if max_tokens is None else min(max_tokens, room)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """A completion's ``usage`` object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def error_body(message: str, kind: str, code: int) -> dict[str, Any]:
    """OpenAI's error body, as vLLM sends it."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def text_choice(
    index: int,
    text: str,
    finish_reason: str,
    token_ids: list[int],
    logprobs: list[float],
    tokens: list[str],
    *,
    prompt_ids: list[int],
    with_logprobs: bool,
    with_token_ids: bool,
) -> dict[str, Any]:
    """One ``choices[i]`` of vLLM 0.32's ``/v1/completions`` answer: ``text``, and when asked the
    sampled tokens' logprobs (``logprobs.token_logprobs``, one per entry of ``token_ids``) and,
    with ``return_token_ids``, ``prompt_token_ids`` (the ids the prompt was, sent as ids or text)
    and ``token_ids`` (the completion's, its stop token included)."""
    choice: dict[str, Any] = {
        "index": index,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "prompt_logprobs": None,
    }
    if with_logprobs:
        offsets, at = [], 0
        for token in tokens:
            offsets.append(at)
            at += len(token)
        choice["logprobs"] = {
            "text_offset": offsets,
            "token_logprobs": logprobs,
            "tokens": tokens,
            "top_logprobs": [{t: lp} for t, lp in zip(tokens, logprobs, strict=True)],
        }
    if with_token_ids:
        choice["prompt_token_ids"] = prompt_ids
        choice["token_ids"] = token_ids
    return choice


def check_token_prompt(prompt: Any, vocab_size: int) -> list[int] | None:
    """A completions ``prompt`` given as token ids (``[1, 2]`` or ``[[1, 2]]``), checked against the
    vocabulary, or None when it is text; ValueError naming what is wrong (vLLM answers a 400)."""
    if isinstance(prompt, str):
        return None
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list | str):
        return check_token_prompt(prompt[0], vocab_size)
    if not isinstance(prompt, list) or not prompt or not all(type(t) is int for t in prompt):
        raise ValueError("prompt must be a string or a non-empty list of token ids (one prompt)")
    bad = next((t for t in prompt if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(f"Token id {bad} is out of vocabulary (size {vocab_size})")
    return prompt
