"""Qwen3's <think> reasoning, written by the model or not: the split every reader shares, the
model server's answer and the SFT export."""

from __future__ import annotations

import json

import pytest

from grpo_service.tracing.export import build_example, validate_example
from inference.reasoning import reply_reasoning, split_reasoning
from training.llm.sampling import Sample
from training.llm.server import ChatRequest, _choice

CALL = '<tool_call>\n{"name": "act", "arguments": {"action": "go forward"}}\n</tool_call>'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Action: go", (None, "Action: go")),  # no block: all content
        ("<think>\nkey ahead\n</think>\n\nAction: go", ("key ahead", "Action: go")),
        ("<think>\n\n</think>\n\nAction: go", ("", "Action: go")),  # Qwen3's empty block
        ("key ahead</think>\nAction: go", ("key ahead", "Action: go")),  # <think> was in the prompt
        ("<think>still thinking", (None, "<think>still thinking")),  # cut off: vLLM leaves it as content
    ],
)
def test_split_reasoning(text: str, expected: tuple[str | None, str]) -> None:
    assert split_reasoning(text) == expected


def test_reply_reasoning_reads_every_field() -> None:
    assert reply_reasoning({"content": "Action: go", "reasoning": "r"}) == ("r", "Action: go")
    assert reply_reasoning({"content": "Action: go", "reasoning_content": "r"}) == ("r", "Action: go")
    assert reply_reasoning({"content": "<think>r</think>Action: go"}) == ("r", "Action: go")
    assert reply_reasoning({"content": None, "tool_calls": []}) == (None, None)
    assert reply_reasoning({"content": "<think>\n\n</think>\n\n"}) == (None, "")


def test_model_server_splits_reasoning_before_parsing_tool_calls() -> None:
    """As vLLM with ``--reasoning-parser qwen3 --tool-call-parser hermes``: a tool call inside the
    reasoning is not a call; the one after it is."""
    text = f"<think>\nmaybe {CALL}\n</think>\n\n{CALL}"
    sample = Sample(token_ids=[1], logprobs=[-0.1], top_logprobs=[], finish_reason="stop", text=text)
    tools = [{"type": "function", "function": {"name": "act", "parameters": {"type": "object"}}}]
    req = ChatRequest(messages=[{"role": "user", "content": "hi"}], tools=tools)
    choice = _choice(0, sample, req, tokenizer=None)
    message = choice["message"]
    assert message["reasoning"] == f"maybe {CALL}" and message["content"] is None
    assert [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]] == [
        {"action": "go forward"}
    ]
    assert choice["finish_reason"] == "tool_calls"
    plain = _choice(
        0, Sample([1], [-0.1], [], "stop", "Action: go"), ChatRequest(messages=req.messages), None
    )
    assert plain["message"]["content"] == "Action: go" and plain["message"]["reasoning"] is None


def test_export_sft_writes_reasoning_where_qwen3s_template_reads_it() -> None:
    session = dict.fromkeys(
        ("session_id", "run_id", "group_id", "group_index", "env_name", "seed", "policy_name", "model"), "x"
    ) | {"achievements": [], "total_reward": 1.0, "stop_reason": "done"}
    prompt = [{"role": "user", "content": "A key is ahead."}]
    for completion in (
        {"role": "assistant", "content": "<think>\nthe key\n</think>\n\nAction: go forward"},
        {"role": "assistant", "content": "Action: go forward", "reasoning": "the key"},
    ):
        turn = {
            "llm": {"error": None, "response": {}, "request": {}},
            "decision_error": None,
            "prompt": prompt,
            "completion": completion,
            "env": {},
            "turn": 0,
            "episode": 0,
        }
        example, reason = build_example(session, turn)
        assert reason is None and example is not None and validate_example(example) == []
        assert example["messages"][-1] == {
            "role": "assistant",
            "content": "Action: go forward",
            "reasoning_content": "the key",
        }
