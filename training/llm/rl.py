"""GRPO for an LLM agent against the task app.

Each step asks the task app for ``groups_per_step`` GRPO groups of ``group_size`` rollouts
(``/rollout/group``, mode ``rl``), sampled by the model server that serves the current weights.
A rollout's reward is the sum of its trajectories' rewards; advantages are group-relative
(`training.grpo.group_advantages`; groups whose rewards are all equal carry no signal and are
counted). A rollout played as token streams (``sequences = "stream"``, the default: the policy
extends one stream per episode, `training.llm.streams`) is trained as one sequence per stream:
one forward pass over the whole episode, the loss on the sampled tokens only, the sampler's
logprobs as the old policy, each completion's advantage that of its turn (the rollout's, or with
a fork plan its stretch's). Otherwise (``"decision"``, or a rollout without streams) every
decision becomes one training sequence made of the server's own token ids (prompt + completion,
never re-tokenized) with a mask over the completion. The clipped objective is
`training.grpo.policy_loss` (optionally with a k3 KL to the start model). After the update the
weights are saved and loaded into the running server (vLLM or serve-model, through vLLM's
weight-sync routes: `training.llm.weight_sync`) as the next weights version, which the policies
record in every call; samples drawn from older weights than ``max_staleness`` allows are
dropped and counted.

Before the first update on a batch, the trainer's logprobs are recomputed under the weights that
sampled it: their largest difference from the server's is logged every step
(``logprob_max_abs_diff``), the check that sampler and trainer agree.

`training` never imports `grpo_service`: the task app comes in as any object with
``rollout_group(body) -> dict`` (`TaskApp`); the CLI and the job API wire the service's HTTP client.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import random
import shutil
import statistics
import time
import urllib.parse
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from training.grpo import Branch, group_advantages, policy_loss, tree_advantages
from training.llm.config import RLConfig
from training.llm.logprobs import TokenBatch, token_logprobs
from training.llm.model import load
from training.llm.rl_async import group_source, span_fidelity
from training.llm.run import RunDir, rng_state, save_weights, set_rng_state
from training.llm.streams import Span, TokenStream, TrainRow, stream_row
from training.llm.weight_sync import WeightSync


class TaskApp(Protocol):
    """What the trainer needs of the task app: one GRPO group per call (``POST /rollout/group``)."""

    async def rollout_group(self, body: dict[str, Any]) -> dict[str, Any]: ...


@dataclass
class Sample:
    """One decision to train on: the server's token ids and logprobs and its rollout's advantage."""

    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]
    advantage: float
    group: int
    member: int
    weights_version: int | None
    run_id: str
    turn: int
    weights_version_sent: int | None = None  # a call that crossed a push (`LLMCall`)

    def row(self) -> TrainRow:
        p, c = len(self.prompt_ids), len(self.completion_ids)
        return TrainRow(
            self.prompt_ids + self.completion_ids,
            [0.0] * p + [1.0] * c,
            [0.0] * p + list(self.old_logprobs),
            [self.advantage] * (p + c),
            [Span(p, p + c, self.turn, self.weights_version, weights_version_sent=self.weights_version_sent)],
        )


@dataclass
class StreamSample:
    """One token stream to train on: an episode (or segment) as one sequence; its
    ``weights_version`` is its oldest span's (the one its staleness is counted by), and the
    version of each span it trains on is in ``train.spans``."""

    train: TrainRow
    group: int
    member: int
    weights_version: int | None
    run_id: str
    turn: int  # its first sampled turn

    def row(self) -> TrainRow:
        return self.train


@dataclass
class Batch:
    samples: list[Sample | StreamSample]
    rewards: list[float]
    group_ids: list[int]
    stats: Counter[str]


# ----------------------------------------------------------------------------- the rollouts


def stream_tokenizer(config: RLConfig) -> str | None:
    """The tokenizer the policy renders its token streams with, when the trainer names it: with
    ``sequences = "stream"``, a task app on this machine and a policy config that names none (nor
    ``token_stream: "off"``), the checkpoint trained from (its tokenizer never changes)."""
    policy = config.policy_config
    if config.sequences != "stream" or "tokenizer" in policy or policy.get("token_stream") == "off":
        return None
    if urllib.parse.urlsplit(config.task_app_url).hostname not in ("127.0.0.1", "localhost", "::1"):
        return None
    path = Path(config.model)
    return str(path.resolve()) if (path / "config.json").is_file() else None


def group_request(
    config: RLConfig, seed: int, served_model: str, step: int, index: int, version: int
) -> dict[str, Any]:
    policy_config = {
        **config.policy_config,
        "inference_url": config.model_server_url,
        "model": served_model,
    }
    if (tokenizer := stream_tokenizer(config)) is not None:
        policy_config["tokenizer"] = tokenizer
    return {
        "group_id": f"grpo-s{step}-g{index}-{random.getrandbits(32):08x}",
        "group_size": config.group_size,
        "env": {"env_name": config.env_name, "seed": seed, "config": config.env_config},
        "policy": {"policy_name": config.policy_name, "config": policy_config},
        "max_turns": config.max_turns,
        "on_done": "terminate",
        "mode": "rl",
        "record": {"logprobs": True, "observations": False},
        "safety": {"max_time_s": config.rollout_timeout_s},
        "weights_version": version,  # what the server serves: set by this trainer (vLLM does not say)
        **({"fork": config.fork} if config.advantage == "tree" else {}),
    }


def member_reward(result: dict[str, Any], format_penalty: float = 0.0, max_turns: int = 1) -> float:
    """The rollout's return, minus ``format_penalty`` times the share of ``max_turns`` lost to
    invalid replies: each invalid turn (answered or not), and the turns a rollout that ended in a
    policy error did not play. A rollout with no invalid turn loses nothing, however short."""
    reward = float(sum(t["total_reward"] for t in result["trajectories"]))
    per_step, unplayed = format_losses(result, format_penalty, max_turns)
    return reward - sum(per_step) - unplayed


def format_losses(result: dict[str, Any], format_penalty: float, max_turns: int) -> tuple[list[float], float]:
    """`member_reward`'s format penalty, split: per recorded step (``format_penalty / max_turns``
    for an invalid turn), and for the turns a rollout that ended in a policy error did not play (a
    fork's continuation played its parent's turns before ``fork_turn``)."""
    steps = _steps(result)
    unit = format_penalty / max_turns
    per_step = [unit if s.get("decision_error") else 0.0 for s in steps]
    unplayed = 0.0
    if format_penalty and str(result.get("stop_reason", "")).startswith("policy_error:"):
        unplayed = unit * max(0, max_turns - len(steps) - (result.get("fork_turn") or 0))
    return per_step, unplayed


@dataclass
class Credit:
    """Each decision's advantage, and the rewards logged for the step (one per root rollout)."""

    decisions: list[tuple[float, int, int, str, dict[str, Any]]] = field(default_factory=list)
    """(advantage, group, member, run id, step) per recorded decision."""
    rewards: list[float] = field(default_factory=list)
    group_ids: list[int] = field(default_factory=list)


