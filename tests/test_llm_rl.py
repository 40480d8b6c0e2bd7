"""The GRPO loop's batch: rewards, group advantages, token samples, staleness and counting."""

from __future__ import annotations

import pytest

from training.llm.config import RLConfig
from training.llm.rl import build_batch, group_request, member_reward


def step(turn: int, version: int | None = 3, tokens: bool = True) -> dict:
    llm = {
        "prompt_token_ids": [1, 2, 3] if tokens else None,
        "completion_token_ids": [7, 8] if tokens else None,
        "completion_logprobs": [-0.5, -0.25] if tokens else None,
        "weights_version": version,
    }
    return {"turn": turn, "llm": llm}


def member(run_id: str, rewards: list[float], steps: list[dict], stop: str = "completed") -> dict:
    result = {
        "stop_reason": stop,
        "trajectories": [
            {"total_reward": r, "steps": steps if i == 0 else []} for i, r in enumerate(rewards)
        ],
    }
    return {"run_id": run_id, "status": "completed", "result": result}


CONFIG = RLConfig(model="m", out="o")


def test_advantages_are_group_relative_and_every_decision_is_a_sample() -> None:
    groups = [
        {"members": [member("a.0", [1.0], [step(0), step(1)]), member("a.1", [0.0], [step(0)])]},
        {"members": [member("b.0", [2.0], [step(0)]), member("b.1", [2.0], [step(0)])]},  # all equal
    ]
    batch = build_batch(groups, CONFIG, version=3)
    assert batch.rewards == [1.0, 0.0, 2.0, 2.0] and batch.group_ids == [0, 0, 1, 1]
    assert batch.stats["groups"] == 2 and batch.stats["groups_all_equal"] == 1
    assert [(s.run_id, s.turn) for s in batch.samples] == [("a.0", 0), ("a.0", 1), ("a.1", 0)]
    adv = [s.advantage for s in batch.samples]
    assert adv[0] == adv[1] > 0 > adv[2] and adv[0] == pytest.approx(-adv[2])
    assert batch.stats["zero_advantage_samples"] == 2  # the all-equal group contributes nothing
    every = build_batch(groups, CONFIG, version=3, keep_zero_advantage=True)  # a counting consumer
    assert [(s.run_id, s.advantage) for s in every.samples[3:]] == [("b.0", 0.0), ("b.1", 0.0)]
    assert every.samples[:3] == batch.samples and not every.stats["zero_advantage_samples"]
    s = batch.samples[0]
    assert s.prompt_ids == [1, 2, 3] and s.completion_ids == [7, 8] and s.old_logprobs == [-0.5, -0.25]


def test_an_invalid_turn_is_a_sample_with_its_rollouts_advantage() -> None:
    invalid = {**step(1), "decision_error": "no_action", "feedback": "Error: ..."}
    groups = [{"members": [member("a.0", [1.0], [step(0), invalid]), member("a.1", [0.0], [step(0)])]}]
    batch = build_batch(groups, CONFIG.model_copy(update={"format_penalty": 0.5, "max_turns": 2}), version=3)
    assert batch.rewards == [0.75, 0.0]
    assert [(s.run_id, s.turn) for s in batch.samples] == [("a.0", 0), ("a.0", 1), ("a.1", 0)]
    assert batch.samples[0].advantage == batch.samples[1].advantage > 0


def test_stale_untokenized_and_failed_are_dropped_and_counted() -> None:
    failed = {"run_id": "a.2", "status": "failed", "result": None, "error": "boom"}
    groups = [
        {
            "members": [
                member("a.0", [1.0], [step(0, version=1), step(1, version=3)]),
                member("a.1", [0.0], [step(0, tokens=False)]),
                failed,
            ]
        }
    ]
    batch = build_batch(groups, CONFIG, version=3)
    assert batch.stats["members_failed"] == 1 and batch.stats["stale_samples"] == 1
    assert batch.stats["decisions_without_tokens"] == 1
    assert [(s.run_id, s.turn) for s in batch.samples] == [("a.0", 1)]
    lenient = build_batch(groups, CONFIG.model_copy(update={"max_staleness": 2}), version=3)
    assert len(lenient.samples) == 2


