"""The lean transport (aiohttp, the default) against the openai SDK's (`INFERENCE_TRANSPORT=sdk`):
the same request bytes and headers on the wire, the same answers, the same errors, retries and
attempts, over real HTTP against the fake (real vLLM and `serve-model`: tests/test_vllm_parity.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from typing import Any

import orjson
import pytest

from envs.crafter.actions import TOOL_SCHEMA
from inference import InferenceClient, InferenceError
from tools.fake_server import FakeConfig, FakeInferenceServer

TRANSPORTS = ("lean", "sdk")
REQUEST: dict[str, Any] = {
    "model": "fake-model",
    "messages": [{"role": "system", "content": "You play Crafter."}, {"role": "user", "content": "Tree."}],
    "tools": [TOOL_SCHEMA],
    "seed": 7,
}


def outcome(result: Any) -> dict[str, Any]:
    """What a caller sees of a call: the LLMCall without its latency, or the error's fields."""
    if isinstance(result, InferenceError):
        return {
            "error": type(result).__name__,
            "kind": result.kind,
            "status": result.status_code,
            "attempts": result.attempts,
            "detail": result.detail,
        }
    fields = {k: v for k, v in dataclasses.asdict(result).items() if k != "latency_ms"}
    fields["response"] = {k: v for k, v in fields["response"].items() if k not in ("id", "created")}
    return fields


async def call(transport: str, base_url: str, request: dict[str, Any], **options: Any) -> Any:
    tokens = options.pop("return_token_ids", True)
    deadline_s = options.pop("deadline_s", None)
    options = {"timeout_s": 5, "max_retries": 2, "backoff_base_s": 0.01, **options}
    client = InferenceClient(base_url, options.pop("api_key", "EMPTY"), transport=transport, **options)
    try:
        return await client.chat(request, return_token_ids=tokens, deadline_s=deadline_s)
    except InferenceError as exc:
        return exc
    finally:
        await client.aclose()


# name: (fake config, request patch, client options); the connection-level faults are compared by
# kind and attempts only (each HTTP stack words a cut connection its own way).
CASES: dict[str, tuple[FakeConfig, dict[str, Any], dict[str, Any]]] = {
    "tokens": (FakeConfig(), {}, {}),
    "no tokens": (FakeConfig(), {}, {"return_token_ids": False}),
    "n choices": (FakeConfig(), {"n": 3}, {}),
    "extra body": (FakeConfig(), {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}, {}),
    "429 then ok": (FakeConfig(fault_script=["http_429"], retry_after_s=0.05), {}, {}),
    "5xx bounded": (FakeConfig(fault_probs={"http_500": 1.0}), {}, {}),
    "empty messages": (FakeConfig(), {"messages": []}, {}),
    "unknown model": (FakeConfig(strict_model=True), {"model": "nope"}, {}),
    "wrong key": (FakeConfig(api_key="sk-right-one"), {}, {"api_key": "sk-wrong-0123456789abcdef"}),
    "not json": (FakeConfig(fault_script=["malformed_json"]), {}, {}),
    "token mismatch": (FakeConfig(fault_script=["token_mismatch"]), {}, {}),
    "too large": (FakeConfig(), {}, {"max_response_bytes": 200}),
    "cut stream": (FakeConfig(fault_probs={"cut_stream": 1.0}), {}, {}),
    "deadline": (FakeConfig(fault_probs={"timeout": 1.0}, timeout_fault_s=10), {}, {"deadline_s": 0.3}),
}
WIRE_WORDED = {"cut stream"}


@pytest.mark.parametrize("case", list(CASES))
async def test_both_transports_answer_alike(fake: FakeInferenceServer, case: str) -> None:
    config, patch, options = CASES[case]
    seen = []
    for transport in TRANSPORTS:
        fake.set_config(config.model_copy(update={"vary_unseeded": False}))
        seen.append(outcome(await call(transport, fake.base_url, {**REQUEST, **patch}, **dict(options))))
    lean, sdk = seen
    if case in WIRE_WORDED:
        lean.pop("detail"), sdk.pop("detail")
    assert lean == sdk
    if "error" in lean and "detail" in lean:
        assert "sk-wrong-0123456789abcdef"[:12] not in lean["detail"]


async def test_connection_refused_alike() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    lean, sdk = [
        outcome(await call(t, f"http://127.0.0.1:{port}", REQUEST, deadline_s=5)) for t in TRANSPORTS
    ]
    assert lean["kind"] == sdk["kind"] == "connection_error" and lean["attempts"] == sdk["attempts"] == 3


async def test_list_models_alike(fake: FakeInferenceServer) -> None:
    listed = []
    for transport in TRANSPORTS:
        client = InferenceClient(fake.base_url, transport=transport)
        try:
            listed.append(await client.list_models())
        finally:
            await client.aclose()
    assert listed[0] == listed[1] == ["fake-model"]


class _Recorder:
    """A bare HTTP/1.1 server on 127.0.0.1 that keeps each request (head and body) and answers
    a fixed chat completion: what each transport puts on the wire."""

    CHOICE = {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    ANSWER = orjson.dumps({"object": "chat.completion", "model": "m", "choices": [CHOICE]})

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
        body = await reader.readexactly(int(headers.get("content-length", 0)))
        self.requests.append((head[0], headers, body))
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
            + f"content-length: {len(self.ANSWER)}\r\n\r\n".encode()
            + self.ANSWER
        )
        await writer.drain()
        writer.close()


async def test_the_same_bytes_and_headers_on_the_wire(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODAL_PROXY_TOKEN_ID", "wk-id")
    monkeypatch.setenv("MODAL_PROXY_TOKEN_SECRET", "ws-secret")
    recorder = _Recorder()
    server = await asyncio.start_server(recorder.handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    request = {
        **REQUEST,
        "temperature": 0.7,
        "extra_body": {"chat_template_kwargs": {"enable_thinking": False}},
        "extra_headers": {"X-Trace": "abc"},
        "extra_query": {"api-version": "2"},
    }
    try:
        for transport in TRANSPORTS:
            call_ = await call(transport, url, request, api_key="sk-own")
            assert not isinstance(call_, InferenceError), call_
    finally:
        server.close()
        await server.wait_closed()
    (lean_line, lean_headers, lean_body), (sdk_line, sdk_headers, sdk_body) = recorder.requests
    assert lean_line == sdk_line == "POST /v1/chat/completions?api-version=2 HTTP/1.1"
    assert lean_body == sdk_body
    assert orjson.loads(lean_body)["return_token_ids"] is True and "extra_body" not in orjson.loads(lean_body)
    for name in ("authorization", "content-type", "accept", "modal-key", "modal-secret", "x-trace"):
        assert lean_headers[name] == sdk_headers[name], name
    assert lean_headers["authorization"] == "Bearer sk-own" and lean_headers["modal-key"] == "wk-id"


def test_a_client_moves_to_a_new_event_loop(fake: FakeInferenceServer) -> None:
    """One pooled session per event loop: a client used again from another loop (a second
    `asyncio.run`) opens its own there instead of reusing the first loop's sockets."""
    client = InferenceClient(fake.base_url, "EMPTY", timeout_s=5)
    first = asyncio.run(client.chat(REQUEST))
    second = asyncio.run(client.chat(REQUEST))
    asyncio.run(client.aclose())
    assert first.attempts == second.attempts == 1