def _steps(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for t in result["trajectories"] for s in t["steps"]]


def _played(groups: list[dict[str, Any]], stats: Counter[str]) -> list[list[dict[str, Any]]]:
    """Per group, the members that played (the failed ones are counted and left out)."""
    out = []
    for group in groups:
        ok = []
        for member in group["members"]:
            if member["status"] == "failed" or member.get("result") is None:
                stats["members_failed"] += 1
            else:
                ok.append(member)
        out.append(ok)
    return out


def group_credit(groups: list[dict[str, Any]], config: RLConfig, stats: Counter[str]) -> Credit:
    """GRPO: every decision of a rollout gets the rollout's group-relative advantage."""
    credit = Credit()
    rows: list[tuple[int, int, dict[str, Any]]] = []
    for g, members in enumerate(_played(groups, stats)):
        for member in members:
            credit.rewards.append(member_reward(member["result"], config.format_penalty, config.max_turns))
            credit.group_ids.append(g)
            rows.append((len(credit.rewards) - 1, g, member))
    adv = group_advantages(credit.rewards, credit.group_ids, scale_by_std=config.scale_by_std)
    stats["subgroups"] += len(groups)
    stats["groups_all_equal"] += adv.degenerate_groups
    stats["subgroups_all_equal"] += adv.degenerate_groups
    for row, g, member in rows:
        advantage = float(adv.advantages[row])
        for step in _steps(member["result"]):
            credit.decisions.append((advantage, g, row, member["run_id"], step))
    return credit


