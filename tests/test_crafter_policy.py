"""crafter-react: request building, parsing, failures as decisions, history, state, secrets."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import crafter.constants
import pytest

from envs.base import DRY_RUN, PolicyContext, StepOptions, StepResult
from envs.crafter.actions import ACHIEVEMENTS, ACTIONS, TOOL_NAME
from envs.crafter.policy import MAKE_COSTS, PLACE_COSTS, CrafterReActPolicy, system_prompt
from envs.errors import InvalidConfig, InvalidState
from inference import InferenceClient, shared_pool
from tools.fake_server import FakeConfig, FakeInferenceServer

SECRET = "sk-policy-secret-0123456789abcdef"
OBS = {"text": "Step 0/10000. Health 9/9. Facing down: grass.", "status": {"health": 9}}


@pytest.fixture
def context(fake: FakeInferenceServer) -> PolicyContext:
    return PolicyContext(inference_url=fake.base_url, model="fake-model", request_timeout_s=5, max_retries=1)


@pytest.fixture
async def client(fake: FakeInferenceServer) -> AsyncIterator[InferenceClient]:
    c = InferenceClient(fake.base_url, timeout_s=5, max_retries=1, backoff_base_s=0.01)
    yield c
    await c.aclose()


def make_policy(
    context: PolicyContext, client: InferenceClient | None = None, **config: Any
) -> CrafterReActPolicy:
    policy = CrafterReActPolicy.create(config, context)
    assert isinstance(policy, CrafterReActPolicy)
    policy.client = client
    return policy


def outcome(reward: float = 0.0, unlocked: list[str] | None = None, executed: int = 1) -> StepResult:
    info = {"actions_executed": executed, "achievements_unlocked": unlocked or []}
    return StepResult(observation=OBS, reward=reward, done=False, truncated=False, info=info, step_idx=1)


# ---- prompt and request ------------------------------------------------------------------


def test_prompt_states_crafters_rules_exactly() -> None:
    prompt = system_prompt(8)
    assert len(prompt) < 2500
    assert all(a in prompt for a in ACTIONS) and all(a in prompt for a in ACHIEVEMENTS)
    assert {k: v["uses"] for k, v in crafter.constants.place.items()} == PLACE_COSTS
    assert {k: v["uses"] for k, v in crafter.constants.make.items()} == MAKE_COSTS
    assert "table 2 wood" in prompt and "furnace 4 stone" in prompt
    assert "1 to 8 actions" in system_prompt(8) and "1 to 3 actions" in system_prompt(3)


async def test_dry_run_returns_the_request(context: PolicyContext) -> None:
    policy = make_policy(
        context, max_actions_per_call=3, seed=7, enable_thinking=False, extra_body={"top_k": 20}
    )
    decision = await policy.step(OBS, DRY_RUN)
    assert decision.tool_calls == [] and decision.error is None and decision.llm_call is None
    request = decision.meta["inference_request"]
    assert request["tool_choice"] == {"type": "function", "function": {"name": TOOL_NAME}}
    assert request["parallel_tool_calls"] is False
    (tool,) = request["tools"]
    assert tool["function"]["name"] == TOOL_NAME
    assert tool["function"]["parameters"]["properties"]["actions"]["maxItems"] == 3
    assert request["model"] == "fake-model" and request["seed"] == 7 and request["temperature"] == 0.7
    assert request["extra_body"] == {"top_k": 20, "chat_template_kwargs": {"enable_thinking": False}}
    messages = request["messages"]
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == system_prompt(3) and messages[1]["content"] == OBS["text"]
    assert policy.turn_index == 0  # a dry run is not a turn


async def test_system_prompt_override_and_model_discovery(
    context: PolicyContext, client: InferenceClient, fake: FakeInferenceServer
) -> None:
    no_model = PolicyContext(inference_url=context.inference_url)
    policy = make_policy(no_model, client, system_prompt="Be brief.")
    dry = await policy.step(OBS, DRY_RUN)
    assert dry.meta["inference_request"]["messages"][0]["content"] == "Be brief."
    assert dry.meta["inference_request"]["model"] is None  # a dry run asks nobody
    fake.set_config(FakeConfig(model="served-model"))
    decision = await policy.step(OBS)  # no model anywhere: the server's /v1/models decides
    assert decision.error is None and decision.meta["model"] == "served-model"
    assert decision.llm_call is not None and decision.llm_call.request["model"] == "served-model"

    fake.set_config(FakeConfig(model=""))
    with pytest.raises(InvalidConfig, match="model"):
        await make_policy(no_model, client).step(OBS)


def test_config_is_strict(context: PolicyContext) -> None:
    for bad in ({"max_actions_per_call": 9}, {"unknown": 1}, {"temperature": -1}):
        with pytest.raises(InvalidConfig):
            CrafterReActPolicy.create(bad, context)


# ---- decisions against the fake ------------------------------------------------------------


async def test_step_returns_canonical_tool_call_and_tokens(context: PolicyContext) -> None:
    policy = make_policy(context)  # no injected client: uses the shared pool
    try:
        decision = await policy.step(OBS, StepOptions(record_logprobs=True))
    finally:
        await shared_pool().aclose()
    assert decision.error is None
    (call,) = decision.tool_calls
    assert set(call) == {"id", "tool", "args"} and call["tool"] == TOOL_NAME
    assert call["id"].startswith("chatcmpl-tool-")
    assert 1 <= len(call["args"]["actions"]) <= 8 and set(call["args"]["actions"]) <= set(ACTIONS)
    llm = decision.llm_call
    assert llm is not None and llm.prompt_token_ids and llm.completion_token_ids
    assert len(llm.completion_token_ids) == len(llm.completion_logprobs or [])
    meta = decision.meta
    assert meta["model"] == "fake-model" and meta["inference_url"] == context.inference_url + "/v1"
    assert (
        meta["turn_index"] == 0 and meta["latency_ms"] > 0 and meta["finish_reason"] == "stop"
    )  # named tool_choice
    assert meta["usage"]["total_tokens"] > 0
    assert policy.turn_index == 1


async def test_without_logprobs_no_ids(context: PolicyContext, client: InferenceClient) -> None:
    decision = await make_policy(context, client).step(OBS)
    assert decision.error is None and decision.llm_call is not None
    assert decision.llm_call.completion_token_ids is None and decision.llm_call.completion_logprobs is None


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ("timeout", "inference_timeout"),
        ("http_429", "inference_rate_limited"),
        ("http_500", "inference_server_error"),
        ("http_503", "inference_server_error"),
        ("malformed_json", "inference_malformed_response"),
        ("cut_stream", "inference_connection_error"),
        ("token_mismatch", "inference_malformed_response"),
        ("no_tool_call", "no_tool_call"),
        ("invalid_action", "invalid_action"),
    ],
)
async def test_each_fault_becomes_a_decision_error(
    context: PolicyContext, client: InferenceClient, fake: FakeInferenceServer, fault: str, error: str
) -> None:
    fake.set_config(FakeConfig(fault_probs={fault: 1.0}, timeout_fault_s=5, retry_after_s=0.01))
    policy = make_policy(context, client)
    decision = await policy.step(OBS, StepOptions(record_logprobs=True, timeout_s=0.5))
    assert decision.error == error, decision.error_detail
    assert decision.error_detail and decision.llm_call is not None
    if fault == "invalid_action":
        assert "'fly'" in decision.error_detail
        assert "fly" in decision.tool_calls[0]["args"]["actions"]  # the trace shows what the model said
    elif fault == "no_tool_call":
        assert decision.tool_calls == [] and "no tool" in decision.error_detail
    else:
        assert decision.tool_calls == [] and decision.llm_call.error
    policy.observe_outcome(outcome())
    assert not policy.history  # a failed decision is not replayed as a turn


async def test_connection_refused_is_a_decision_error(context: PolicyContext) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = InferenceClient(f"http://127.0.0.1:{port}", max_retries=1, backoff_base_s=0.01)
    try:
        decision = await make_policy(context, client).step(OBS, StepOptions(timeout_s=2))
    finally:
        await client.aclose()
    assert decision.error == "inference_connection_error"


def parse_tool_calls(message: dict[str, Any], max_actions: int) -> tuple[Any, str | None, str | None]:
    policy = CrafterReActPolicy.create({"max_actions_per_call": max_actions}, PolicyContext())
    assert isinstance(policy, CrafterReActPolicy)
    reply = policy.parse_reply(message, "tool_calls")
    return reply.tool_calls, reply.error, reply.detail


def test_parse_tool_calls_shapes() -> None:
    def message(name: str = TOOL_NAME, arguments: Any = '{"actions": ["do"]}') -> dict[str, Any]:
        return {
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}
            ]
        }

    assert parse_tool_calls(message(), 8) == (
        [{"id": "c1", "tool": TOOL_NAME, "args": {"actions": ["do"]}}],
        None,
        None,
    )
    assert parse_tool_calls(message(arguments={"actions": ["noop"]}), 8)[1] is None
    assert parse_tool_calls(message(arguments={"actions": "noop"}), 8)[1] is None
    assert parse_tool_calls({"content": "hi", "tool_calls": []}, 8)[1] == "no_tool_call"
    calls, error, detail = parse_tool_calls(message(arguments="{not json"), 8)
    assert error == "invalid_tool_call" and calls[0]["args"] == {"raw": "{not json"}
    assert parse_tool_calls(message(name="move"), 8)[1] == "invalid_tool_call"
    assert parse_tool_calls(message(arguments={"actions": []}), 8)[1] == "invalid_tool_call"
    assert parse_tool_calls(message(arguments={"actions": ["do"] * 4}), 3)[1] == "invalid_tool_call"
    _, error, detail = parse_tool_calls(message(arguments={"actions": ["do", "jump", 3]}), 8)
    assert error == "invalid_action" and "'jump'" in (detail or "") and "3" in (detail or "")


# ---- history and state -------------------------------------------------------------------


async def test_history_window_is_bounded(context: PolicyContext, client: InferenceClient) -> None:
    policy = make_policy(context, client, history_window=2)
    for turn in range(5):
        obs = {"text": f"observation {turn}"}
        decision = await policy.step(obs)
        assert decision.error is None
        policy.observe_outcome(outcome(reward=1.0, unlocked=["collect_wood"]))
    assert len(policy.history) == 2
    request = (await policy.step({"text": "now"}, DRY_RUN)).meta["inference_request"]
    roles = [m["role"] for m in request["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "user", "assistant", "tool", "user"]
    assert [m["content"] for m in request["messages"] if m["role"] == "user"] == [
        "observation 3",
        "observation 4",
        "now",
    ]
    assistant, tool = request["messages"][2], request["messages"][3]
    assert tool["tool_call_id"] == assistant["tool_calls"][0]["id"]
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"])["actions"]
    assert "Reward +1.00" in tool["content"] and "collect_wood" in tool["content"]
    policy.reset()
    assert not policy.history and policy.turn_index == 0


async def test_state_round_trip(context: PolicyContext, client: InferenceClient) -> None:
    policy = make_policy(context, client, history_window=3, seed=4, api_key=SECRET)
    for turn in range(4):
        await policy.step({"text": f"obs {turn}"})
        policy.observe_outcome(outcome())
    await policy.step({"text": "pending"})  # decided, outcome not yet observed
    state = json.loads(json.dumps(policy.get_state()))
    restored = CrafterReActPolicy.from_state(state, context)
    assert restored.get_state() == state and restored.turn_index == 5
    assert restored.config.api_key is None  # keys are never stored; the context's key is used
    after = outcome(reward=2.0)
    policy.observe_outcome(after)
    restored.observe_outcome(after)
    same = {"text": "next"}
    original_request = (await policy.step(same, DRY_RUN)).meta["inference_request"]
    assert (await restored.step(same, DRY_RUN)).meta["inference_request"] == original_request

    for bad in (
        {**state, "version": 2},
        {**state, "policy": "crafter-random"},
        {**state, "turn_index": -1},
        {**state, "history": [{"observation": 1}]},
        {**state, "config": {**state["config"], "max_actions_per_call": 99}},
        {"nonsense": True},
    ):
        with pytest.raises(InvalidState):
            CrafterReActPolicy.from_state(bad, context)


async def test_api_key_never_leaks(context: PolicyContext, fake: FakeInferenceServer) -> None:
    fake.set_config(FakeConfig(api_key="sk-the-right-key"))
    policy = make_policy(context, api_key=SECRET, timeout_s=5)
    try:
        denied = await policy.step(OBS)
    finally:
        await shared_pool().aclose()
    assert denied.error == "inference_auth_error"
    dry = await policy.step(OBS, DRY_RUN)
    texts = [
        json.dumps(policy.get_state()),
        json.dumps(dry.meta),
        json.dumps(denied.meta),
        denied.error_detail or "",
        json.dumps(denied.llm_call.request if denied.llm_call else {}),
        denied.llm_call.error if denied.llm_call else "",
        repr(policy.config),
        repr(policy.client),
    ]
    for text in texts:
        assert SECRET not in text and SECRET[:12] not in text and SECRET[-12:] not in text

    fake.set_config(FakeConfig(api_key=SECRET))
    policy = make_policy(context, api_key=SECRET)
    try:
        assert (await policy.step(OBS)).error is None  # the key is really sent
    finally:
        await shared_pool().aclose()


async def test_plays_the_real_env(context: PolicyContext, client: InferenceClient) -> None:
    from envs.crafter.env import CrafterEnv

    env = CrafterEnv.create({}, 3)
    result = env.reset()
    policy = make_policy(context, client)
    for _ in range(3):
        decision = await policy.step(result.observation)
        assert decision.error is None
        result = env.step(env.actions_from_tool_calls(decision.tool_calls))
        policy.observe_outcome(result)
    request = (await policy.step(result.observation, DRY_RUN)).meta["inference_request"]
    assert request["messages"][-1]["content"] == result.observation["text"]
    assert len(policy.history) == 3
