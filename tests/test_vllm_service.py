"""The task app and the trainer against the real vLLM server (CPU build), every way a trainer
collects data: `/rollout` (seed 000's example), `/rollout/group` in `rl` mode, seed 003's
`/rollouts`, `eval` and `export-sft`; tool calls parsed by vLLM's Hermes parser and by the text
format; logprob fidelity and weight sync; GRPO with vLLM as the sampler; and vLLM failing (an
overlong prompt, a hung server, an abort, a server gone mid-rollout and back).

The tests share the session's vLLM (`real_vllm`); those that load other weights into it load the
original ones back. None stops it: a server gone and back is a TCP proxy in front of it, cut and
restored.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import torch

import grpo_service.cli  # noqa: F401  (first: grpo_service.client.eval and the CLI import each other)
from grpo_service.client.eval import EvalConfig, run_eval
from grpo_service.tracing import TraceReader
from grpo_service.tracing.export import ExportFilters, export_sft
from grpo_service.training_api.llm_jobs import TaskAppGroups
from tests.tcp_proxy import TcpProxy
from tests.test_llm_loop import wait_for_runs
from tests.vllm_helpers import SERVED, RealVLLM
from tools.server_thread import ServerThread
from training.llm.config import RLConfig, SFTConfig
from training.llm.logprobs import completion_logprobs
from training.llm.model import load
from training.llm.rl import train_rl
from training.llm.sft import train_sft
from training.llm.weight_sync import WeightSync

FIDELITY_BOUND = 1e-4  # measured here: about 3e-6 (fp32, docs/training.md)
SHORT = {"max_tokens": 24, "temperature": 1.0}


@pytest.fixture(scope="module")
def task_app(
    real_vllm: RealVLLM, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerThread, Path]]:
    from grpo_service import create_app
    from tests.conftest import make_settings

    root = tmp_path_factory.mktemp("vllm-task-app")
    db = root / "traces.db"
    settings = make_settings(root, trace_db=db, vllm_base_url=real_vllm.base_url, default_model=SERVED)
    with ServerThread(create_app(settings), name="task-app") as server:
        yield server, db


@pytest.fixture(scope="module")
def sync(real_vllm: RealVLLM) -> Iterator[WeightSync]:
    """The trainer's handle on the session's vLLM; its original weights are loaded back after."""
    handle = WeightSync(real_vllm.base_url)
    yield handle
    if real_vllm.server.healthy():
        handle.load(real_vllm.checkpoint, 0)


def post(server: ServerThread, path: str, body: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
    r = httpx.post(f"{server.base_url}{path}", json=body, timeout=timeout)
    assert r.status_code == 200, r.text
    return r.json()


def decisions(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for t in result["trajectories"] for s in t["steps"] if s.get("llm")]


def assert_vllm_tokens(step: dict[str, Any]) -> None:
    """The step carries vLLM's token ids with one logprob (a probability's log) per completion id."""
    llm = step["llm"]
    ids, logprobs = llm["completion_token_ids"], llm["completion_logprobs"]
    assert llm["prompt_token_ids"] and ids and len(ids) == len(logprobs)
    assert all(lp <= 0 for lp in logprobs)


# ---------------------------------------------------------------------------------- rollouts


def test_rollout_and_rl_group_record_vllms_own_tokens(task_app, real_vllm: RealVLLM) -> None:
    server, db = task_app
    _, tokenizer = load(real_vllm.checkpoint)
    # Seed 000's example: crafter-react plays (one tool: vLLM guides the call, tool_choice named).
    rollout = post(
        server,
        "/rollout",
        {
            "run_id": "vllm-rollout",
            "env": {"env_name": "crafter", "seed": 42},
            "policy": {"policy_name": "crafter-react", "config": SHORT},
            "max_turns": 3,
            "record": {"logprobs": True},
        },
    )
    steps = decisions(rollout)
    assert steps, rollout
    for step in steps:
        assert_vllm_tokens(step)
        assert step["llm"]["model"] == SERVED

    # A GRPO group in rl mode: G members from one state, tokens, logprobs and the weights version.
    group = post(
        server,
        "/rollout/group",
        {
            "group_size": 3,
            "env": {"env_name": "babyai", "seed": 5},
            "policy": {"policy_name": "babyai-agent", "config": SHORT},
            "max_turns": 3,
            "mode": "rl",
            "weights_version": 0,
        },
    )
    members = [m["result"] for m in group["members"]]
    assert [m["status"] for m in group["members"]] == ["completed"] * 3
    firsts = [decisions(m)[0] for m in members]
    assert len({f["llm"]["prompt_token_ids"].__repr__() for f in firsts}) == 1  # one start state
    for member in members:
        for step in decisions(member):
            assert_vllm_tokens(step)
            assert step["llm"]["weights_version"] == 0

    # The trace keeps the same tokens, and the prompt ids are the chat template's.
    wait_for_runs(db, {"vllm-rollout"})
    with TraceReader(db) as reader:
        (session,) = reader.session_ids("vllm-rollout")
        turn = reader.turns(session)[0]
    assert turn["llm"]["completion_token_ids"] == steps[0]["llm"]["completion_token_ids"]
    request = turn["llm"]["request"]
    text = tokenizer.apply_chat_template(
        [{k: v for k, v in m.items() if v is not None} for m in turn["prompt"]],
        tools=request.get("tools"),
        add_generation_prompt=True,
        tokenize=False,
    )
    assert tokenizer.encode(text, add_special_tokens=False) == turn["llm"]["prompt_token_ids"]


def test_batch_rollouts_and_eval_against_vllm(task_app, real_vllm: RealVLLM) -> None:
    server, _ = task_app
    batch = post(
        server,
        "/rollouts",
        {
            "env": "textcraft",
            "model": SERVED,
            "base_url": real_vllm.base_url,
            "ids": [0, 1],
            "max_round": 3,
            "max_tokens": 24,
        },
    )
    assert batch["failed"] == 0 and batch["completed"] == 2
    for result in batch["results"]:
        assert result["turns"], result
        for turn in result["turns"]:
            assert turn["prompt_token_ids"] and len(turn["completion_token_ids"]) == len(
                turn["completion_logprobs"]
            )

    config = EvalConfig(
        base_url=server.base_url,
        model=SERVED,
        env_name="babyai",
        max_turns=2,
        seeds=[1, 2],
        policy_config=SHORT,
    )
    results = asyncio.run(run_eval(config))
    assert len(results) == 2 and all(r.returned for r in results)


# ------------------------------------------------------------------- fidelity and weight sync


def sampled(base_url: str, seed: int) -> tuple[list[int], list[int], list[float]]:
    body = {
        "model": SERVED,
        "messages": [{"role": "user", "content": f"Describe the room, version {seed}."}],
        "max_tokens": 24,
        "temperature": 1.0,
        "seed": seed,
        "logprobs": True,
        "return_token_ids": True,
    }
    answer = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120).json()
    choice = answer["choices"][0]
    logprobs = [e["logprob"] for e in choice["logprobs"]["content"]]
    return answer["prompt_token_ids"], choice["token_ids"], logprobs


def worst_gap(model: Any, samples: list[tuple[list[int], list[int], list[float]]]) -> float:
    worst = 0.0
    for prompt, completion, logprobs in samples:
        mine = completion_logprobs(model, [prompt], [completion], 0)[0]
        worst = max(worst, max(abs(a - b) for a, b in zip(mine, logprobs, strict=True)))
    return worst


def test_logprobs_match_the_trainer_before_and_after_a_weight_sync(
    real_vllm: RealVLLM, sync: WeightSync, tmp_path: Path
) -> None:
    from tests.vllm_helpers import make_vllm_checkpoint

    torch.set_num_threads(1)
    start, _ = load(real_vllm.checkpoint)
    before = [sampled(real_vllm.base_url, s) for s in range(4)]
    gap_before = worst_gap(start, before)

    other_dir = make_vllm_checkpoint(tmp_path / "other", seed=1)  # same shape, other weights
    seconds = sync.load(other_dir, 1)
    assert sync.version() == "1" and seconds < 30
    other, _ = load(other_dir)
    after = [sampled(real_vllm.base_url, s) for s in range(4)]
    gap_after = worst_gap(other, after)
    gap_stale = worst_gap(start, after)  # scoring the new samples with the old weights
    print(f"vLLM vs trainer logprobs: max |diff| {gap_before:.2e} before, {gap_after:.2e} after a sync")
    assert gap_before < FIDELITY_BOUND and gap_after < FIDELITY_BOUND
    assert gap_stale > 100 * FIDELITY_BOUND  # the new weights were really in use
    sync.load(real_vllm.checkpoint, 0)


def test_a_stream_of_groups_spans_weight_pushes_each_span_tagged_with_the_weights_that_sampled_it(
    task_app, real_vllm: RealVLLM, sync: WeightSync, tmp_path: Path
) -> None:
    """`/rollout/stream` of token streams against vLLM: version 1 (other weights) is pushed while
    groups play, so an episode's stream holds spans of versions 0 and 1, and the trainer's
    `span_fidelity` (each version's weights over the whole stream, compared on that version's
    spans) matches every span vLLM sampled to 1e-5; then version 3 (the start weights again) makes
    the groups begun under 1 too stale (max_staleness 1): they are restarted from their seeds, and
    fresh ones delivered."""
    from tests.test_rollout_stream import member_versions, wait_until_sampling
    from tests.vllm_helpers import make_vllm_checkpoint
    from training.llm.rl import build_batch
    from training.llm.rl_async import span_fidelity

    server, _ = task_app
    torch.set_num_threads(1)
    weights = tmp_path / "weights"  # the versions the trainer keeps: step-V
    other_dir = make_vllm_checkpoint(weights / "step-1", seed=1)
    (weights / "step-0").symlink_to(real_vllm.checkpoint)
    # exact token streams: the policy renders the between-turn tokens with the served tokenizer
    policy_config = {**SHORT, "tokenizer": str(real_vllm.checkpoint)}
    body = {
        "group": {
            "group_size": 2,
            "env": {"env_name": "babyai", "seed": 11},
            "policy": {"policy_name": "babyai-agent", "config": policy_config},
            # long enough that a group is still playing when the push lands (a quiet vLLM
            # answers these 24-token turns in tens of ms)
            "max_turns": 30,
            "record": {"logprobs": True},
        },
        "in_flight": 2,
        "max_staleness": 1,
        "stale_policy": "restart",
    }
    with httpx.Client(base_url=server.base_url, timeout=300) as client:
        sid = client.post("/rollout/stream", json=body).json()["stream_id"]

        def push(weights: Path, version: int) -> None:
            note = lambda: client.post(f"/rollout/stream/{sid}/version", json={"weights_version": version})  # noqa: E731
            sync.load(weights, version, before_resume=note)

        def take(count: int) -> list[dict[str, Any]]:
            groups: list[dict[str, Any]] = []
            while len(groups) < count:
                taken = client.post(f"/rollout/stream/{sid}/take", json={"max_groups": count, "wait_s": 60})
                groups += taken.json()["groups"]
            return groups

        try:
            wait_until_sampling(client, sid)
            push(other_dir, 1)
            first = take(2)
            wait_until_sampling(client, sid)
            push(real_vllm.checkpoint, 3)  # two versions on: every group begun under 1 is too stale
            later = take(2)
            final = client.get(f"/rollout/stream/{sid}/status").json()
        finally:
            client.delete(f"/rollout/stream/{sid}")
            sync.load(real_vllm.checkpoint, 0)

    spanning = [g for g in first if g["oldest_version"] == 0 and g["newest_version"] == 1]
    assert spanning, [(g["oldest_version"], g["newest_version"]) for g in first]
    members = [m for taken in first + later for m in taken["group"]["members"] if m.get("result")]
    for member in members:
        assert member_versions(member) == sorted(member_versions(member))
    streams = [s for m in members for t in m["result"]["trajectories"] for s in t["streams"]]
    assert any(len({span["weights_version"] for span in s["spans"]}) == 2 for s in streams)
    # The trainer at version 3 (the start weights live), versions 0 and 1 on disk; a bound and a
    # KL term wide enough that every span is trained on, so every span is checked.
    config = RLConfig(
        model=str(real_vllm.checkpoint),
        task_app_url=server.base_url,
        model_server_url=real_vllm.base_url,
        env_name="babyai",
        policy_name="babyai-agent",
        max_turns=30,
        max_staleness=3,
        kl_coef=0.01,
    )
    batch = build_batch([taken["group"] for taken in first + later], config, 3)
    worst, checked = span_fidelity(batch.samples, 3, load(real_vllm.checkpoint)[0], weights, 0)
    print(
        f"token streams against vLLM: worst per-span gap {worst:.2e}, {checked}; counters {final['counters']}"
    )
    # Every span checked: one read after a push it crossed is scored under both versions.
    assert checked["fidelity_checked_spans"] == sum(len(s["spans"]) for s in streams), checked
    assert set(checked) <= {"fidelity_checked_spans", "fidelity_crossed_spans"}, checked
    assert worst <= 1e-5
    assert all(g["oldest_version"] >= 1 for g in later) and final["counters"]["restarted_stale"] >= 1


# ------------------------------------------------ a distilled model: tool calls, export, GRPO


@pytest.fixture(scope="module")
def distilled(task_app, real_vllm: RealVLLM, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The vLLM checkpoint after a short SFT on BabyAI's scripted solver (`teacher: oracle`) in the
    tool-calling format: a model that writes Hermes tool calls."""
    server, db = task_app
    root = tmp_path_factory.mktemp("distilled")
    teacher = {"prompt_format": "tool_calls", "teacher": "oracle"}
    for k in range(8):  # BabyAI task 40k + 1: GoToRedBall, reset seed k
        post(
            server,
            "/rollout/group",
            {
                "group_size": 1,
                "env": {"env_name": "babyai", "seed": 40 * k + 1, "config": {"oracle": True}},
                "policy": {"policy_name": "babyai-agent", "config": teacher},
                "max_turns": 4,
                "on_done": "terminate",
            },
        )
    for _ in range(100):
        with TraceReader(db) as reader:
            if sum(s["model"] == "oracle" for s in reader.sessions()) >= 8:
                break
        time.sleep(0.1)
    report = export_sft(db, root / "oracle.jsonl", ExportFilters(model="oracle"))
    assert report.examples >= 8, report.as_dict()
    torch.set_num_threads(1)
    result = train_sft(
        SFTConfig(
            model=str(real_vllm.checkpoint),
            out=str(root / "sft"),
            dataset=str(root / "oracle.jsonl"),
            # 112 steps of 2 examples: the format is learnt (loss ~0.2) at a fifth of the tokens
            # of 40 epochs in batches of 8
            epochs=16,
            batch_size=2,
            lr=5e-3,
            save_every=10_000,
        )
    )
    assert result["last_loss"] < result["first_loss"], result
    return Path(result["final"])


