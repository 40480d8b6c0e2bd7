"""Regression tests for the second adversarial probe (issue 16): each defect as the probe found it,
on loopback, against the fake inference server or a misbehaving server of the test's own.
The sibling search and the figures are in docs/reliability.md ("Hardening, round 2")."""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from grpo_service.models import RolloutRequest
from tests.conftest import MODEL
from tests.hardening import assert_error, counts, rss_mb, start_service
from tests.test_hardening_inference import wait_for_traces
from tools.fake_server import FakeConfig, FakeInferenceServer, build_completion
from tools.server_thread import ServerThread

SERVER_KEY = "sk-server-inference-key-0123456789abcdef"


# ------------------------------------------------------------------ a misbehaving LLM server


def _completion(body: dict[str, Any]) -> dict[str, Any]:
    return build_completion(body, FakeConfig(model=MODEL), "ok", 1)


def _set_logprob(value: float) -> Callable[[dict[str, Any]], None]:
    def mutate(reply: dict[str, Any]) -> None:
        reply["choices"][0]["logprobs"]["content"][0]["logprob"] = value

    return mutate


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(reply: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = reply
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[int(last) if last.isdigit() else last] = value

    return mutate


# Replies that parse as JSON but break OpenAI's shape (item 6), hold non-finite logprobs (item 7).
MALFORMED: dict[str, Callable[[dict[str, Any]], None]] = {
    "usage_prompt_tokens_abc": _set("usage.prompt_tokens", "abc"),
    "usage_list": _set("usage", [1, 2]),
    "message_string": _set("choices.0.message", "hello"),
    "tool_calls_string": _set("choices.0.message.tool_calls", "abc"),
    "function_list": _set("choices.0.message.tool_calls.0.function", [1, 2]),
    "content_list": _set("choices.0.message.content", ["a"]),
    "finish_reason_int": _set("choices.0.finish_reason", 5),
    "logprob_nan": _set_logprob(math.nan),
    "logprob_minus_infinity": _set_logprob(-math.inf),
    "logprob_1e400": _set_logprob(1e400),
}


class Misbehaving:
    """An OpenAI-shaped server whose reply at ``/{name}/v1/chat/completions`` is a valid fake
    completion altered by ``MALFORMED[name]``; ``/big/...`` answers ``big_bytes`` of content.
    It records the ``Authorization`` header of every request."""

    def __init__(self, big_bytes: int = 0) -> None:
        self.big_bytes = big_bytes
        self.authorizations: list[str] = []
        self.status = 200
        self._lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = dict(scope["headers"])
        with self._lock:
            self.authorizations.append(headers.get(b"authorization", b"").decode())
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        name = scope["path"].strip("/").split("/")[0]
        if scope["path"].endswith("/models"):
            payload = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
        elif self.status != 200:
            payload = b'{"error": {"message": "unavailable"}}'
        elif name == "big":
            payload = b'{"choices": [{"message": {"content": "' + b"x" * self.big_bytes + b'"}}]}'
        else:
            reply = _completion(json.loads(body))
            if name in MALFORMED:
                MALFORMED[name](reply)
            payload = json.dumps(reply).encode()  # NaN and Infinity come out as Python writes them
        await send(
            {
                "type": "http.response.start",
                "status": self.status if not scope["path"].endswith("/models") else 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": payload})


@pytest.fixture
def misbehaving() -> Iterator[tuple[Misbehaving, str]]:
    app = Misbehaving(big_bytes=5 * 1024 * 1024)
    with ServerThread(app, name="misbehaving-llm") as server:
        yield app, server.base_url


def react(url: str, **config: Any) -> dict[str, Any]:
    return {"policy_name": "crafter-react", "config": {"inference_url": url, **config}}


# ------------------------------------------------------------------------ 1. the key leak


def test_the_server_key_never_reaches_a_url_the_caller_names(
    start_server: Callable[..., ServerThread], misbehaving: tuple[Misbehaving, str]
) -> None:
    listener, listener_url = misbehaving
    listener.status = 503  # so the client retries: every attempt must be clean
    with FakeInferenceServer(FakeConfig(model=MODEL, api_key=SERVER_KEY)) as configured:
        server = start_server(
            vllm_base_url=configured.base_url, inference_api_key=SERVER_KEY, inference_max_retries=2
        )
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            observation = {"observation": {"text": "You see grass."}}
            stolen = client.post("/policy/create", json=react(listener_url + "/steal")).json()["policy_id"]
            step = client.post("/policy/step", json={"policy_id": stolen, **observation}).json()
            assert step["error"] == "inference_server_error"
            assert len(listener.authorizations) == 3  # 1 try + 2 retries, none with the key
            assert all(SERVER_KEY not in header for header in listener.authorizations)
            assert set(listener.authorizations) == {"Bearer EMPTY"}

            # A caller's own key goes to its own URL.
            own = client.post(
                "/policy/create", json=react(listener_url + "/own", api_key="sk-callers-own-key")
            ).json()["policy_id"]
            client.post("/policy/step", json={"policy_id": own, **observation})
            assert listener.authorizations[-1] == "Bearer sk-callers-own-key"

            # The configured endpoint (which requires the key) still gets it.
            default = client.post("/policy/create", json={"policy_name": "crafter-react"}).json()
            step = client.post("/policy/step", json={"policy_id": default["policy_id"], **observation})
            assert step.json()["error"] is None and step.json()["tool_calls"], step.text

        # An operator may allow more endpoints to receive the key.
        listener.authorizations.clear()
        allowed = start_server(
            vllm_base_url=configured.base_url,
            inference_api_key=SERVER_KEY,
            inference_max_retries=0,
            inference_key_urls=[listener_url + "/trusted"],
        )
        with httpx.Client(base_url=allowed.base_url, timeout=60) as client:
            pid = client.post("/policy/create", json=react(listener_url + "/trusted/v1")).json()["policy_id"]
            client.post("/policy/step", json={"policy_id": pid, "observation": {"text": "grass"}})
            assert listener.authorizations == [f"Bearer {SERVER_KEY}"]


def test_cors_answers_no_foreign_origin(client: httpx.Client) -> None:
    """No CORS by default: a web page on another origin cannot read the (keyless) loopback API."""
    preflight = client.options(
        "/env/create",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in preflight.headers
    response = client.get("/health", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in response.headers


def test_cors_allows_the_configured_origins(start_server: Callable[..., ServerThread]) -> None:
    server = start_server(cors_allow_origins=["https://viewer.example"])
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        ok = client.get("/health", headers={"Origin": "https://viewer.example"})
        assert ok.headers["access-control-allow-origin"] == "https://viewer.example"
        other = client.get("/health", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers


# ------------------------------------------------------------- 2. the client pool's growth


def test_policy_config_churn_keeps_memory_bounded(tmp_path: Path, fake_llm: FakeInferenceServer) -> None:
    """create/step/terminate with a different ``timeout_s`` each time, on a real server process:
    RSS stays flat (before the fix each cycle kept a client and its transport, about 0.8 MB)."""
    service = start_service(
        tmp_path,
        {
            "VLLM_BASE_URL": fake_llm.base_url,
            "DEFAULT_MODEL": MODEL,
            "STATE_DIR": str(tmp_path / "state"),
            "SNAPSHOT_SECRET": "s" * 40,
        },
        log_level="warning",
    )
    try:
        with httpx.Client(base_url=service.base_url, timeout=30) as client:

            def cycles(start: int, count: int) -> None:
                for i in range(start, start + count):
                    body = react(fake_llm.base_url, timeout_s=5 + i / 1000)
                    pid = client.post("/policy/create", json=body).json()["policy_id"]
                    step = client.post("/policy/step", json={"policy_id": pid, "observation": {"text": "x"}})
                    assert step.json()["error"] is None, step.text
                    client.post("/policy/terminate", json={"policy_id": pid})

            cycles(0, 70)  # warm-up: the pool fills to its bound (64 clients)
            before = rss_mb(service.pid)
            cycles(70, 150)
            after = rss_mb(service.pid)
            assert counts(client)["policies"] == 0
        print(f"config churn: RSS {before:.0f} -> {after:.0f} MiB after 150 more cycles")
        assert after - before < 30, (before, after)  # the unbounded pool grew ~0.8 MiB per cycle
    finally:
        service.stop()


# ------------------------------------------------------- 4. run slots of concurrent groups


def test_racing_groups_never_leak_run_slots(start_server: Callable[..., ServerThread]) -> None:
    server = start_server(max_active_runs=12, max_envs=200, max_policies=200)
    body = {
        "group_size": 5,
        "env": {"env_name": "crafter", "seed": 3},
        "policy": {"policy_name": "crafter-random"},
        "max_turns": 2,
    }
    with httpx.Client(base_url=server.base_url, timeout=60) as client, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: client.post("/rollout/group", json=body), range(100)))
        statuses = [r.status_code for r in answers]
        assert set(statuses) <= {200, 429} and 200 in statuses, statuses
        for r in answers:
            if r.status_code == 200:
                assert [m["status"] for m in r.json()["members"]] == ["completed"] * 5
            else:
                assert_error(r, 429, "capacity_exceeded")
        assert counts(client) == {"envs": 0, "policies": 0, "runs_active": 0}
        # Every slot is free again: a group of 11 (12 slots with the group's own) runs.
        full = client.post("/rollout/group", json={**body, "group_size": 11})
        assert full.status_code == 200, full.text
    ran, refused = statuses.count(200), statuses.count(429)
    print(f"after 100 racing groups: {ran} ran, {refused} refused, 12/12 slots free")


def test_a_group_that_cannot_start_frees_its_members(start_server: Callable[..., ServerThread]) -> None:
    server = start_server(max_active_runs=10, max_envs=3)
    body = {"group_size": 5, "env": {"env_name": "crafter"}, "policy": {"policy_name": "crafter-random"}}
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        assert_error(client.post("/rollout/group", json={**body, "group_id": "g", "max_turns": 1}), 429)
        assert counts(client) == {"envs": 0, "policies": 0, "runs_active": 0}
        status = client.get("/run/status/g.0").json()
        assert status["status"] == "failed" and "could not start" in status["error"]


# ------------------------------------------- 6, 7, 8. malformed, non-finite and huge replies


def test_malformed_non_finite_and_huge_replies_are_recorded_policy_errors(
    start_server: Callable[..., ServerThread], misbehaving: tuple[Misbehaving, str], tmp_path: Path
) -> None:
    _, url = misbehaving
    db = tmp_path / "trace.db"
    server = start_server(
        vllm_base_url=url, inference_max_response_bytes=1024 * 1024, trace_db=db, inference_max_retries=0
    )
    names = [*MALFORMED, "big"]
    bodies = {
        name: {
            "run_id": f"bad-{name}",
            "env": {"env_name": "crafter", "seed": 1},
            "policy": react(f"{url}/{name}"),
            "max_turns": 2,
            "record": {"logprobs": True},
        }
        for name in names
    }
    with httpx.Client(base_url=server.base_url, timeout=60) as client, ThreadPoolExecutor(6) as pool:
        replies = pool.map(lambda n: client.post("/rollout", json=bodies[n]), names)
        answers = dict(zip(names, replies, strict=True))
        good = {**bodies["big"], "run_id": "ok", "policy": react(f"{url}/ok")}
        healthy = client.post("/rollout", json=good)
    for name, answer in answers.items():
        assert answer.status_code == 200, (name, answer.text[:300])
        out = answer.json()
        assert out["stop_reason"] == "policy_error:inference_malformed_response", (name, out["stop_reason"])
        (trajectory,) = out["trajectories"]
        (step,) = trajectory["steps"]  # the failed decision is recorded
        assert step["decision_error"] == "inference_malformed_response" and step["llm"]["error"], name
        assert "malformed_response" in step["decision_error_detail"], name
    big = answers["big"].json()["trajectories"][0]["steps"][0]
    assert "exceeds 1048576 bytes" in big["decision_error_detail"]
    ok = healthy.json()
    assert ok["stop_reason"] == "completed"
    logprobs = ok["trajectories"][0]["steps"][0]["llm"]["completion_logprobs"]
    assert logprobs and all(math.isfinite(x) for x in logprobs)

    traces = wait_for_traces(db, {f"bad-{name}" for name in names} | {"ok"})
    for name in names:
        trace = traces[f"bad-{name}"]
        assert trace["stop_reason"] == "policy_error:inference_malformed_response", name
        assert trace["turns"][-1]["decision_error"] == "inference_malformed_response", name
    # Everything the trace DB holds is standard JSON (no NaN or Infinity text).
    with sqlite3.connect(db) as conn:
        columns = conn.execute(
            "SELECT m.name, p.name FROM sqlite_master m JOIN pragma_table_info(m.name) p "
            "WHERE m.type = 'table' AND p.type IN ('TEXT', '')"
        ).fetchall()
        for table, column in columns:
            for (value,) in conn.execute(f'SELECT "{column}" FROM "{table}"'):  # noqa: S608
                if isinstance(value, str) and value[:1] in "[{":
                    json.loads(value, parse_constant=_refuse)


def _refuse(constant: str) -> Any:
    raise AssertionError(f"the trace DB holds {constant}")


# ------------------------------------------------------- 12. terminate during a rollout


@pytest.mark.parametrize("what", ["env", "policy"])
def test_terminating_what_a_rollout_plays_keeps_the_partial_trajectory(
    start_server: Callable[..., ServerThread], tmp_path: Path, what: str
) -> None:
    with FakeInferenceServer(FakeConfig(model=MODEL, latency_s=0.15)) as slow:
        server = start_server(vllm_base_url=slow.base_url, trace_db=tmp_path / "trace.db")
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            env_id = client.post("/env/create", json={"env_name": "crafter", "seed": 2}).json()["env_id"]
            policy_id = client.post(
                "/policy/create", json={"policy_name": "crafter-react", "bound_env_id": env_id}
            ).json()["policy_id"]
            run_id = f"terminated-{what}"
            started = client.post(
                "/rollout/start",
                json={
                    "run_id": run_id,
                    "env": {"env_id": env_id},
                    "policy": {"policy_id": policy_id},
                    "max_turns": 50,
                },
            )
            assert started.status_code == 202, started.text
            time.sleep(0.8)
            target = {"env_id": env_id} if what == "env" else {"policy_id": policy_id}
            assert client.post(f"/{what}/terminate", json=target).json()["existed"] is True
            deadline = time.monotonic() + 10
            while (status := client.get(f"/run/status/{run_id}").json())["status"] == "running":
                assert time.monotonic() < deadline
                time.sleep(0.05)
        result = status["result"]
        assert status["status"] == "aborted" and result["stop_reason"] == f"{what}_terminated", status
        steps = result["trajectories"][0]["steps"]
        assert 2 <= len(steps) < 50
        trace = wait_for_traces(tmp_path / "trace.db", {run_id})[run_id]
        assert trace["stop_reason"] == f"{what}_terminated" and len(trace["turns"]) == len(steps)


def test_max_turns_is_not_cut_by_a_smaller_default_max_ops() -> None:
    request = RolloutRequest.model_validate(
        {"env": {"env_name": "crafter"}, "policy": {"policy_name": "crafter-random"}, "max_turns": 100_000}
    )
    cap = request.safety.max_ops
    assert cap is None or cap >= len(request.op_list())
