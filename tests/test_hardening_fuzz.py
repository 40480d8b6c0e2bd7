"""Schemathesis against the live OpenAPI schema of a running server, with and without an API key:
no 5xx and no response that violates the schema. A bounded run (a few examples per operation);
the long one is ``tests/fuzz_schemathesis.py``, run by hand."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.fuzz_schemathesis import KEY, run_schemathesis, unlisted_routes_schema
from tools.fake_server import FakeInferenceServer
from tools.server_thread import ServerThread

pytestmark = [pytest.mark.slow, pytest.mark.through_ray]


# Schemathesis's coverage phase (about 4,000 boundary cases for the main schema, most of a run's
# time) runs embedded and open; the Ray runs differ from it only in the front.
WITHOUT_COVERAGE = "examples,fuzzing,stateful"
# The main schema's examples phase sends each operation's example with its "<env_id from ...>"
# placeholders as they are (most answer 422 or 404); test_openapi_examples.py plays every example
# with live ids and checks each answer as the schema documents it, so the runs here leave it out.
MAIN_SCHEMA_PHASES = {"embedded": "coverage,fuzzing,stateful", "ray": "fuzzing,stateful"}


def fuzz(
    server: ServerThread, workdir: Path, headers: dict[str, str] | None = None, **options: object
) -> None:
    result = run_schemathesis(server.base_url, workdir, headers=headers, max_examples=3, seed=1, **options)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    paths = httpx.get(server.base_url + "/openapi.json", timeout=30).json()["paths"]
    operations = sum(len(ops) for ops in paths.values())  # every route, including ones added later
    assert f"Tested: {operations}" in result.stdout, result.stdout[-2000:]


@pytest.mark.parametrize("keyed", [False, True], ids=["open", "keyed"])
def test_fuzzing_finds_no_5xx_and_no_schema_violation(
    start_server: Callable[..., ServerThread],
    fake_llm: FakeInferenceServer,
    tmp_path: Path,
    keyed: bool,
    serving: str,
) -> None:
    if keyed and serving == "ray":  # the front checks the key with the same gate as embedded
        pytest.skip("the key gate is the embedded one; fuzzed open through Ray (70 s saved)")
    server = start_server(vllm_base_url=fake_llm.base_url, environment_api_key=KEY if keyed else None)
    if keyed:
        # Without the key every answer is a 401. With it the app answers as the open one, which is
        # fuzzed in full: the gate passes a request through unchanged (test_hardening_auth.py).
        fuzz(server, tmp_path, phases="fuzzing")
    else:
        fuzz(server, tmp_path, phases=MAIN_SCHEMA_PHASES[serving])
    # The server still serves normally afterwards.
    headers = {"X-API-Key": KEY} if keyed else {}
    with httpx.Client(base_url=server.base_url, headers=headers, timeout=60) as client:
        body = {"env": {"env_name": "crafter"}, "policy": {"policy_name": "crafter-random"}, "max_turns": 2}
        assert client.post("/rollout", json=body).json()["status"] == "completed"


def test_fuzzing_the_routes_outside_the_schema_finds_no_5xx(
    start_server: Callable[..., ServerThread], tmp_path: Path, serving: str
) -> None:
    """The viewer's pages and JSON API are left out of /openapi.json (`include_in_schema=False`):
    fuzz them from a schema of their own, against a server with real traced rollouts. Their
    status codes and HTML pages are not documented anywhere, so only those checks are left out."""
    if serving == "ray":  # LOCAL_PREFIXES in grpo_service/cluster/router.py
        pytest.skip("the viewer is the front's own app, reading the trace DB on the front's node")
    server = start_server(trace_db=tmp_path / "trace.db")
    body = {"env": {"env_name": "crafter"}, "policy": {"policy_name": "crafter-random"}, "max_turns": 3}
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        for seed in (1, 2):
            body["env"] = {"env_name": "crafter", "seed": seed}
            assert client.post("/rollout", json=body).is_success
    schema = unlisted_routes_schema(server.app)
    operations = sum(len(ops) for ops in schema["paths"].values())
    assert any(path.startswith("/viewer/api/") for path in schema["paths"]), sorted(schema["paths"])
    (tmp_path / "unlisted.json").write_text(json.dumps(schema))
    result = run_schemathesis(
        server.base_url,
        tmp_path,
        schema=str(tmp_path / "unlisted.json"),
        exclude_checks=("status_code_conformance", "content_type_conformance"),
        max_examples=2,
        seed=1,
    )
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    assert f"Tested: {operations}" in result.stdout, result.stdout[-2000:]


@pytest.mark.parametrize("game", ["textcraft", "babyai", "sciworld"])
def test_fuzzing_the_agentgym_servers_finds_no_5xx(
    start_server: Callable[..., ServerThread], tmp_path: Path, game: str, serving: str
) -> None:
    """The AgentGym-compatible servers are sub-apps with their own schema: no 5xx, and bodies
    that violate it (``{"id": false}``, a float task index) are rejected, not read as id 0."""
    if serving == "ray" and game != "textcraft":  # the front forwards every game alike
        pytest.skip("through Ray, one game is fuzzed: the route to the home host is the same")
    server = start_server()
    base = f"{server.base_url}/agentgym/{game}"
    result = run_schemathesis(
        base,
        tmp_path,
        schema=f"{base}/openapi.json",
        max_examples=2,
        seed=1,
        **({"phases": WITHOUT_COVERAGE} if serving == "ray" else {}),
    )
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
