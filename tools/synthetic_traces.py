"""Synthetic `RolloutTrace`s shaped like crafter-react's, for tests and writer benchmarks.

They carry what a real rollout carries (a system prompt, a history window of user/assistant
tool-call/tool messages, vLLM-shaped responses with token ids and logprobs, env steps with
rewards and achievements) without running an env or an LLM.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

from envs.base import PolicyDecision, StepResult
from grpo_service.models import RolloutMetrics, RolloutRequest, RolloutResponse
from grpo_service.tracing.derive import derive_file
from grpo_service.tracing.traces import DecisionTrace, RolloutTrace
from grpo_service.tracing.writer import TraceWriter
from inference import LLMCall

TOOL = {
    "type": "function",
    "function": {
        "name": "interact_many",
        "description": "Execute a short sequence of Crafter actions in order (1-8).",
        "parameters": {
            "type": "object",
            "properties": {"actions": {"type": "array", "items": {"type": "string"}, "maxItems": 8}},
            "required": ["actions"],
        },
    },
}
SYSTEM_PROMPT = "You play Crafter, a 2D survival game. " * 40  # about the real prompt's size
ACTIONS = ("move_left", "move_right", "move_up", "move_down", "do", "noop")


def synthetic_trace(
    run_id: str = "synthetic",
    *,
    turns: int = 5,
    seed: int = 0,
    model: str = "fake-qwen3",
    policy_name: str = "crafter-react",
    unlocks: dict[int, list[str]] | None = None,
    rewards: dict[int, float] | None = None,
    error_turn: int | None = None,
    done_turn: int | None = None,
    with_tokens: bool = True,
    group_id: str | None = None,
    group_index: int | None = None,
    history_window: int = 4,
) -> RolloutTrace:
    """``turns`` decisions; ``unlocks[t]`` are unlocked (+1 each) at turn t; ``error_turn`` ends the
    rollout with a ``no_tool_call`` decision; ``done_turn`` ends the episode (terminate)."""
    unlocks, rewards = unlocks or {}, rewards or {}
    uses_llm = policy_name == "crafter-react"
    started = time.time()
    history: list[list[dict[str, Any]]] = []
    decisions: list[DecisionTrace] = []
    achievements: list[str] = []
    total = 0.0
    stop_reason = "completed"
    for turn in range(turns):
        observation = {"text": f"Step {turn}. You see grass and a tree to the left.", "step_idx": turn}
        actions = [ACTIONS[(turn + i) % len(ACTIONS)] for i in range(1 + turn % 3)]
        call_id = f"call-{run_id}-{turn}"
        arguments = json.dumps({"actions": actions})
        tool_calls = [{"id": call_id, "tool": "interact_many", "args": {"actions": actions}}]
        error = "no_tool_call" if turn == error_turn else None
        llm_call = None
        if uses_llm:
            messages = [{"role": "system", "content": SYSTEM_PROMPT}]
            for past in history[-history_window:] if history_window else []:
                messages.extend(past)
            messages.append({"role": "user", "content": observation["text"]})
            wire = {
                "id": call_id,
                "type": "function",
                "function": {"name": "interact_many", "arguments": arguments},
            }
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [wire]}
            if error:
                message = {"role": "assistant", "content": "I am not sure.", "tool_calls": []}
                tool_calls = []
            completion_ids = list(range(100 + turn, 112 + turn))
            response: dict[str, Any] = {
                "id": f"chatcmpl-{run_id}-{turn}",
                "object": "chat.completion",
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                "usage": {
                    "prompt_tokens": 300 + 40 * turn,
                    "completion_tokens": 12,
                    "total_tokens": 312 + 40 * turn,
                },
            }
            llm_call = LLMCall(
                request={
                    "model": model,
                    "messages": messages,
                    "tools": [TOOL],
                    "tool_choice": {"type": "function", "function": {"name": "interact_many"}},
                    "temperature": 0.7,
                    "top_p": 1.0,
                    "max_tokens": 512,
                },
                response=response,
                latency_ms=12.5 + turn,
                usage=response["usage"],
                model=model,
                finish_reason="tool_calls",
                prompt_token_ids=list(range(300 + 40 * turn)) if with_tokens else None,
                completion_token_ids=completion_ids if with_tokens else None,
                completion_logprobs=[-0.01 * (i + 1) for i in range(len(completion_ids))]
                if with_tokens
                else None,
            )
        decision = PolicyDecision(tool_calls=tool_calls, llm_call=llm_call, error=error)
        d = DecisionTrace(turn=turn, observation=observation, decision=decision)
        decisions.append(d)
        if error:
            stop_reason = f"policy_error:{error}"
            break
        unlocked = unlocks.get(turn, [])
        reward = float(len(unlocked)) + rewards.get(turn, 0.0)
        total += reward
        achievements.extend(unlocked)
        done = turn == done_turn
        d.result = StepResult(
            observation={"text": f"Step {turn + 1}."},
            reward=reward,
            done=done,
            truncated=False,
            info={"actions": actions, "actions_executed": len(actions), "achievements_unlocked": unlocked},
            step_idx=turn + 1,
        )
        d.env_ms = 0.4
        if uses_llm:
            history.append(
                [
                    {"role": "user", "content": observation["text"]},
                    {"role": "assistant", "content": None, "tool_calls": [wire]},
                    {
                        "role": "tool",
                        "tool_call_id": call_id,
                        "content": f"Executed {actions}. Reward {reward:+.2f}.",
                    },
                ]
            )
        if done:
            stop_reason = "episode_done"
            break
    calls = [d.decision.llm_call for d in decisions if d.decision.llm_call]
    request = RolloutRequest.model_validate(
        {
            "run_id": run_id,
            "env": {"env_name": "crafter", "seed": seed},
            "policy": {"policy_name": policy_name, "config": {"model": model, "api_key": "sk-do-not-store"}},
            "max_turns": turns,
        }
    )
    response = RolloutResponse(
        run_id=run_id,
        status="completed",
        trajectories=[],
        metrics=RolloutMetrics(
            episode_returns=[round(total, 6)],
            mean_return=round(total, 6),
            num_steps=sum(len(d.result.info["actions"]) for d in decisions if d.result),
            num_decisions=len(decisions),
            num_episodes=1,
            achievements=sorted(set(achievements)),
            achievements_count=len(set(achievements)),
            llm_calls=len(calls),
            llm_time_s=0.01,
            env_time_s=0.001,
            wall_time_s=0.02,
            prompt_tokens=sum(c.usage["prompt_tokens"] for c in calls if c.usage),
            completion_tokens=sum(c.usage["completion_tokens"] for c in calls if c.usage),
        ),
        aborted=False,
        ops_executed=2 * len(decisions),
        stop_reason=stop_reason,
        group_id=group_id,
        group_index=group_index,
    )
    return RolloutTrace(
        request=request,
        response=response,
        env_name="crafter",
        policy_name=policy_name,
        policy_config={"model": model, "temperature": 0.7} if uses_llm else {},
        seed=seed,
        started_at=started,
        finished_at=time.time(),
        decisions=decisions,
    )


async def write_synthetic_db(path: Path, rollouts: int, *, turns: int = 16, seed: int = 0) -> None:
    """``rollouts`` synthetic rollouts (mixed models, rewards, achievements, stop reasons, groups)."""
    rng = random.Random(seed)
    models = ["Qwen/Qwen3-4B", "Qwen/Qwen3-1.7B", "ft:qwen3-4b:sft-1"]
    names = ["collect_wood", "place_table", "collect_sapling", "wake_up", "eat_cow", "collect_drink"]
    writer = TraceWriter(path, queue_size=1024, max_batch=256, close_timeout_s=600.0)
    await writer.start()
    for i in range(rollouts):
        while writer.stats()["queued"] >= 768:  # never drop: wait for the writer to catch up
            await asyncio.sleep(0.01)
        n = rng.randint(3, turns)
        unlocks = {rng.randrange(n): [name] for name in names if rng.random() < 0.3}
        writer.submit(
            synthetic_trace(
                f"synthetic-{i:05d}",
                turns=n,
                seed=rng.randrange(1000),
                model=rng.choice(models),
                unlocks=unlocks,
                error_turn=n - 1 if rng.random() < 0.1 else None,
                group_id=f"synthetic-group-{i // 8}",
                group_index=i % 8,
                with_tokens=False,
                history_window=1,
            )
        )
    await writer.close()
    derive_file(path)  # the detail tables filled, as a reader would find them
