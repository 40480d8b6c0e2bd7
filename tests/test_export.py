"""SFT export from a trace DB: examples, validation, and filters that really select."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_service.tracing import TraceWriter
from grpo_service.tracing.export import ExportFilters, export_sft, validate_example
from tools.synthetic_traces import synthetic_trace


@pytest.fixture
async def db(tmp_path: Path) -> Path:
    """Six sessions that differ in model, achievements, reward and failures."""
    traces = [
        synthetic_trace("wood", turns=4, unlocks={1: ["collect_wood"]}),
        synthetic_trace("table", turns=5, unlocks={0: ["collect_wood"], 3: ["place_table", "wake_up"]}),
        synthetic_trace("nothing", turns=3),
        synthetic_trace("hurt", turns=3, unlocks={0: ["collect_wood"]}, rewards={1: -2.0}),
        synthetic_trace("other-model", turns=3, model="ft:other", unlocks={0: ["collect_wood"]}),
        synthetic_trace("broke", turns=4, error_turn=2, unlocks={0: ["collect_sapling"]}),
        synthetic_trace("scripted", turns=3, policy_name="crafter-random", unlocks={0: ["collect_wood"]}),
    ]
    path = tmp_path / "task_app_traces_test.db"
    writer = TraceWriter(path)
    await writer.start()
    for trace in traces:
        writer.submit(trace)
    await writer.close()
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_turn_becomes_a_valid_chat_example(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "sft.jsonl"
    report = export_sft(db, out)
    examples = read_jsonl(out)
    assert report.sessions_total == report.sessions_kept == 7
    # 4+5+3+3+3 good turns, 2 before the failure in "broke"; none from the scripted policy.
    assert report.examples == len(examples) == 20
    assert report.turn_skips == {"decision_error:no_tool_call": 1, "no_llm_call": 3}
    for example in examples:
        assert validate_example(example) == []
        messages = example["messages"]
        assert messages[0]["role"] == "system" and messages[-2]["role"] == "user"
        call = messages[-1]["tool_calls"][0]
        assert call["type"] == "function" and json.loads(call["function"]["arguments"])["actions"]
        assert "content" not in messages[-1]  # a tool call with no text carries no null content
        assert example["tools"][0]["function"]["name"] == "interact_many"
    # A later turn's prompt replays earlier turns, tool results answering their tool calls.
    later = next(e for e in examples if e["metadata"]["run_id"] == "table" and e["metadata"]["turn"] == 2)
    roles = [m["role"] for m in later["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "user", "assistant", "tool", "user", "assistant"]
    assert later["messages"][3]["tool_call_id"] == later["messages"][2]["tool_calls"][0]["id"]
    meta = next(e for e in examples if e["metadata"]["run_id"] == "table" and e["metadata"]["turn"] == 3)
    assert meta["metadata"]["achievements_unlocked"] == ["place_table", "wake_up"]
    assert meta["metadata"]["session_achievements"] == ["collect_wood", "place_table", "wake_up"]


@pytest.mark.parametrize(
    ("filters", "runs", "skips"),
    [
        (ExportFilters(model="ft:other"), {"other-model"}, {"model": 6}),
        (ExportFilters(min_achievements=2), {"table"}, {"min_achievements": 6}),
        (
            ExportFilters(require_achievements=["collect_wood"]),
            {"wood", "table", "hurt", "other-model", "scripted"},
            {"require_achievement:collect_wood": 2},
        ),
        (
            ExportFilters(require_achievements=["collect_wood", "wake_up"]),
            {"table"},
            {"require_achievement:collect_wood": 2, "require_achievement:wake_up": 4},
        ),
        (
            ExportFilters(min_reward=1.0),
            {"wood", "table", "other-model", "broke", "scripted"},
            {"min_reward": 2},
        ),
        (ExportFilters(limit=2), {"wood", "table"}, {"limit": 5}),
        (
            ExportFilters(model="fake-qwen3", min_achievements=1, limit=1),
            {"wood"},
            {"model": 2, "min_achievements": 1, "limit": 3},  # the scripted session has no model
        ),
    ],
)
def test_filters_select_sessions(
    db: Path, tmp_path: Path, filters: ExportFilters, runs: set[str], skips: dict[str, int]
) -> None:
    out = tmp_path / "sft.jsonl"
    report = export_sft(db, out, filters)
    exported = {e["metadata"]["run_id"] for e in read_jsonl(out)}
    assert exported == runs - {"scripted"}  # the scripted session is kept but has no LLM turns
    assert dict(report.session_skips) == skips
    assert report.sessions_kept == len(runs)


def test_filters_that_match_nothing_write_an_empty_file(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "sft.jsonl"
    report = export_sft(db, out, ExportFilters(require_achievements=["collect_diamond"]))
    assert out.read_text() == "" and report.examples == 0
    assert report.session_skips == {"require_achievement:collect_diamond": 7}


def _example(**changes: object) -> dict:
    base = {
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            {"role": "user", "content": "u2"},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "t", "arguments": '{"actions": ["do"]}'},
                    }
                ],
            },
        ]
    }
    base.update(changes)
    return base


def test_validation_catches_what_fine_tuning_would_reject() -> None:
    assert validate_example(_example()) == []
    ex = _example()
    ex["messages"][1]["role"] = "observer"
    assert validate_example(ex) == ["bad_role"]
    ex = _example()
    ex["messages"][3]["tool_call_id"] = "nope"
    assert validate_example(ex) == ["tool_without_call"]
    ex = _example()
    ex["messages"][-1]["tool_calls"][0]["function"]["arguments"] = {"actions": ["do"]}
    assert validate_example(ex) == ["arguments_not_string"]
    ex = _example()
    ex["messages"][-1]["tool_calls"][0]["function"]["arguments"] = "{actions: do"
    assert validate_example(ex) == ["arguments_not_json"]
    ex = _example(tools=[{"type": "function", "function": {"name": "t"}}])
    ex["messages"][-1] = {"role": "assistant", "content": "just text"}
    assert validate_example(ex) == ["last_not_tool_call"]  # offered tools, it must call one
    ex["messages"][-1] = {"role": "user", "content": "u3"}
    assert validate_example(ex) == ["last_not_assistant"]
    text_format = {
        "messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "Action: go"}]
    }
    assert validate_example(text_format) == []  # agentgym's format: the reply is text
    text_format["messages"][-1]["content"] = " "
    assert validate_example(text_format) == ["last_reply_empty"]
    ex = _example()
    ex["messages"][1]["content"] = None
    assert validate_example(ex) == ["content_not_string"]
    assert validate_example({"messages": []}) == ["empty_messages"]