@pytest.mark.timeout(900)  # a short SFT on 2 cores (its fixture)
def test_a_distilled_model_through_vllms_hermes_parser_and_export(
    task_app, real_vllm: RealVLLM, sync: WeightSync, distilled: Path, tmp_path: Path
) -> None:
    server, db = task_app
    sync.load(distilled, 0)
    # tool_choice auto: the reply's <tool_call> block is parsed by vLLM's hermes parser.
    auto = {
        "prompt_format": "tool_calls",
        "temperature": 0.0,
        "max_tokens": 48,
        "extra_body": {"tool_choice": "auto"},
    }
    group = post(
        server,
        "/rollout/group",
        {
            "group_id": "vllm-hermes",
            "group_size": 2,
            "env": {"env_name": "babyai", "seed": 40 * 20 + 1},
            "policy": {"policy_name": "babyai-agent", "config": auto},
            "max_turns": 4,
            "mode": "rl",
        },
    )
    steps = [s for m in group["members"] for s in decisions(m["result"])]
    parsed = [s for s in steps if not s.get("decision_error")]
    assert parsed, [s.get("decision_error_detail") for s in steps]
    for step in parsed:
        assert step["llm"]["finish_reason"] == "tool_calls"  # vLLM's parser found the call
        assert step["tool_calls"][0]["tool"] == "act"

    # export-sft keeps the decisions vLLM sampled and the env executed.
    run_ids = {m["run_id"] for m in group["members"]}
    wait_for_runs(db, run_ids)
    report = export_sft(db, tmp_path / "vllm.jsonl", ExportFilters(model=SERVED))
    assert report.examples >= len(parsed), report.as_dict()
    example = json.loads((tmp_path / "vllm.jsonl").read_text().splitlines()[0])
    assert example["messages"][-1]["tool_calls"][0]["function"]["name"] == "act"

    sync.load(real_vllm.checkpoint, 0)


