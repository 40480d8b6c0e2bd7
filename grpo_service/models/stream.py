"""The token stream of an episode: what the model was sampled on, token for token."""

from __future__ import annotations

from pydantic import BaseModel, Field


class StreamSpan(BaseModel):
    """One completion in a stream: the tokens ``[start, end)`` the model sampled at one turn."""

    start: int = Field(ge=0, description="Index of the span's first token in `token_ids`.")
    end: int = Field(ge=0, description="One past its last token.")
    turn: int = Field(ge=0, description="The decision (rollout turn) that sampled it.")
    weights_version: int | None = Field(default=None, description="The weights that sampled it.")
    weights_version_sent: int | None = Field(
        default=None,
        description="Set only for a completion that crossed a weight push: the version when it was "
        "requested (either may have sampled it; the trainer's fidelity check tells which).",
    )
    finish_reason: str | None = Field(
        default=None,
        description="`stop`, or `length`: cut by max_tokens (the turn's end-of-turn tokens follow it, "
        "unsampled, and the stream goes on).",
    )


class TokenStream(BaseModel):
    """One episode (or one segment of it) as a single sequence: every prompt of the segment starts
    with the previous prompt and completion, so the last prompt + completion holds them all.
    Train on it with one forward pass: loss on the ``sampled`` tokens, ``logprobs`` as the old
    policy, each span's advantage from its turn."""

    token_ids: list[int] = Field(description="The stream: prompts' and completions' tokens, in order.")
    sampled: list[int] = Field(description="1 where the model sampled the token (a completion), else 0.")
    logprobs: list[float] = Field(description="The sampler's logprob of each sampled token; 0 elsewhere.")
    spans: list[StreamSpan] = Field(description="The completions, in order.")
    start_reason: str = Field(
        description="Why this segment starts: `start` (the episode's first prompt), `context_limit` (the "
        "stream outgrew the model's context), `template_differs` "
        "(token_stream 'segment'), `prefix_break` (the prompt did not extend the stream: a per-decision "
        "chat, or a policy without streams)."
    )
    end_reason: str = Field(
        description="Why it ends: the next segment's `start_reason`, else the episode's stop reason "
        "(`done`, `truncated`, `running`...) or the rollout's (`policy_error:<kind>` for an invalid reply "
        "that ended it, `time_limit`, ...)."
    )
