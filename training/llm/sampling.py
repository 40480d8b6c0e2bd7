"""Batched token sampling with a KV cache, reporting each sampled token's logprob.

Rows of different prompt lengths are left-padded and decoded together; each row has its own
random generator (seeded per request and choice index), temperature and top-p. The logprob
reported for a sampled token is read from the raw distribution (``log_softmax(logits)``, before
temperature and top-p), as vLLM does by default, so that it equals what a trainer recomputes
from the same weights with one forward pass over prompt + completion.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class SampleRequest:
    prompt_ids: list[int]
    max_tokens: int
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    top_logprobs: int = 0


@dataclass
class Sample:
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    finish_reason: str  # "stop" (end of turn or a stop string) | "length"
    text: str


@dataclass
class _Row:
    request: SampleRequest
    generator: torch.Generator
    stop_ids: set[int]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish: str | None = None
    text: str | None = None


def _generator(seed: int | None) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
    return generator


def _sample(raw_logprobs: torch.Tensor, row: _Row) -> int:
    req = row.request
    if req.temperature <= 0:
        return int(torch.argmax(raw_logprobs))
    probs = torch.softmax(raw_logprobs / req.temperature, dim=-1)
    if req.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < req.top_p  # always keeps the first
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs, 1, generator=row.generator))


class Sampler:
    """Samples completions for many requests at once from a causal LM (fp32, CPU or GPU)."""

    def __init__(self, model: Any, tokenizer: Any, stop_ids: set[int], pad_id: int) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.stop_ids = stop_ids
        self.pad_id = pad_id

    @property
    def max_positions(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))

    @torch.no_grad()
    def generate(self, requests: Sequence[SampleRequest]) -> list[list[Sample]]:
        rows = [
            _Row(req, _generator(None if req.seed is None else req.seed + i), self.stop_ids)
            for req in requests
            for i in range(req.n)
        ]
        if not rows:
            return []
        device = next(self.model.parameters()).device
        width = max(len(r.request.prompt_ids) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            prompt = row.request.prompt_ids
            ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[i, width - len(prompt) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        ids, mask, positions = ids.to(device), mask.to(device), positions.to(device)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        past, logits = out.past_key_values, out.logits[:, -1]
        last_pos = positions[:, -1]
        for _ in range(max(r.request.max_tokens for r in rows)):
            raw = torch.log_softmax(logits.float(), dim=-1).cpu()
            next_ids = []
            for i, row in enumerate(rows):
                if row.finish is not None:
                    next_ids.append(self.pad_id)
                    continue
                token = _sample(raw[i], row)
                row.tokens.append(token)
                row.logprobs.append(float(raw[i, token]))
                if row.request.top_logprobs:
                    values, indices = torch.topk(raw[i], row.request.top_logprobs)
                    row.top.append(list(zip(indices.tolist(), values.tolist(), strict=True)))
                self._check_finished(row, token)
                next_ids.append(token)
            if all(r.finish is not None for r in rows):
                break
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=mask.dtype, device=device)], dim=1)
            last_pos = last_pos + 1
            out = self.model(
                input_ids=torch.tensor(next_ids, device=device).unsqueeze(1),
                attention_mask=mask,
                position_ids=last_pos.unsqueeze(1),
                past_key_values=past,
                use_cache=True,
            )
            past, logits = out.past_key_values, out.logits[:, -1]
        results: list[list[Sample]] = []
        k = 0
        for req in requests:
            group = []
            for row in rows[k : k + req.n]:
                text = row.text if row.text is not None else self._text(row.tokens)
                group.append(Sample(row.tokens, row.logprobs, row.top, row.finish or "length", text))
            results.append(group)
            k += req.n
        return results

    def _text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def _check_finished(self, row: _Row, token: int) -> None:
        if token in row.stop_ids:
            row.finish = "stop"
            row.text = self._text(row.tokens[:-1])
            return
        if row.request.stop:
            text = self._text(row.tokens)
            hits = [text.find(s) for s in row.request.stop if s in text]
            if hits:  # vLLM: the stop string is cut from the text; its tokens stay in token_ids
                row.finish, row.text = "stop", text[: min(hits)]
                return
        if len(row.tokens) >= row.request.max_tokens:
            row.finish = "length"
