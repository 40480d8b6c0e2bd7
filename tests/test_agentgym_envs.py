"""TextCraft, BabyAI and SciWorld in-process: AgentGym's task numbering, texts and scores, the
oracle baselines, and snapshots that refuse tampering."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("SCIWORLD_JVMS", "1")

from envs.babyai.env import BabyAIEnv  # noqa: E402
from envs.babyai.levels import LEVELS  # noqa: E402
from envs.errors import EpisodeOver, InvalidAction, InvalidConfig, InvalidState
from envs.sciworld.env import SciWorldEnv  # noqa: E402
from envs.sciworld.pool import Load, pool  # noqa: E402
from envs.sciworld.tasks import EXCLUDED, TASKS, VARIATIONS  # noqa: E402
from envs.text_game import decode_state, encode_state, parse_action_line, parse_react_action  # noqa: E402
from envs.textcraft.env import TextCraftEnv  # noqa: E402
from envs.textcraft.recipes import recipe_book  # noqa: E402


def play_oracle(env, max_steps: int = 400):
    result = env.reset()
    while not result.done and result.step_idx < max_steps:
        action = result.observation.get("oracle_action")
        if action is None:
            break
        result = env.step([action])
    return result


# ------------------------------------------------------------------------------- TextCraft


def test_textcraft_tasks_are_agentgyms_goals_by_depth() -> None:
    book = recipe_book()
    depths = [book.depth[goal] for goal in book.goals]
    assert len(book) == TextCraftEnv.num_tasks() == 544
    assert depths == sorted(depths) and depths[0] == 1
    env = TextCraftEnv.create({}, 0)
    first = env.reset().observation["text"]
    assert first.startswith("Crafting commands:\ncraft ") and first.endswith("\n\nGoal: craft acacia planks.")
    assert TextCraftEnv.create({}, 0).reset().observation == env.observe().observation


def test_textcraft_answers_in_agentgyms_words() -> None:
    env = TextCraftEnv.create({}, 3)
    env.reset()
    texts = [
        env.step([a]).observation["text"]
        for a in [
            "inventory",
            "get 1 oak logs",
            "craft 4 oak planks using 1 oak logs",
            "inventory",
            "dance",
            "get 1 oak planks",
        ]
    ]
    assert texts == [
        "Inventory: You are not carrying anything.",
        "Got 1 oak logs",
        "Crafted 4 minecraft:oak_planks",
        "Inventory: [oak planks] (4) ",
        "Could not execute dance",
        "Could not find oak planks",
    ]
    assert env.observe().observation["inventory"] == {"oak planks": 4}


def test_textcraft_goal_gives_reward_one_and_ends() -> None:
    env = TextCraftEnv.create(
        {"goal": "minecraft:oak_planks", "commands": "craft 4 oak planks using 1 oak logs"}, 0
    )
    assert env.reset().observation["goal"] == "oak planks"
    env.step(["get 1 oak logs"])
    result = env.step(["craft 4 oak planks using 1 oak logs"])
    assert result.reward == 1.0 and result.done and result.info["success"] and result.info["score"] == 1.0
    with pytest.raises(EpisodeOver):
        env.step(["inventory"])
    with pytest.raises(InvalidConfig):
        TextCraftEnv.create({"goal": "minecraft:stick"}, 0)


def test_textcraft_planner_solves_every_task() -> None:
    results = [
        play_oracle(TextCraftEnv.create({"oracle": True}, i), 60) for i in range(TextCraftEnv.num_tasks())
    ]
    assert all(r.info["success"] for r in results)


def test_textcraft_snapshot_refuses_tampering() -> None:
    env = TextCraftEnv.create({}, 2)
    env.reset()
    env.step(["get 1 oak logs"])
    state = env.get_state()
    assert TextCraftEnv.from_state(state).observe().observation == env.observe().observation
    body = decode_state(b"TXTCRAFT1", state, "textcraft")
    for bad in (
        {**body, "game": {**body["game"], "inventory": [["minecraft:oak_log", "many"]]}},
        {**body, "steps": -1},
        {**body, "version": "0"},
        {**body, "config": {"nope": 1}},
    ):
        with pytest.raises(InvalidState):
            TextCraftEnv.from_state(encode_state(b"TXTCRAFT1", bad))
    for junk in (b"", b"TXTCRAFT1garbage", state[:-5], b"BABYAI1" + state[9:]):
        with pytest.raises(InvalidState):
            TextCraftEnv.from_state(junk)
    with pytest.raises(InvalidAction):
        env.step([3])


# ---------------------------------------------------------------------------------- BabyAI


def test_babyai_task_numbering_and_first_observation() -> None:
    assert len(LEVELS) == 40
    env = BabyAIEnv.create({}, 41)  # level 2 of AgentGym's table (index 1), seed 1
    obs = env.reset().observation
    assert obs["level"] == "BabyAI-GoToRedBall-v0"
    assert obs["text"].startswith("Your goal: go to the red ball\n")
    assert obs["text"].endswith('\nAvailable actions: ["' + '", "'.join(obs["available_actions"]) + '"]')
    assert obs["available_actions"][:2] == ["turn left", "turn right"]
    assert obs["available_actions"][-1] == "check available actions"
    assert any(a.startswith("pickup ") for a in obs["available_actions"])  # AgentGym's spelling
    assert BabyAIEnv.create({}, 41).reset().observation == obs


def test_babyai_actions_answer_like_agentgym() -> None:
    env = BabyAIEnv.create({}, 41)
    env.reset()
    assert env.step(["Pick up the moon"]).observation["state"] == (
        "The action is not recognized. Please check valid actions."
    )
    assert env.step([""]).observation["state"] == "No change in state."
    listed = env.step(["check available actions"]).observation
    assert listed["state"] == "You can take the following actions: " + ", ".join(listed["available_actions"])
    moved = env.step(["turn left"])
    assert moved.step_idx == 4 and moved.reward == 0.0 and not moved.done
    assert (
        moved.observation["text"]
        == moved.observation["state"]
        + '\nAvailable actions: ["'
        + '", "'.join(moved.observation["available_actions"])
        + '"]'
    )
    assert env.step([2]).info["actions"] == [2]  # a primitive minigrid action
    with pytest.raises(InvalidAction):
        env.step([7])


@pytest.mark.parametrize("level", range(0, 16))
@pytest.mark.slow
def test_babyai_bot_solves_the_goto_and_open_levels(level: int) -> None:
    result = play_oracle(BabyAIEnv.create({"oracle": True}, level))
    assert result.done and result.info["success"] and 0.5 < result.info["score"] <= 1.0
    assert result.observation["state"].endswith("\n The task is completed.")


def bot_primitives(task: int) -> list[int]:
    """minigrid's BabyAI bot alone on task ``task``: the primitive steps it takes to the end."""
    from minigrid.utils.baby_ai_bot import BabyAIBot

    from envs.babyai import levels

    level, seed = levels.level_of(task)
    gym = levels.make(level)
    gym.reset(seed=seed)
    bot, steps, taken = BabyAIBot(gym), [], None
    for _ in range(400):
        action = int(bot.replan(taken))
        steps.append(action)
        if gym.step(action)[2]:
            return steps
        taken = action
    raise AssertionError(f"the bot did not finish task {task}")


