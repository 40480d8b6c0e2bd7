"""The link a Ray front's WebSocket uses to reach its session on a host (`ClusterLink`), driven
against a real app in this process: each operation one internal request through the app, as the
front's router sends it to a host (through a real Ray cluster: `test_openenv_ray.py`)."""

from __future__ import annotations

import json
from pathlib import Path

from grpo_service import create_app
from grpo_service.protocols.openenv.links import ClusterLink
from tests.conftest import make_settings

KEY = "links-test-key-0123456789"


async def test_a_cluster_link_plays_a_session_through_the_app(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path, max_envs=1, environment_api_key=KEY))
    link = ClusterLink(app, "/openenv/textcraft/link", [(b"x-api-key", KEY.encode())])
    opened = await link.open(None)
    assert opened.session_id is not None and opened.reply is None
    reset = await link.frame(json.dumps({"type": "reset", "data": {"seed": 1, "episode_id": "linked"}}))
    assert reset.reply is not None and reset.reply["type"] == "observation" and reset.close is None
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
