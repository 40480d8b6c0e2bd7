"""Supervised fine-tuning on chat JSONL (``grpo-service export-sft`` output): the loss is taken on
the assistant tokens only (`assistant_mask`), with checkpoints that resume exactly (weights,
optimizer, schedule, data position, RNG), a metrics file and curves.

Each line is ``{"messages": [...], "tools": [...]}``; it is rendered with the checkpoint's own
chat template, so the tokens trained on are the ones the model server will see at inference. A
token stream's line (``export-sft --streams``: ``{"token_ids": [...], "sampled": [...]}``) is
taken as it is: the exact tokens, the loss on the ones the model sampled.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.llm.config import SFTConfig
from training.llm.logprobs import TokenBatch
from training.llm.model import end_of_turn_ids, load
from training.llm.run import RunDir, rng_state, save_weights, set_rng_state


@dataclass
class Example:
    input_ids: list[int]
    assistant_mask: list[int]


def assistant_mask(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> tuple[list[int], list[int]]:
    """The conversation's token ids as the chat template renders it, and the mask of the tokens
    the model writes: for each assistant turn, from the end of the prompt it answered (the turns
    before it rendered with the generation prompt) through its end-of-turn token.

    Rendering prefixes needs no ``{% generation %}`` markers, so it serves any chat template, Qwen3's
    own included: there the last turn carries its ``<think>`` block (empty when the reply had no
    reasoning: what the model emits at inference) and earlier turns none (the template drops past
    reasoning). A template that renders the turns before a reply differently once more follow is
    refused (``ValueError``): its mask would be wrong.
    """
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(encoded["input_ids"]), encoded["offset_mapping"]
    stops = end_of_turn_ids(tokenizer)
    mask = [0] * len(ids)
    for index, message in enumerate(messages):
        if message.get("role") != "assistant" or index == 0:
            continue
        prompt = tokenizer.apply_chat_template(
            messages[:index], tools=tools, tokenize=False, add_generation_prompt=True
        )
        if not text.startswith(prompt):
            raise ValueError(f"the chat template renders the turns before message {index} differently")
        token = next((t for t, (start, _) in enumerate(offsets) if start >= len(prompt)), len(ids))
        while token < len(ids):
            mask[token] = 1
            if ids[token] in stops:
                break
            token += 1
    return ids, mask


def stream_example(row: dict[str, Any], vocab_size: int) -> tuple[list[int], list[int]]:
    """A token stream's ids and its ``sampled`` mask, checked (ValueError when they do not fit)."""
    ids, sampled = row["token_ids"], row["sampled"]
    if not isinstance(ids, list) or not isinstance(sampled, list) or len(ids) != len(sampled):
        raise ValueError("token_ids and sampled must be lists of one length")
    if not all(type(t) is int and 0 <= t < vocab_size for t in ids) or not set(sampled) <= {0, 1}:
        raise ValueError("token ids outside the vocabulary, or a sampled mask that is not 0/1")
    return ids, sampled


def load_examples(path: Path, tokenizer: Any, max_length: int) -> tuple[list[Example], Counter[str]]:
    """Tokenize every line with the chat template; skipped lines are counted by reason."""
    examples: list[Example] = []
    skipped: Counter[str] = Counter()
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if "token_ids" in row:
                    ids, mask = stream_example(row, len(tokenizer))
                else:
                    ids, mask = assistant_mask(tokenizer, row["messages"], row.get("tools") or None)
            except (ValueError, KeyError, TypeError) as exc:
                skipped[f"invalid: {type(exc).__name__}"] += 1
                continue
            if not any(mask):
                skipped["no_assistant_tokens"] += 1
            elif len(ids) > max_length:
                skipped["too_long"] += 1
            else:
                examples.append(Example(ids, mask))
    return examples, skipped


def _batch(examples: list[Example], pad_id: int) -> tuple[TokenBatch, torch.Tensor]:
    """Right-padded rows and the label mask (assistant tokens)."""
    batch = TokenBatch.build([e.input_ids for e in examples], [[] for _ in examples], pad_id)
    labels = torch.zeros_like(batch.completion_mask)
    for row, e in enumerate(examples):
        labels[row, : len(e.assistant_mask)] = torch.tensor(e.assistant_mask, dtype=torch.float32)
    return batch, labels