def test_grpo_with_vllm_as_the_sampler(
    task_app, real_vllm: RealVLLM, sync: WeightSync, tmp_path: Path
) -> None:
    """New weights reach the running vLLM after each update (no restart), every rollout records
    the version that sampled it, and vLLM's logprobs are the trainer's. AgentGym's text format:
    with tools, vLLM 0.32 grammar-masks the call it samples and reports the masked logprobs
    (docs/training.md, "Guided decoding is another policy"); a KL term gives the untrained model's
    all-equal groups a gradient."""
    server, _ = task_app
    config = RLConfig(
        model=str(real_vllm.checkpoint),
        out=str(tmp_path / "rl"),
        task_app_url=server.base_url,
        model_server_url=real_vllm.base_url,
        env_name="babyai",
        policy_name="babyai-agent",
        policy_config={"temperature": 1.5, "max_tokens": 24},
        seeds=[40 * 21 + 1, 40 * 22 + 1],
        steps=2,
        groups_per_step=2,
        group_size=3,
        max_turns=2,
        lr=1e-3,
        kl_coef=0.05,
        save_every=10,
    )
    result = train_rl(config, task_app=TaskAppGroups(server.base_url))
    rows = [json.loads(x) for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "loss" in r]
    assert len(trained) == 2, rows
    assert result["weights_version_last"] == 2 and sync.version() == "2"
    for r in trained:
        assert r["logprob_max_abs_diff"] < FIDELITY_BOUND, r
        assert r["weight_sync_s"] < 30
        assert r["streams"] == r["sequences"] > 0  # token in, token out: one sequence per episode
    gaps, syncs = [r["logprob_max_abs_diff"] for r in trained], [r["weight_sync_s"] for r in trained]
    print(f"GRPO with vLLM: sampler/trainer max |diff| {gaps}, weight sync {syncs} s")
    sync.load(real_vllm.checkpoint, 0)


