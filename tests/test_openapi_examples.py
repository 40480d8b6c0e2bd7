"""The OpenAPI page is part of the product: every operation's example works as written (ids
pasted in, as a user would) and is answered as the page documents it, every field is described,
and each route lists only the errors it can return. The test walks the app's own OpenAPI
document, so routes added later are covered.

A placeholder such as ``"<env_id from /env/create>"`` stands for an id an earlier call returned:
the test fills it with a live object's id, chosen by the field's name (``env_id``,
``bound_env_id``, ``policy_id``, ``snapshot_id``, ``run_id``, ``job_id``, ``stream_id``,
``model_name`` and their lists).
"""

from __future__ import annotations

import copy
import re
import time
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis.errors import FailureGroup

from tools.server_thread import ServerThread

METHODS = ("get", "post", "put", "patch", "delete")


def operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, op)
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
        if method in METHODS
    ]


def resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is None:
        return node
    return schema["components"]["schemas"][ref.rsplit("/", 1)[-1]]


def body_example(schema: dict[str, Any], op: dict[str, Any]) -> Any:
    """The body Swagger UI starts from: the media type's example(s), else the schema's first."""
    media = op["requestBody"]["content"]["application/json"]
    if "example" in media:
        return media["example"]
    if media.get("examples"):
        return next(iter(media["examples"].values()))["value"]
    model = resolve(schema, media["schema"])
    examples = model.get("examples") or ([model["example"]] if "example" in model else [])
    return examples[0] if examples else None


