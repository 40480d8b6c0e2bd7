"""Token-in/token-out rollouts: an episode played as one token stream against serve-model (a tiny
model made here) and the fake, and the trainer's one-pass recomputation of the whole stream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from grpo_service import create_app
from grpo_service.models import RolloutGroupResponse, RolloutResponse
from grpo_service.tracing import TraceReader
from grpo_service.tracing.export import ExportFilters, export_sft
from inference.reasoning import split_reasoning
from inference.tool_calls import parse_tool_calls
from tests.conftest import MODEL, make_settings
from tests.llm_helpers import make_tiny_model
from tests.test_llm_loop import wait_for_runs
from tools.fake_server import FakeInferenceServer
from tools.server_thread import ServerThread
from training.llm.config import RLConfig
from training.llm.logprobs import TokenBatch, token_logprobs
from training.llm.model import load
from training.llm.rl import StreamSample, build_batch, update
from training.llm.server import ModelEngine, create_model_app
from training.llm.sft import load_examples
from training.llm.streams import TokenStream

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("streams") / "model", max_positions=4096)


@pytest.fixture(scope="module")
def stack(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    torch.set_num_threads(1)
    engine = ModelEngine(model_dir, served_name="tiny")
    with ServerThread(create_model_app(engine), name="model-server") as served:
        root = tmp_path_factory.mktemp("app")
        settings = make_settings(
            root, vllm_base_url=served.base_url, default_model="tiny", trace_db=root / "traces.db"
        )
        with ServerThread(create_app(settings), name="task-app") as app:
            yield {"app": app.base_url, "engine": engine, "model": served.base_url, "db": root / "traces.db"}
    engine.close()


def rollout(stack: dict[str, Any], model_dir: Path, turns: int, **config: Any) -> dict[str, Any]:
    body = {
        "env": {"env_name": "babyai", "seed": 4},
        "policy": {
            "policy_name": "babyai-agent",
            "config": {"tokenizer": str(model_dir), "max_tokens": 6, "temperature": 1.0, "seed": 5, **config},
        },
        "max_turns": turns,
        "on_done": "terminate",
    }
    r = httpx.post(f"{stack['app']}/rollout", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def check_stream_extends(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Every prompt starts with the last prompt + completion; the streams hold each step."""
    (trajectory,) = result["trajectories"]
    steps = trajectory["steps"]
    previous: list[int] | None = None
    for step in steps:
        llm = step["llm"]
        if previous is not None:
            assert llm["prompt_token_ids"][: len(previous)] == previous, step["turn"]
        previous = llm["prompt_token_ids"] + llm["completion_token_ids"]
    (stream,) = trajectory["streams"]
    assert stream["token_ids"] == previous
    assert [s["turn"] for s in stream["spans"]] == [s["turn"] for s in steps]
    for span, step in zip(stream["spans"], steps, strict=True):
        assert stream["token_ids"][span["start"] : span["end"]] == step["llm"]["completion_token_ids"]
        assert stream["logprobs"][span["start"] : span["end"]] == step["llm"]["completion_logprobs"]
        assert set(stream["sampled"][span["start"] : span["end"]]) == {1}
    assert sum(stream["sampled"]) == sum(len(s["llm"]["completion_token_ids"]) for s in steps)
    assert result["metrics"]["stream_segments"] == 1
    return trajectory["streams"]


def worst_logprob_gap(model: Any, stream: dict[str, Any]) -> float:
    """One fp32 forward over the whole stream against every sampled token's sampler logprob."""
    parsed = TokenStream.from_json(stream)
    batch = TokenBatch.from_rows([parsed.token_ids], [[float(m) for m in parsed.sampled]], 0)
    with torch.no_grad():
        lp = token_logprobs(model, batch)[0]
    sampled = torch.tensor(parsed.sampled, dtype=torch.bool)
    return float((lp[sampled] - torch.tensor(parsed.logprobs)[sampled]).abs().max())


def test_a_20_turn_episode_is_one_stream_the_trainer_reproduces(
    stack: dict[str, Any], model_dir: Path, tmp_path: Path
) -> None:
    result = rollout(stack, model_dir, 20)
    (stream,) = check_stream_extends(result)
    assert len(stream["spans"]) == 20 and result["metrics"]["num_decisions"] == 20
    # A tiny random model rarely stops by itself: cut turns go on in the same stream.
    assert any(s["finish_reason"] == "length" for s in stream["spans"])
    model, _ = load(model_dir)
    assert worst_logprob_gap(model, stream) <= TOLERANCE
    # Held after a weight sync: other weights served, the same check against them.
    other = make_tiny_model(tmp_path / "other", seed=1, max_positions=4096)
    stack["engine"].reload_weights(other)
    try:
        (stream,) = check_stream_extends(rollout(stack, model_dir, 20))
        assert worst_logprob_gap(load(other)[0], stream) <= TOLERANCE
    finally:
        stack["engine"].reload_weights(model_dir)


