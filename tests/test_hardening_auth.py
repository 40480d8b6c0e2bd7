"""Auth, beyond test_service_auth.py: every operation the live schema lists refuses a missing or
wrong key in every form, with no oracle for a partly right one; and no key (the service's, the
inference server's, a policy's own) appears in any response, log line, trace or snapshot file,
even when the inference server echoes the key it was sent."""

from __future__ import annotations

import io
import re
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import MODEL
from tests.hardening import counts, start_service
from tools.fake_server import FakeConfig, FakeInferenceServer
from tools.server_thread import ServerThread

pytestmark = pytest.mark.through_ray

KEY = "sk-env-7f3a9c2e5bQx81"
INFERENCE_KEY = "sk-inf-4d8e1a6fWq27"  # the service's default key to the LLM: rejected there
POLICY_KEY = "sk-pol-9b2c7e4a1dZk54"  # a policy's own key in its config: rejected there too
LLM_KEY = "sk-llm-0c6d2b9e7aYp33"


def pieces(secret: str, size: int = 8) -> set[str]:
    """Every ``size``-character piece of a secret: servers echo prefixes, logs truncate."""
    return {secret[i : i + size] for i in range(len(secret) - size + 1)}


def assert_no_secret(
    text: str, where: str, secrets: tuple[str, ...] = (KEY, INFERENCE_KEY, POLICY_KEY)
) -> None:
    for secret in secrets:
        found = [p for p in pieces(secret) if p in text]
        assert not found, f"{where} contains part of a key: {found[:3]}"
    # The LLM server echoes a 12-character prefix of a key it refuses; all of it must be cut.
    echoed = re.findall(r"Incorrect API key provided: ([^.]*)\.", text)
    assert all(set(e) <= {"*"} for e in echoed), f"{where} shows part of an echoed key: {echoed[:3]}"


@pytest.fixture
def keyed(start_server: Callable[..., ServerThread], fake_llm: FakeInferenceServer) -> Iterator[httpx.Client]:
    server = start_server(environment_api_key=KEY, vllm_base_url=fake_llm.base_url)
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client


def operations(client: httpx.Client) -> list[tuple[str, str]]:
    schema = client.get("/openapi.json").json()
    return [(method.upper(), path) for path, ops in schema["paths"].items() for method in ops]


WRONG_KEYS: dict[str, dict[str, str]] = {
    "no key": {},
    "empty key": {"X-API-Key": ""},
    "wrong key": {"X-API-Key": "sk-wrong"},
    "prefix of the key": {"X-API-Key": KEY[:-1]},
    "key plus a character": {"X-API-Key": KEY + "x"},
    "key in upper case": {"X-API-Key": KEY.upper()},
    "wrong bearer": {"Authorization": "Bearer " + KEY[:12]},
    "key with the Basic scheme": {"Authorization": "Basic " + KEY},
    "key as the scheme": {"Authorization": KEY},
}


def test_every_listed_operation_refuses_a_missing_or_wrong_key(keyed: httpx.Client) -> None:
    ops = operations(keyed)
    assert len(ops) >= 20  # the schema lists every route, so a route added later is covered too
    before = counts(keyed)
    for method, path in ops:
        url = re.sub(r"\{[^}]+\}", "x", path)
        answers = {}
        for name, headers in WRONG_KEYS.items():
            r = keyed.request(method, url, json={} if method == "POST" else None, headers=headers)
            if path == "/health":
                assert r.status_code == 200
                continue
            assert r.status_code == 401, (method, path, name, r.status_code)
            assert r.json()["code"] in ("missing_api_key", "invalid_api_key")
            answers[name] = r.text
        if path != "/health":
            # A partly right key gets exactly the answer a wholly wrong one gets.
            assert answers["prefix of the key"] == answers["wrong key"] == answers["key plus a character"]
        r = keyed.request(method, url + "?api_key=" + KEY, json={} if method == "POST" else None)
        assert r.status_code == (200 if path == "/health" else 401)  # a key in the URL is not accepted
    assert counts(keyed) == before