def tree_credit(groups: list[dict[str, Any]], config: RLConfig, stats: Counter[str]) -> Credit:
    """Per-turn credit from forking groups (`training.grpo.tree_advantages`): a member's turns are
    cut at the turns where it was forked; each stretch is a branch from the state it started in
    (the group's start for a root's first stretch, else the fork's) to the next fork or the end."""
    credit = Credit()
    for g, (group, members) in enumerate(zip(groups, _played(groups, stats), strict=True)):
        forked_at: dict[int, set[int]] = {}
        for fork in (group.get("tree") or {}).get("forks", []):
            forked_at.setdefault(fork["parent_index"], set()).add(fork["turn"])
        branches: list[Branch] = []
        owners: list[tuple[dict[str, Any], list[int]]] = []  # (member, each step's branch)
        for member in members:
            result, index = member["result"], member["group_index"]
            if result.get("parent_index") is None:
                credit.rewards.append(member_reward(result, config.format_penalty, config.max_turns))
                credit.group_ids.append(g)
                start: tuple[Any, ...] = ("start",)
            else:
                stats["continuations"] += 1
                start = ("fork", result["parent_index"], result["fork_turn"])
            cuts = sorted(forked_at.get(index, ()))
            nodes = [start] + [("fork", index, t) for t in cuts]
            steps = _steps(result)
            of_step = [bisect_right(cuts, s["turn"]) for s in steps]  # the stretch each turn is in
            rewards = [0.0] * len(nodes)
            losses, unplayed = format_losses(result, config.format_penalty, config.max_turns)
            for s, j, lost in zip(steps, of_step, losses, strict=True):
                rewards[j] += s["reward"] - lost
            rewards[-1] -= unplayed
            first = len(branches)
            ends = [*nodes[1:], None]
            branches += [Branch(n, r, end) for n, r, end in zip(nodes, rewards, ends, strict=True)]
            owners.append((member, [first + j for j in of_step]))
        if not branches:
            continue
        adv = tree_advantages(branches, scale_by_std=config.scale_by_std)
        stats["subgroups"] += adv.nodes
        stats["subgroups_all_equal"] += adv.degenerate_nodes
        stats["groups_all_equal"] += adv.degenerate_nodes == adv.nodes
        for member, of_step in owners:
            for step, b in zip(_steps(member["result"]), of_step, strict=True):
                credit.decisions.append((adv.advantages[b], g, member["group_index"], member["run_id"], step))
    return credit