def test_format_penalty_and_rewards_summed_over_episodes() -> None:
    assert member_reward(member("x", [1.0, 0.5], [])["result"]) == 1.5
    broken = member("x", [0.0], [], stop="policy_error:no_tool_call")["result"]
    assert member_reward(broken) == 0.0 and member_reward(broken, 0.5) == -0.5
    # Two of 4 turns acted before the third failed: half the penalty.
    steps = [{"turn": 0}, {"turn": 1}, {"turn": 2, "decision_error": "invalid_action"}]
    later = member("x", [0.25], steps, stop="policy_error:invalid_action")["result"]
    assert member_reward(later, 1.0, max_turns=4) == pytest.approx(0.25 - 0.5)
    # Answered invalid turns cost their share; a short rollout without one loses nothing.
    answered = member("x", [0.25], steps + [{"turn": 3, "decision_error": "no_action"}])["result"]
    assert member_reward(answered, 1.0, max_turns=4) == pytest.approx(0.25 - 0.5)
    short = member("x", [1.0], [{"turn": 0}], stop="episode_done")["result"]
    assert member_reward(short, 1.0, max_turns=4) == 1.0


def test_group_request_points_the_policy_at_the_model_server() -> None:
    config = RLConfig(
        model="m",
        out="o",
        model_server_url="http://127.0.0.1:9",
        policy_config={"temperature": 1.0},
        env_name="babyai",
        env_config={"level": 1},
        group_size=3,
        max_turns=7,
    )
    body = group_request(config, seed=42, served_model="tiny", step=2, index=1, version=5)
    assert body["policy"]["config"] == {
        "temperature": 1.0,
        "inference_url": "http://127.0.0.1:9",
        "model": "tiny",
    }
    assert body["weights_version"] == 5
    assert body["env"] == {"env_name": "babyai", "seed": 42, "config": {"level": 1}}
    assert body["mode"] == "rl" and body["record"]["logprobs"] is True and body["group_size"] == 3
    assert body["group_id"].startswith("grpo-s2-g1-")


class FailingTaskApp:
    def __init__(self) -> None:
        self.calls = 0

    async def rollout_group(self, body: dict) -> dict:
        self.calls += 1
        raise ConnectionError("task app down")


def test_a_task_app_that_keeps_failing_stops_the_run_with_a_checkpoint(tmp_path) -> None:
    import torch

    from tests.llm_helpers import make_tiny_model
    from tools.server_thread import ServerThread
    from training.llm.rl import MAX_FAILED_STEPS, train_rl
    from training.llm.server import ModelEngine, create_model_app

    torch.set_num_threads(1)
    model = make_tiny_model(tmp_path / "model")
    engine = ModelEngine(model, served_name="tiny")
    task_app = FailingTaskApp()
    with ServerThread(create_model_app(engine)) as server:
        config = RLConfig(
            model=str(model), out=str(tmp_path / "rl"), model_server_url=server.base_url, steps=10
        )
        result = train_rl(config, task_app=task_app)
    engine.close()
    assert result["steps"] == MAX_FAILED_STEPS - 1 and "task app down" in result["error"]
    assert task_app.calls == MAX_FAILED_STEPS * config.groups_per_step
    assert (tmp_path / "rl" / "final" / "config.json").exists()
    assert result["weights_version_first"] == result["weights_version_last"] == 0
    assert engine.weights_version == "0"


def tree_member(
    index: int, rewards: dict[int, float], parent: int | None = None, fork_turn: int | None = None
):
    """A member of a forking group: its own turns (turn → reward) from ``fork_turn`` on."""
    steps = [{**step(turn), "reward": r} for turn, r in rewards.items()]
    result = {
        "stop_reason": "episode_done",
        "parent_index": parent,
        "fork_turn": fork_turn,
        "trajectories": [{"total_reward": sum(rewards.values()), "steps": steps}],
    }
    return {"run_id": f"t.{index}", "group_index": index, "status": "completed", "result": result}


TREE = RLConfig(model="m", out="o", advantage="tree", fork={"at_turns": [1]}, scale_by_std=False)


