"""Demonstrations in TRL's conversation shape, for warm-starting a model that TRL's GRPOTrainer
then trains against the task app (tests/test_trl.py, scripts/bench_trl.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envs.agent import TEXT_ACTION_TOOL
from grpo_service.trl_env import Episode, Reply, TaskAppEnv, play_episode

DONE = {"role": "assistant", "content": "Done."}


def tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
    }


def oracle_reply(env: TaskAppEnv) -> Reply:
    """A text game's scripted solver (its ``oracle`` config) as the assistant: its next action as
    an ``act`` call, then Done."""

    def reply(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        action = env.observation.get("oracle_action")
        if env.done or action is None:
            return DONE
        return tool_call(TEXT_ACTION_TOOL, {"action": str(action)})

    return reply


def write_demonstrations(
    env_class: type[TaskAppEnv],
    prompt: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    path: Path,
    teacher: Callable[[TaskAppEnv, dict[str, Any]], Reply],
    max_turns: int,
) -> list[Episode]:
    """The teacher's episodes in TRL's shape as chat JSONL (``train --type sft`` input)."""
    env = env_class()
    try:
        episodes = [play_episode(env, prompt, row, teacher(env, row), max_turns) for row in rows]
    finally:
        env._close()
    with open(path, "w", encoding="utf-8") as f:
        for episode in episodes:
            f.write(json.dumps({"messages": episode.messages, "tools": episode.tools}) + "\n")
    return episodes