def test_babyai_oracle_speaks_the_agents_actions_and_moves_as_the_bot_does() -> None:
    """The oracle's actions are the agent's own (available text actions); each takes exactly the
    bot's next steps, so the bot's success stands; a walk to a visible goal is one "go to"."""
    walks = 0
    for task in (0, 1, 2, 3, 4, 11, 16, 40, 41, 42):
        text_env = BabyAIEnv.create({"oracle": True}, task)
        result = text_env.reset()
        while not result.done and result.step_idx < 200:
            action = result.observation["oracle_action"]
            assert isinstance(action, str) and action in result.observation["available_actions"]
            walks += action.startswith("go to")
            result = text_env.step([action])
        assert result.info["success"], task
        played = decode_state(b"BABYAI1", text_env.get_state(), "babyai")["game"]["primitives"]
        assert played == bot_primitives(task), task
    assert walks >= 5


def test_babyai_snapshot_replays_and_refuses_tampering() -> None:
    env = BabyAIEnv.create({}, 13)
    env.reset()
    for action in ["turn right", "move forward", "move forward"]:
        env.step([action])
    state = env.get_state()
    copy = BabyAIEnv.from_state(state)
    assert copy.observe().observation == env.observe().observation
    assert copy.step(["turn left"]).observation == env.step(["turn left"]).observation
    body = decode_state(b"BABYAI1", state, "babyai")
    for bad_game in (
        {"primitives": [9]},
        {"primitives": "012"},
        {"level": "BabyAI-BossLevel-v0"},
        {"reward": "x"},
    ):
        with pytest.raises(InvalidState):
            BabyAIEnv.from_state(encode_state(b"BABYAI1", {**body, "game": {**body["game"], **bad_game}}))