# ---------------------------------------------------------------------------------- failures


def rollout_body(run_id: str, **config: Any) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "env": {"env_name": "crafter", "seed": 1},
        "policy": {"policy_name": "crafter-react", "config": {**SHORT, **config}},
        "max_turns": 2,
        "record": {"logprobs": True},
    }


def in_background(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.update(value=call()), daemon=True)
    thread.start()
    return thread, out


def test_vllm_failing_ends_each_rollout_with_a_structured_error(task_app, real_vllm: RealVLLM) -> None:
    server, _ = task_app
    # An overlong prompt: vLLM's 400, recorded as the decision's error, not retried.
    long = post(server, "/rollout", rollout_body("vllm-overlong", system_prompt="word " * 3900))
    assert long["stop_reason"] == "policy_error:inference_bad_request", long["stop_reason"]

    # The server going away and coming back on the same port: rollouts whose policy calls vLLM
    # through a TCP proxy that cuts every connection and stops listening, then listens again.
    vllm = urlsplit(real_vllm.base_url)
    with TcpProxy(vllm.hostname or "127.0.0.1", vllm.port or 80) as proxy:
        via = {"inference_url": proxy.base_url}

        # A hung server (SIGSTOP): the call's deadline ends the rollout, and it is a timeout.
        engine_pids = [real_vllm.server.proc.pid]
        os.killpg(engine_pids[0], signal.SIGSTOP)
        try:
            started = time.monotonic()
            hung = post(server, "/rollout", rollout_body("vllm-hung", timeout_s=1.0))
            assert time.monotonic() - started < 30
            assert hung["stop_reason"].startswith("policy_error:inference_timeout"), hung["stop_reason"]

            # An abort reaches a rollout waiting on the hung server within its deadline.
            thread, out = in_background(
                lambda: post(server, "/rollout", rollout_body("vllm-abort", timeout_s=60))
            )
            time.sleep(1.0)
            started = time.monotonic()
            r = httpx.post(f"{server.base_url}/run/abort", json={"run_id": "vllm-abort"}, timeout=30)
            assert r.status_code == 200, r.text
            thread.join(30)
            assert not thread.is_alive() and time.monotonic() - started < 30
            assert out["value"]["stop_reason"] == "aborted"

            # Gone mid-rollout (its call waiting on the hung server): a connection error, not a hang.
            thread, out = in_background(
                lambda: post(server, "/rollout", rollout_body("vllm-stopped", timeout_s=60, **via))
            )
            deadline = time.monotonic() + 30
            while proxy.connections == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert proxy.connections, "the rollout never called vLLM"
            proxy.cut()
            thread.join(60)
            assert not thread.is_alive()
            stopped = out["value"]["stop_reason"]
            assert stopped == "policy_error:inference_connection_error", stopped
        finally:
            os.killpg(engine_pids[0], signal.SIGCONT)

        down = post(server, "/rollout", rollout_body("vllm-down", **via))
        assert down["stop_reason"] == "policy_error:inference_connection_error", down["stop_reason"]

        # Back on the same port: the next rollout plays.
        proxy.restore()
        again = post(server, "/rollout", rollout_body("vllm-again", **via))
        assert decisions(again) and not (decisions(again)[0].get("decision_error") or "").startswith(
            "inference"
        )