class LiveIds:
    """Fresh objects of every kind, for filling one example's placeholders."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self.run_id = self._finished_run()
        self.job_id = self._finished_job()
        # Stopping takes a running job: one with a budget it will not finish during the test.
        self.running_job_id = self._post(
            "/train", {"total_timesteps": 10_000_000, "model_name": "example-running"}
        )["job_id"]
        # One stream for the stream routes' examples (its DELETE comes last, with the deletions).
        self.stream_id = client.post(
            "/rollout/stream",
            json={
                "group": {
                    "group_size": 2,
                    "env": {"env_name": "crafter"},
                    "policy": {"policy_name": "crafter-random"},
                    "max_turns": 2,
                },
                "in_flight": 1,
            },
        ).json()["stream_id"]
        inference = client.get("/info").json()["inference"]  # the test's fake LLM
        self.base_url, self.model = inference["base_url"], inference["default_model"]

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self.client.post(path, json=body)
        assert response.status_code == 200, (path, response.text)
        return response.json()

    def _finished_run(self) -> str:
        started = self.client.post(
            "/rollout/start",
            json={
                "env": {"env_name": "crafter"},
                "policy": {"policy_name": "crafter-random"},
                "max_turns": 2,
            },
        ).json()
        deadline = time.monotonic() + 30
        while self.client.get(started["status_url"]).json()["status"] == "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        return started["run_id"]

    def _finished_job(self) -> str:
        job_id = self._post("/train", {"total_timesteps": 64, "model_name": "example-live"})["job_id"]
        deadline = time.monotonic() + 60
        while self.client.get(f"/training/{job_id}/status").json()["status"] in ("pending", "running"):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        return job_id

    def fresh(self) -> dict[str, str]:
        env_id = self._post("/env/create", {"env_name": "crafter", "seed": 3})["env_id"]
        policy_id = self._post(
            "/policy/create", {"policy_name": "crafter-react", "config": {}, "bound_env_id": env_id}
        )["policy_id"]
        return {
            "env_id": env_id,
            "policy_id": policy_id,
            "env_snapshot_id": self._post("/env/snapshot", {"env_id": env_id})["snapshot_id"],
            "policy_snapshot_id": self._post("/policy/snapshot", {"policy_id": policy_id})["snapshot_id"],
            "run_id": self.run_id,
            "job_id": self.job_id,
            "running_job_id": self.running_job_id,
            "stream_id": self.stream_id,
            "model_name": "example-live",
            "base_url": self.base_url,
            "model": self.model,
        }


def fill(value: Any, path: str, ids: dict[str, str], key: str | None = None) -> Any:
    """Replace each ``"<...>"`` placeholder by the live id its key names."""
    if isinstance(value, dict):
        return {k: fill(v, path, ids, k) for k, v in value.items()}
    if isinstance(value, list):
        item_key = key[:-1] if key and key.endswith("_ids") else key
        return [fill(v, path, ids, item_key) for v in value]
    if isinstance(value, str) and value.startswith("<") and value.endswith(">"):
        if key in ("env_id", "bound_env_id"):
            return ids["env_id"]
        if key == "job_id" and path.endswith("/stop"):
            return ids["running_job_id"]
        if key == "snapshot_id":
            return ids["policy_snapshot_id" if path.startswith("/policy/") else "env_snapshot_id"]
        if key in ids:
            return ids[key]
        raise AssertionError(f"{path}: no live id for the placeholder {value!r} of {key!r}")
    return value


@pytest.fixture
def schema(client: httpx.Client) -> dict[str, Any]:
    return client.get("/openapi.json").json()


@pytest.mark.slow  # a sweep: every operation of the API, each on fresh ids
def test_every_operation_example_succeeds(server: ServerThread, client: httpx.Client, schema: dict) -> None:
    """Each example succeeds, and its answer is the documented one (status, content type, body),
    checked by the fuzzer's own validator: its examples phase is this sweep with live ids."""
    live = LiveIds(client)
    documented = schemathesis.openapi.from_dict(schema)
    failures = []
    # Deletions last, as a user cleans up: deleting the example model first would fail /inference.
    for path, method, op in sorted(operations(schema), key=lambda item: item[1] == "delete"):
        ids = live.fresh()
        url = path
        for name in re.findall(r"\{(\w+)\}", path):
            url = url.replace(f"{{{name}}}", fill(f"<{name}>", path, ids, name))
        body = None
        if "requestBody" in op:
            example = body_example(schema, op)
            if example is None:
                failures.append(f"{method.upper()} {path}: no example")
                continue
            body = fill(copy.deepcopy(example), path, ids)
        response = client.request(method, url, json=body)
        if not 200 <= response.status_code < 300:
            failures.append(f"{method.upper()} {path}: {response.status_code} {response.text[:300]}")
            continue
        if str(response.status_code) not in op["responses"]:
            failures.append(f"{method.upper()} {path}: {response.status_code} is not documented")
        try:  # a failure is an AssertionError naming the fault, several a group of them
            documented[path][method.upper()].validate_response(response)
        except (AssertionError, FailureGroup) as exc:
            failures.append(f"{method.upper()} {path}: not as documented: {str(exc)[:600]}")
    assert failures == []


def test_every_field_is_described_and_every_request_has_an_example(schema: dict) -> None:
    undescribed = [
        f"{name}.{field}"
        for name, component in schema["components"]["schemas"].items()
        for field, prop in component.get("properties", {}).items()
        if not prop.get("description")
    ]
    assert undescribed == []
    for path, method, op in operations(schema):
        assert op.get("description") or op.get("summary"), f"{method} {path}"
        for parameter in op.get("parameters", []):
            assert parameter.get("description"), f"{method} {path}: {parameter['name']}"


def test_routes_list_only_the_errors_they_can_return(schema: dict, start_server: Any, fake_llm: Any) -> None:
    for path, method, op in operations(schema):
        assert "401" not in op["responses"], f"{method} {path}: no key is configured"
    assert set(schema["paths"]["/health"]["get"]["responses"]) == {"200", "503"}  # 503: no Ray host answers
    assert set(schema["paths"]["/env/list"]["get"]["responses"]) == {"200", "422"}

    keyed = start_server(environment_api_key="k" * 24, vllm_base_url=fake_llm.base_url)
    keyed_schema = httpx.get(keyed.base_url + "/openapi.json", timeout=30).json()
    for path, method, op in operations(keyed_schema):
        assert ("401" in op["responses"]) == (path != "/health"), f"{method} {path}"
