"""Regression tests for the second adversarial probe (issue 16): each defect as the probe found it,
on loopback, against the fake inference server or a misbehaving server of the test's own.
The sibling search and the figures are in docs/reliability.md ("An adversarial probe, kept as tests")."""

from __future__ import annotations

import io
import json
import math
import socket
import sqlite3
import tarfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from grpo_service import Settings
from grpo_service.app import build_services
from grpo_service.core.branching import branch
from grpo_service.errors import CapacityExceeded
from grpo_service.models import BranchRequest, RolloutRequest
from storage import SnapshotCodec, SnapshotCorrupt
from storage.codec import _HEADER_LEN as HEADER
from tests.conftest import MODEL, Served, make_settings
from tests.hardening import assert_error, counts, file_tree, rss_mb, start_service
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
        elif name in ("big", "big_error"):  # a reply, or an error page, of `big_bytes`
            payload = b'{"choices": [{"message": {"content": "' + b"x" * self.big_bytes + b'"}}]}'
        else:
            reply = _completion(json.loads(body))
            if name in MALFORMED:
                MALFORMED[name](reply)
            payload = json.dumps(reply).encode()  # NaN and Infinity come out as Python writes them
        status = 200 if scope["path"].endswith("/models") else 503 if name == "big_error" else self.status
        await send(
            {
                "type": "http.response.start",
                "status": status,
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


@pytest.mark.slow
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
            cycles(70, 100)
            after = rss_mb(service.pid)
            assert counts(client)["policies"] == 0
        print(f"config churn: RSS {before:.0f} -> {after:.0f} MiB after 100 more cycles")
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
        refused = assert_error(
            client.post("/rollout/group", json={**body, "group_id": "g", "max_turns": 1}), 429
        )
        assert "needs 5 env slots (3 of MAX_ENVS 3 are free)" in refused["detail"]  # refused up front
        assert counts(client) == {"envs": 0, "policies": 0, "runs_active": 0}
        assert_error(client.get("/run/status/g.0"), 404)
        # Admitted, then its start fails (an unknown snapshot): its members are failed and freed.
        unknown = {
            **body,
            "env": {"snapshot_id": "ab" * 16},
            "group_size": 2,
            "group_id": "h",
            "max_turns": 1,
        }
        assert_error(client.post("/rollout/group", json=unknown), 404)
        assert counts(client) == {"envs": 0, "policies": 0, "runs_active": 0}
        status = client.get("/run/status/h.0").json()
        assert status["status"] == "failed" and "could not start" in status["error"]
        assert (
            client.post("/rollout/group", json={**body, "group_size": 3, "max_turns": 1}).status_code == 200
        )


# ------------------------------------------- 6, 7, 8. malformed, non-finite and huge replies


def test_malformed_non_finite_and_huge_replies_are_recorded_policy_errors(
    start_server: Callable[..., ServerThread], misbehaving: tuple[Misbehaving, str], tmp_path: Path
) -> None:
    _, url = misbehaving
    db = tmp_path / "trace.db"
    server = start_server(
        vllm_base_url=url, inference_max_response_bytes=1024 * 1024, trace_db=db, inference_max_retries=0
    )
    names = [*MALFORMED, "big", "big_error"]
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
    for name in ("big", "big_error"):  # refused as it streamed in, and not retried
        big = answers[name].json()["trajectories"][0]["steps"][0]
        assert "exceeds 1048576 bytes" in big["decision_error_detail"] and big["llm"]["attempts"] == 1
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
                if isinstance(value, str) and value.startswith(("[", "{")):
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


# ------------------------------------------------------------------------ 3. the tar bomb


def _tar_bomb(genuine: bytes, long_name_bytes: int) -> bytes:
    """A gzip whose first tar header is a GNU long-name (``L``) record of ``long_name_bytes`` of
    one byte, followed by the genuine snapshot's members (about 1 KB compressed per MiB)."""
    header = tarfile.TarInfo("././@LongLink")
    header.type, header.size = tarfile.GNUTYPE_LONGNAME, long_name_bytes
    deflate = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [deflate.compress(header.tobuf(tarfile.GNU_FORMAT))]
    chunk = b"a" * (16 * 1024 * 1024)
    for _ in range(long_name_bytes // len(chunk)):
        parts.append(deflate.compress(chunk))
    with tarfile.open(fileobj=io.BytesIO(genuine), mode="r:gz") as tar:
        inner = io.BytesIO()
        with tarfile.open(fileobj=inner, mode="w") as out:
            for member in tar:
                out.addfile(member, tar.extractfile(member))
    parts.append(deflate.compress(inner.getvalue()) + deflate.flush())
    return b"".join(parts)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return rss_mb(pid)


@pytest.mark.slow
def test_a_tar_bomb_is_refused_before_it_is_inflated(tmp_path: Path) -> None:
    state = tmp_path / "state"
    service = start_service(
        tmp_path, {"STATE_DIR": str(state), "SNAPSHOT_SECRET": "s" * 40}, log_level="warning"
    )
    try:
        with httpx.Client(base_url=service.base_url, timeout=60) as client:
            env_id = client.post("/env/create", json={"env_name": "crafter", "seed": 1}).json()["env_id"]
            snap = client.post("/env/snapshot", json={"env_id": env_id}).json()
            path = Path(snap["path"])
            genuine = path.read_bytes()
            before, peak_before = rss_mb(service.pid), peak_rss_mb(service.pid)
            path.write_bytes(_tar_bomb(genuine, 256 * 1024 * 1024))
            t0 = time.monotonic()
            refused = client.post("/env/restore", json={"snapshot_id": snap["snapshot_id"]})
            elapsed = time.monotonic() - t0
            assert_error(refused, 422, "invalid_snapshot")
            after, peak_after = rss_mb(service.pid), peak_rss_mb(service.pid)
            print(
                f"tar bomb ({path.stat().st_size / 2**20:.1f} MiB file, 256 MiB long name): 422 in "
                f"{elapsed:.2f} s, RSS {before:.0f} -> {after:.0f} MiB, "
                f"peak {peak_before:.0f} -> {peak_after:.0f} MiB"
            )
            assert peak_after - peak_before < 100 and after - before < 50
            path.write_bytes(genuine)  # the genuine snapshot still restores
            assert client.post("/env/restore", json={"snapshot_id": snap["snapshot_id"]}).status_code == 200
    finally:
        service.stop()


def test_a_forged_signed_header_costs_one_hmac() -> None:
    """A file that claims the signed format is refused on its signature, before inflating."""
    codec = SnapshotCodec(b"k" * 32)
    genuine = codec.pack({"snapshot_id": "x"}, b"payload")
    bomb = zlib.compress(b"\0" * (64 * 1024 * 1024), 9)[2:-4]  # raw deflate: 64 MiB of zeros
    forged = genuine[:HEADER] + bomb + genuine[-8:]
    with pytest.raises(SnapshotCorrupt, match="signature"):
        codec.unpack(forged)
    assert codec.unpack(genuine) == (codec.unpack(genuine)[0], b"payload")


# ------------------------------------------------------------------ 5. branch at capacity


def test_branch_over_capacity_creates_nothing(
    start_server: Callable[..., ServerThread], tmp_path: Path
) -> None:
    server = start_server(max_envs=10, max_policies=10)
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        envs = [
            client.post("/env/create", json={"env_name": "crafter", "seed": i}).json()["env_id"]
            for i in (1, 2)
        ]
        policies = [
            client.post("/policy/create", json={"policy_name": "crafter-random", "bound_env_id": e}).json()[
                "policy_id"
            ]
            for e in envs
        ]
        files = file_tree(tmp_path / "state")
        assert_error(client.post("/branch", json={"env_ids": envs, "num_children": 5}), 429)
        assert_error(client.post("/branch", json={"policy_ids": policies, "num_children": 5}), 429)
        assert counts(client) == {"envs": 2, "policies": 2, "runs_active": 0}
        assert file_tree(tmp_path / "state") == files  # no snapshot written
        ok = client.post("/branch", json={"env_ids": envs[:1], "policy_ids": policies[:1], "num_children": 4})
        assert ok.status_code == 200 and counts(client)["envs"] == 6 and counts(client)["policies"] == 6


async def test_a_branch_that_fails_midway_removes_what_it_made(tmp_path: Path) -> None:
    """A table that fills up between the capacity check and the copies (a racing request):
    every child made and every snapshot written by the call is removed."""
    services = build_services(make_settings(tmp_path))
    env = await services.envs.create("crafter", None, 1, "run")
    policy = await services.policies.create("crafter-random", None, "run", bound_env_id=env.id)

    async def full_table(*args: Any, **kwargs: Any) -> Any:
        raise CapacityExceeded("policy capacity reached")

    services.policies.fork = full_table  # type: ignore[method-assign]
    request = BranchRequest(env_ids=[env.id], policy_ids=[policy.id], num_children=3)
    with pytest.raises(CapacityExceeded):
        await branch(request, services.envs, services.policies)
    assert services.registry.counts()["envs"] == 1 and services.registry.counts()["snapshots"] == 0
    assert not list((tmp_path / "state").rglob("*.tar.gz"))


# ---------------------------------------------------------------------- 9. deep nesting


def _nested(depth: int) -> Any:
    value: Any = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def test_deep_nesting_is_refused_where_it_enters(
    client: httpx.Client, misbehaving: tuple[Misbehaving, str]
) -> None:
    deep = {"policy_name": "crafter-react", "config": {"extra_body": _nested(300)}}
    refused = client.post("/policy/create", json=deep)
    assert_error(refused, 422, "invalid_request")
    assert "nested more than 64" in refused.text
    # 40 levels are fine, everywhere they go (dry run, snapshot, rollout).
    fine = client.post("/policy/create", json={**deep, "config": {"extra_body": _nested(40)}}).json()
    assert (
        client.post(
            "/policy/step",
            json={"policy_id": fine["policy_id"], "observation": {"text": "x"}, "dry_run": True},
        ).status_code
        == 200
    )
    assert client.post("/policy/snapshot", json={"policy_id": fine["policy_id"]}).status_code == 200
    rollout = {"env": {"env_name": "crafter"}, "policy": deep["policy_name"], "max_turns": 1}
    rollout["policy"] = {"policy_name": "crafter-react", "config": {"extra_body": _nested(300)}}
    assert_error(client.post("/rollout", json=rollout), 422)
    # An LLM reply nesting its tool-call arguments 300 deep is an invalid tool call, not a 500.
    _, url = misbehaving
    MALFORMED["deep_arguments"] = _set(
        "choices.0.message.tool_calls.0.function.arguments", json.dumps(_nested(300))
    )
    try:
        body = {"env": {"env_name": "crafter"}, "policy": react(f"{url}/deep_arguments"), "max_turns": 1}
        out = client.post("/rollout", json={**body, "record": {"return_trace": True}})
        assert out.status_code == 200, out.text
        (step,) = out.json()["trajectories"][0]["steps"]  # answered: the rollout went on to max_turns
        assert step["decision_error"] == "invalid_tool_call" and len(step["feedback"]) < 2000, out.text
    finally:
        del MALFORMED["deep_arguments"]


# ------------------------------------------------- 10. the Ray front's router before the app


@pytest.mark.slow
def test_the_ray_router_never_answers_500(
    serve: Callable[..., Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ray")
    monkeypatch.setenv("ENVIRONMENT_API_KEY", SERVER_KEY)
    # A local Ray cluster of one host: what is tested is the front's router, before any host.
    served = serve("--ray", "local", "--ray-hosts", "1", wait_s=120)
    group = '{"env": {"env_name": "crafter"}, "policy": {"policy_name": "crafter-random"}, "max_turns": 1, '
    bodies = {
        "Infinity": group + '"group_size": Infinity}',
        "1e300": group + '"group_size": 1e300}',
        "20 digits": group + '"group_size": 99999999999999999999999}',
        "50,000 [": group + '"group_size": ' + "[" * 50_000 + "]" * 50_000 + "}",
    }
    headers = {"content-type": "application/json"}
    with httpx.Client(base_url=served.base_url, timeout=30) as client:
        for name, body in bodies.items():
            anonymous = client.post("/rollout/group", content=body, headers=headers)
            assert_error(anonymous, 401)
            keyed = client.post("/rollout/group", content=body, headers={**headers, "X-API-Key": SERVER_KEY})
            assert keyed.status_code in (400, 422), (name, keyed.status_code, keyed.text[:200])
        fine = client.post(
            "/rollout/group", content=group + '"group_size": 2}', headers={**headers, "X-API-Key": SERVER_KEY}
        )
        assert fine.status_code == 200, fine.text


# ------------------------------------------------------------- 11. secrets in logs and /info


@pytest.mark.slow
def test_no_secret_in_the_access_log_or_info(tmp_path: Path, fake_llm: FakeInferenceServer) -> None:
    env_key = "sk-env-key-in-query-0123456789abcdef"
    password = "vllm-pass-9f8e7d6c5b4a"
    environ = {
        "ENVIRONMENT_API_KEY": env_key,
        "DEFAULT_MODEL": MODEL,
        "STATE_DIR": str(tmp_path / "state"),
        "SNAPSHOT_SECRET": "s" * 40,
    }
    # Credentials in VLLM_BASE_URL never worked (aiohttp cannot send them with the bearer key:
    # every LLM call was a 500) and showed the password in /info: refused at startup, unshown.
    with pytest.raises(ValidationError, match="must not carry credentials") as refused:
        Settings(_env_file=None, vllm_base_url=f"http://user:{password}@127.0.0.1:1")  # type: ignore[call-arg]
    assert password not in str(refused.value)

    service = start_service(tmp_path, {**environ, "VLLM_BASE_URL": fake_llm.base_url})
    try:
        with httpx.Client(base_url=service.base_url, timeout=30) as client:
            for path in ("/info", "/env/create", "/run/status/x"):
                assert client.get(f"{path}?api_key={env_key}&token={env_key}").status_code == 401
            keyed = {"X-API-Key": env_key}
            url = fake_llm.base_url.replace("http://", f"http://user:{password}@")
            config = {"policy_name": "crafter-react", "config": {"inference_url": url}}
            answer = client.post("/policy/create", json=config, headers=keyed)
            assert_error(answer, 422, "invalid_config")
            assert password not in answer.text and "must not carry credentials" in answer.text
    finally:
        service.stop()
    log = service.log.read_text()
    assert "/info?api_key=***&token=***" in log  # the access log has the line, without the key
    for secret in (env_key, password):
        assert all(secret[i : i + 8] not in log for i in range(len(secret) - 7)), secret


# --------------------------------------- 12. unauthenticated bodies are never read or parsed


def test_an_unauthenticated_body_is_refused_before_it_is_read(
    start_server: Callable[..., ServerThread],
) -> None:
    server = start_server(environment_api_key=SERVER_KEY)
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        malformed = client.post(
            "/env/create", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert_error(malformed, 401)
        assert_error(client.get("/run/status/x"), 401)
        assert client.get("/health").status_code == 200 and client.get("/openapi.json").status_code == 200
    # An 8 MB body announced but not sent: the 401 comes at once, without waiting for it.
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        sock.sendall(
            b"POST /rollout HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 8000000\r\n\r\n" + b" " * 1000
        )
        assert sock.recv(1024).startswith(b"HTTP/1.1 401 ")