# ------------------------------------------------------------ token-in/token-out rollouts


def stream_rollout(task_app, real_vllm: RealVLLM, seed: int) -> dict[str, Any]:
    """A 20-turn BabyAI episode played as one token stream (mode rl, the policy renders the
    between-turn tokens with the served checkpoint's own tokenizer)."""
    server, _ = task_app
    config = {"tokenizer": str(real_vllm.checkpoint), "max_tokens": 8, "temperature": 1.0, "seed": seed}
    body = {
        "env": {"env_name": "babyai", "seed": seed},
        "policy": {"policy_name": "babyai-agent", "config": config},
        "max_turns": 20,
        "on_done": "terminate",
    }
    result = post(server, "/rollout", body, timeout=600)
    (trajectory,) = result["trajectories"]
    previous: list[int] | None = None
    for step in trajectory["steps"]:  # every prompt extends the last prompt + completion
        llm = step["llm"]
        if previous is not None:
            assert llm["prompt_token_ids"][: len(previous)] == previous
        previous = llm["prompt_token_ids"] + llm["completion_token_ids"]
    return result


def stream_gap(model: Any, stream: dict[str, Any]) -> float:
    from training.llm.logprobs import TokenBatch, token_logprobs

    batch = TokenBatch.from_rows([stream["token_ids"]], [stream["sampled"]], 0)
    with torch.no_grad():
        lp = token_logprobs(model, batch)[0]
    sampled = torch.tensor(stream["sampled"], dtype=torch.bool)
    return float((lp[sampled] - torch.tensor(stream["logprobs"])[sampled]).abs().max())