def build_batch(
    groups: list[dict[str, Any]], config: RLConfig, version: int, *, keep_zero_advantage: bool = False
) -> Batch:
    """Advantages (`group_credit` or `tree_credit`), then the training sequences: one per token
    stream (``sequences = "stream"``), and one per recorded decision outside any stream. An
    invalid turn's completion is the sampler's as much as a valid one's, so it is trained on with
    its advantage (the format penalty is what makes it worse than a valid turn). A sample with no
    advantage and no KL term carries no gradient and is left out, unless ``keep_zero_advantage``
    (a consumer that counts samples, such as a fixed-count batcher, then sees every episode)."""
    stats: Counter[str] = Counter()
    credit = (tree_credit if config.advantage == "tree" else group_credit)(groups, config, stats)
    stats["groups"] = len(groups)
    samples: list[Sample | StreamSample] = []
    streamed: set[tuple[str, int]] = set()
    drop_zero = config.kl_coef == 0 and not keep_zero_advantage
    if config.sequences == "stream":
        samples += _stream_samples(groups, credit, config, version, stats, streamed, drop_zero)
    for advantage, g, member, run_id, step in credit.decisions:
        llm = step.get("llm")
        if llm is None or (run_id, step["turn"]) in streamed:
            continue
        ids, completion, logprobs = (
            llm.get("prompt_token_ids"),
            llm.get("completion_token_ids"),
            llm.get("completion_logprobs"),
        )
        if not ids or not completion or logprobs is None or len(completion) != len(logprobs):
            stats["decisions_without_tokens"] += 1
            continue
        sampled_by = llm.get("weights_version")
        if sampled_by is not None and version - sampled_by > config.max_staleness:
            stats["stale_samples"] += 1
            continue
        if advantage == 0.0 and drop_zero:  # no gradient at all
            stats["zero_advantage_samples"] += 1
            continue
        turn = step["turn"]
        sent = llm.get("weights_version_sent")  # set when the call crossed a push
        samples.append(
            Sample(ids, completion, logprobs, advantage, g, member, sampled_by, run_id, turn, sent)
        )
    return Batch(samples, credit.rewards, credit.group_ids, stats)


def _stream_samples(
    groups: list[dict[str, Any]],
    credit: Credit,
    config: RLConfig,
    version: int,
    stats: Counter[str],
    streamed: set[tuple[str, int]],
    drop_zero: bool,
) -> list[StreamSample]:
    """One sample per token stream of the played members; the (run id, turn) of every span
    trained this way is added to ``streamed`` (those decisions are not trained again alone)."""
    of_turn = {(run_id, step["turn"]): (adv, g, m) for adv, g, m, run_id, step in credit.decisions}

    def fresh(span: Span) -> bool:
        return span.weights_version is None or version - span.weights_version <= config.max_staleness

    out: list[StreamSample] = []
    for group in groups:
        for member in group["members"]:
            result, run_id = member.get("result"), member.get("run_id")
            if member.get("status") == "failed" or not result:
                continue
            for trajectory in result["trajectories"]:
                for data in trajectory.get("streams") or []:
                    try:
                        stream = TokenStream.from_json(data)
                    except (KeyError, TypeError, ValueError):
                        stats["streams_malformed"] += 1
                        continue
                    turns = [s.turn for s in stream.spans if (run_id, s.turn) in of_turn]
                    streamed.update((run_id, t) for t in turns)
                    if not turns:
                        continue
                    advantages = {t: of_turn[(run_id, t)][0] for t in turns}
                    row, stale = stream_row(stream, advantages.get, fresh)
                    stats["stale_samples"] += stale
                    if row is None:
                        continue
                    if drop_zero and not any(row.advantages):
                        stats["zero_advantage_samples"] += 1
                        continue
                    _, g, m = of_turn[(run_id, turns[0])]
                    versions = [s.weights_version for s in stream.spans if s.weights_version is not None]
                    out.append(StreamSample(row, g, m, min(versions, default=None), run_id, turns[0]))
                    stats["streams"] += 1
    return out


# ------------------------------------------------------------------------------- the update


@dataclass
class _Chunk:
    tokens: TokenBatch
    old: torch.Tensor  # (B, T) the sampler's logprobs where trained, else 0
    advantages: torch.Tensor  # (B, T)
    rows: int


def _micro_batches(samples: list[Sample | StreamSample], size: int, pad_id: int) -> list[_Chunk]:
    out = []
    for i in range(0, len(samples), size):
        rows = [s.row() for s in samples[i : i + size]]
        tokens = TokenBatch.from_rows([r.ids for r in rows], [r.mask for r in rows], pad_id)
        old = torch.zeros_like(tokens.completion_mask)
        advantages = torch.zeros_like(tokens.completion_mask)
        for b, r in enumerate(rows):
            old[b, : len(r.ids)] = torch.tensor(r.old_logprobs, dtype=torch.float32)
            advantages[b, : len(r.ids)] = torch.tensor(r.advantages, dtype=torch.float32)
        out.append(_Chunk(tokens, old, advantages, len(rows)))
    return out


