"""InferenceClient over real HTTP (the real `openai` client) against the fake vLLM server."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from envs.crafter.actions import TOOL_SCHEMA
from inference import (
    ClientPool,
    InferenceClient,
    InferenceError,
    TokenMismatchError,
    normalize_base_url,
    per_choice_calls,
    resolve_api_key,
    shared_pool,
)
from inference.openai_client import _int_list, redact
from tools.fake_server import FakeConfig, FakeInferenceServer, build_completion

MESSAGES = [{"role": "system", "content": "You play Crafter."}, {"role": "user", "content": "Tree ahead."}]
REQUEST: dict[str, Any] = {"model": "fake-model", "messages": MESSAGES, "tools": [TOOL_SCHEMA]}


@pytest.fixture
def server(fake: FakeInferenceServer) -> FakeInferenceServer:
    return fake


async def failed_chat(
    base_url: str, api_key: str | None = None, *, deadline_s: float | None = None, **options: Any
) -> tuple[InferenceError, float]:
    """The error of a chat that must fail (a fresh client with ``options``), and the seconds it took."""
    client = InferenceClient(base_url, api_key, **options)
    started = time.monotonic()
    try:
        with pytest.raises(InferenceError) as info:
            await client.chat(REQUEST, deadline_s=deadline_s)
    finally:
        await client.aclose()
    return info.value, time.monotonic() - started


@pytest.fixture
async def client(server: FakeInferenceServer) -> AsyncIterator[InferenceClient]:
    c = InferenceClient(server.base_url, "EMPTY", timeout_s=5, max_retries=3, backoff_base_s=0.01)
    yield c
    await c.aclose()


def test_base_url_normalization() -> None:
    assert normalize_base_url("http://vllm:8001") == "http://vllm:8001/v1"
    assert normalize_base_url("http://vllm:8001/v1/") == "http://vllm:8001/v1"
    assert normalize_base_url("https://x.io/v1/chat/completions") == "https://x.io/v1"
    assert normalize_base_url("https://api.groq.com/openai/v1") == "https://api.groq.com/openai/v1"
    with pytest.raises(ValueError):
        normalize_base_url("vllm:8001")


def test_api_key_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INFERENCE_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert resolve_api_key(None) == "EMPTY"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    assert resolve_api_key(None) == "sk-openai"
    monkeypatch.setenv("INFERENCE_API_KEY", "sk-inference")
    assert resolve_api_key(None) == "sk-inference"
    assert resolve_api_key("sk-explicit") == "sk-explicit"


async def test_ok_call_with_exact_token_ids(client: InferenceClient, server: FakeInferenceServer) -> None:
    call = await client.chat(REQUEST, return_token_ids=True)
    assert call.attempts == 1 and call.model == "fake-model" and call.finish_reason == "tool_calls"
    assert call.request["logprobs"] is True and call.request["extra_body"] == {"return_token_ids": True}
    # What the server computed, bit for bit (the fake is deterministic for the same request).
    body = {**REQUEST, "logprobs": True, "return_token_ids": True}
    expected = build_completion(body, server.state.config, "ok", 1)
    choice = expected["choices"][0]
    assert call.prompt_token_ids == expected["prompt_token_ids"]
    # Their compact JSON, kept from the check for the trace to store as it is.
    assert call.prompt_token_ids_json == orjson.dumps(expected["prompt_token_ids"])
    assert call.completion_token_ids == choice["token_ids"]
    assert call.completion_logprobs == [e["logprob"] for e in choice["logprobs"]["content"]]
    assert call.usage is not None and expected["usage"].items() <= call.usage.items()
    assert call.response is not None and call.response["choices"][0]["message"]["tool_calls"]
    assert call.latency_ms > 0


async def test_extra_body_is_merged(client: InferenceClient) -> None:
    request = {**REQUEST, "extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}
    call = await client.chat(request, return_token_ids=True)
    assert call.request["extra_body"] == {
        "chat_template_kwargs": {"enable_thinking": False},
        "return_token_ids": True,
    }
    assert request["extra_body"] == {"chat_template_kwargs": {"enable_thinking": False}}  # not mutated
    assert call.completion_token_ids is not None


async def test_without_token_ids(client: InferenceClient, server: FakeInferenceServer) -> None:
    call = await client.chat(REQUEST)
    assert (
        call.prompt_token_ids is None
        and call.completion_token_ids is None
        and call.completion_logprobs is None
    )
    server.set_config(FakeConfig(supports_token_ids=False))  # like OpenAI/Groq: logprobs yes, ids no
    call = await client.chat(REQUEST, return_token_ids=True)
    assert call.prompt_token_ids is None and call.completion_token_ids is None
    assert call.completion_logprobs and all(lp < 0 for lp in call.completion_logprobs)


async def test_token_mismatch_raises(client: InferenceClient, server: FakeInferenceServer) -> None:
    server.set_config(FakeConfig(fault_script=["token_mismatch"]))
    with pytest.raises(TokenMismatchError, match="token ids but") as info:
        await client.chat(REQUEST, return_token_ids=True)
    assert info.value.kind == "malformed_response" and server.stats()["requests"] == 1


async def test_n_choices(client: InferenceClient) -> None:
    call = await client.chat({**REQUEST, "n": 4}, return_token_ids=True)
    assert call.response is not None and len(call.response["choices"]) == 4
    calls = per_choice_calls(call)
    assert len(calls) == 4 and calls[0].completion_token_ids == call.completion_token_ids
    assert len({tuple(c.completion_token_ids or ()) for c in calls}) > 1
    for c in calls:
        assert c.completion_token_ids is not None and c.completion_logprobs is not None
        assert len(c.completion_token_ids) == len(c.completion_logprobs)
        assert c.prompt_token_ids == call.prompt_token_ids
    assert call.usage is not None
    assert call.usage["completion_tokens"] == sum(len(c.completion_token_ids or []) for c in calls)


async def test_429_with_retry_after_then_success(
    client: InferenceClient, server: FakeInferenceServer
) -> None:
    server.set_config(FakeConfig(fault_script=["http_429"], retry_after_s=0.2))
    started = time.monotonic()
    call = await client.chat(REQUEST)
    assert call.attempts == 2 and time.monotonic() - started >= 0.2


async def test_500_twice_then_success(client: InferenceClient, server: FakeInferenceServer) -> None:
    server.set_config(FakeConfig(fault_script=["http_500", "http_503"]))
    call = await client.chat(REQUEST)
    assert call.attempts == 3 and server.stats()["requests"] == 3


async def test_attempts_are_bounded(client: InferenceClient, server: FakeInferenceServer) -> None:
    server.set_config(FakeConfig(fault_probs={"http_500": 1.0}))
    with pytest.raises(InferenceError) as info:
        await client.chat(REQUEST)
    assert info.value.kind == "server_error" and info.value.attempts == 4 and info.value.status_code == 500
    assert server.stats()["requests"] == 4


@pytest.mark.parametrize(
    ("request_patch", "config", "kind"),
    [
        ({"messages": []}, FakeConfig(), "bad_request"),
        ({"model": "unknown"}, FakeConfig(strict_model=True), "bad_request"),
        ({}, FakeConfig(fault_script=["malformed_json"]), "malformed_response"),
    ],
)
async def test_not_retried(
    client: InferenceClient, server: FakeInferenceServer, request_patch: dict, config: FakeConfig, kind: str
) -> None:
    server.set_config(config)
    with pytest.raises(InferenceError) as info:
        await client.chat({**REQUEST, **request_patch})
    assert info.value.kind == kind and info.value.attempts == 1 and server.stats()["requests"] == 1


async def test_auth_error_never_leaks_the_key(server: FakeInferenceServer) -> None:
    secret = "sk-live-0123456789abcdefSECRET"
    server.set_config(FakeConfig(api_key="sk-the-right-one"))
    error, _ = await failed_chat(server.base_url, secret, max_retries=3)
    assert error.kind == "auth_error" and error.attempts == 1
    for text in (str(error), repr(error), error.detail, repr(client)):
        assert secret not in text and secret[:12] not in text


def test_redact_catches_prefixes() -> None:
    key = "sk-abcdefghijklmnop"
    assert "abcdefgh" not in redact(f"Incorrect key {key[:12]}**** and {key}", key)
    assert redact("nothing here", "EMPTY") == "nothing here"


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        "[0, 1, -2, 151643, 9223372036854775807, 18446744073709551615]",
        "[1, true]",
        "[1, false]",
        "[1, null]",
        "[1, 2.0]",
        "[1, 1e3]",
        '[1, "2"]',
        '["-"]',
        "[1, [2]]",
        "[[]]",
        '[1, {"a": 2}]',
        "[18446744073709551616]",
        "{}",
        '"1,2"',
        "7",
    ],
)
def test_token_id_lists_hold_integers_only(text: str) -> None:
    """The reply's token id lists are checked in C (`_int_list`): the same verdict as a check of
    every element's type, on any parsed JSON."""
    value = orjson.loads(text)
    exact = isinstance(value, list) and all(type(v) is int for v in value)
    if exact:
        assert _int_list(value, "ids") is value
    else:
        with pytest.raises(InferenceError, match="ids is not a list of integers"):
            _int_list(value, "ids")


