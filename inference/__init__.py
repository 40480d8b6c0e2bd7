"""Inference: the async OpenAI-compatible client, the LLM call types and the tool-call parser.

The lowest layer: it imports none of the project's other packages.
"""

from inference.calls import LLMCall
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
from inference.tool_calls import canonical_tool_call, wire_tool_call

__all__ = [
    "ERROR_KINDS",
    "ClientPool",
    "InferenceClient",
    "InferenceError",
    "InferenceErrorKind",
    "LLMCall",
    "TokenMismatchError",
    "canonical_tool_call",
    "choice_tokens",
    "compact_response",
    "normalize_base_url",
    "per_choice_calls",
    "resolve_api_key",
    "shared_pool",
    "wire_tool_call",
]