def update(
    model: Any,
    ref_model: Any | None,
    optimizer: torch.optim.Optimizer,
    samples: list[Sample | StreamSample],
    config: RLConfig,
    pad_id: int,
) -> dict[str, float]:
    """``updates_per_step`` optimizer steps on the batch; the metrics of the last, and the
    fidelity of the first forward pass (before any step: the weights that sampled the batch)."""
    batches = _micro_batches(samples, config.micro_batch, pad_id)
    total_tokens = sum(float(c.tokens.completion_mask.sum()) for c in batches)
    ref_lp: list[torch.Tensor | None] = []
    for chunk in batches:
        if ref_model is not None:
            with torch.no_grad():
                ref_lp.append(token_logprobs(ref_model, chunk.tokens))
        else:
            ref_lp.append(None)
    fidelity: list[float] = []
    metrics: dict[str, float] = {}
    for epoch in range(config.updates_per_step):
        optimizer.zero_grad(set_to_none=True)
        sums: Counter[str] = Counter()
        for chunk, ref in zip(batches, ref_lp, strict=True):
            new = token_logprobs(model, chunk.tokens)
            old = chunk.old
            mask = chunk.tokens.completion_mask
            if epoch == 0:
                diff = ((new.detach() - old).abs() * mask).max()
                fidelity.append(float(diff))
            result = policy_loss(
                new,
                old,
                chunk.advantages,
                mask,
                clip_eps=config.clip_eps,
                clip_eps_high=config.clip_eps_high,
                ref_logprobs=ref,
                kl_coef=config.kl_coef,
                aggregation=config.aggregation,
            )
            share = (
                float(mask.sum()) / total_tokens
                if config.aggregation == "token"
                else chunk.rows / len(samples)
            )
            (result.loss * share).backward()
            for key, value in result.metrics().items():
                sums[key] += value * share
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip))
        optimizer.step()
        metrics = {k: round(v, 6) for k, v in sums.items()}
        metrics["grad_norm"] = round(grad_norm, 6)
    metrics["logprob_max_abs_diff"] = max(fidelity) if fidelity else 0.0
    metrics["trained_tokens"] = int(total_tokens)
    # What one pass over the batch feeds the model (prompts included): per-decision sequences
    # repeat each turn's history, streams hold it once.
    metrics["forward_tokens"] = int(sum(int(c.tokens.attention_mask.sum()) for c in batches))
    metrics["sequences"] = len(samples)
    return metrics


# --------------------------------------------------------------------------------- the loop


def _seed(config: RLConfig, step: int, index: int) -> int:
    k = step * config.groups_per_step + index
    return config.seeds[k % len(config.seeds)] if config.seeds else config.seed_base + k


MAX_FAILED_STEPS = 3
"""Consecutive steps in which every group request failed before the run gives up (saving first)."""


async def collect(
    task_app: TaskApp, config: RLConfig, step: int, served: str, version: int
) -> tuple[list[dict[str, Any]], list[str]]:
    """The step's groups, and the errors of the group requests that failed (they are skipped)."""
    bodies = [
        group_request(config, _seed(config, step, i), served, step, i, version)
        for i in range(config.groups_per_step)
    ]
    answers = await asyncio.gather(*(task_app.rollout_group(b) for b in bodies), return_exceptions=True)
    groups = [a for a in answers if not isinstance(a, BaseException)]
    errors = [f"{type(a).__name__}: {a}"[:300] for a in answers if isinstance(a, BaseException)]
    return groups, errors


