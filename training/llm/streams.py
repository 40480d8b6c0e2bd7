"""Token streams on the trainer's side: an episode (or segment) as one training sequence.

The task app returns each trajectory's ``streams`` (`grpo_service.models.TokenStream` on the
wire): ``token_ids``, ``sampled`` (1 where the model sampled the token), ``logprobs`` (the
sampler's, 0 where not sampled) and ``spans`` (each completion's ``[start, end)``, ``turn`` and
``weights_version``). `TokenStream.from_json` reads one; `TrainRow` is what a trainer feeds the
model: one forward pass over the whole stream, the loss on the sampled tokens only, each token's
advantage that of the turn that sampled it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Span:
    start: int
    end: int
    turn: int
    weights_version: int | None = None
    finish_reason: str | None = None
    weights_version_sent: int | None = None  # set when it crossed a push: either version may have sampled it

    def versions(self, current: int) -> list[int]:
        """The versions whose weights may have sampled it (``current`` for a span naming none)."""
        v = self.weights_version if self.weights_version is not None else current
        sent = self.weights_version_sent
        return [v] if sent is None or sent == v else sorted({sent, v})


@dataclass(slots=True)
class TokenStream:
    token_ids: list[int]
    sampled: list[int]
    logprobs: list[float]
    spans: list[Span] = field(default_factory=list)
    start_reason: str = "start"
    end_reason: str = ""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TokenStream:
        """A stream as the task app returns it; ValueError when its fields do not line up."""
        ids, sampled, logprobs = list(data["token_ids"]), list(data["sampled"]), list(data["logprobs"])
        if not len(ids) == len(sampled) == len(logprobs):
            raise ValueError(
                f"a token stream's token_ids, sampled and logprobs differ in length "
                f"({len(ids)}, {len(sampled)}, {len(logprobs)})"
            )
        spans = [
            Span(
                int(s["start"]),
                int(s["end"]),
                int(s["turn"]),
                s.get("weights_version"),
                s.get("finish_reason"),
                s.get("weights_version_sent"),
            )
            for s in data.get("spans") or []
        ]
        if any(not 0 <= s.start <= s.end <= len(ids) for s in spans):
            raise ValueError("a token stream's span lies outside its tokens")
        reasons = data.get("start_reason", "start"), data.get("end_reason", "")
        return cls(ids, sampled, logprobs, spans, *reasons)


@dataclass(slots=True)
class TrainRow:
    """One training sequence: ``mask`` 1 on the tokens trained on, ``old_logprobs`` and
    ``advantages`` aligned with ``ids`` (0 where not trained), ``spans`` the completions trained
    on, each with the weights version that sampled it."""

    ids: list[int]
    mask: list[float]
    old_logprobs: list[float]
    advantages: list[float]
    spans: list[Span] = field(default_factory=list)


def stream_row(
    stream: TokenStream, advantage_of: Callable[[int], float | None], keep: Callable[[Span], bool]
) -> tuple[TrainRow | None, int]:
    """The stream as a training row: each span whose turn has an advantage (``advantage_of(turn)``
    not None) and that ``keep`` accepts (e.g. not too stale) is trained on with that advantage;
    ``(None, dropped)`` when no span is. Returns the number of spans ``keep`` refused."""
    n = len(stream.token_ids)
    mask = [0.0] * n
    advantages = [0.0] * n
    dropped = 0
    kept: list[Span] = []
    for span in stream.spans:
        advantage = advantage_of(span.turn)
        if advantage is None:
            continue
        if not keep(span):
            dropped += 1
            continue
        kept.append(span)
        width = span.end - span.start
        mask[span.start : span.end] = [1.0] * width
        advantages[span.start : span.end] = [advantage] * width
    if not any(mask):
        return None, dropped
    old = [lp if m else 0.0 for lp, m in zip(stream.logprobs, mask, strict=True)]
    return TrainRow(list(stream.token_ids), mask, old, advantages, kept), dropped
