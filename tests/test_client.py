"""The typed client (`grpo_service.client.task_app`), sync and async, against a real server on loopback."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from grpo_service.client.task_app import (
    AsyncTaskAppClient,
    ServiceCallError,
    ServiceRequest,
    TaskAppClient,
    acall,
    call,
)
from grpo_service.models import RolloutGroupResponse, RolloutRequest, RolloutResponse
from tools.server_thread import ServerThread

GROUP = {
    "group_size": 3,
    "env": {"env_name": "crafter", "seed": 4},
    "policy": {"policy_name": "crafter-random", "config": {"seed": 1}},
    "max_turns": 3,
}


def test_sync_client_covers_the_lifecycle(server: ServerThread) -> None:
    with TaskAppClient(server.base_url) as app:
        assert app.health().status == "healthy"
        assert "crafter" in {e.name for e in app.info().environments}
        env = app.create_env(env_name="crafter", seed=3)
        step = app.step_env(env_id=env.env_id, actions=["move_left", "do"])
        assert step.step_idx == 2 and step.env_id == env.env_id
        snap = app.snapshot_env(env_id=env.env_id)
        restored = app.restore_env(snapshot_id=snap.snapshot_id)
        assert restored.observation == step.observation and restored.parent_snapshot_id == snap.snapshot_id
        policy = app.create_policy(policy_name="crafter-react", bound_env_id=env.env_id)
        decision = app.step_policy(
            policy_id=policy.policy_id, observation=step.observation, record_logprobs=True
        )
        assert decision.error is None and decision.llm is not None and decision.llm.completion_token_ids
        children = app.branch(env_ids=[env.env_id], num_children=2)
        assert len(children.children) == 2
        # A model or a dict works as well as keyword fields; the answer is the route's model.
        request = RolloutRequest.model_validate(
            {"env": {"env_id": env.env_id}, "policy": {"policy_id": policy.policy_id}, "max_turns": 2}
        )
        rollout = app.rollout(request)
        assert isinstance(rollout, RolloutResponse) and rollout.metrics.num_decisions == 2
        started = app.start_group(GROUP)
        status = app.run_status(started.run_id)
        assert status.run_id == started.run_id
        assert app.terminate_env(env_id=env.env_id).existed
        assert app.terminate_policy(policy_id=policy.policy_id).existed

        with pytest.raises(ServiceCallError) as missing:
            app.step_env(env_id=env.env_id, action="noop")
        assert missing.value.cause == "http_404" and missing.value.status == 404
        with pytest.raises(ServiceCallError) as invalid:  # checked here: nothing is sent
            app.step_env(env_id=env.env_id)
        assert invalid.value.cause == "invalid_request" and "exactly one" in invalid.value.detail
        with pytest.raises(TypeError):
            app.rollout(request, max_turns=3)


async def test_async_client_plays_a_group(server: ServerThread) -> None:
    async with AsyncTaskAppClient(server.base_url) as app:
        group = await app.rollout_group(GROUP)
        assert isinstance(group, RolloutGroupResponse) and group.metrics.completed == 3
        assert len({m.result.trajectories[0].steps[0].step_idx for m in group.members if m.result}) == 1
        env = await app.create_env(env_name="crafter")
        assert (await app.reset_env(env_id=env.env_id, seed=5)).step_idx == 0
        with pytest.raises(ServiceCallError) as unknown:
            await app.abort(run_id="no-such-run")
        assert unknown.value.cause == "http_404"


def test_unreachable_service_and_api_key(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(environment_api_key="k" * 32)
    with TaskAppClient(server.base_url) as anonymous, pytest.raises(ServiceCallError) as denied:
        anonymous.info()
    assert denied.value.status == 401
    with TaskAppClient(server.base_url, api_key="k" * 32) as app:
        assert app.info().policies
    with TaskAppClient("http://127.0.0.1:9", attempts=1) as nowhere, pytest.raises(ServiceCallError) as down:
        nowhere.health()
    assert down.value.cause == "connect_error"


class Flaky:
    """An ASGI app that refuses the first ``refusals`` requests (503, ``Retry-After: 0``), then
    answers ``{"n": <request count>}``; ``/slow`` answers after ``slow_s`` seconds."""

    def __init__(self, refusals: int, slow_s: float = 1.0) -> None:
        self.refusals, self.slow_s, self.requests = refusals, slow_s, 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.requests += 1
        status, body = 200, json.dumps({"n": self.requests}).encode()
        if scope["path"] == "/slow":
            await asyncio.sleep(self.slow_s)
        elif self.requests <= self.refusals:
            status, body = 503, b'{"detail": "busy"}'
        headers = [(b"content-type", b"application/json"), (b"retry-after", b"0")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@pytest.mark.parametrize("transport", ["sync", "async"])
def test_refusals_are_retried_and_timeouts_are_not(transport: str) -> None:
    flaky = Flaky(refusals=2)
    with ServerThread(flaky, lifespan="off", name="flaky") as server:

        def send(request: ServiceRequest) -> Any:
            if transport == "sync":
                with httpx.Client(base_url=server.base_url) as client:
                    return call(client, request)

            async def send_async() -> Any:
                async with httpx.AsyncClient(base_url=server.base_url) as client:
                    return await acall(client, request)

            return asyncio.run(send_async())

        assert send(ServiceRequest("GET", "/", attempts=3)) == {"n": 3}  # two 503s, then the answer
        flaky.requests, flaky.refusals = 0, 1
        with pytest.raises(ServiceCallError) as refused:
            send(ServiceRequest("GET", "/", attempts=1))
        assert refused.value.cause == "http_503" and flaky.requests == 1
        with pytest.raises(ServiceCallError) as slow:
            send(ServiceRequest("GET", "/slow", attempts=3, read_timeout_s=0.2))
        assert slow.value.cause == "timeout" and flaky.requests == 2, (
            "a timed-out request is never sent again"
        )