@pytest.mark.parametrize("prompt_format", ["agentgym", "tool_calls"])
def test_the_trainer_trains_one_sequence_per_stream(
    stack: dict[str, Any], model_dir: Path, prompt_format: str
) -> None:
    results = [rollout(stack, model_dir, 4, prompt_format=prompt_format, seed=s) for s in (1, 2)]
    for result in results:
        check_stream_extends(result)
    group = {
        "members": [
            {"group_index": i, "run_id": r["run_id"], "status": r["status"], "result": r}
            for i, r in enumerate(results)
        ]
    }
    # Rewards differ only by the format penalty: a tiny model's invalid replies still give signal.
    config = RLConfig(
        model=str(model_dir),
        task_app_url="http://127.0.0.1:1",
        model_server_url="http://127.0.0.1:1",
        env_name="babyai",
        policy_name="babyai-agent",
        max_turns=4,
        format_penalty=1.0,
        kl_coef=0.01,
    )
    batch = build_batch([group], config, version=0)
    assert batch.samples and all(isinstance(s, StreamSample) for s in batch.samples)
    assert batch.stats["streams"] == 2 and batch.stats["decisions_without_tokens"] == 0
    flat = config.model_copy(update={"format_penalty": 0.0, "kl_coef": 0.0})  # equal rewards
    assert not build_batch([group], flat, version=0).samples  # no signal, no sample
    kept = build_batch([group], flat, version=0, keep_zero_advantage=True)  # a counting consumer
    assert len(kept.samples) == 2 and not any(any(s.train.advantages) for s in kept.samples)
    model, tokenizer = load(model_dir)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    metrics = update(model, None, optimizer, batch.samples, config, 0)
    assert metrics["logprob_max_abs_diff"] <= TOLERANCE
    assert metrics["sequences"] == 2
    streams = [r["trajectories"][0]["streams"][0] for r in results]
    assert metrics["forward_tokens"] == sum(len(s["token_ids"]) for s in streams)
    per_decision = build_batch([group], config.model_copy(update={"sequences": "decision"}), version=0)
    assert len(per_decision.samples) == 8
    assert (
        sum(len(s.prompt_ids) + len(s.completion_ids) for s in per_decision.samples)
        > metrics["forward_tokens"]
    )


