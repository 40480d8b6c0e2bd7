"""The gymnasium GRPO trainer in-process: groups share reset seeds, degenerate groups give no
update, the value head and the KL term, custom reward functions, the policy zip."""

from __future__ import annotations

from pathlib import Path

import gymnasium
import numpy as np
import pytest
import torch

from training.context import TrainContext
from training.curves import read_metrics
from training.gym.config import GymTrainConfig
from training.gym.policy import InvalidPolicyFile, MLPPolicy
from training.gym.rewards import REWARD_FUNCTIONS, register_reward
from training.gym.trainer import collect, train_gym

TINY = {"total_timesteps": 600, "n_steps": 16, "group_size": 8, "n_epochs": 2, "learning_rate": 0.01}


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def test_a_group_shares_its_reset_seed() -> None:
    rng = np.random.default_rng(0)
    policy = MLPPolicy(4, 2, [(np.zeros((4, 2), np.float32), np.zeros(2, np.float32))])
    envs = [gymnasium.make("CartPole-v1") for _ in range(4)]
    episodes = collect(policy, envs, [7, 7, 9, 9], rng, 500, TrainContext(Path("."), "x"))
    assert np.array_equal(episodes[0].obs[0], episodes[1].obs[0])
    assert not np.array_equal(episodes[0].obs[0], episodes[2].obs[0])
    for ep in episodes:  # obs[t + 1] is next_obs[t]: the trajectory is consistent
        assert np.array_equal(ep.obs[1:], ep.next_obs[:-1])
        assert len(ep.actions) == len(ep.env_rewards) == len(ep.obs)


def test_degenerate_groups_are_counted_and_do_not_move_the_policy(tmp_path: Path) -> None:
    register_reward("flat", lambda s, a, n: np.zeros(len(a)), description="always 0")
    try:
        train_gym(
            GymTrainConfig(**TINY, reward_function_type="flat", model_name="f"), TrainContext(tmp_path, "f")
        )
    finally:
        del REWARD_FUNCTIONS["flat"]
    rows = read_metrics(tmp_path / "f.metrics.jsonl")
    assert rows and all(r["degenerate_groups"] == r["groups"] == 2 for r in rows)
    assert all(r["gradient_steps"] == 0 for r in rows)
    # A reward that varies within groups does move it.
    train_gym(GymTrainConfig(**TINY, model_name="g"), TrainContext(tmp_path, "g"))
    rows = read_metrics(tmp_path / "g.metrics.jsonl")
    assert rows[0]["degenerate_groups"] == 0 and rows[0]["gradient_steps"] == 2


def test_value_head_kl_and_the_zip(tmp_path: Path) -> None:
    config = GymTrainConfig(**TINY, value_head=True, kl_coef=0.05, hidden_sizes=[16], model_name="v")
    result = train_gym(config, TrainContext(tmp_path, "v"))
    assert result["reason"] == "completed"
    m = result["metrics"]
    assert m["kl_ref"] >= 0 and m["value_loss"] > 0 and m["timesteps"] >= 600
    policy = MLPPolicy.load(tmp_path / "v.zip")
    obs = np.zeros((3, 4), np.float32)
    assert policy.probs(obs).shape == (3, 2) and np.allclose(policy.probs(obs).sum(-1), 1)
    assert policy.value(obs) is not None and policy.value(obs).shape == (3,)
    assert policy.meta["config"]["value_head"] is True and policy.meta["status"] == "completed"
    with pytest.raises(ValueError, match="4 values"):
        policy.check_observation(np.zeros(5))
    (tmp_path / "bad.zip").write_bytes(b"PK\x03\x04 nope")
    with pytest.raises(InvalidPolicyFile):
        MLPPolicy.load(tmp_path / "bad.zip")


def test_a_stop_request_saves_and_ends_the_run(tmp_path: Path) -> None:
    calls = {"n": 0}

    def stop_after_first_update(current: int, total: int, metrics: dict) -> None:
        calls["n"] += 1

    ctx = TrainContext(tmp_path, "s", report=stop_after_first_update, should_stop=lambda: calls["n"] >= 1)
    result = train_gym(GymTrainConfig(**{**TINY, "total_timesteps": 10**6}, model_name="s"), ctx)
    assert result["reason"] == "stopped" and calls["n"] == 1
    assert MLPPolicy.load(tmp_path / "s.zip").meta["status"] == "stopped"
