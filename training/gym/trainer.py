"""Episode-level GRPO on a gymnasium environment.

Each update collects ``n_steps`` episodes as groups of ``group_size`` that share a reset seed
(same start state; only the policy's sampling differs), scores each episode with the reward
function, turns the scores into group-relative advantages (`training.grpo.group_advantages`)
and takes ``n_epochs`` passes of clipped policy-gradient steps (`training.grpo.policy_loss`)
over every action of the update. No critic; an optional value head is fitted for `/inference`.

Episodes of an update are stepped in lockstep so that one numpy forward pass serves them all.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np
import torch
from torch import nn

from training.context import TrainContext
from training.curves import MetricsLog, plot_curves
from training.grpo import entropy_of, group_advantages, logprobs_of, policy_loss
from training.gym.config import GymTrainConfig, env_spaces, initial_policy, policy_meta
from training.gym.policy import MLPPolicy
from training.gym.rewards import get_reward

RETURN_WINDOW = 20
"""Episodes in the moving mean of the environment return (`mean_episode_return`)."""
CHECKPOINT_EVERY_S = 2.0
VALUE_GAMMA = 0.99
MAX_GRAD_NORM = 1.0
CURVE_KEYS = ("mean_episode_return", "mean_reward", "loss", "clip_fraction", "approx_kl", "steps_per_s")


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


class PolicyNet(nn.Module):
    """The torch twin of an `MLPPolicy`, built from one (so the job process and the service that
    wrote the job's initial model agree on the weights)."""

    def __init__(self, policy: MLPPolicy) -> None:
        super().__init__()

        def build(layers: list[tuple[np.ndarray, np.ndarray]]) -> nn.Sequential:
            seq = mlp([layers[0][0].shape[0], *(w.shape[1] for w, _ in layers)])
            linears = [m for m in seq if isinstance(m, nn.Linear)]
            with torch.no_grad():
                for m, (w, b) in zip(linears, layers, strict=True):
                    m.weight.copy_(torch.from_numpy(np.ascontiguousarray(w.T)))
                    m.bias.copy_(torch.from_numpy(b))
            return seq

        self.pi = build(policy.layers)
        self.v = build(policy.value_layers) if policy.value_layers is not None else None

    def to_policy(self, obs_dim: int, n_actions: int, meta: dict[str, Any]) -> MLPPolicy:
        def export(seq: nn.Sequential) -> list[tuple[np.ndarray, np.ndarray]]:
            return [
                (m.weight.detach().numpy().T.copy(), m.bias.detach().numpy().copy())
                for m in seq
                if isinstance(m, nn.Linear)
            ]

        return MLPPolicy(
            obs_dim, n_actions, export(self.pi), "tanh", export(self.v) if self.v is not None else None, meta
        )


@dataclass
class Episode:
    seed: int
    obs: np.ndarray  # [T, obs_dim]
    actions: np.ndarray  # [T]
    next_obs: np.ndarray  # [T, obs_dim]
    env_rewards: np.ndarray  # [T]

    @property
    def length(self) -> int:
        return len(self.actions)


class Stopped(Exception):
    """The run was asked to stop (or ran out of wall time) in the middle of collecting."""


def collect(
    policy: MLPPolicy,
    envs: list[gymnasium.Env],
    seeds: list[int],
    rng: np.random.Generator,
    max_steps: int,
    ctx: TrainContext,
) -> list[Episode]:
    """One episode per env, env ``i`` reset with ``seeds[i]``, all stepped in lockstep."""
    n = len(envs)
    first = [np.asarray(env.reset(seed=s)[0], np.float32) for env, s in zip(envs, seeds, strict=True)]
    obs = np.stack(first)
    actions_of: list[list[int]] = [[] for _ in range(n)]
    next_of: list[list[np.ndarray]] = [[] for _ in range(n)]
    rewards_of: list[list[float]] = [[] for _ in range(n)]
    active = list(range(n))
    while active:
        if ctx.stop_reason() is not None:
            raise Stopped
        actions, _ = policy.sample(obs[active], rng)
        still = []
        for i, a in zip(active, actions.tolist(), strict=True):
            nxt, reward, terminated, truncated, _ = envs[i].step(a)
            nxt = np.asarray(nxt, np.float32)
            actions_of[i].append(a)
            next_of[i].append(nxt)
            rewards_of[i].append(float(reward))
            obs[i] = nxt  # copies into the batch row; next_of keeps its own array
            if not (terminated or truncated or len(actions_of[i]) >= max_steps):
                still.append(i)
        active = still
    episodes = []
    for i, seed in enumerate(seeds):
        nexts = np.stack(next_of[i])
        episodes.append(
            Episode(
                seed,
                np.concatenate([first[i][None], nexts[:-1]]),
                np.asarray(actions_of[i], np.int64),
                nexts,
                np.asarray(rewards_of[i], np.float64),
            )
        )
    return episodes


def discounted_to_go(rewards: np.ndarray, gamma: float) -> np.ndarray:
    out = np.empty_like(rewards)
    acc = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        acc = rewards[t] + gamma * acc
        out[t] = acc
    return out


def train_gym(config: GymTrainConfig, ctx: TrainContext) -> dict[str, Any]:
    """Run one training job to its end (budget, target, stop or time limit); the model zip, its
    metrics JSONL and its curves PNG are in ``ctx.models_dir``. Returns a summary."""
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    obs_dim, n_actions = env_spaces(config.env_name)
    reward = get_reward(config.reward_function_type)
    envs = [gymnasium.make(config.env_name, disable_env_checker=True) for _ in range(config.n_steps)]
    spec_limit = envs[0].spec.max_episode_steps if envs[0].spec else None
    max_steps = config.max_episode_steps or spec_limit or 1_000_000

    net = PolicyNet(initial_policy(config))
    reference = copy.deepcopy(net.pi).requires_grad_(False) if config.kl_coef > 0 else None
    optimizer = torch.optim.Adam(net.parameters(), lr=config.learning_rate)
    meta = policy_meta(config)
    log = MetricsLog(ctx.metrics_path)
    rows: list[dict[str, Any]] = []
    recent: deque[float] = deque(maxlen=RETURN_WINDOW)
    timesteps = episodes = updates = 0
    next_seed = config.seed * 1_000_003
    last_checkpoint = time.monotonic()
    reason = "completed"
    metrics: dict[str, Any] = {}

    def save(status: str) -> None:
        nonlocal last_checkpoint
        summary = {k: metrics[k] for k in ("mean_episode_return", "updates", "timesteps") if k in metrics}
        meta.update(status=status, summary=summary, saved_at=time.time())
        net.to_policy(obs_dim, n_actions, meta).save(ctx.model_path)
        last_checkpoint = time.monotonic()

    try:
        save("training")
        ctx.report(0, config.total_timesteps, {})  # the model file exists from here on
        while timesteps < config.total_timesteps:
            update_started = time.monotonic()
            policy = net.to_policy(obs_dim, n_actions, meta)
            seeds = []
            for _ in range(config.groups_per_update):
                seeds += [next_seed] * config.group_size
                next_seed += 1
            try:
                batch = collect(policy, envs, seeds, rng, max_steps, ctx)
            except Stopped:
                reason = ctx.stop_reason() or "stopped"
                break
            stats = update(net, reference, optimizer, batch, config, reward, ctx)
            updates += 1
            episodes += len(batch)
            new_steps = sum(ep.length for ep in batch)
            timesteps += new_steps
            recent.extend(float(ep.env_rewards.sum()) for ep in batch)
            elapsed = time.monotonic() - ctx.started
            metrics = {
                "timesteps": timesteps,
                "episodes": episodes,
                "elapsed_s": round(elapsed, 3),
                "steps_per_s": round(new_steps / max(time.monotonic() - update_started, 1e-9), 1),
                "mean_episode_return": float(np.mean(recent)),
                "mean_episode_length": float(np.mean([ep.length for ep in batch])),
                **stats,
                "updates": updates,
            }
            rows.append(metrics)
            log.write(metrics)
            ctx.report(timesteps, config.total_timesteps, metrics)
            target = config.target_return
            if (
                target is not None
                and len(recent) == RETURN_WINDOW
                and metrics["mean_episode_return"] >= target
            ):
                reason = "target_reached"
                break
            stop = ctx.stop_reason()
            if stop is not None:
                reason = stop
                break
            if config.max_wall_time_s is not None and elapsed >= config.max_wall_time_s:
                reason = "time_limit"
                break
            if time.monotonic() - last_checkpoint >= CHECKPOINT_EVERY_S:
                save("training")
        save("stopped" if reason in ("stopped", "time_limit") else "completed")
    finally:
        log.close()
        for env in envs:
            env.close()
    if reason != "stopped":  # a stop must end within a second: the curves are drawn on completion
        plot_curves(rows, ctx.curves_path, CURVE_KEYS)
    return {"reason": reason, "model_path": str(ctx.model_path), "metrics": metrics}


def update(
    net: PolicyNet,
    reference: nn.Module | None,
    optimizer: torch.optim.Optimizer,
    batch: list[Episode],
    config: GymTrainConfig,
    reward: Any,
    ctx: TrainContext,
) -> dict[str, float]:
    """Group-relative advantages for the batch's episodes, then n_epochs of clipped GRPO steps."""
    step_rewards = [
        ep.env_rewards
        if reward.fn is None
        else np.asarray(reward.fn(ep.obs, ep.actions, ep.next_obs), np.float64)
        for ep in batch
    ]
    returns = torch.tensor([float(r.sum()) for r in step_rewards]).reshape(-1, config.group_size)
    adv = group_advantages(returns)
    lengths = torch.tensor([ep.length for ep in batch])
    obs = torch.from_numpy(np.concatenate([ep.obs for ep in batch]))
    actions = torch.from_numpy(np.concatenate([ep.actions for ep in batch]))
    action_adv = adv.advantages.reshape(-1).repeat_interleave(lengths)
    episode_of = torch.arange(len(batch)).repeat_interleave(lengths)
    with torch.no_grad():
        old_logp = logprobs_of(net.pi(obs), actions)
        ref_logp = logprobs_of(reference(obs), actions) if reference is not None else None
    value_target = (
        torch.from_numpy(np.concatenate([discounted_to_go(r, VALUE_GAMMA) for r in step_rewards])).float()
        if net.v is not None
        else None
    )
    totals: dict[str, float] = {}
    steps = 0
    useful = adv.degenerate_groups < adv.groups
    for _ in range(config.n_epochs if useful or net.v is not None else 0):
        if ctx.stop_reason() is not None:  # the caller saves and ends; a stop answers within a second
            break
        order = torch.randperm(len(batch))
        for mb in order.split(config.batch_size):
            if len(mb) == len(batch):
                idx = torch.arange(len(actions))
            else:
                chosen = torch.zeros(len(batch), dtype=torch.bool)
                chosen[mb] = True
                idx = chosen[episode_of].nonzero().squeeze(-1)
            logits = net.pi(obs[idx])
            logp = logprobs_of(logits, actions[idx])
            out = policy_loss(
                logp,
                old_logp[idx],
                action_adv[idx],
                clip_eps=config.clip_range,
                ref_logprobs=ref_logp[idx] if ref_logp is not None else None,
                kl_coef=config.kl_coef,
            )
            entropy = entropy_of(logits).mean()
            loss = out.loss - config.ent_coef * entropy if useful else out.loss * 0.0
            m = out.metrics()
            if value_target is not None and net.v is not None:
                value_loss = torch.nn.functional.mse_loss(net.v(obs[idx]).squeeze(-1), value_target[idx])
                loss = loss + 0.5 * value_loss / value_target.abs().mean().clamp(min=1.0) ** 2
                m["value_loss"] = value_loss.item()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), MAX_GRAD_NORM)
            optimizer.step()
            m["entropy"] = entropy.item()
            for k, v in m.items():
                totals[k] = totals.get(k, 0.0) + v
            steps += 1
    stats = {k: v / steps for k, v in totals.items()} if steps else {"loss": 0.0}
    stats.update(
        mean_reward=float(returns.mean()),
        groups=adv.groups,
        degenerate_groups=adv.degenerate_groups,
        gradient_steps=steps,
    )
    return stats
