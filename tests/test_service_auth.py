"""API-key auth: every route but /health needs it; no response ever carries the key."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

KEY = "sk-env-very-secret-0123456789"

ROUTES = [
    ("GET", "/info", None),
    ("POST", "/env/create", {"env_name": "crafter"}),
    ("POST", "/env/reset", {"env_id": "x"}),
    ("POST", "/env/step", {"env_id": "x", "action": "noop"}),
    ("POST", "/env/snapshot", {"env_id": "x"}),
    ("POST", "/env/restore", {"snapshot_id": "x"}),
    ("POST", "/env/terminate", {"env_id": "x"}),
    ("POST", "/policy/create", {"policy_name": "crafter-random"}),
    ("POST", "/policy/step", {"policy_id": "x"}),
    ("POST", "/policy/snapshot", {"policy_id": "x"}),
    ("POST", "/policy/restore", {"snapshot_id": "x"}),
    ("POST", "/policy/terminate", {"policy_id": "x"}),
    ("POST", "/rollout", {}),
    ("POST", "/rollout/start", {}),
    ("POST", "/rollout/group", {}),
    ("POST", "/rollout/group/start", {}),
    ("POST", "/branch", {}),
    ("POST", "/run/abort", {"run_id": "x"}),
    ("GET", "/run/status/x", None),
    ("POST", "/agentgym/textcraft/step", {"id": 0, "action": "inventory"}),  # `FastPaths`
    ("POST", "/agentgym/babyai/step", {"id": 0, "action": "turn left"}),
]


@pytest.fixture
def secured(start_server, fake_llm) -> httpx.Client:
    server = start_server(environment_api_key=KEY, vllm_base_url=fake_llm.base_url)
    with httpx.Client(base_url=server.base_url, timeout=30) as c:
        yield c


def test_every_route_but_health_requires_the_key(secured: httpx.Client) -> None:
    partial = KEY[: len(KEY) // 2]
    for method, path, body in ROUTES:
        for headers in (
            {},
            {"X-API-Key": "wrong"},
            {"Authorization": "Bearer " + partial},
            {"X-API-Key": partial},
        ):
            r = secured.request(method, path, json=body, headers=headers)
            assert r.status_code == 401, (method, path, headers, r.status_code)
            assert partial not in r.text and KEY[-6:] not in r.text
    health = secured.get("/health")
    assert health.status_code == 200 and KEY[:4] not in health.text and KEY[-4:] not in health.text


def test_key_accepted_in_either_header(secured: httpx.Client) -> None:
    assert secured.get("/info", headers={"X-API-Key": KEY}).status_code == 200
    assert secured.get("/info", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    r = secured.post("/env/create", json={"env_name": "crafter"}, headers={"X-API-Key": KEY})
    assert r.status_code == 200
    assert KEY not in secured.get("/info", headers={"X-API-Key": KEY}).text


def test_no_key_means_loopback_only() -> None:
    env = {**os.environ, "HOST": "0.0.0.0", "PORT": "0", "ENVIRONMENT_API_KEY": ""}
    env.pop("ENVIRONMENT_API_KEY")
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from grpo_service.serving import serve; from grpo_service import Settings; "
            "serve(Settings(_env_file=None))",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "refusing to serve on 0.0.0.0" in proc.stderr
