"""Inference faults, injected by the fake: timeouts, 429 with Retry-After, 500/503, connection
refused, malformed JSON, no tool call, invalid actions, a body cut mid-stream, token ids that do
not match the logprobs. Each rollout ends within its deadline with a structured ``stop_reason``
in its trajectory and in the trace DB; retries are bounded (the fake counts every request);
rollouts beside it, in the same group or server, are unaffected."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from grpo_service.tracing import TraceReader
from tests.conftest import MODEL
from tools.fake_server import FakeConfig, FakeInferenceServer
from tools.server_thread import ServerThread

pytestmark = pytest.mark.through_ray

LLM_TIMEOUT_S = 0.5  # per attempt
DECISION_S = 4.0  # safety.llm_timeout_s: one decision, its retries and backoffs included
RETRIES = 2  # so at most 3 requests per decision
TURNS = 3
DEADLINE_S = 10.0  # safety.max_time_s of every rollout here


@dataclass(frozen=True)
class Expected:
    stop_reason: str
    requests: int  # chat requests the fake sees for the failing decision
    max_s: float  # the rollout ends within this (retries and backoff included)


BACKOFF_S = 0.5 + 1.0  # the most two backoffs can take (base 0.5 s, doubling, jittered down)
# The fakes' request counts show how often each fault was tried; these bounds only show that
# nothing waited longer than its timeouts and backoffs, with slack for the suite's loaded cores.
SLACK_S = 2.5
NO_RETRY_S = 3.0  # a fault that is not retried ends its rollout at once
RETRY_AFTER_S = 0.05  # the 429 fake's Retry-After
EXPECTED: dict[str, Expected] = {
    "timeout": Expected(
        "policy_error:inference_timeout", RETRIES + 1, 3 * LLM_TIMEOUT_S + BACKOFF_S + SLACK_S
    ),
    # Retry-After is honoured instead of the backoff: a tighter bound than the backoffs get.
    "http_429": Expected(
        "policy_error:inference_rate_limited", RETRIES + 1, RETRIES * RETRY_AFTER_S + SLACK_S
    ),
    "http_500": Expected("policy_error:inference_server_error", RETRIES + 1, BACKOFF_S + SLACK_S),
    "http_503": Expected("policy_error:inference_server_error", RETRIES + 1, BACKOFF_S + SLACK_S),
    "cut_stream": Expected("policy_error:inference_connection_error", RETRIES + 1, BACKOFF_S + SLACK_S),
    "malformed_json": Expected("policy_error:inference_malformed_response", 1, NO_RETRY_S),
    "token_mismatch": Expected("policy_error:inference_malformed_response", 1, NO_RETRY_S),
    "no_tool_call": Expected("policy_error:no_tool_call", 1, NO_RETRY_S),
    "invalid_action": Expected("policy_error:invalid_action", 1, NO_RETRY_S),
}


def closed_port() -> int:
    """A loopback port nothing listens on: connections are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def faulty_fakes() -> Iterator[dict[str, FakeInferenceServer]]:
    """One fake per fault kind, each failing every request with it."""
    with ExitStack() as stack:
        yield {
            kind: stack.enter_context(
                FakeInferenceServer(
                    FakeConfig(
                        model=MODEL, fault_probs={kind: 1.0}, timeout_fault_s=10, retry_after_s=RETRY_AFTER_S
                    )
                )
            )
            for kind in EXPECTED
        }


@pytest.fixture
def traced(
    start_server: Callable[..., ServerThread], fake_llm: FakeInferenceServer, tmp_path: Path
) -> ServerThread:
    return start_server(
        vllm_base_url=fake_llm.base_url,
        inference_timeout_s=LLM_TIMEOUT_S,
        inference_max_retries=RETRIES,
        trace_db=tmp_path / "trace.db",
    )


def react(url: str, **config: Any) -> dict[str, Any]:
    return {
        "policy_name": "crafter-react",
        "config": {"inference_url": url, "timeout_s": LLM_TIMEOUT_S, **config},
    }


