"""Per-turn credit from a tree of rollouts (`training.grpo.tree_advantages`), on hand-made trees."""

from __future__ import annotations

import math

import pytest

from training.grpo import Branch, group_advantages, tree_advantages


def test_a_tree_without_forks_is_plain_grpo() -> None:
    rewards = [1.0, 0.0, 0.5, 0.0]
    tree = tree_advantages([Branch("s0", r) for r in rewards])
    plain = group_advantages([rewards])
    assert tree.advantages == pytest.approx(plain.advantages[0].tolist(), abs=1e-6)
    assert tree.values == {"s0": pytest.approx(0.375)} and tree.nodes == 1 and tree.degenerate_nodes == 0
    unscaled = tree_advantages([Branch("s0", r) for r in rewards], scale_by_std=False)
    assert unscaled.advantages == pytest.approx([0.625, -0.375, 0.125, -0.375])


def test_one_fork_gives_each_stretch_its_own_advantage() -> None:
    # Two roots from s0. Root A plays turn 0 (reward 0), forks at turn 1 into a1; from a1 its own
    # continuation earns 1, and two copies earn 0 and 1. Root B earns 0 and never forks.
    branches = [
        Branch("s0", 0.0, next="a1"),  # A's turn 0
        Branch("s0", 0.0),  # B, whole episode
        Branch("a1", 1.0),  # A's own turns from 1
        Branch("a1", 0.0),  # copy 1
        Branch("a1", 1.0),  # copy 2
    ]
    t = tree_advantages(branches, scale_by_std=False)
    assert t.values["a1"] == pytest.approx(2 / 3) and t.values["s0"] == pytest.approx(1 / 3)
    assert t.q == pytest.approx([2 / 3, 0.0, 1.0, 0.0, 1.0])
    assert t.advantages == pytest.approx([1 / 3, -1 / 3, 1 / 3, -2 / 3, 1 / 3])
    scaled = tree_advantages(branches)
    root_std = math.sqrt(2 * (1 / 3) ** 2)  # sample std of (2/3, 0)
    fork_std = math.sqrt((1 / 9 + 4 / 9 + 1 / 9) / 2)  # sample std of (1, 0, 1)
    assert scaled.advantages == pytest.approx(
        [(1 / 3) / root_std, -(1 / 3) / root_std, (1 / 3) / fork_std, -(2 / 3) / fork_std, (1 / 3) / fork_std]
    )


def test_forks_give_signal_to_a_group_whose_roots_all_failed() -> None:
    # Plain GRPO: both roots earn 0, no signal. With a fork, one copy from A's turn-2 state
    # succeeds: A's first stretch led somewhere better than B's start did.
    roots_only = tree_advantages([Branch("s0", 0.0), Branch("s0", 0.0)])
    assert roots_only.degenerate_nodes == 1 and roots_only.advantages == [0.0, 0.0]
    t = tree_advantages(
        [
            Branch("s0", 0.0, next="a2"),
            Branch("s0", 0.0),
            Branch("a2", 0.0),
            Branch("a2", 1.0),
            Branch("a2", 0.0),
        ],
        scale_by_std=False,
    )
    assert t.degenerate_nodes == 0
    assert t.advantages[0] > 0 > t.advantages[1] and t.advantages[3] > 0 > t.advantages[2]
    assert t.values == {"a2": pytest.approx(1 / 3), "s0": pytest.approx(1 / 6)}


def test_nested_forks_back_values_up_from_the_leaves() -> None:
    # s0 → (A: reward 1 then fork at x) and (B: 0, ends). x → (A's rest: 0, ends), (copy: 2 then
    # fork at y). y → (copy's rest: 0), (copy of copy: 4).
    t = tree_advantages(
        [
            Branch("s0", 1.0, next="x"),
            Branch("s0", 0.0),
            Branch("x", 0.0),
            Branch("x", 2.0, next="y"),
            Branch("y", 0.0),
            Branch("y", 4.0),
        ],
        scale_by_std=False,
    )
    assert t.values["y"] == pytest.approx(2.0)
    assert t.values["x"] == pytest.approx((0.0 + 4.0) / 2)
    assert t.values["s0"] == pytest.approx((3.0 + 0.0) / 2)
    assert t.advantages == pytest.approx([1.5, -1.5, -2.0, 2.0, -2.0, 2.0])


def test_all_equal_siblings_are_counted_and_carry_nothing() -> None:
    t = tree_advantages([Branch("s0", 0.5, next="a"), Branch("s0", 1.0), Branch("a", 0.5), Branch("a", 0.5)])
    assert t.values["a"] == pytest.approx(0.5)
    # q = 0.5 + 0.5 = 1.0 for A and 1.0 for B: the start state is all-equal too.
    assert t.degenerate_nodes == 2 and t.nodes == 2 and t.advantages == [0.0] * 4
    single = tree_advantages([Branch("s0", 1.0)])
    assert single.degenerate_nodes == 1 and single.advantages == [0.0]


def test_malformed_trees_are_refused() -> None:
    with pytest.raises(ValueError, match="no branches"):
        tree_advantages([Branch("s0", 0.0, next="missing")])
    with pytest.raises(ValueError, match="cycle"):
        tree_advantages([Branch("a", 0.0, next="b"), Branch("b", 0.0, next="a")])
    with pytest.raises(ValueError, match="finite"):
        tree_advantages([Branch("s0", float("nan"))])
