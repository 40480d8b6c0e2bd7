"""RL-mode rollouts record token ids and logprobs by default; a server that returns none is reported."""

from __future__ import annotations

import httpx

from grpo_service.models import RolloutGroupResponse
from tests.conftest import MODEL
from tools.fake_server import FakeConfig, FakeInferenceServer


def group(client: httpx.Client, **extra: object) -> dict:
    body = {
        "group_size": 2,
        "env": {"env_name": "crafter", "seed": 3},
        "policy": {"policy_name": "crafter-react", "config": {"model": MODEL, **extra.pop("config", {})}},
        "max_turns": 2,
        **extra,
    }
    r = client.post("/rollout/group", json=body)
    assert r.status_code == 200, r.text
    # The route's bytes (orjson) are pydantic's.
    assert r.content == RolloutGroupResponse.model_validate_json(r.content).model_dump_json().encode()
    return r.json()


def steps(out: dict) -> list[dict]:
    return [s for m in out["members"] for t in m["result"]["trajectories"] for s in t["steps"]]


def test_rl_group_records_tokens_without_asking(client: httpx.Client) -> None:
    out = group(client)
    assert out["warnings"] == [] and out["metrics"]["llm_calls_without_tokens"] == 0
    for step in steps(out):
        llm = step["llm"]
        assert llm["prompt_token_ids"] and llm["completion_token_ids"]
        assert len(llm["completion_token_ids"]) == len(llm["completion_logprobs"])


def test_eval_mode_and_explicit_off_record_no_tokens(client: httpx.Client) -> None:
    for extra in ({"mode": "eval"}, {"record": {"logprobs": False}}):
        out = group(client, **extra)
        assert all(s["llm"]["completion_token_ids"] is None for s in steps(out))
        assert out["warnings"] == []


def test_server_without_token_ids_is_reported(client: httpx.Client) -> None:
    with FakeInferenceServer(FakeConfig(model=MODEL, supports_token_ids=False)) as plain:
        out = group(client, config={"inference_url": plain.base_url})
    assert out["metrics"]["llm_calls_without_tokens"] == 4
    (warning,) = out["warnings"]
    assert warning.startswith("no_token_ids:") and "2 of 2 LLM calls" in warning
    member = out["members"][0]["result"]
    assert member["metrics"]["llm_calls_without_tokens"] == 2 and member["warnings"] == [warning]