def train_rl(config: RLConfig, ctx: Any = None, *, task_app: TaskApp, console: Any = None) -> dict[str, Any]:
    """Run ``config.steps`` GRPO steps (resuming from the run's latest checkpoint)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or Console()
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    random.seed(config.seed)
    run = RunDir(config.out or Path(ctx.models_dir) / ctx.model_name)
    server = WeightSync(config.model_server_url)
    checkpoint = run.latest_checkpoint()
    model, tokenizer = load(checkpoint or config.model)
    model.train()
    ref_model = load(config.model)[0] if config.kl_coef > 0 else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    step = 0
    # The server must serve the weights we train: push them once at the start (or on resume).
    weights_dir = run.out / "weights"
    start_weights = (
        save_weights(weights_dir / "step-0", model, tokenizer) if checkpoint is None else checkpoint
    )
    if checkpoint is not None:
        state = run.load_state(checkpoint)
        optimizer.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"])
        step = state["step"]
        run.truncate_metrics(step)
        console.print(f"resuming from {checkpoint} (step {step} of {config.steps})")
    # Versions count the weights pushed: the start weights are version `step` (0, or the step
    # resumed from), and each update adds one, so versions only grow, across resumes too.
    version = step
    server.load(start_weights, version)
    served = server.served()["id"]
    source = group_source(  # each step's own requests, or the task app's stream (rl_async)
        config,
        task_app,
        version,
        step,
        collect_step=lambda at, v: collect(task_app, config, at, served, v),
        template=lambda k: group_request(config, _seed(config, 0, k), served, 0, k, version),
    )
    first_version = version
    totals: Counter[str] = Counter()
    failed_steps, stop_error, saved = 0, None, step
    logged = run.metrics()
    turns_total = int(logged[-1].get("turns_sampled_total", 0)) if step and logged else 0

    def save(at: int) -> None:
        state = {
            "step": at,
            "optimizer": optimizer.state_dict(),
            "rng": rng_state(),
            "config": config.model_dump(),
        }
        run.save_checkpoint(at, model, tokenizer, state, config.keep_checkpoints)

    columns = (TextColumn("GRPO"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"))
    with contextlib.closing(source), Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("rl", total=config.steps, completed=step, info="")
        while step < config.steps:
            if ctx is not None and ctx.stop_reason():
                break
            t0 = time.monotonic()
            groups, errors, source_stats = source.collect(step, version)
            rollout_s = time.monotonic() - t0
            for error in errors:
                console.print(f"[yellow]group request failed[/]: {error}")
            failed_steps = failed_steps + 1 if not groups else 0
            if failed_steps >= MAX_FAILED_STEPS:
                stop_error = (
                    f"every group request failed in {failed_steps} steps in a row; last: {errors[-1]}"
                )
                break
            batch = build_batch(groups, config, version)
            batch.stats["group_requests_failed"] += len(errors)
            totals.update(batch.stats)
            rewards = batch.rewards
            record: dict[str, Any] = {
                "step": step + 1,
                "reward_mean": round(statistics.fmean(rewards), 6) if rewards else None,
                "reward_std": round(statistics.pstdev(rewards), 6) if rewards else None,
                "success_rate": (
                    round(sum(r >= config.success_reward for r in rewards) / len(rewards), 6)
                    if rewards
                    else None
                ),
                "samples": len(batch.samples),
                "rollout_s": round(rollout_s, 3),
                "weights_version": version,
                **{k: batch.stats.get(k, 0) for k in ("groups", "groups_all_equal", "members_failed")},
                **{k: batch.stats.get(k, 0) for k in ("subgroups", "subgroups_all_equal", "continuations")},
                **{k: batch.stats.get(k, 0) for k in ("stale_samples", "decisions_without_tokens")},
                "streams": batch.stats.get("streams", 0),
                "group_requests_failed": len(errors),
                **source_stats,
            }
            completions = [ids for g in groups for ids in _completions(g)]
            turns_total += sum(_turns(g) for g in groups)
            record["turns_sampled"] = sum(_turns(g) for g in groups)
            record["turns_sampled_total"] = turns_total
            record["completion_tokens"] = sum(len(ids) for ids in completions)
            record["rollout_tokens_per_s"] = round(record["completion_tokens"] / max(rollout_s, 1e-9), 2)
            if batch.samples:
                t1 = time.monotonic()
                if config.mode == "async":  # each span under the weights that sampled it
                    fidelity, checked = span_fidelity(batch.samples, version, model, weights_dir, pad_id)
                    record.update(checked)
                metrics = update(model, ref_model, optimizer, batch.samples, config, pad_id)
                if config.mode == "async":
                    metrics["logprob_gap_to_current"] = metrics["logprob_max_abs_diff"]
                    metrics["logprob_max_abs_diff"] = fidelity
                train_s = time.monotonic() - t1
                if metrics["logprob_max_abs_diff"] > config.fidelity_tolerance:
                    console.print(
                        f"[yellow]warning[/]: server and trainer logprobs differ by up to "
                        f"{metrics['logprob_max_abs_diff']:.2e} (tolerance {config.fidelity_tolerance:g}); "
                        "with tools, vLLM grammar-masks the calls it samples and reports the masked "
                        "logprobs: use a text action format (docs/training.md)"
                    )
                path = save_weights(weights_dir / f"step-{step + 1}", model, tokenizer)
                version += 1
                pushed = server.load(path, version, before_resume=functools.partial(source.pushed, version))
                record["weight_sync_s"] = round(pushed, 3)
                kept = source.keep_weights
                for old in sorted(weights_dir.glob("step-*"), key=lambda p: int(p.name[5:]))[:-kept]:
                    shutil.rmtree(old, ignore_errors=True)
                record.update(metrics)
                record["train_s"] = round(train_s, 3)
                record["train_tokens_per_s"] = round(metrics["trained_tokens"] / max(train_s, 1e-9), 1)
            else:
                record["skipped"] = "no samples with a nonzero advantage"
            step += 1
            record["weights_version_after"] = version
            run.log(record)
            if ctx is not None:
                ctx.report(step, config.steps, {k: v for k, v in record.items() if _is_number(v)})
            info = (
                f"reward {record['reward_mean']}  all-equal {record['groups_all_equal']}/{record['groups']}"
            )
            progress.update(task, advance=1, info=info)
            if step % config.save_every == 0 or step == config.steps:
                save(step)
                saved = step
            if config.turn_budget is not None and turns_total >= config.turn_budget:
                console.print(f"turn budget reached: {turns_total} decisions sampled in {step} steps")
                break
    if step > saved:  # stopped early: keep what was trained, resumable
        save(step)
    model.eval()
    save_weights(run.final, model, tokenizer)
    keys = ["reward_mean", "success_rate", "groups_all_equal", "kl_ref", "clip_fraction", "approx_kl"]
    keys.append("logprob_max_abs_diff")
    run.plot([*keys, "rollout_tokens_per_s", "train_tokens_per_s"], f"GRPO {config.env_name}")
    metrics = run.metrics()
    return {
        "final": str(run.final),
        "steps": step,
        "weights_version_first": first_version,
        "weights_version_last": version,
        "reward_first": metrics[0]["reward_mean"] if metrics else None,
        "reward_last": metrics[-1]["reward_mean"] if metrics else None,
        "totals": dict(totals),
        "turns_sampled": turns_total,
        "error": stop_error,
        "metrics": str(run.metrics_path),
        "curves": str(run.curves_path),
    }


def _completions(group: dict[str, Any]) -> list[list[int]]:
    out = []
    for member in group["members"]:
        for trajectory in (member.get("result") or {}).get("trajectories", []):
            for step in trajectory["steps"]:
                ids = (step.get("llm") or {}).get("completion_token_ids")
                if ids:
                    out.append(ids)
    return out


def _turns(group: dict[str, Any]) -> int:
    """Decisions the group sampled (a continuation's own turns only: its prefix was copied)."""
    return sum(
        len(t["steps"]) for m in group["members"] for t in (m.get("result") or {}).get("trajectories", [])
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
