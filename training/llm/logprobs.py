"""Per-token logprobs of completions under a model: what the trainer recomputes, and what the
model server reports for the tokens it samples (both read the raw distribution, before
temperature and top-p, as vLLM does by default)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class TokenBatch:
    """Right-padded prompt+completion rows; ``completion_mask`` marks the completion tokens."""

    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    completion_mask: torch.Tensor  # (B, T), float: 1 on completion tokens

    @classmethod
    def build(
        cls, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int
    ) -> TokenBatch:
        width = max(len(p) + len(c) for p, c in zip(prompts, completions, strict=True))
        ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        completion = torch.zeros((len(prompts), width), dtype=torch.float32)
        for row, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            n = len(p) + len(c)
            ids[row, :n] = torch.tensor(list(p) + list(c), dtype=torch.long)
            attention[row, :n] = 1
            completion[row, len(p) : n] = 1.0
        return cls(ids, attention, completion)

    @classmethod
    def from_rows(
        cls, rows: Sequence[Sequence[int]], masks: Sequence[Sequence[float]], pad_id: int
    ) -> TokenBatch:
        """Right-padded whole sequences (token streams); ``masks`` marks the tokens trained on."""
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        trained = torch.zeros((len(rows), width), dtype=torch.float32)
        for row, (r, m) in enumerate(zip(rows, masks, strict=True)):
            ids[row, : len(r)] = torch.tensor(list(r), dtype=torch.long)
            attention[row, : len(r)] = 1
            trained[row, : len(r)] = torch.tensor(list(m), dtype=torch.float32)
        return cls(ids, attention, trained)


def token_logprobs(model: Any, batch: TokenBatch) -> torch.Tensor:
    """``logprobs[b, t]`` = log p(input_ids[b, t] | input_ids[b, :t]) (0 at t = 0), shape (B, T)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logprobs.gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0))


def completion_logprobs(
    model: Any, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int
) -> list[list[float]]:
    """The logprob of each completion token, per row, without gradients."""
    batch = TokenBatch.build(prompts, completions, pad_id)
    with torch.no_grad():
        lp = token_logprobs(model, batch)
    return [
        lp[row, len(p) : len(p) + len(c)].tolist()
        for row, (p, c) in enumerate(zip(prompts, completions, strict=True))
    ]
