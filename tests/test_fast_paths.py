"""`POST /env/step` answered ahead of FastAPI's routing (`FastPaths`): byte for byte as the route
answers it, errors included; whatever the fast path does not take goes on to the route."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from grpo_service.api import fast_paths

# A content type the fast path leaves to the route (FastAPI reads it as JSON all the same).
ROUTED = {"Content-Type": "application/json; charset=utf-8"}


@pytest.fixture
def replays(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The bodies the fast path handed on to the route (the server runs in this process)."""
    seen: list[bytes] = []
    replay = fast_paths._replay

    def counted(body: bytes, receive: Any) -> Any:
        seen.append(body)
        return replay(body, receive)

    monkeypatch.setattr(fast_paths, "_replay", counted)
    return seen


def _same(fast: httpx.Response, routed: httpx.Response, fast_id: str = "", routed_id: str = "") -> None:
    """The same answer, each env's id (when the two stepped different envs) read as one."""
    assert fast.status_code == routed.status_code, (fast.text, routed.text)
    fast_body, routed_body = fast.content, routed.content
    if fast_id:
        fast_body, routed_body = (
            fast_body.replace(fast_id.encode(), b"ID"),
            routed_body.replace(routed_id.encode(), b"ID"),
        )
    assert fast_body == routed_body
    drop = {"date", "content-length"}  # the ids may differ in length; the bodies were compared
    assert {k: v for k, v in fast.headers.items() if k not in drop} == {
        k: v for k, v in routed.headers.items() if k not in drop
    }


def test_env_step_is_answered_alike_before_and_by_the_route(
    client: httpx.Client, replays: list[bytes]
) -> None:
    ids = [
        client.post("/env/create", json={"env_name": "crafter", "seed": 5}).json()["env_id"] for _ in range(2)
    ]
    steps: list[dict[str, Any]] = [
        {"action": "move_left"},
        {"actions": ["do", "noop", "move_up"]},
        {"tool_calls": [{"tool": "interact_many", "args": {"actions": ["move_down", "do"]}}]},
        {"action": "fly"},  # an invalid action: the env's 400
        {"actions": []},  # refused by the request model: the route's 422
    ]
    for step in steps:
        fast = client.post("/env/step", json={"env_id": ids[0], **step})
        routed = client.post("/env/step", content=json.dumps({"env_id": ids[1], **step}), headers=ROUTED)
        _same(fast, routed, ids[0], ids[1])
    assert [json.loads(body) for body in replays] == [{"env_id": ids[0], "actions": []}]  # the 422 only

    unknown = {"env_id": "env_" + "0" * 32, "action": "noop"}
    fast = client.post("/env/step", json=unknown)
    routed = client.post("/env/step", content=json.dumps(unknown), headers=ROUTED)
    assert fast.status_code == 404 and fast.json()["code"] == "env_not_found"
    _same(fast, routed)


@pytest.mark.parametrize(
    "body",
    [b'{"env_id": "x", "action": NaN}', b"{", b"", b"[]", b'{"env_id": 5, "action": "noop"}'],
    ids=["nan", "cut", "empty", "list", "id-type"],
)
def test_a_body_the_fast_path_does_not_take_gets_the_routes_422(
    client: httpx.Client, replays: list[bytes], body: bytes
) -> None:
    answer = client.post("/env/step", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["code"] == "invalid_request"
    assert replays == [body]
