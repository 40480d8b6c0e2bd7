"""A deterministic toy tokenizer for the fake inference server.

Text is split into words and single punctuation marks; a token's id is a stable hash
(BLAKE2b, not Python's salted ``hash``) modulo ``VOCAB_SIZE``, so ids are the same in
every process and run. Ids are read back (`decode_tokens`) through the tokens this process has
encoded: the fake answers a token-id prompt from a policy in the same process (tests, the
benchmark); ids it never saw read as ``<unk>``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any

VOCAB_SIZE = 50_000
_TOKEN_RE = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def stable_hash(*parts: Any) -> int:
    """A 64-bit hash of ``parts`` that is identical across processes."""
    data = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def tokenize(text: str) -> list[str]:
    return _TOKEN_RE.findall(text)


@functools.lru_cache(maxsize=1 << 16)  # prompts repeat their words: the fake's main cost
def token_id(token: str) -> int:
    digest = hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest()
    found = int.from_bytes(digest, "big") % VOCAB_SIZE
    _SEEN[found] = token
    return found


_SEEN: dict[int, str] = {}  # at most VOCAB_SIZE entries: id -> the last token encoded to it
UNKNOWN = "<unk>"


def decode_tokens(ids: Iterable[int]) -> list[str]:
    """The tokens of ``ids``, as far as this process has encoded them (else ``<unk>``)."""
    return [_SEEN.get(i, UNKNOWN) for i in ids]


def encode(text: str) -> list[int]:
    return [token_id(t) for t in tokenize(text)]


def chat_parts(messages: Iterable[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[str]:
    """A ChatML-like rendering of a conversation, one string per turn, ending with the
    assistant turn's opening. Every part ends in a newline, so no token spans two parts."""
    parts: list[str] = []
    if tools:
        parts.append("<|im_start|>tools\n" + json.dumps(tools, sort_keys=True) + "<|im_end|>\n")
    for message in messages:
        content = message.get("content")
        if not isinstance(content, str):
            content = json.dumps(content, sort_keys=True) if content is not None else ""
        calls = message.get("tool_calls")
        if calls:
            content += json.dumps(calls, sort_keys=True)
        parts.append(f"<|im_start|>{message.get('role', 'user')}\n{content}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return parts


def render_chat(
    messages: Iterable[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    parts = chat_parts(messages, tools)
    return "".join(parts if add_generation_prompt else parts[:-1])


TOOLS_HEADER = ["<", "|", "im_start", "|", ">", "tools"]
TURN_END = ["<", "|", "im_end", "|", ">"]


def tools_in(tokens: list[str]) -> list[dict[str, Any]]:
    """The tools a rendered prompt's tokens declare (its ``tools`` part read back: the JSON's
    tokens joined without the whitespace tokenizing dropped, so strings lose their spaces)."""
    n = len(TOOLS_HEADER)
    for start in range(len(tokens) - n + 1):
        if tokens[start : start + n] == TOOLS_HEADER:
            body = tokens[start + n :]
            end = next((i for i in range(len(body)) if body[i : i + 5] == TURN_END), len(body))
            try:
                tools = json.loads("".join(body[:end]))
            except (ValueError, RecursionError):
                return []
            return [t for t in tools if isinstance(t, dict)] if isinstance(tools, list) else []
    return []


@functools.lru_cache(maxsize=4096)  # the system prompt, tools and history repeat turn after turn
def _encode_part(part: str) -> tuple[int, ...]:
    return tuple(encode(part))


def encode_chat(messages: Iterable[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
    """``encode(render_chat(messages, tools))``, tokenizing each repeated turn only once."""
    ids: list[int] = []
    for part in chat_parts(messages, tools):
        ids.extend(_encode_part(part))
    return ids
