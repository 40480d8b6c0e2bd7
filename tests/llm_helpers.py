"""A tiny causal LM made in a temporary directory, and its model server on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

from training.llm.model import ModelSpec, init_model

CORPUS = [
    "You play Crafter. Call interact_many with 1-2 actions.",
    '<tool_call>{"name": "interact_many", "arguments": {"actions": ["move_left", "do"]}}</tool_call>',
    "Step 0/10000, day. Health 9/9, food 9/9, drink 9/9, energy 9/9. Facing down: grass.",
    "Nearby: tree 3 left, water 2 up, stone 4 right, cow 1 down.",
    "Thought: the key is north. Action: go north",
]
TINY = ModelSpec(
    vocab_size=512,
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=32,
    intermediate_size=64,
    max_positions=1024,
)


def make_tiny_model(
    path: Path, texts: list[str] | None = None, seed: int = 0, max_positions: int = TINY.max_positions
) -> Path:
    spec = ModelSpec(**{**TINY.__dict__, "seed": seed, "max_positions": max_positions})
    init_model(path, (texts or []) + CORPUS * 20, spec)
    return path
