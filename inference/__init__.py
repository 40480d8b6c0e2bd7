"""Inference: the async OpenAI-compatible client and a vLLM-shaped fake server."""

from inference.errors import ERROR_KINDS, InferenceError, InferenceErrorKind, TokenMismatchError
from inference.openai_client import (
    ClientPool,
    InferenceClient,
    choice_tokens,
    compact_response,
    normalize_base_url,
    per_choice_calls,
    resolve_api_key,
    shared_pool,
)

__all__ = [
    "ERROR_KINDS",
    "ClientPool",
    "InferenceClient",
    "InferenceError",
    "InferenceErrorKind",
    "TokenMismatchError",
    "choice_tokens",
    "compact_response",
    "normalize_base_url",
    "per_choice_calls",
    "resolve_api_key",
    "shared_pool",
]
