"""TRL's GRPOTrainer trains against the task app through `grpo_service.client.trl_env`: the factory's
tools are the env's own (typed, documented, as TRL reads them), G rollouts of a prompt start from
the same state, rewards are the env's, and every episode TRL plays is traced by the service.
One task app (with the one-decision ``toy-words`` env registered) for the module."""

from __future__ import annotations

import inspect
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from grpo_service import create_app
from grpo_service.client.trl_env import (
    DONE,
    SERVICE_CLOCK,
    TaskAppEnv,
    TaskAppError,
    assistant_tool_call,
    environment_factory,
    tool_schemas,
    write_demonstrations,
)
from grpo_service.tracing import TraceReader
from tests.conftest import make_settings
from tests.llm_helpers import CORPUS
from tests.llm_toy import WORDS, toy_plugins
from tools.server_thread import ServerThread
from training.llm.model import ModelSpec, init_model

SPEC = ModelSpec(
    vocab_size=600,
    hidden_size=64,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=32,
    intermediate_size=128,
    max_positions=1024,
)
PROMPT = [{"role": "system", "content": "Name a fruit. Call say."}, {"role": "user", "content": ""}]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, Path]]:
    tmp = tmp_path_factory.mktemp("trl-app")
    trace_db = tmp / "traces.db"
    with (
        toy_plugins(),
        ServerThread(create_app(make_settings(tmp, trace_db=trace_db)), name="trl-app") as server,
    ):
        yield server, trace_db


@pytest.fixture(scope="module")
def babyai(served: tuple[ServerThread, Path]) -> type[TaskAppEnv]:
    return environment_factory(served[0].base_url, "babyai", config={"max_steps": 8})


def say_a_word(env: TaskAppEnv, row: dict[str, Any]) -> Any:
    """The teacher: one word picked by the row's seed, then Done (the model learns the format,
    and its words still vary, so GRPO's groups are not all equal)."""
    word = random.Random(row["seed"]).choice(WORDS)
    return lambda messages, tools: DONE if env.done else assistant_tool_call("say", {"actions": [word]})


@pytest.fixture(scope="module")
def warm_model(served: tuple[ServerThread, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3 that calls the say tool: `train --type sft` on the teacher's episodes."""
    from training.llm.config import SFTConfig
    from training.llm.model import jsonl_corpus
    from training.llm.sft import train_sft

    root = tmp_path_factory.mktemp("trl-model")
    toy = environment_factory(served[0].base_url, "toy-words")
    data = root / "demos.jsonl"
    write_demonstrations(toy, PROMPT, [{"seed": s} for s in range(24)], data, say_a_word, max_turns=3)
    init_model(root / "model", list(jsonl_corpus([data])) + CORPUS * 5, SPEC)
    config = SFTConfig(
        model=str(root / "model"),
        dataset=str(data),
        out=str(root / "sft"),
        batch_size=8,
        lr=1e-2,
        max_steps=60,
        epochs=1000,
        warmup_steps=4,
        threads=1,
        save_every=1000,
    )
    return Path(train_sft(config)["final"])


def test_the_factorys_methods_are_the_envs_tools(babyai: type[TaskAppEnv]) -> None:
    """TRL reads an instance's public methods: `act` with a typed, documented `action`."""
    methods = [n for n, _ in inspect.getmembers(babyai, inspect.isfunction) if not n.startswith("_")]
    assert sorted(methods) == ["act", "get_reward", "reset"]
    (schema,) = tool_schemas(babyai)
    function = schema["function"]
    assert function["name"] == "act" and "BabyAI action" in function["description"]
    assert function["parameters"]["properties"]["action"]["type"] == "string"
    assert function["parameters"]["required"] == ["action"]


def test_reset_seeds_from_the_row_and_rewards_are_the_envs(babyai: type[TaskAppEnv]) -> None:
    first, second = babyai(), babyai()
    try:
        assert first.reset(seed=5, prompt="ignored") == second.reset(seed=5)  # G rollouts, one state
        assert first.reset(seed=6) != second.reset(seed=5)
        text = first.act(action="turn left")
        assert "In front of you" in text and first.steps == 1 and first.get_reward() == 0.0
        assert "not recognized" in first.act(action="fly to the moon")  # BabyAI answers, as AgentGym
        refused = first.act(action=" ")  # the env refuses it: its message, as an observation
        assert "needs arguments" in refused and first.steps == 3 and first.get_reward() == 0.0
        with pytest.raises(TaskAppError, match="integer"):
            first.reset(seed="five")
    finally:
        first._close()
        second._close()


def test_a_dropped_session_is_reopened_at_the_next_reset(served: tuple[ServerThread, Path], babyai) -> None:
    env = babyai()
    env.reset(seed=1)
    env_id = env._exchange({"type": "state"})["env_id"]
    terminated = httpx.post(f"{served[0].base_url}/env/terminate", json={"env_id": env_id}, timeout=10)
    assert terminated.json()["existed"] is True  # as the idle reaper or another client would
    with pytest.raises(TaskAppError):
        env.act(action="turn left")
    assert "Your goal" in (env.reset(seed=1) or "")  # a new session
    env._close()


def test_grpo_trainer_trains_on_the_task_app(
    served: tuple[ServerThread, Path], warm_model: Path, tmp_path: Path
) -> None:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    server, trace_db = served
    toy = environment_factory(server.base_url, "toy-words")
    rows: list[dict[str, Any]] = [{"prompt": PROMPT, "seed": s} for s in range(4)]  # rounds it was taught
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"),
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=96,
        max_tool_calling_iterations=2,
        temperature=0.7,
        learning_rate=1e-3,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=0,
    )
    SERVICE_CLOCK.reset()
    trainer = GRPOTrainer(
        model=str(warm_model), args=args, train_dataset=Dataset.from_list(rows), environment_factory=toy
    )
    started = time.monotonic()
    trainer.train()
    wall = time.monotonic() - started
    assert trainer.state.global_step == 2
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2, trainer.state.log_history
    assert sum(entry["tools/call_frequency"] for entry in logs) > 0, logs  # the warm start calls say
    assert any(entry["rewards/ToyWordsEnv/std"] > 0 for entry in logs), logs  # the env's rewards vary
    service = f"service {SERVICE_CLOCK.seconds:.2f} s over {SERVICE_CLOCK.frames} frames"
    print(f"TRL: {wall:.1f} s for 2 steps, {service}")

    for env in trainer._environment_pool[None]:
        env._close()  # the service traces each episode when it ends or its session closes
    deadline = time.monotonic() + 30
    while True:
        with TraceReader(trace_db) as reader:
            sessions = [
                s for s in reader.sessions() if s["rl_run_id"] == "trl" and s["env_name"] == "toy-words"
            ]
            steps = sum(len(reader.turns(s["session_id"])) for s in sessions)
        if steps or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert sessions and steps > 0, "TRL's episodes are not in the trace DB"