MOUNTS = (
    "/agentgym/textcraft",
    "/agentgym/babyai",
    "/agentgym/sciworld",
    "/openenv/crafter",
    "/openenv/textcraft",
)
OPEN_MOUNTED = {"/health", "/metadata", "/schema"}  # OpenEnv's own open routes


def test_mounted_servers_refuse_a_missing_key_and_internal_routes_answer_no_client(
    keyed: httpx.Client,
) -> None:
    """The key rule holds in the sub-apps mounted in the app (AgentGym's, OpenEnv's) as in the
    app itself, served in one process or through Ray (where the hosts running them have no key);
    the internal ``/link`` of OpenEnv's sockets answers a client 404, key or not."""
    before = counts(keyed)
    checked = 0
    for mount in MOUNTS:
        schema = keyed.get(mount + "/openapi.json").json()
        for path, ops in schema["paths"].items():
            for method in ops:
                url = mount + re.sub(r"\{[^}]+\}", "x", path)
                body = {"id": 0, "action": "x"} if method == "post" else None
                if method == "post" and path == "/mcp":
                    body = {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create", "params": {}}
                for name in ("no key", "wrong key", "wrong bearer"):
                    r = keyed.request(method.upper(), url, json=body, headers=WRONG_KEYS[name])
                    if path in OPEN_MOUNTED:
                        assert r.status_code == 200, (method, url, r.status_code)
                        continue
                    assert r.status_code == 401, (method, url, name, r.status_code, r.text)
                    assert r.json()["code"] in ("missing_api_key", "invalid_api_key")
                    checked += 1
    assert checked >= 3 * 30
    for headers in ({}, {"X-API-Key": KEY}):
        for op in ({"op": "open"}, {"op": "end", "session_id": "x"}):
            r = keyed.post("/openenv/crafter/link", json=op, headers=headers)
            assert r.status_code == 404 and r.json()["code"] == "not_found", r.text
    assert counts(keyed) == before
    created = keyed.post("/agentgym/textcraft/create", json={}, headers={"X-API-Key": KEY})
    assert created.status_code == 200, created.text  # with the key, the same call is served
    closed = keyed.post(
        "/agentgym/textcraft/close", json={"id": created.json()["id"]}, headers={"X-API-Key": KEY}
    )
    assert closed.status_code == 200, closed.text


def test_health_docs_and_schema_leak_nothing(keyed: httpx.Client) -> None:
    health = keyed.get("/health")
    assert health.status_code == 200
    body = health.json()
    assert set(body) <= {
        "status",
        "version",
        "instance",
        "workers",
        "lost_hosts",
        "uptime_s",
        "envs",
        "policies",
        "runs_active",
        "capacity",
        "tracing",
        "timestamp",
        "active_jobs",
        "loaded_models",
    }
    assert all(isinstance(v, (int, float)) for v in body["capacity"].values())
    assert "http" not in health.text and "state" not in health.text  # no URL, no path
    for path in ("/health", "/openapi.json", "/docs"):
        r = keyed.get(path)
        assert r.status_code == 200 and KEY not in r.text
        assert_no_secret(r.text + str(r.headers), path)
    schema = keyed.get("/openapi.json").json()
    for path, ops in schema["paths"].items():
        for op in ops.values():
            assert bool(op.get("security")) == (path != "/health"), path  # the key is documented


def collect_files(root: Path) -> Iterator[tuple[str, str]]:
    """Every file under ``root`` as text, with tarballs opened member by member."""
    for path in root.rglob("*"):
        if not path.is_file():
            continue
        data = path.read_bytes()
        if path.name.endswith(".tar.gz"):
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                for member in tar:
                    content = tar.extractfile(member)
                    yield f"{path}:{member.name}", (content.read() if content else b"").decode("latin-1")
        else:
            yield str(path), data.decode("latin-1")


@pytest.mark.slow
def test_no_key_in_any_response_log_trace_or_snapshot(tmp_path: Path) -> None:
    """A real server process logging at debug level: exercise every route with right and wrong
    keys, with an inference server that rejects the keys it is sent and echoes a prefix of each
    (as OpenAI does); then search every response, the log, the trace DB and the state files."""
    with FakeInferenceServer(FakeConfig(model=MODEL, api_key=LLM_KEY)) as llm:
        service = start_service(
            tmp_path,
            {
                "ENVIRONMENT_API_KEY": KEY,
                "INFERENCE_API_KEY": INFERENCE_KEY,
                "VLLM_BASE_URL": llm.base_url,
                "DEFAULT_MODEL": MODEL,
                "STATE_DIR": str(tmp_path / "state"),
                "TRACE_DB": str(tmp_path / "trace.db"),
                "SNAPSHOT_SECRET": "auth-test-secret-" + "z" * 32,
            },
            log_level="debug",
        )
        seen: list[str] = []

        def call(method: str, path: str, body: Any = None, key: str | None = KEY) -> dict[str, Any]:
            headers = {"X-API-Key": key} if key else {}
            r = httpx.request(method, service.base_url + path, json=body, headers=headers, timeout=60)
            seen.append(f"{method} {path} {r.status_code} {r.headers} {r.text}")
            return r.json() if r.headers.get("content-type", "").startswith("application/json") else {}

        def rollout(policy: dict[str, Any], path: str = "/rollout", **extra: Any) -> dict[str, Any]:
            return call(
                "POST", path, {"env": {"env_name": "crafter"}, "policy": policy, "max_turns": 1, **extra}
            )

        try:
            for key in (None, "sk-wrong", KEY[:-2], KEY.upper()):
                call("POST", "/env/create", {"env_name": "crafter"}, key=key)
            call("GET", "/info")
            env_id = call("POST", "/env/create", {"env_name": "crafter", "seed": 1})["env_id"]
            call("POST", "/env/snapshot", {"env_id": env_id})
            own = {"policy_name": "crafter-react", "config": {"api_key": POLICY_KEY}, "bound_env_id": env_id}
            policy_id = call("POST", "/policy/create", own)["policy_id"]
            for body in ({"dry_run": True}, {"record_logprobs": True}):
                assert call("POST", "/policy/step", {"policy_id": policy_id, **body}).get("error") in (
                    None,
                    "inference_auth_error",
                )
            call("POST", "/policy/snapshot", {"policy_id": policy_id})
            react = {"policy_name": "crafter-react"}
            for policy in ({"policy_id": policy_id}, react, {**react, "config": {"api_key": POLICY_KEY}}):
                out = rollout(policy, record={"return_trace": True, "logprobs": True})
                assert out["stop_reason"] == "policy_error:inference_auth_error", out.get("stop_reason")
            rollout(react, "/rollout/group", group_size=2)
            call("GET", f"/run/status/{rollout(react, '/rollout/start')['run_id']}")
            call("POST", "/env/step", {"env_id": "nope", "action": "noop"})
            assert "Incorrect API key provided" in "\n".join(seen)  # the LLM server did echo a prefix
            assert_no_secret("\n".join(seen), "a response")
            # A caller that puts a key in a body gets it back in its own 422, but it goes nowhere else.
            call("POST", "/env/create", {"env_name": "crafter", "config": {"api_key": KEY}})
        finally:
            service.stop()
        assert llm.stats()["requests"] >= 5  # the keys really were sent, and refused
    log = service.log.read_text()
    assert "POST /rollout" in log  # the log is really there, at debug level
    assert_no_secret(log, "the server log")
    for where, text in collect_files(tmp_path / "state"):
        assert_no_secret(text, where)
    assert_no_secret((tmp_path / "trace.db").read_bytes().decode("latin-1"), "the trace DB")
