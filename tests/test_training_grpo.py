"""GRPO's math (training/grpo.py): group advantages, the clipped loss, KL, diagnostics."""

from __future__ import annotations

import math

import pytest
import torch

from training.grpo import entropy_of, group_advantages, kl_k3, logprobs_of, masked_mean, policy_loss


def test_group_advantages_are_standardised_within_each_group() -> None:
    out = group_advantages(torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 10.0, 30.0, 30.0]]))
    assert out.groups == 2 and out.degenerate_groups == 0
    for row, rewards in zip(out.advantages, ([1, 2, 3, 4], [10, 10, 30, 30]), strict=True):
        r = torch.tensor(rewards, dtype=torch.float32)
        expected = (r - r.mean()) / r.std()
        assert torch.allclose(row, expected, atol=1e-6)
        assert abs(float(row.sum())) < 1e-5


def test_degenerate_group_is_counted_and_contributes_nothing() -> None:
    out = group_advantages(torch.tensor([[5.0, 5.0, 5.0], [0.0, 1.0, 2.0]]))
    assert out.degenerate_groups == 1
    assert torch.equal(out.advantages[0], torch.zeros(3))
    assert out.advantages[1].abs().sum() > 0


def test_ragged_groups_by_id_and_singletons() -> None:
    rewards = [1.0, 3.0, 7.0, 2.0, 2.0, 9.0]
    ids = [4, 4, 8, 2, 2, 4]  # group 4: 1, 3, 9; group 8: singleton; group 2: all equal
    out = group_advantages(rewards, ids)
    assert out.groups == 3 and out.degenerate_groups == 2
    g = torch.tensor([1.0, 3.0, 9.0])
    expected = (g - g.mean()) / g.std()
    assert torch.allclose(out.advantages[[0, 1, 5]], expected, atol=1e-6)
    assert torch.equal(out.advantages[[2, 3, 4]], torch.zeros(3))


def test_unscaled_advantages_and_bad_inputs() -> None:
    out = group_advantages(torch.tensor([[1.0, 3.0]]), scale_by_std=False)
    assert torch.allclose(out.advantages, torch.tensor([[-1.0, 1.0]]))
    with pytest.raises(ValueError, match="groups, G"):
        group_advantages(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="finite"):
        group_advantages(torch.tensor([[1.0, math.nan]]))
    with pytest.raises(ValueError, match="group_ids shape"):
        group_advantages([1.0, 2.0], [0])
    assert group_advantages(torch.zeros(0, 4)).groups == 0


def test_loss_at_ratio_one_is_minus_mean_advantage_and_gradient_follows_advantage() -> None:
    logits = torch.zeros(4, 2, requires_grad=True)
    actions = torch.tensor([0, 1, 0, 1])
    logp = logprobs_of(logits, actions)
    adv = torch.tensor([1.0, -1.0, 2.0, 0.0])
    out = policy_loss(logp, logp.detach(), adv)
    assert math.isclose(out.loss.item(), -float(adv.mean()), abs_tol=1e-6)
    assert out.clip_fraction == 0.0 and abs(out.approx_kl) < 1e-7 and math.isclose(out.ratio_mean, 1.0)
    out.loss.backward()
    # A positive advantage raises its action's logit (gradient descent moves against the gradient).
    assert logits.grad[0, 0] < 0 and logits.grad[1, 1] > 0 and logits.grad[2, 0] < 0
    assert torch.allclose(logits.grad[3], torch.zeros(2))


def test_clipping_stops_the_gradient_beyond_the_trust_region() -> None:
    new = torch.tensor([math.log(1.5), math.log(0.5)], requires_grad=True)
    old = torch.zeros(2)
    out = policy_loss(new, old, torch.tensor([1.0, -1.0]), clip_eps=0.2)
    assert out.clip_fraction == 1.0
    out.loss.backward()
    assert torch.equal(new.grad, torch.zeros(2))  # both on the clipped side of the min
    # Clip-higher: a wider upper bound keeps the gradient of a ratio of 1.5 with eps_high 0.6.
    new2 = torch.tensor([math.log(1.5)], requires_grad=True)
    policy_loss(new2, torch.zeros(1), torch.tensor([1.0]), clip_eps=0.2, clip_eps_high=0.6).loss.backward()
    assert new2.grad[0] < 0


def test_masks_and_sequence_aggregation() -> None:
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.9], [0.25, 0.1, 0.1]]))
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([1.0, 2.0])  # one per row, broadcast over tokens
    tok = policy_loss(logp, logp, adv, mask)
    assert math.isclose(tok.loss.item(), -(1 + 1 + 2) / 3, abs_tol=1e-6)
    seq = policy_loss(logp, logp, adv, mask, aggregation="sequence")
    assert math.isclose(seq.loss.item(), -(1 + 2) / 2, abs_tol=1e-6)
    # Masked-out entries never matter, whatever their values.
    garbage = logp.clone()
    garbage[0, 2] = 50.0
    assert math.isclose(policy_loss(garbage, logp, adv, mask).loss.item(), tok.loss.item(), abs_tol=1e-6)
    with pytest.raises(ValueError, match="mask shape"):
        policy_loss(logp, logp, adv, mask[:, :2])
    with pytest.raises(ValueError, match="sequence aggregation"):
        policy_loss(logp[0], logp[0], torch.zeros(3), aggregation="sequence")
    with pytest.raises(ValueError, match="advantages shape"):
        policy_loss(logp, logp, torch.zeros(3))


def test_kl_to_reference_is_zero_at_reference_and_positive_elsewhere() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]], requires_grad=True)
    actions = torch.tensor([0, 1])
    logp = logprobs_of(logits, actions)
    same = policy_loss(logp, logp.detach(), torch.zeros(2), ref_logprobs=logp.detach(), kl_coef=0.1)
    assert same.kl_ref is not None and abs(same.kl_ref) < 1e-7
    ref = torch.log(torch.tensor([0.5, 0.5]))
    out = policy_loss(logp, logp.detach(), torch.zeros(2), ref_logprobs=ref, kl_coef=0.5)
    assert out.kl_ref is not None and out.kl_ref > 0
    assert math.isclose(out.loss.item(), 0.5 * out.kl_ref, rel_tol=1e-5)
    assert "kl_ref" in out.metrics()
    assert "kl_ref" not in policy_loss(logp, logp.detach(), torch.zeros(2)).metrics()
    assert float(kl_k3(torch.tensor(0.0), torch.tensor(0.0))) == 0.0


def test_helpers() -> None:
    logits = torch.tensor([[0.0, 0.0], [100.0, 0.0]])
    assert torch.allclose(entropy_of(logits), torch.tensor([math.log(2), 0.0]), atol=1e-5)
    assert float(masked_mean(torch.tensor([1.0, 5.0]), torch.tensor([1, 0]))) == 1.0
    assert float(masked_mean(torch.tensor([1.0]), torch.tensor([0]))) == 0.0
