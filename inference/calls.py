"""What one chat-completion call leaves behind (`LLMCall`): the types every layer above shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class LLMCall:
    """One chat-completion call, as the trainer needs it.

    Token ids and logprobs are exactly what the server returned (never re-tokenized); they
    are ``None`` when the server does not return them (OpenAI, Groq).
    """

    request: dict[str, Any]
    response: dict[str, Any] | None
    latency_ms: float
    attempts: int = 1
    usage: dict[str, Any] | None = None
    model: str | None = None
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    error: str | None = None
    # The weights version that sampled the reply: the server's when its reply names one, else
    # the one the policy was told (vLLM's replies do not say; a GRPO trainer sets it after each
    # weight update). A trainer drops samples drawn from weights older than it allows.
    weights_version: int | None = None
    # The version told when the call was sent, when it differs from ``weights_version`` (told when
    # it returned): the call crossed a weight push, and either version's weights may have sampled
    # it (a reply finished just before the pause but read after the new version was told).
    weights_version_sent: int | None = None
    # ``prompt_token_ids`` as compact JSON, kept from the reply's check (which encodes them):
    # a trace stores this text instead of encoding thousands of ids per call again.
    prompt_token_ids_json: bytes | None = field(default=None, repr=False, compare=False)