async def test_cut_stream_is_retried(client: InferenceClient, server: FakeInferenceServer) -> None:
    server.set_config(FakeConfig(fault_script=["cut_stream"]))
    call = await client.chat(REQUEST)
    assert call.attempts == 2
    server.set_config(FakeConfig(fault_probs={"cut_stream": 1.0}))
    with pytest.raises(InferenceError) as info:
        await client.chat(REQUEST)
    assert info.value.kind == "connection_error" and info.value.attempts == 4


async def test_timeout_is_bounded_by_deadline(client: InferenceClient, server: FakeInferenceServer) -> None:
    server.set_config(FakeConfig(fault_probs={"timeout": 1.0}, timeout_fault_s=10))
    started = time.monotonic()
    with pytest.raises(InferenceError) as info:
        await client.chat(REQUEST, deadline_s=0.4)
    assert info.value.kind == "timeout"
    assert time.monotonic() - started < 1.0


async def test_per_attempt_timeout_then_success(server: FakeInferenceServer) -> None:
    server.set_config(FakeConfig(fault_script=["timeout"], timeout_fault_s=10))
    client = InferenceClient(server.base_url, timeout_s=0.3, backoff_base_s=0.01)
    try:
        call = await client.chat(REQUEST, deadline_s=5)
    finally:
        await client.aclose()
    assert call.attempts == 2