def test_tree_credit_gives_each_stretch_between_forks_its_own_advantage() -> None:
    # Root 0 forks at turn 1 into members 2 and 3; root 1 never forks. Every root fails, so
    # plain GRPO has no signal; member 3 succeeds from root 0's turn-1 state.
    group = {
        "members": [
            tree_member(0, {0: 0.0, 1: 0.0, 2: 0.0}),
            tree_member(1, {0: 0.0, 1: 0.0}),
            tree_member(2, {1: 0.0, 2: 0.0}, parent=0, fork_turn=1),
            tree_member(3, {1: 1.0}, parent=0, fork_turn=1),
        ],
        "tree": {"forks": [{"parent_index": 0, "turn": 1, "children": [2, 3]}]},
    }
    plain = build_batch([group], CONFIG, version=3)
    assert plain.stats["groups_all_equal"] == 0  # group mode sees member 3's return of 1 too...
    roots_only = {"members": group["members"][:2]}
    # ...the roots alone have none.
    assert build_batch([roots_only], CONFIG, version=3).stats["groups_all_equal"] == 1

    batch = build_batch([group], TREE, version=3)
    assert batch.rewards == [0.0, 0.0] and batch.group_ids == [0, 0]  # the roots' returns, logged
    assert batch.stats["subgroups"] == 2 and batch.stats["subgroups_all_equal"] == 0
    assert batch.stats["groups_all_equal"] == 0 and batch.stats["continuations"] == 2
    adv = {(s.run_id, s.turn): s.advantage for s in batch.samples}
    v_fork = 1 / 3  # the fork state: root 0's rest (0), member 2 (0), member 3 (1)
    v_start = v_fork / 2  # root 0's first stretch reached the fork state, root 1 earned 0
    assert adv[("t.0", 0)] == pytest.approx(v_fork - v_start)
    assert adv[("t.1", 0)] == adv[("t.1", 1)] == pytest.approx(-v_start)
    assert adv[("t.0", 1)] == adv[("t.0", 2)] == pytest.approx(-v_fork)
    assert adv[("t.2", 1)] == pytest.approx(-v_fork) and adv[("t.3", 1)] == pytest.approx(1 - v_fork)
    assert len(batch.samples) == 8  # every decision of every member: 3 + 2 + 2 + 1


def test_tree_credit_counts_an_all_failed_tree_as_no_signal_and_penalises_the_last_stretch() -> None:
    group = {
        "members": [
            tree_member(0, {0: 0.0, 1: 0.0}),
            tree_member(1, {0: 0.0}),
            tree_member(2, {1: 0.0}, parent=0, fork_turn=1),
        ],
        "tree": {"forks": [{"parent_index": 0, "turn": 1, "children": [2]}]},
    }
    batch = build_batch([group], TREE, version=3)
    assert batch.stats["groups_all_equal"] == 1 and batch.stats["subgroups_all_equal"] == 2
    assert batch.samples == [] and batch.stats["zero_advantage_samples"] == 4
    # A continuation that broke the format at its second own turn loses on that stretch only.
    group["members"][2]["result"]["stop_reason"] = "policy_error:no_tool_call"
    broken = {**step(2), "reward": 0.0, "decision_error": "no_tool_call"}
    group["members"][2]["result"]["trajectories"][0]["steps"].append(broken)
    penalised = build_batch([group], TREE.model_copy(update={"format_penalty": 1.0, "max_turns": 4}), 3)
    adv = {(s.run_id, s.turn): s.advantage for s in penalised.samples}
    # acted: 1 copied turn + 1 own = 2 of 4, so it loses 0.5; the fork's value drops to -0.25.
    assert adv[("t.2", 1)] == adv[("t.2", 2)] == pytest.approx(-0.25)
    assert adv[("t.0", 1)] == pytest.approx(0.25)


def test_the_tree_mode_needs_a_fork_plan_and_sends_it() -> None:
    with pytest.raises(ValueError, match="needs a fork plan"):
        RLConfig(model="m", advantage="tree")
    with pytest.raises(ValueError, match='set advantage = "tree"'):
        RLConfig(model="m", fork={"every": 2})
    body = group_request(TREE, seed=1, served_model="tiny", step=0, index=0, version=0)
    assert body["fork"] == {"at_turns": [1]} and "fork" not in group_request(CONFIG, 1, "tiny", 0, 0, 0)