def timed_post(client: httpx.Client, path: str, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    t0 = time.monotonic()
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text[:500]
    return r.json(), time.monotonic() - t0


def rollout_body(run_id: str, policy: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "env": {"env_name": "crafter", "seed": 4},
        "policy": policy,
        "max_turns": TURNS,
        "record": {"logprobs": True},
        "safety": {"max_time_s": DEADLINE_S, "llm_timeout_s": DECISION_S},
        **extra,
    }


def wait_for_traces(db: Path, run_ids: set[str], timeout_s: float = 10.0) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        with TraceReader(db) as reader:
            sessions = {s["run_id"]: s for s in reader.sessions()}
            if run_ids <= set(sessions) or time.monotonic() > deadline:
                return {
                    run_id: {**sessions[run_id], "turns": reader.turns(sessions[run_id]["session_id"])}
                    for run_id in run_ids & set(sessions)
                }
        time.sleep(0.05)


def test_every_fault_ends_its_rollout_with_a_structured_reason_and_bounded_retries(
    traced: ServerThread,
    faulty_fakes: dict[str, FakeInferenceServer],
    fake_llm: FakeInferenceServer,
    tmp_path: Path,
) -> None:
    fakes: dict[str, str] = {kind: fake.base_url for kind, fake in faulty_fakes.items()}
    fakes["connection_refused"] = f"http://127.0.0.1:{closed_port()}"
    expected = {**EXPECTED, "connection_refused": EXPECTED["cut_stream"]}
    healthy = [f"healthy-{i}" for i in range(4)]
    # A reply fault is answered by default (tests/test_invalid_replies.py); here it ends the rollout.
    ending = {"no_tool_call": {"on_invalid_reply": "end"}, "invalid_action": {"on_invalid_reply": "end"}}
    bodies = {
        f"fault-{kind}": rollout_body(f"fault-{kind}", react(url, **ending.get(kind, {})))
        for kind, url in fakes.items()
    }
    # The healthy ones are given one attempt as long as their decision's budget: a loaded core
    # must not turn them into timeouts; the faults' own timeouts are what is under test.
    healthy_policy = react(fake_llm.base_url, timeout_s=DECISION_S)
    bodies |= {run_id: rollout_body(run_id, healthy_policy) for run_id in healthy}
    group = {
        "group_id": "healthy-group",
        "group_size": 4,
        "env": {"env_name": "crafter", "seed": 4},
        "policy": healthy_policy,
        "max_turns": TURNS,
        "safety": {"max_time_s": DEADLINE_S, "llm_timeout_s": DECISION_S},
    }
    # Everything at once, on one server: the faults run beside the healthy rollouts and group.
    with httpx.Client(base_url=traced.base_url, timeout=60) as client, ThreadPoolExecutor(20) as pool:
        futures = {
            run_id: pool.submit(timed_post, client, "/rollout", body) for run_id, body in bodies.items()
        }
        group_future = pool.submit(timed_post, client, "/rollout/group", group)
        results = {run_id: f.result() for run_id, f in futures.items()}
        group_result, _ = group_future.result()
        assert client.get("/health").json()["envs"] == 0

    traces = wait_for_traces(tmp_path / "trace.db", set(bodies))
    for kind, want in expected.items():
        out, elapsed = results[f"fault-{kind}"]
        assert out["status"] == "completed" and out["error"] is None, (kind, out["error"])
        assert out["stop_reason"] == want.stop_reason, (kind, out["stop_reason"])
        # The rollout's own time is bounded by its timeouts and backoffs; the request's, which
        # also waits behind the others on a loaded server, by the deadline.
        assert out["metrics"]["wall_time_s"] < want.max_s, (kind, out["metrics"]["wall_time_s"])
        assert elapsed < DEADLINE_S + SLACK_S, (kind, elapsed)
        (trajectory,) = out["trajectories"]
        last = trajectory["steps"][-1]
        assert trajectory["stop_reason"] == want.stop_reason and len(trajectory["steps"]) == 1, kind
        assert last["decision_error"] == want.stop_reason.removeprefix("policy_error:"), kind
        assert last["decision_error_detail"], kind
        if want.requests > 1:  # an inference error: the attempts are recorded with it
            assert last["llm"]["attempts"] == want.requests and last["llm"]["error"], (kind, last["llm"])
        if kind in faulty_fakes:
            assert faulty_fakes[kind].stats()["requests"] == want.requests, kind
        trace = traces[f"fault-{kind}"]
        assert trace["stop_reason"] == want.stop_reason, kind
        assert trace["turns"][-1]["decision_error"] == last["decision_error"], kind

    for run_id in healthy:
        out, _ = results[run_id]
        assert out["stop_reason"] == "completed" and len(out["trajectories"][0]["steps"]) == TURNS
        assert traces[run_id]["stop_reason"] == "completed" and len(traces[run_id]["turns"]) == TURNS
    members = group_result["members"]
    assert [m["result"]["stop_reason"] for m in members] == ["completed"] * 4


def test_a_hung_llm_call_is_cut_at_the_rollout_deadline(traced: ServerThread) -> None:
    """A per-call timeout longer than the rollout's own deadline: the deadline wins."""
    with FakeInferenceServer(
        FakeConfig(model=MODEL, fault_probs={"timeout": 1.0}, timeout_fault_s=30)
    ) as hung:
        safety = {"max_time_s": 1.0, "llm_timeout_s": 30}
        body = rollout_body("hung", react(hung.base_url, timeout_s=30), safety=safety)
        with httpx.Client(base_url=traced.base_url, timeout=60) as client:
            out, elapsed = timed_post(client, "/rollout", body)
        assert out["stop_reason"] == "time_limit" and out["aborted"] is True
        assert 1.0 <= elapsed < 3.0
        assert hung.stats()["requests"] == 1  # no retry past the deadline


def test_flaky_llm_never_sinks_a_group(
    start_server: Callable[..., ServerThread], fake_llm: FakeInferenceServer
) -> None:
    """Random faults in a group: every member is reported, ends within its deadline with a
    structured reason, and a member that met no fault played every turn."""
    faults = {
        "http_500": 0.15,
        "http_429": 0.1,
        "timeout": 0.05,
        "malformed_json": 0.05,
        "no_tool_call": 0.05,
    }
    config = FakeConfig(model=MODEL, fault_probs=faults, timeout_fault_s=10, retry_after_s=0.05, seed=7)
    with FakeInferenceServer(config) as flaky:
        server = start_server(
            vllm_base_url=fake_llm.base_url, inference_timeout_s=LLM_TIMEOUT_S, inference_max_retries=RETRIES
        )
        turns, size = 5, 8
        body = {
            "group_size": size,
            "env": {"env_name": "crafter", "seed": 4},
            "policy": react(flaky.base_url),
            "max_turns": turns,
            "safety": {"max_time_s": DEADLINE_S, "llm_timeout_s": DECISION_S},
        }
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            group, elapsed = timed_post(client, "/rollout/group", body)
        members = group["members"]
        assert [m["group_index"] for m in members] == list(range(size)) and elapsed < DEADLINE_S + 2
        for m in members:
            result = m["result"]
            assert m["status"] == "completed" and result["error"] is None, m
            reason, steps = result["stop_reason"], result["trajectories"][0]["steps"]
            if reason == "completed":
                assert len(steps) == turns
            else:
                assert reason.startswith("policy_error:") and steps[-1]["decision_error"], reason
        stats = flaky.stats()
        assert sum(stats["by_fault"].get(kind, 0) for kind in faults) > 0  # the faults did happen
        assert stats["requests"] <= size * turns * (RETRIES + 1)  # bounded, whatever happened
