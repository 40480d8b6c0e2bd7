"""GRPO's math, shared by every trainer in this package (gymnasium policies and LLMs).

GRPO (Shao et al., 2024, DeepSeekMath) needs no critic: G rollouts start from the same state,
each gets one scalar reward, and a rollout's advantage is its reward relative to its group,
``(R - mean) / std``. Every action (or token) of a rollout shares that advantage in a clipped
importance-ratio objective (PPO's), optionally with a KL penalty to a frozen reference policy.

Per-turn credit (`tree_advantages`): when the rollouts of a group fork mid-episode (several
continuations played from an exact copy of one state), each fork state gets a Monte-Carlo value,
the mean return of the samples played from it, and each stretch of turns between two forks gets
its own advantage, ``reward of the stretch + V(state it reached) - V(state it left)``, relative to
its siblings (the group's roots are siblings of the start state, as in GRPO).

Shapes: ``logprobs`` is anything per action/token (``[N]`` actions or ``[B, T]`` tokens) with a
``mask`` of the same shape (1 = counts, 0 = padding or prompt); ``advantages`` is the same shape,
or one value per row (``[B]``), broadcast over the row.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

Aggregation = Literal["token", "sequence"]


@dataclass(frozen=True)
class GroupAdvantages:
    advantages: torch.Tensor
    """Same shape as the rewards: ``(R - mean) / std`` within each group, 0 in a degenerate group."""
    groups: int
    degenerate_groups: int
    """Groups whose rewards were all equal (or that had one member): no signal, advantage 0."""


def group_advantages(
    rewards: torch.Tensor | list[float],
    group_ids: torch.Tensor | list[int] | None = None,
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> GroupAdvantages:
    """Group-relative advantages.

    ``rewards`` is ``[groups, G]`` (equal groups), or 1-D with ``group_ids`` naming each reward's
    group (ragged groups, e.g. when some rollouts of a group failed). The std is the sample std
    (Bessel-corrected, as in DeepSeekMath and TRL). A group whose std is below ``eps`` (all
    rewards equal) or that has a single member is degenerate: its advantages are exactly 0 and it
    is counted. ``scale_by_std=False`` keeps ``R - mean`` (Dr. GRPO's unbiased variant).
    """
    r = torch.as_tensor(rewards, dtype=torch.float32)
    if group_ids is None:
        if r.dim() != 2:
            raise ValueError(f"rewards must be [groups, G] without group_ids, got shape {tuple(r.shape)}")
        shape = r.shape
        ids = torch.arange(shape[0]).repeat_interleave(shape[1])
        r = r.reshape(-1)
    else:
        if r.dim() != 1:
            raise ValueError(f"rewards must be 1-D with group_ids, got shape {tuple(r.shape)}")
        shape = r.shape
        ids = torch.as_tensor(group_ids)
        if ids.shape != r.shape:
            raise ValueError(f"group_ids shape {tuple(ids.shape)} != rewards shape {tuple(r.shape)}")
    if r.numel() == 0:
        return GroupAdvantages(torch.zeros(shape), 0, 0)
    if not torch.isfinite(r).all():
        raise ValueError("rewards must be finite")
    _, index = torch.unique(ids, return_inverse=True)
    n_groups = int(index.max()) + 1
    counts = torch.bincount(index, minlength=n_groups).to(r.dtype)
    mean = torch.zeros(n_groups).index_add_(0, index, r) / counts
    centered = r - mean[index]
    sq = torch.zeros(n_groups).index_add_(0, index, centered * centered)
    std = torch.sqrt(sq / (counts - 1).clamp(min=1))
    degenerate = (counts < 2) | (std < eps)
    adv = centered / std[index].clamp(min=eps) if scale_by_std else centered
    adv = torch.where(degenerate[index], torch.zeros_like(adv), adv)
    return GroupAdvantages(adv.reshape(shape), n_groups, int(degenerate.sum()))


@dataclass(frozen=True)
class Branch:
    """One sample of a tree: turns played from the state ``node`` until the next fork on the
    same path (``next``, a node of its own) or the end of the episode (``next=None``)."""

    node: Hashable
    reward: float
    """The rewards of this branch's own turns, summed."""
    next: Hashable | None = None


@dataclass(frozen=True)
class TreeAdvantages:
    advantages: list[float]
    """Per branch, in input order: ``(Q - V(node)) / std`` over the node's branches (0 at a
    degenerate node), or ``Q - V(node)`` without ``scale_by_std``."""
    q: list[float]
    """Per branch: its reward plus the value of the node it reached (0 at the episode's end)."""
    values: dict[Hashable, float]
    """Per node: the mean ``q`` of its branches, the Monte-Carlo value of that state."""
    nodes: int
    degenerate_nodes: int
    """Nodes whose branches' ``q`` were all equal (or that had one branch): no signal there."""


def tree_advantages(
    branches: Sequence[Branch], *, scale_by_std: bool = True, eps: float = 1e-6
) -> TreeAdvantages:
    """Per-turn advantages from a tree of rollouts (every turn of a branch shares its branch's).

    ``V(node) = mean(q of its branches)`` and ``q = reward + V(next)``, computed from the leaves
    up. Siblings are normalised like a GRPO group (sample std, Bessel-corrected), so a tree
    whose only node is the start state, with branches that run to the end, gives exactly
    `group_advantages`. Raises ``ValueError`` for a ``next`` that has no branches, a cycle, or a
    non-finite reward.
    """
    by_node: dict[Hashable, list[int]] = {}
    for i, b in enumerate(branches):
        if not isinstance(b.reward, int | float) or b.reward != b.reward or abs(b.reward) == float("inf"):
            raise ValueError(f"branch {i}: reward must be finite, got {b.reward!r}")
        by_node.setdefault(b.node, []).append(i)
    values: dict[Hashable, float] = {}
    q: list[float | None] = [None] * len(branches)

    def value(node: Hashable, path: tuple[Hashable, ...]) -> float:
        if node in values:
            return values[node]
        if node in path:
            raise ValueError(f"the tree has a cycle through node {node!r}")
        if node not in by_node:
            raise ValueError(f"node {node!r} is reached by a branch but has no branches of its own")
        for i in by_node[node]:
            b = branches[i]
            q[i] = b.reward + (value(b.next, (*path, node)) if b.next is not None else 0.0)
        values[node] = statistics.fmean(q[i] for i in by_node[node])  # type: ignore[misc]
        return values[node]

    for node in by_node:
        value(node, ())
    advantages = [0.0] * len(branches)
    degenerate = 0
    for node, members in by_node.items():
        qs = [q[i] for i in members]
        std = statistics.stdev(qs) if len(qs) > 1 else 0.0  # type: ignore[type-var]
        if len(qs) < 2 or std < eps:
            degenerate += 1
            continue
        for i in members:
            centered = q[i] - values[node]  # type: ignore[operator]
            advantages[i] = centered / std if scale_by_std else centered
    return TreeAdvantages(advantages, [float(x) for x in q], values, len(by_node), degenerate)  # type: ignore[arg-type]


def logprobs_of(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Log-probability of each taken action (or token) under ``logits`` ``[..., n_actions]``."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


def entropy_of(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of each categorical distribution in ``logits`` ``[..., n_actions]``."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over the entries where ``mask`` is 1 (0 when none is)."""
    if mask is None:
        return values.mean() if values.numel() else values.new_zeros(())
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


@dataclass(frozen=True)
class PolicyLoss:
    loss: torch.Tensor
    """Scalar to minimise (``.backward()``): clipped policy-gradient loss plus ``kl_coef * kl``."""
    policy_loss: float
    kl_ref: float | None
    """Mean KL to the reference policy (k3 estimator), when reference logprobs were given."""
    clip_fraction: float
    """Share of counted actions/tokens whose ratio was outside the clip range."""
    approx_kl: float
    """Mean KL(old || new) (k3 estimator): how far this update has moved the policy."""
    ratio_mean: float

    def metrics(self) -> dict[str, float]:
        out = {
            "loss": self.loss.item(),
            "policy_loss": self.policy_loss,
            "clip_fraction": self.clip_fraction,
            "approx_kl": self.approx_kl,
            "ratio_mean": self.ratio_mean,
        }
        if self.kl_ref is not None:
            out["kl_ref"] = self.kl_ref
        return out


def kl_k3(logprobs: torch.Tensor, other_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-entry estimate of KL(pi || other) from samples of pi: ``exp(d) - d - 1``, ``d = other - log pi``
    (Schulman's k3: unbiased, never negative)."""
    d = other_logprobs - logprobs
    return torch.exp(d) - d - 1.0


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    aggregation: Aggregation = "token",
) -> PolicyLoss:
    """GRPO's clipped surrogate loss over per-action/per-token logprobs.

    ``ratio = exp(logprobs - old_logprobs)``; per entry ``-min(ratio * A, clip(ratio, 1 - eps,
    1 + eps_high) * A)`` (+ ``kl_coef`` * k3 KL to ``ref_logprobs``). ``aggregation="token"``
    averages over every counted entry (longer rollouts weigh more, as in DAPO); ``"sequence"``
    averages within each row then over rows (DeepSeekMath's GRPO; needs ``[B, T]``).
    ``clip_eps_high`` (default ``clip_eps``) allows DAPO's asymmetric "clip-higher".
    """
    if logprobs.shape != old_logprobs.shape:
        raise ValueError(f"old_logprobs shape {tuple(old_logprobs.shape)} != {tuple(logprobs.shape)}")
    if mask is not None and mask.shape != logprobs.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != logprobs shape {tuple(logprobs.shape)}")
    adv = advantages.to(logprobs.dtype)
    if adv.dim() == logprobs.dim() - 1:
        adv = adv.unsqueeze(-1)
    try:
        adv = adv.expand_as(logprobs)
    except RuntimeError:
        raise ValueError(
            f"advantages shape {tuple(advantages.shape)} fits neither logprobs {tuple(logprobs.shape)} "
            "nor one value per row"
        ) from None
    high = clip_eps if clip_eps_high is None else clip_eps_high
    old = old_logprobs.detach()
    log_ratio = logprobs - old
    ratio = torch.exp(log_ratio)
    per_entry = -torch.min(ratio * adv, torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high) * adv)
    pg = per_entry
    kl_mean: float | None = None
    if ref_logprobs is not None:
        kl = kl_k3(logprobs, ref_logprobs.detach())
        per_entry = per_entry + kl_coef * kl
        kl_mean = float(masked_mean(kl.detach(), mask))
    if aggregation == "token":
        loss = masked_mean(per_entry, mask)
        pg_mean = float(masked_mean(pg.detach(), mask))
    elif aggregation == "sequence":
        if logprobs.dim() != 2:
            raise ValueError("sequence aggregation needs [B, T] logprobs")
        m = torch.ones_like(per_entry) if mask is None else mask.to(per_entry.dtype)
        counts = m.sum(-1)
        rows = counts > 0
        per_row = (per_entry * m).sum(-1) / counts.clamp(min=1.0)
        loss = per_row[rows].mean() if bool(rows.any()) else per_entry.sum() * 0.0
        pg_row = (pg.detach() * m).sum(-1) / counts.clamp(min=1.0)
        pg_mean = float(pg_row[rows].mean()) if bool(rows.any()) else 0.0
    else:
        raise ValueError(f"unknown aggregation {aggregation!r}: 'token' or 'sequence'")
    with torch.no_grad():
        clipped = (ratio < 1.0 - clip_eps) | (ratio > 1.0 + high)
        clip_fraction = float(masked_mean(clipped.to(ratio.dtype), mask))
        approx_kl = float(masked_mean((ratio - 1.0) - log_ratio, mask))
        ratio_mean = float(masked_mean(ratio, mask))
    return PolicyLoss(loss, pg_mean, kl_mean, clip_fraction, approx_kl, ratio_mean)
