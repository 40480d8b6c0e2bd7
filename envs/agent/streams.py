"""Token streams: one episode as the exact tokens the model was sampled on.

In mode ``rl`` an `LLMAgent` that knows its model's tokenizer (config ``tokenizer``) builds turn
t+1's prompt by extending turn t's exact tokens: turn t's prompt ids + the completion ids the
server returned + the tokens of what comes between (the environment's reply and the next
assistant header, rendered as the chat template renders them: `between_text`). It sends that as
token ids to ``/v1/completions`` and parses the reply itself (Hermes ``<tool_call>`` blocks, or
the ``Action:`` line). So every prompt of an episode starts with the previous prompt and
completion, token for token, and one forward pass over the last prompt + completion scores every
sampled token of the episode.

Where the chat template would render the history differently (Qwen3's drops an earlier turn's
reasoning, a re-rendered tool call is not byte-equal to what the model wrote), ``token_stream``
decides:

- ``"exact"`` (default): the stream goes on as sampled; the model is sampled on, and trained on,
  exactly the tokens it produced. The difference is counted (``template_differs``), never fixed
  by re-tokenizing.
- ``"segment"``: a new stream (segment) starts from the template's own rendering of the
  conversation; segments are counted.
- ``"off"``: one chat completion per decision (the server renders each prompt).

A completion cut by ``max_tokens`` (``finish_reason: "length"``) is closed as the template closes
a turn (its end-of-turn tokens follow it, unsampled) and the stream goes on; its span records the
cut. When the extended prompt no longer fits the model's context, the stream ends
(``context_limit``) and a new segment starts from the template's rendering of the conversation
(the history window bounds it). Every segment start is recorded with its reason.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from envs.agent.formats import Turn

StreamMode = Literal["exact", "segment", "off"]
# Why a segment starts: the episode's first prompt; the extended stream would not fit the
# context; the template renders the history differently (mode "segment").
SegmentStart = Literal["start", "context_limit", "template_differs"]


class StreamState(BaseModel):
    """The policy's stream of the episode in play (kept in its state, so forks and snapshots
    continue it)."""

    model_config = ConfigDict(extra="forbid")

    ids: list[int] = Field(default_factory=list, description="The last prompt + its completion.")
    closed: bool = Field(default=True, description="The last completion ended with its stop token.")
    segments: int = Field(default=0, ge=0, description="Segments started in this episode.")
    restart: SegmentStart | None = Field(default=None, description="The next prompt starts a segment.")
    last_turn: Turn | None = Field(default=None, description="The last decision (for the between tokens).")
    template_differs: int = Field(default=0, ge=0, description="Turns the template rendered differently.")


def tail_after_assistant(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages after the last assistant message: the environment's reply and the new
    user message (what separates two completions)."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    return messages[last + 1 :]