def sft_loss(model: Any, batch: TokenBatch, label_mask: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Mean negative log-likelihood of the masked tokens, and their count."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logprobs.gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    mask = label_mask[:, 1:]
    count = int(mask.sum())
    return -(picked * mask).sum() / max(count, 1), count


def _schedule(config: SFTConfig, total_steps: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / (config.warmup_steps + 1)
        progress = (step - config.warmup_steps) / max(1, total_steps - config.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))  # cosine to 0

    return factor


def train_sft(config: SFTConfig, ctx: Any = None, *, console: Any = None) -> dict[str, Any]:
    """Train; resume from the run directory's latest checkpoint when there is one. ``ctx`` (a job's
    `TrainContext`) receives progress reports and may ask the run to stop (it saves first)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = console or Console()
    torch.set_num_threads(config.threads)
    if not config.dataset:
        raise ValueError("no dataset: give --dataset or `dataset` in the config")
    run = RunDir(config.out or Path(ctx.models_dir) / ctx.model_name)
    checkpoint = run.latest_checkpoint()
    model, tokenizer = load(checkpoint or config.model)
    model.train()
    examples, skipped = load_examples(Path(config.dataset), tokenizer, config.max_length)
    if not examples:
        raise ValueError(f"{config.dataset}: no usable examples (skipped: {dict(skipped)})")
    steps_per_epoch = math.ceil(len(examples) / config.batch_size)
    total_steps = min(config.max_steps or 10**12, steps_per_epoch * config.epochs)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(config, total_steps))
    step = 0
    if checkpoint is not None:
        state = run.load_state(checkpoint)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        step = state["step"]
        run.truncate_metrics(step)
        console.print(f"resuming from {checkpoint} (step {step} of {total_steps})")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    console.print(
        f"SFT: {len(examples)} examples ({sum(skipped.values())} skipped: {dict(skipped)}), "
        f"{total_steps} steps of {config.batch_size}"
    )

    def save(at: int) -> None:
        state = {
            "step": at,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": rng_state(),
            "config": config.model_dump(),
        }
        run.save_checkpoint(at, model, tokenizer, state, config.keep_checkpoints)

    columns = (TextColumn("SFT"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"))
    started = time.monotonic()
    with Progress(*columns, TimeRemainingColumn(), console=console, transient=False) as progress:
        task = progress.add_task("sft", total=total_steps, completed=step, info="")
        while step < total_steps:
            if ctx is not None and ctx.stop_reason():
                save(step)
                break
            epoch, index = divmod(step, steps_per_epoch)
            order = list(range(len(examples)))
            random.Random(config.seed + epoch).shuffle(order)  # the same order on resume
            chosen = [examples[i] for i in order[index * config.batch_size : (index + 1) * config.batch_size]]
            batch, labels = _batch(chosen, pad_id)
            t0 = time.monotonic()
            loss, count = sft_loss(model, batch, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip))
            optimizer.step()
            scheduler.step()
            step += 1
            tokens = int(batch.attention_mask.sum())
            record = {
                "step": step,
                "epoch": epoch + (index + 1) / steps_per_epoch,
                "loss": round(loss.item(), 6),
                "lr": scheduler.get_last_lr()[0],
                "grad_norm": round(grad_norm, 6),
                "assistant_tokens": count,
                "tokens_per_s": round(tokens / max(1e-9, time.monotonic() - t0), 1),
            }
            run.log(record)
            progress.update(task, advance=1, info=f"loss {record['loss']:.4f}")
            if ctx is not None:
                ctx.report(step, total_steps, {k: v for k, v in record.items() if k != "step"})
            if step % config.save_every == 0 or step == total_steps:
                save(step)
    model.eval()
    save_weights(run.final, model, tokenizer)
    run.plot(["loss", "lr", "grad_norm", "tokens_per_s"], f"SFT {Path(config.dataset).name}")
    metrics = run.metrics()
    return {
        "final": str(run.final),
        "steps": step,
        "examples": len(examples),
        "skipped": dict(skipped),
        "first_loss": metrics[0]["loss"] if metrics else None,
        "last_loss": metrics[-1]["loss"] if metrics else None,
        "wall_s": round(time.monotonic() - started, 3),
        "metrics": str(run.metrics_path),
        "curves": str(run.curves_path),
    }