async def test_backoff_never_overshoots_the_deadline(server: FakeInferenceServer) -> None:
    server.set_config(FakeConfig(fault_probs={"http_503": 1.0}))
    error, took_s = await failed_chat(server.base_url, deadline_s=0.5, backoff_base_s=2.0, max_retries=5)
    assert error.kind == "server_error" and error.attempts == 1
    assert took_s < 0.5


async def test_connection_refused_fails_fast() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    error, took_s = await failed_chat(
        f"http://127.0.0.1:{port}", deadline_s=5, max_retries=2, backoff_base_s=0.01
    )
    assert error.kind == "connection_error" and error.attempts == 3
    assert took_s < 1.0


async def test_pool_shares_clients(server: FakeInferenceServer) -> None:
    pool = ClientPool()
    a = pool.get(server.base_url, "k1", timeout_s=10)
    assert pool.get(server.base_url + "/v1/", "k1", timeout_s=10) is a
    assert pool.get(server.base_url, "k2", timeout_s=10) is not a
    assert pool.get(server.base_url, "k1", timeout_s=20) is not a
    assert len(pool) == 3
    assert (await a.chat(REQUEST)).attempts == 1
    await pool.aclose()
    assert len(pool) == 0
    assert shared_pool() is shared_pool()


@pytest.mark.parametrize(
    "module", ["inference", "inference.openai_client", "envs.agent", "envs.crafter.policy"]
)
def test_imports_in_any_order(module: str) -> None:
    code = f"import {module}, envs; assert 'crafter-react' in envs.POLICIES"
    root = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=60)
