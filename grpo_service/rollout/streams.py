"""An episode's token streams, built from its decisions' calls.

A prompt that starts with the stream so far (the last prompt + its completion) extends it: its new
tokens are appended unsampled, its completion sampled. Any other prompt starts a new segment: a
token-stream policy's restart (its reason recorded by the policy), or a per-decision chat whose
prompt the server re-rendered (``prefix_break``). So a rollout played as streams gives one stream
per episode (or segment), and one played per decision gives one per decision: the trainer reads
both the same way.
"""

from __future__ import annotations

from collections.abc import Iterable

from grpo_service.models import RolloutStep, StreamSpan, TokenStream

PREFIX_BREAK = "prefix_break"


def token_streams(steps: Iterable[RolloutStep], starts: dict[int, str], end_reason: str) -> list[TokenStream]:
    """The streams of an episode's ``steps``; ``starts`` maps a turn to why the policy started a
    segment there; the last stream ends with ``end_reason``. Steps whose call returned no token
    ids or logprobs (a failed call, a server without them) add nothing."""
    streams: list[TokenStream] = []
    current: TokenStream | None = None
    for step in steps:
        llm = step.llm
        if llm is None or not llm.prompt_token_ids or llm.completion_token_ids is None:
            continue
        prompt, completion, logprobs = llm.prompt_token_ids, llm.completion_token_ids, llm.completion_logprobs
        if logprobs is None or len(logprobs) != len(completion):
            continue
        at = len(current.token_ids) if current is not None else 0
        if current is None or step.turn in starts or len(prompt) < at or prompt[:at] != current.token_ids:
            reason = starts.get(step.turn, PREFIX_BREAK if current is not None else "start")
            if current is not None:
                current.end_reason = reason
            current = TokenStream(
                token_ids=[], sampled=[], logprobs=[], spans=[], start_reason=reason, end_reason=""
            )
            streams.append(current)
            at = 0
        fresh = len(prompt) - at
        current.token_ids += prompt[at:]
        current.sampled += [0] * fresh
        current.logprobs += [0.0] * fresh
        start = len(current.token_ids)
        current.token_ids += completion
        current.sampled += [1] * len(completion)
        current.logprobs += logprobs
        current.spans.append(
            StreamSpan(
                start=start,
                end=start + len(completion),
                turn=step.turn,
                weights_version=llm.weights_version,
                weights_version_sent=llm.weights_version_sent,
                finish_reason=llm.finish_reason,
            )
        )
    if current is not None:
        current.end_reason = end_reason
    return streams
