"""The fake inference server: vLLM response shape, determinism, faults, control routes."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from envs.crafter.actions import ACTIONS, TOOL_NAME, TOOL_SCHEMA
from inference.toy_tokenizer import encode, encode_chat, render_chat, token_id, tokenize
from tools.fake_server import FAULT_KINDS, FakeConfig, FakeInferenceServer, _json_body, _parse_fault_prob

MESSAGES = [{"role": "system", "content": "You play Crafter."}, {"role": "user", "content": "Tree ahead."}]


@pytest.fixture
def server(fake: FakeInferenceServer) -> FakeInferenceServer:
    return fake


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": MESSAGES, "tools": [TOOL_SCHEMA], **extra}


def post(server: FakeInferenceServer, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=kw.pop("timeout", 5), **kw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "messages": [], "temperature": 0.7, "seed": 3}',
        b'{"seed": 123456789012345678901234567890}',  # past 64 bits: orjson would read a float
        b'{"seed": -9223372036854775809, "n": 1}',
        b'{"temperature": NaN, "top_p": Infinity}',  # not JSON, read by Python's json (and vLLM)
        b'{"content": "\\ud800 lone"}',
        b'{"a": 1, "a": 2}',
        '{"content": "caf\u00e9"}'.encode("utf-16"),
        b"\xef\xbb\xbf{}",
        b"[1, 2.50, -0.0, 1e400]",
        b"",
        b"{",
        b"\xff\xfe\x00",
    ],
)
def test_body_reads_as_pythons_json(raw: bytes) -> None:
    """The fake reads a body by orjson where that gives Python's value, else by Python's json."""
    try:
        expected: Any = json.loads(raw)
    except ValueError as exc:
        with pytest.raises(type(exc)):
            _json_body(raw)
        return
    got = _json_body(raw)
    assert json.dumps(got) == json.dumps(expected)


def test_response_has_vllm_shape(server: FakeInferenceServer) -> None:
    data = post(server, chat_body(logprobs=True, top_logprobs=2, return_token_ids=True)).json()
    assert data["object"] == "chat.completion" and data["id"].startswith("chatcmpl-")
    assert isinstance(data["created"], int) and data["model"] == "fake-model"
    (choice,) = data["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["index"] == 0
    message = choice["message"]
    assert message["role"] == "assistant" and message["content"] is None
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"]["name"] == TOOL_NAME
    actions = json.loads(call["function"]["arguments"])["actions"]
    assert 1 <= len(actions) <= 4 and set(actions) <= set(ACTIONS)

    entries = choice["logprobs"]["content"]
    assert len(entries) == len(choice["token_ids"]) == data["usage"]["completion_tokens"]
    for entry, tid in zip(entries, choice["token_ids"], strict=True):
        assert entry["logprob"] < 0 and token_id(entry["token"]) == tid
        assert bytes(entry["bytes"]).decode() == entry["token"]
        assert len(entry["top_logprobs"]) == 2 and entry["top_logprobs"][0]["token"] == entry["token"]
    assert data["prompt_token_ids"] == encode(render_chat(MESSAGES, [TOOL_SCHEMA]))
    assert encode_chat(MESSAGES, [TOOL_SCHEMA]) == encode(render_chat(MESSAGES, [TOOL_SCHEMA]))
    usage = data["usage"]
    assert usage["prompt_tokens"] == len(data["prompt_token_ids"])
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_ids_and_logprobs_only_when_asked(server: FakeInferenceServer) -> None:
    data = post(server, chat_body()).json()
    assert "prompt_token_ids" not in data and "token_ids" not in data["choices"][0]
    assert data["choices"][0]["logprobs"] is None


def test_deterministic_and_seed_sensitive(server: FakeInferenceServer) -> None:
    def decision(**extra: Any) -> list[dict[str, Any]]:
        return [c["message"]["tool_calls"] for c in post(server, chat_body(**extra)).json()["choices"]]

    assert decision(n=4) == decision(n=4)
    assert decision(n=4, seed=1) != decision(n=4, seed=2)
    server.set_config(FakeConfig(vary_unseeded=True))
    assert decision(n=4, temperature=1.0) != decision(n=4, temperature=1.0)
    assert decision(n=4, seed=5) == decision(n=4, seed=5)


def test_n_choices_differ_and_usage_sums(server: FakeInferenceServer) -> None:
    data = post(server, chat_body(n=5, return_token_ids=True)).json()
    assert [c["index"] for c in data["choices"]] == list(range(5))
    args = {c["message"]["tool_calls"][0]["function"]["arguments"] for c in data["choices"]}
    assert len(args) > 1
    assert data["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in data["choices"])


def test_respects_max_items_and_named_tool(server: FakeInferenceServer) -> None:
    tool = json.loads(json.dumps(TOOL_SCHEMA))
    tool["function"]["parameters"]["properties"]["actions"]["maxItems"] = 2
    other = {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}}
    server.set_config(FakeConfig(actions_per_call=(3, 8)))
    choice = {"type": "function", "function": {"name": TOOL_NAME}}
    body = chat_body(tools=[other, tool], tool_choice=choice, n=8)
    for c in post(server, body).json()["choices"]:
        call = c["message"]["tool_calls"][0]["function"]
        assert call["name"] == TOOL_NAME and len(json.loads(call["arguments"])["actions"]) == 2


def test_max_tokens_truncates_with_finish_length(server: FakeInferenceServer) -> None:
    choice = post(server, chat_body(max_tokens=3, return_token_ids=True)).json()["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 3
    assert "tool_calls" not in choice["message"]  # as vLLM: no key when no call was parsed


def test_plain_chat_without_tools(server: FakeInferenceServer) -> None:
    choice = post(server, {"model": "m", "messages": MESSAGES}).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"]


def test_bad_requests_and_models_route(server: FakeInferenceServer) -> None:
    assert post(server, {"model": "m", "messages": []}).status_code == 400
    assert post(server, chat_body(n=0)).status_code == 400
    server.set_config(FakeConfig(strict_model=True))
    assert post(server, chat_body(model="nope")).status_code == 404
    models = httpx.get(f"{server.base_url}/v1/models").json()
    assert models["data"][0]["id"] == "fake-model"


def test_auth_echoes_only_a_prefix(server: FakeInferenceServer) -> None:
    server.set_config(FakeConfig(api_key="sk-right-key"))
    assert post(server, chat_body(), headers={"Authorization": "Bearer sk-right-key"}).status_code == 200
    denied = post(server, chat_body(), headers={"Authorization": "Bearer sk-wrong-key-123456"})
    assert denied.status_code == 401 and "sk-wrong-key" in denied.text


def test_fault_script_then_probabilities_and_stats(server: FakeInferenceServer) -> None:
    server.set_config(FakeConfig(fault_script=["http_500", "ok", "http_503", "http_429"]))
    codes = [post(server, chat_body()).status_code for _ in range(5)]
    assert codes == [500, 200, 503, 429, 200]
    stats = httpx.get(f"{server.base_url}/fake/stats").json()
    assert stats["requests"] == 5
    assert stats["by_fault"] == {"http_500": 1, "ok": 2, "http_503": 1, "http_429": 1}

    server.set_config(FakeConfig(fault_probs={"http_500": 1.0}))
    assert post(server, chat_body()).status_code == 500
    server.set_config(FakeConfig(fault_probs={"http_500": 0.5}, seed=3))
    codes = [post(server, chat_body()).status_code for _ in range(40)]
    assert 5 < codes.count(500) < 35


def test_config_route_merges_and_validates(server: FakeInferenceServer) -> None:
    url = f"{server.base_url}/fake/config"
    updated = httpx.post(url, json={"fault_script": ["http_503"], "latency_s": 0.01})
    assert updated.status_code == 200 and updated.json()["latency_s"] == 0.01
    assert post(server, chat_body()).status_code == 503
    assert httpx.post(url, json={"fault_script": ["explode"]}).status_code == 422
    assert httpx.post(url, json={"actions_per_call": [3, 1]}).status_code == 422
    assert httpx.post(f"{server.base_url}/fake/stats/reset").json()["requests"] == 0


def test_each_fault_on_the_wire(server: FakeInferenceServer) -> None:
    server.set_config(FakeConfig(fault_script=list(FAULT_KINDS), timeout_fault_s=0.2, retry_after_s=0.07))
    responses: dict[str, Any] = {}
    for fault in FAULT_KINDS:
        try:
            responses[fault] = post(server, chat_body(logprobs=True, return_token_ids=True))
        except httpx.HTTPError as exc:
            responses[fault] = exc
    assert responses["timeout"].status_code == 504
    assert responses["http_429"].headers["retry-after"] == "0.07"
    assert responses["http_500"].status_code == 500 and responses["http_503"].status_code == 503
    with pytest.raises(json.JSONDecodeError):
        json.loads(responses["malformed_json"].text)
    no_call = responses["no_tool_call"].json()["choices"][0]
    assert no_call["finish_reason"] == "stop" and "tool_calls" not in no_call["message"]
    bad = responses["invalid_action"].json()["choices"][0]["message"]["tool_calls"][0]["function"]
    assert "fly" in json.loads(bad["arguments"])["actions"]
    assert isinstance(responses["cut_stream"], httpx.RemoteProtocolError)
    mismatch = responses["token_mismatch"].json()["choices"][0]
    assert len(mismatch["token_ids"]) == len(mismatch["logprobs"]["content"]) + 1


def test_no_token_ids_when_unsupported(server: FakeInferenceServer) -> None:
    server.set_config(FakeConfig(supports_token_ids=False))
    data = post(server, chat_body(logprobs=True, return_token_ids=True)).json()
    assert "prompt_token_ids" not in data and "token_ids" not in data["choices"][0]
    assert data["choices"][0]["logprobs"]["content"]


def test_tokenizer_is_stable_across_processes() -> None:
    assert tokenize("make_wood_pickaxe, then do!") == ["make_wood_pickaxe", ",", "then", "do", "!"]
    # Fixed values: a salted hash() would change them between interpreter runs.
    assert [token_id(t) for t in ("hello", "tree")] == [41741, 2749]


def test_stop_is_prompt_with_a_hanging_request() -> None:
    srv = FakeInferenceServer(FakeConfig(fault_script=["timeout"], timeout_fault_s=30)).start()
    outcome: list[Any] = []

    def hang() -> None:
        try:
            outcome.append(post(srv, chat_body(), timeout=20).status_code)
        except httpx.HTTPError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=hang)
    thread.start()
    time.sleep(0.2)
    started = time.monotonic()
    srv.stop()
    thread.join(5)
    assert time.monotonic() - started < 3 and outcome


def test_cli_fault_parser() -> None:
    assert _parse_fault_prob("http_500=0.25") == ("http_500", 0.25)
    with pytest.raises(Exception, match="unknown fault"):
        _parse_fault_prob("explode=1")


def test_completions_are_written_as_json_response_writes_them(server: FakeInferenceServer) -> None:
    """The fake writes its completions by orjson: the bytes are Starlette's `JSONResponse`'s
    (compact, UTF-8), tool calls, logprob entries, token ids and non-ASCII text included."""
    from fastapi.responses import JSONResponse

    unicode = [{"role": "user", "content": "é ✓ 😀 \u2028"}]
    for body in (
        chat_body(logprobs=True, top_logprobs=2, return_token_ids=True, seed=3),
        chat_body(n=3, logprobs=True),
        {"model": "fake-model", "messages": unicode, "logprobs": True, "return_token_ids": True},
    ):
        r = post(server, body)
        assert r.status_code == 200 and r.content == JSONResponse(r.json()).body
    text = httpx.post(
        f"{server.base_url}/v1/completions",
        json={"model": "fake-model", "prompt": [1, 2, 3], "max_tokens": 4, "logprobs": 1},
        timeout=5,
    )
    assert text.status_code == 200 and text.content == JSONResponse(text.json()).body