def test_the_trace_keeps_the_stream_and_export_and_sft_read_it(
    stack: dict[str, Any], model_dir: Path, tmp_path: Path
) -> None:
    result = rollout(stack, model_dir, 3, seed=9)
    (stream,) = check_stream_extends(result)
    wait_for_runs(stack["db"], {result["run_id"]})
    with TraceReader(stack["db"]) as reader:
        (session_id,) = reader.session_ids(result["run_id"])
        (traced,) = reader.streams(session_id)
        # The per-decision view stays: each turn's call as it was.
        assert [t["llm"]["completion_token_ids"] for t in reader.turns(session_id)] == [
            s["llm"]["completion_token_ids"] for s in result["trajectories"][0]["steps"]
        ]
    assert {k: traced[k] for k in stream} == stream
    out = tmp_path / "streams.jsonl"
    report = export_sft(stack["db"], out, ExportFilters(run_ids=[result["run_id"]]), streams=True)
    assert report.examples == 1, report.as_dict()
    (line,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert line["token_ids"] == stream["token_ids"] and line["sampled"] == stream["sampled"]
    examples, skipped = load_examples(out, load(model_dir)[1], 4096)
    assert not skipped and examples[0].input_ids == stream["token_ids"]
    assert examples[0].assistant_mask == stream["sampled"]


@pytest.mark.parametrize("prompt_format", ["agentgym", "tool_calls"])
def test_the_oracle_teacher_plays_streams_that_export_as_sft_data(
    stack: dict[str, Any], model_dir: Path, tmp_path: Path, prompt_format: str
) -> None:
    """`teacher: oracle` with a tokenizer: each reply is a span of the episode's stream, the tokens a
    model would write after the generation prompt (Qwen3's empty think block, the action, the
    end-of-turn token), logprobs 0; `export-sft --streams` turns them into SFT lines."""
    config = {"tokenizer": str(model_dir), "teacher": "oracle", "prompt_format": prompt_format}
    body = {
        "env": {"env_name": "babyai", "seed": 5, "config": {"oracle": True}},
        "policy": {"policy_name": "babyai-agent", "config": config},
        "max_turns": 4,
        "on_done": "terminate",
    }
    r = httpx.post(f"{stack['app']}/rollout", json=body, timeout=300)
    assert r.status_code == 200, r.text
    result = r.json()
    (stream,) = check_stream_extends(result)
    assert len(stream["spans"]) == 4 and set(stream["logprobs"]) == {0.0}
    tokenizer = load(model_dir)[1]
    for span, step in zip(stream["spans"], result["trajectories"][0]["steps"], strict=True):
        reply = tokenizer.decode(stream["token_ids"][span["start"] : span["end"]])
        reasoning, text = split_reasoning(reply.removesuffix("<|im_end|>"))
        assert reply.startswith("<think>\n\n</think>\n\n") and reply.endswith("<|im_end|>") and not reasoning
        action = step["tool_calls"][0]["args"]["action"]
        if prompt_format == "agentgym":
            assert text == f"Action: {action}"
        else:
            assert parse_tool_calls(text)[1][0]["function"]["arguments"] == json.dumps({"action": action})
    wait_for_runs(stack["db"], {result["run_id"]})
    out = tmp_path / "oracle.jsonl"
    filters = ExportFilters(model="oracle", run_ids=[result["run_id"]])
    report = export_sft(stack["db"], out, filters, streams=True)
    assert report.examples == 1, report.as_dict()
    (line,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert line["token_ids"] == stream["token_ids"] and line["sampled"] == stream["sampled"]


# ---- every env, every path, against the fake (its toy tokenizer) ----------------------------

ENV_CASES = [
    ("crafter", "crafter-react", "tool_calls"),
    ("textcraft", "textcraft-agent", "agentgym"),
    ("textcraft", "textcraft-agent", "tool_calls"),
    ("babyai", "babyai-agent", "agentgym"),
    ("sciworld", "sciworld-agent", "tool_calls"),
]


def streams_of(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for t in result["trajectories"] for s in t["streams"]]


def test_every_env_and_path_plays_streams_against_the_fake(
    client: httpx.Client, fake_llm: FakeInferenceServer
) -> None:
    for env, policy, prompt_format in ENV_CASES:
        config = {"model": MODEL, "tokenizer": "toy", "prompt_format": prompt_format}
        spec = {"env": {"env_name": env, "seed": 2}, "policy": {"policy_name": policy, "config": config}}
        r = client.post("/rollout", json={**spec, "max_turns": 3})
        assert r.status_code == 200, (env, r.text)
        assert r.content == RolloutResponse.model_validate_json(r.content).model_dump_json().encode()
        result = r.json()
        (stream,) = streams_of(result)
        assert len(stream["spans"]) == result["metrics"]["num_decisions"] == 3, (env, prompt_format)
        assert stream["start_reason"] == "start" and stream["end_reason"] == result["stop_reason"]
    # A group, and a forking group: each continuation's stream holds its parent's tokens unsampled.
    spec = {
        "env": {"env_name": "crafter", "seed": 5},
        "policy": {"policy_name": "crafter-react", "config": {"model": MODEL, "tokenizer": "toy"}},
        "max_turns": 4,
        "group_size": 2,
    }
    for fork in (None, {"at_turns": [2], "continuations": 2}):
        r = client.post("/rollout/group", json={**spec, **({"fork": fork} if fork else {})})
        assert r.status_code == 200, r.text
        assert r.content == RolloutGroupResponse.model_validate_json(r.content).model_dump_json().encode()
        members = [m["result"] for m in r.json()["members"]]
        assert len(members) == (6 if fork else 2)
        for result in members:
            (stream,) = streams_of(result)
            turns = [s["turn"] for s in stream["spans"]]
            assert turns == [s["turn"] for t in result["trajectories"] for s in t["steps"]]
            if result.get("fork_turn"):
                assert turns[0] == 2 and sum(stream["sampled"][: stream["spans"][0]["start"]]) == 0
    # The batch API.
    body = {
        "env": "textcraft",
        "model": MODEL,
        "base_url": fake_llm.base_url,
        "ids": [0, 1],
        "max_round": 2,
    }
    r = client.post("/rollouts", json={**body, "policy_config": {"tokenizer": "toy"}})
    assert r.status_code == 200, r.text
    for result in r.json()["results"]:
        assert result["error"] is None and len(result["streams"]) == 1, result


def test_streams_end_cleanly_at_the_context_limit_and_an_invalid_reply(
    client: httpx.Client, fake_llm: FakeInferenceServer
) -> None:
    def play(turns: int, **config: Any) -> dict[str, Any]:
        policy = {"model": MODEL, "tokenizer": "toy", "max_tokens": 16, **config}
        body = {
            "env": {"env_name": "textcraft", "seed": 1},
            "policy": {"policy_name": "textcraft-agent", "config": policy},
            "max_turns": turns,
        }
        r = client.post("/rollout", json=body)
        assert r.status_code == 200, r.text
        return r.json()

    first = play(1)["trajectories"][0]["steps"][0]["llm"]
    room = len(first["prompt_token_ids"]) + len(first["completion_token_ids"]) + 80
    original = fake_llm.state.config
    fake_llm.set_config(original.model_copy(update={"max_model_len": room}))
    try:
        # The stream outgrows the context: it ends there, and a new segment starts from the
        # conversation as the template renders it (one turn of history).
        result = play(6, history_window=1)
        streams = streams_of(result)
        assert len(streams) >= 2 and result["metrics"]["stream_segments"] == len(streams)
        assert streams[0]["end_reason"] == streams[1]["start_reason"] == "context_limit"
        assert sum(len(s["spans"]) for s in streams) == 6
        # A history that never fits again ends the episode, its stream with the rollout's reason.
        result = play(6)
        assert result["stop_reason"] == "policy_error:inference_bad_request"
        assert streams_of(result)[-1]["end_reason"] == result["stop_reason"]
    finally:
        fake_llm.set_config(original)
    # An invalid reply that ends the episode (the fake writes no 'Action:' line) ends the stream.
    result = play(3, on_invalid_reply="end")
    (stream,) = streams_of(result)
    assert result["stop_reason"] == stream["end_reason"] == "policy_error:no_action"


def test_where_qwen3s_template_renders_history_differently(stack: dict[str, Any], model_dir: Path) -> None:
    """With thinking off, Qwen3's template pre-fills an empty <think> block for the reply and drops
    it from the turns before: a re-rendered prompt never extends the last one. The exact stream
    goes on and counts it; `segment` starts a new segment at every such turn."""
    exact = rollout(stack, model_dir, 3, enable_thinking=False)
    check_stream_extends(exact)
    assert exact["metrics"]["template_differs"] == 2
    segment = rollout(stack, model_dir, 3, enable_thinking=False, token_stream="segment")
    streams = segment["trajectories"][0]["streams"]
    assert segment["metrics"]["stream_segments"] == len(streams) == 3
    assert [s["start_reason"] for s in streams] == ["start", "template_differs", "template_differs"]
    assert streams[0]["end_reason"] == "template_differs"


def test_tree_advantages_reach_each_span_of_a_stream(client: httpx.Client) -> None:
    """A forking group played as streams: a root's stream is cut by its fork turn into stretches,
    each span trained with its stretch's advantage; a continuation's stream trains only its own."""
    body = {
        "env": {"env_name": "crafter", "seed": 7},
        "policy": {
            "policy_name": "crafter-react",
            "config": {"model": MODEL, "tokenizer": "toy", "temperature": 1.0},
        },
        "max_turns": 4,
        "group_size": 2,
        "fork": {"at_turns": [2], "continuations": 2},
    }
    r = client.post("/rollout/group", json=body)
    assert r.status_code == 200, r.text
    config = RLConfig(
        model="m",
        env_name="crafter",
        policy_name="crafter-react",
        max_turns=4,
        advantage="tree",
        fork={"at_turns": [2], "continuations": 2},
        scale_by_std=False,
        format_penalty=1.0,
        kl_coef=0.01,
    )
    group = r.json()
    batch = build_batch([group], config, version=0)
    decisions = build_batch([group], config.model_copy(update={"sequences": "decision"}), version=0)
    assert len(batch.samples) == 6 and batch.stats["streams"] == 6
    expected = {(s.run_id, s.turn): s.advantage for s in decisions.samples}
    members = {m["run_id"]: m["result"] for m in group["members"]}
    for sample in batch.samples:
        (stream,) = members[sample.run_id]["trajectories"][0]["streams"]
        for span in stream["spans"]:
            values = set(sample.train.advantages[span["start"] : span["end"]])
            assert values == {expected[(sample.run_id, span["turn"])]}
        own = sum(span["end"] - span["start"] for span in stream["spans"])
        assert sum(sample.train.mask) == own  # a continuation's copied prefix is not trained again
