"""The link a Ray front's WebSocket uses to reach its session on a host (`ClusterLink`), driven
against a real app in this process: each operation one internal request through the app, as the
front's router sends it to a host (through a real Ray cluster: `test_openenv_ray.py`)."""

from __future__ import annotations

import json
from pathlib import Path

from grpo_service import create_app
from grpo_service.cluster.step_batcher import batched
from grpo_service.protocols.openenv.links import STEP_LINK, ClusterLink, LinkRequest, is_step_frame
from tests.conftest import make_settings

KEY = "links-test-key-0123456789"


async def test_a_cluster_link_plays_a_session_through_the_app(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path, max_envs=1, environment_api_key=KEY))
    link = ClusterLink(app, "/openenv/textcraft/link", [(b"x-api-key", KEY.encode())])
    opened = await link.open(None)
    assert opened.session_id is not None and opened.reply is None
    reset = await link.frame(json.dumps({"type": "reset", "data": {"seed": 1, "episode_id": "linked"}}))
    assert reset.reply is not None and reset.reply["type"] == "observation" and reset.close is None
    step = await link.frame(json.dumps({"type": "step", "data": {"action": "inventory"}}))  # op "step"
    assert step.reply is not None and step.reply["type"] == "observation", step
    odd = await link.frame(json.dumps({"type": "step", "data": 5}))  # checked on the host as any frame
    assert odd.reply is not None and odd.reply["data"]["code"] == "VALIDATION_ERROR" and odd.close is None
    bad = await link.frame("not json")
    assert bad.reply is not None and bad.reply["data"]["code"] == "INVALID_JSON" and bad.close is None
    state = (await link.frame(json.dumps({"type": "state"}))).reply
    assert state is not None and state["data"]["episode_id"] == "linked"
    assert (await link.check()).close is None

    full = ClusterLink(app, "/openenv/crafter/link", [(b"x-api-key", KEY.encode())])
    refused = await full.open(None)  # max_envs=1: the host answers 429, the socket gets the frame
    assert refused.session_id is None and refused.close == 1013
    assert refused.reply is not None and refused.reply["data"]["code"] == "CAPACITY_REACHED"

    closing = await link.frame(json.dumps({"type": "close"}))
    assert (closing.close, closing.reason) == (1000, "closed")
    await link.end(closing.reason)
    gone = await link.check()
    assert gone.close == 1000 and gone.reply is not None and gone.reply["data"]["code"] == "SESSION_ERROR"
    assert app.state.services.registry.envs.__len__() == 0

    keyless = ClusterLink(app, "/openenv/textcraft/link", [])
    unauthorized = await keyless.open(None)
    assert unauthorized.close == 1000 and "401" in unauthorized.reply["data"]["message"]  # type: ignore[index]


def test_the_front_sends_step_frames_with_the_other_steps_of_their_turn() -> None:
    """A step frame's link request is recognised by its first bytes (`STEP_LINK`), which the Ray
    front's router sends through the step batcher; every other operation goes alone."""
    assert [is_step_frame(raw) for raw in ('{"type": "step", "data": {}}', '{"data":1,"type":"step"}')] == [
        True,
        True,
    ]
    others = ('{"type": "reset"}', '{"data": {"type": "step"}}', "[1]", "not json", "[" * 2_000 + "]" * 2_000)
    assert not any(is_step_frame(raw) for raw in others)
    step = LinkRequest(op="step", session_id="h1-abc", frame='{"type":"step"}').model_dump_json().encode()
    assert step.startswith(STEP_LINK) and batched("POST", "/openenv/textcraft/link", step)
    for op in ("open", "frame", "check", "end"):
        body = LinkRequest(op=op, session_id="h1-abc", frame="{}").model_dump_json().encode()  # type: ignore[arg-type]
        assert not batched("POST", "/openenv/textcraft/link", body), op
    assert batched("POST", "/env/step", b"{}") and not batched("GET", "/openenv/textcraft/link", step)


async def test_a_link_request_is_answered_ahead_of_routing_only_when_internal(tmp_path: Path) -> None:
    """On a host, a link request takes the internal fast path; one it does not take (not a
    `LinkRequest`) gets the route's 422, and from outside the service the path does not exist."""
    from grpo_service.api.asgi import call_asgi

    app = create_app(make_settings(tmp_path))
    path, headers = "/openenv/textcraft/link", [(b"content-type", b"application/json")]
    status, _, body = await call_asgi(app, "POST", path, b"", headers, b'{"op":"open"}')
    assert status == 200 and json.loads(body)["session_id"]
    status, _, body = await call_asgi(app, "POST", path, b"", headers, b'{"op":"nope"}')
    assert status == 422, body
    from fastapi.testclient import TestClient

    with TestClient(app) as client:  # a client's request is not internal: 404, as for any unknown path
        assert client.post(path, json={"op": "open"}).status_code == 404