def test_react_reply_parsing_follows_agentgyms_clients() -> None:
    assert parse_action_line("Thought:\nI should look.\n\nAction:\ngo to red ball 1") == "go to red ball 1"
    assert (
        parse_action_line("Action: craft 1 blue dye using 1 lapis_lazuli!")
        == "craft 1 blue dye using 1 lapislazuli"
    )
    assert parse_action_line("no action here") == ""
    assert parse_action_line("Action: a\nAction: b") is None
    assert parse_react_action("Thought: hm\nAction: open door to kitchen  ") == "open door to kitchen"
    assert parse_react_action("just thinking") == ""


# -------------------------------------------------------------------------------- SciWorld


def test_sciworld_task_list_matches_the_simulator() -> None:
    assert len(TASKS) == SciWorldEnv.num_tasks() == 4639
    with pool().lease(Load("boil", 0, False), []) as sim:
        for task_id, (name, count) in VARIATIONS.items():
            assert sim.env.get_max_variations(name) == count, task_id
    assert not {t.task_id for t in TASKS} & EXCLUDED


@pytest.mark.slow
def test_sciworld_gold_path_scores_100_and_step_limit_ends() -> None:
    result = play_oracle(SciWorldEnv.create({"oracle": True}, 0), 100)
    assert result.done and result.info["success"] and result.info["score"] == 100.0
    assert result.observation["task_name"] == "boil" and result.observation["variation"] == 0
    env = SciWorldEnv.create({"step_limit": 2}, 0)
    first = env.reset()
    assert first.observation["text"].startswith("Your task is to boil water.")
    assert "This room is called the hallway." in first.observation["text"]
    results = [env.step(["wait1"])]
    while not results[-1].done and len(results) < 5:  # ScienceWorld: done once moves > the limit
        results.append(env.step(["wait1"]))
    assert results[-1].done and results[-1].observation["moves"] > 2 >= results[-2].observation["moves"]
    assert not results[-1].info["success"]
    with pytest.raises(InvalidConfig):
        SciWorldEnv.create({}, len(TASKS))


@pytest.mark.slow
def test_env_bench_smoke_reports_every_env() -> None:
    from tools.bench.envs import run_env_bench

    report = run_env_bench("smoke")
    assert set(report["steps_per_s"]) == {"crafter", "textcraft", "babyai", "sciworld"}
    assert all(min(r["in_process"], r["http"], r["openenv"]) > 0 for r in report["steps_per_s"].values())
    assert report["oracle"]["textcraft"]["success_rate"] == 1.0
    assert report["oracle"]["sciworld"]["success_rate"] == 1.0


def test_viewer_frames_leave_the_state_alone() -> None:
    babyai = BabyAIEnv.create({}, 5)
    babyai.reset()
    before = babyai.get_state()
    frame = babyai.render_frame()
    assert frame.png is not None and frame.png.startswith(b"\x89PNG") and frame.text == babyai.text
    assert babyai.get_state() == before
    textcraft = TextCraftEnv.create({}, 1)
    textcraft.reset()
    assert (
        textcraft.render_frame().text.startswith("Crafting commands:")
        and textcraft.render_frame().png is None
    )
