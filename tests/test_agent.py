"""The generic LLM agent (`envs.agent`): AgentGym's conversation and tool calls for one text env."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar

import pytest

from envs.agent import (
    AGENTGYM_ACK,
    TEXT_ACTION_TOOL,
    LLMAgent,
    LLMAgentConfig,
    text_action_tool,
    text_actions,
)
from envs.base import DRY_RUN, PluginConfig, PolicyContext, StepOptions, StepResult
from envs.errors import InvalidAction, InvalidConfig, InvalidState
from inference import InferenceClient
from inference.toy_tokenizer import token_id, tokenize
from tools.fake_server import FakeConfig, FakeInferenceServer

INSTRUCTION = "You are in a small house. Reach the kitchen. Reply with one line 'Action: <action>'."
DOORS = ["go north", "go east", "look"]


class HouseAgent(LLMAgent[LLMAgentConfig]):
    """An environment's whole LLM policy: its prompt, its action space and its checks."""

    name: ClassVar[str] = "test-house-agent"
    config_model: ClassVar[type[PluginConfig]] = LLMAgentConfig
    prompt_formats = ("agentgym", "tool_calls")

    def system_prompt(self) -> str:
        return INSTRUCTION

    def tools(self) -> list[dict[str, Any]]:
        return [text_action_tool("Act in the house.")]

    def check_tool_call(self, call: dict[str, Any]) -> tuple[str, str] | None:
        action = call["args"].get("action")
        if action not in DOORS:
            return "invalid_action", f"unknown action {action!r}; valid: {', '.join(DOORS)}"
        return None

    def clean_text_action(self, text: str) -> str:
        return " ".join(text.lower().rstrip(".").split())


def observation(text: str) -> dict[str, Any]:
    return {"text": text, "room": text.split()[-1]}


def outcome(text: str, done: bool = False) -> StepResult:
    return StepResult(observation(text), 1.0 if done else 0.0, done, False, {}, 1)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeInferenceServer]:
    with FakeInferenceServer(FakeConfig(text_actions=["go north", "Go  East."])) as srv:
        yield srv


@pytest.fixture
async def client(fake: FakeInferenceServer) -> AsyncIterator[InferenceClient]:
    c = InferenceClient(fake.base_url, timeout_s=5, max_retries=0)
    yield c
    await c.aclose()


def agent(fake: FakeInferenceServer, client: InferenceClient | None, **config: Any) -> HouseAgent:
    context = PolicyContext(inference_url=fake.base_url, model="fake-model", request_timeout_s=5)
    policy = HouseAgent.create(config, context)
    assert isinstance(policy, HouseAgent)
    policy.client = client
    return policy


async def test_agentgym_conversation(fake: FakeInferenceServer, client: InferenceClient) -> None:
    policy = agent(fake, client, history_window=2)
    dry = (await policy.step(observation("You are in the hall"), DRY_RUN)).meta["inference_request"]
    assert "tools" not in dry and "tool_choice" not in dry
    assert dry["messages"] == [
        {"role": "user", "content": INSTRUCTION},
        {"role": "assistant", "content": AGENTGYM_ACK},
        {"role": "user", "content": "You are in the hall"},
    ]
    replies = []
    for room in ("hall", "stairs", "attic"):
        decision = await policy.step(observation(f"You are in the {room}"), StepOptions(record_logprobs=True))
        assert decision.error is None, decision.error_detail
        (call,) = decision.tool_calls
        assert call["tool"] == TEXT_ACTION_TOOL and call["args"]["action"] in ("go north", "go east")
        reply = decision.meta["assistant_content"]
        assert reply.startswith("Thought: ") and "\nAction: " in reply
        llm = decision.llm_call
        assert llm is not None and llm.prompt_token_ids
        # Exactly the server's ids for the reply, never re-tokenized by the agent.
        assert llm.completion_token_ids == [token_id(t) for t in tokenize(reply)]
        assert len(llm.completion_logprobs or []) == len(llm.completion_token_ids)
        replies.append(reply)
        policy.observe_outcome(outcome("You moved"))
    messages = (await policy.step(observation("You are in the kitchen"), DRY_RUN)).meta["inference_request"][
        "messages"
    ]
    assert [m["role"] for m in messages] == ["user", "assistant"] + ["user", "assistant"] * 2 + ["user"]
    assert [m["content"] for m in messages[2:]] == [
        "You are in the stairs",
        replies[1],  # replayed verbatim
        "You are in the attic",
        replies[2],
        "You are in the kitchen",
    ]


async def test_a_prompt_replays_the_window_as_the_same_message_objects(
    fake: FakeInferenceServer, client: InferenceClient
) -> None:
    """Each prompt repeats the window's messages as the objects the earlier prompts sent (the
    opening messages and each turn's user message included): a trace keeps each once, by identity."""
    policy = agent(fake, client, history_window=2)
    prompts = []
    for room in ("hall", "stairs", "attic", "cellar"):
        decision = await policy.step(observation(f"You are in the {room}"), StepOptions(record_logprobs=True))
        assert decision.error is None and decision.llm_call is not None
        prompts.append(decision.llm_call.request["messages"])
        policy.observe_outcome(outcome("You moved"))
    last, before = prompts[-1], prompts[-2]
    assert last[0] is before[0] and last[1] is before[1]  # the instruction and its answer
    sent = {id(m) for prompt in prompts[:-1] for m in prompt}
    # New: the last turn's reply, in a prompt for the first time, and the observation.
    assert [id(m) in sent for m in last] == [True] * (len(last) - 2) + [False, False]
    assert last[-1]["content"] == "You are in the cellar"
    rooms = ("stairs", "attic", "cellar")
    assert [m["content"] for m in last[2::2]] == [f"You are in the {r}" for r in rooms]