def test_a_20_turn_stream_matches_the_trainer_before_and_after_a_weight_sync(
    task_app, real_vllm: RealVLLM, sync: WeightSync, tmp_path: Path
) -> None:
    """vLLM's completions API on token ids: one fp32 forward over the whole episode's stream gives
    every sampled token's logprob as vLLM reported it (≤ 1e-5), before and after a weight sync."""
    from tests.vllm_helpers import make_vllm_checkpoint

    torch.set_num_threads(1)
    result = stream_rollout(task_app, real_vllm, 3)
    (stream,) = result["trajectories"][0]["streams"]
    assert len(stream["spans"]) == 20 and result["metrics"]["stream_segments"] == 1
    gap_before = stream_gap(load(real_vllm.checkpoint)[0], stream)
    other_dir = make_vllm_checkpoint(tmp_path / "other", seed=1)
    sync.load(other_dir, 1)
    try:
        after = stream_rollout(task_app, real_vllm, 4)
        (stream_after,) = after["trajectories"][0]["streams"]
        assert {s["weights_version"] for s in stream_after["spans"]} == {None}  # vLLM names none
        gap_after = stream_gap(load(other_dir)[0], stream_after)
    finally:
        sync.load(real_vllm.checkpoint, 0)
    print(f"20-turn stream vs trainer: max |diff| {gap_before:.2e} before, {gap_after:.2e} after a sync")
    assert gap_before <= 1e-5 and gap_after <= 1e-5