async def test_text_replies_without_one_action(fake: FakeInferenceServer, client: InferenceClient) -> None:
    policy = agent(fake, client)
    parse = policy.parse_reply
    assert parse({"content": "Thought: hm.\nAction: go north"}, "stop").error is None
    assert parse({"content": "Action:  Go   East.\n"}, "stop").tool_calls[0]["args"] == {"action": "go east"}
    assert parse({"content": "I will go north."}, "stop").error == "no_action"
    assert parse({"content": "Action: go north\nAction: look"}, "stop").error == "multiple_actions"
    jump = parse({"content": "Action: jump"}, "stop")
    assert jump.error == "invalid_action" and "'jump'" in (jump.detail or "") and jump.tool_calls
    assert parse({"content": None}, "length").error == "no_action"

    fake.set_config(FakeConfig(text_actions=["go north"], fault_script=["no_tool_call"]))
    try:
        decision = await policy.step(observation("You are in the hall"))
    finally:
        fake.set_config(FakeConfig(text_actions=["go north", "Go  East."]))
    assert decision.error == "no_action" and decision.tool_calls == [] and decision.llm_call is not None
    policy.observe_outcome(outcome("nothing"))
    assert not policy.history  # a failed decision is not replayed


async def test_tool_call_format_gives_the_same_call(
    fake: FakeInferenceServer, client: InferenceClient
) -> None:
    fake.set_config(FakeConfig())
    policy = agent(fake, client, prompt_format="tool_calls")
    request = (await policy.step(observation("hall"), DRY_RUN)).meta["inference_request"]
    assert request["messages"][0] == {"role": "system", "content": INSTRUCTION}
    assert request["tool_choice"] == {"type": "function", "function": {"name": TEXT_ACTION_TOOL}}
    reply = policy.parse_reply(
        {"tool_calls": [{"id": "c1", "function": {"name": "act", "arguments": '{"action": "look"}'}}]}, None
    )
    assert reply.error is None and reply.tool_calls == [
        {"id": "c1", "tool": "act", "args": {"action": "look"}}
    ]
    text = policy.parse_reply({"content": "Action: look"}, None)
    assert text_actions(reply.tool_calls) == ["look"]
    policy.prompt_format = "agentgym"
    assert text_actions(policy.parse_reply({"content": "Action: look"}, None).tool_calls) == ["look"]
    assert text.error == "no_tool_call"  # the tool_calls format wants a tool call
    for bad in ([], [{"tool": "move", "args": {}}], [{"tool": "act", "args": {}}], [{"function": "x"}]):
        with pytest.raises(InvalidAction):
            text_actions(bad)


async def test_state_round_trip_and_config(fake: FakeInferenceServer, client: InferenceClient) -> None:
    fake.set_config(FakeConfig(text_actions=["go north"]))
    policy = agent(fake, client, history_window=3, seed=1)
    for turn in range(2):
        assert (await policy.step(observation(f"room {turn}"))).error is None
        policy.observe_outcome(outcome("moved"))
    await policy.step(observation("pending"))
    state = json.loads(json.dumps(policy.get_state()))
    restored = HouseAgent.from_state(state, policy.context)
    assert restored.get_state() == state and restored.prompt_format == "agentgym"
    restored.observe_outcome(outcome("moved"))
    policy.observe_outcome(outcome("moved"))
    same = observation("next")
    assert (await restored.step(same, DRY_RUN)).meta == (await policy.step(same, DRY_RUN)).meta
    with pytest.raises(InvalidState):
        HouseAgent.from_state({**state, "policy": "crafter-react"}, policy.context)

    class ToolsOnly(HouseAgent):
        name: ClassVar[str] = "test-tools-only"
        prompt_formats = ("tool_calls",)

    with pytest.raises(InvalidConfig, match="prompt_format"):
        ToolsOnly.create({"prompt_format": "agentgym"}, policy.context)
    with pytest.raises(InvalidConfig):
        HouseAgent.create({"prompt_format": "xml"}, policy.context)


async def test_a_think_block_is_reasoning_not_the_reply(fake: FakeInferenceServer) -> None:
    """Qwen3 may open its reply with <think>...</think>; a server may split it off or leave it in
    the content. Either way the action is read from the answer alone and replayed without it."""
    from inference.calls import LLMCall
    from inference.completions import chat_choice

    policy = agent(fake, None, history_window=2)
    replies = {
        "left in the content": chat_choice(
            0, "<think>\nAction: look\n</think>\n\nAction: go north", [], "stop"
        ),
        "split off by the server": chat_choice(0, "Action: go north", [], "stop", reasoning="Action: look"),
    }
    for how, choice in replies.items():
        call = LLMCall(request={}, response={"choices": [choice]}, latency_ms=1.0, finish_reason="stop")
        decision = policy._decide(observation("You are in the hall"), call, {})
        assert decision.error is None, how
        assert text_actions(decision.tool_calls) == ["go north"], how
        assert decision.meta["reasoning_content"] == "Action: look", how
        assert decision.meta["assistant_content"] == "Action: go north", how
        policy.observe_outcome(outcome("You moved"))
    messages = (await policy.step(observation("You are in the attic"), DRY_RUN)).meta["inference_request"]
    assert [m["content"] for m in messages["messages"] if m["role"] == "assistant"][-2:] == [
        "Action: go north"
    ] * 2
