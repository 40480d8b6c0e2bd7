"""`serve-model`'s server: vLLM's response shape, sampling controls, batching, weight reloads,
and the fidelity of its logprobs to the trainer's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch

from tests.llm_helpers import make_tiny_model
from tools.server_thread import ServerThread
from training.llm.chat import parse_tool_calls
from training.llm.logprobs import completion_logprobs
from training.llm.server import ModelEngine, create_model_app

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "interact_many",
            "parameters": {"type": "object", "properties": {"actions": {"type": "array"}}},
        },
    }
]
MESSAGES = [{"role": "system", "content": "You play."}, {"role": "user", "content": "Facing down: grass."}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def served(model_dir: Path) -> Iterator[tuple[ServerThread, ModelEngine]]:
    torch.set_num_threads(1)
    engine = ModelEngine(model_dir, served_name="tiny")
    with ServerThread(create_model_app(engine), name="model-server") as server:
        yield server, engine
    engine.close()


def chat(server: ServerThread, **body: object) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/v1/chat/completions", json={"messages": MESSAGES, **body}, timeout=120
    )


def test_vllm_shape_token_ids_and_logprobs_match_the_trainer(served) -> None:
    server, engine = served
    r = chat(
        server,
        model="tiny",
        tools=TOOLS,
        n=3,
        seed=7,
        max_tokens=24,
        logprobs=True,
        top_logprobs=2,
        return_token_ids=True,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == "tiny" and len(body["choices"]) == 3
    assert "weights_version" not in body  # as vLLM: a reply does not name its weights
    prompt = body["prompt_token_ids"]
    text = engine.tokenizer.apply_chat_template(
        MESSAGES, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert prompt == engine.tokenizer.encode(text, add_special_tokens=False)  # the chat template's tokens
    assert body["usage"]["prompt_tokens"] == len(prompt)
    worst = 0.0
    for choice in body["choices"]:
        ids = choice["token_ids"]
        entries = choice["logprobs"]["content"]
        assert len(ids) == len(entries) <= 24 and choice["finish_reason"] in ("stop", "length", "tool_calls")
        assert all(
            len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["logprob"] >= e["logprob"] - 1e-6
            for e in entries
        )
        recomputed = completion_logprobs(engine.model, [prompt], [ids], engine.sampler.pad_id)[0]
        worst = max(worst, max(abs(a - e["logprob"]) for a, e in zip(recomputed, entries, strict=True)))
    assert worst < 1e-4, worst
    assert body["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in body["choices"])


def test_seed_reproduces_and_greedy_is_deterministic(served) -> None:
    server, _ = served
    ids = lambda r: [c["token_ids"] for c in r.json()["choices"]]  # noqa: E731
    a = chat(server, seed=3, n=2, max_tokens=12, return_token_ids=True)
    b = chat(server, seed=3, n=2, max_tokens=12, return_token_ids=True)
    assert ids(a) == ids(b) and ids(a)[0] != ids(a)[1]
    g1 = chat(server, temperature=0, max_tokens=12, return_token_ids=True)
    g2 = chat(server, temperature=0, max_tokens=12, return_token_ids=True, seed=99)
    assert ids(g1) == ids(g2)
    assert "prompt_token_ids" not in chat(server, max_tokens=2).json()


def test_concurrent_requests_are_batched_and_answer_like_one_by_one(served) -> None:
    server, engine = served

    async def many() -> list[dict]:
        async with httpx.AsyncClient(timeout=120) as client:
            bodies = [
                {
                    "messages": MESSAGES[:1] + [{"role": "user", "content": "x " * (1 + 7 * i)}],
                    "seed": i,
                    "max_tokens": 10,
                    "logprobs": True,
                    "return_token_ids": True,
                }
                for i in range(6)
            ]
            rs = await asyncio.gather(
                *(client.post(f"{server.base_url}/v1/chat/completions", json=b) for b in bodies)
            )
            return [r.json() for r in rs]

    batches_before = engine.batches
    answers = asyncio.run(many())
    assert engine.batches - batches_before < 6  # some requests shared a batch
    for i, answer in enumerate(answers):
        alone = chat(
            server,
            messages=MESSAGES[:1] + [{"role": "user", "content": "x " * (1 + 7 * i)}],
            seed=i,
            max_tokens=10,
            return_token_ids=True,
        ).json()
        assert alone["choices"][0]["token_ids"] == answer["choices"][0]["token_ids"]


def test_openai_client_and_models_route(served) -> None:
    server, _ = served
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == ["tiny"]
    out = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, stop=["\n"])
    assert out.choices[0].finish_reason in ("stop", "length") and out.usage.completion_tokens <= 5


def test_tool_calls_are_parsed_in_hermes_format() -> None:
    text = 'I will act. <tool_call>{"name": "interact_many", "arguments": {"actions": ["do"]}}</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "I will act." and calls[0]["type"] == "function"
    assert calls[0]["function"]["name"] == "interact_many"
    assert json.loads(calls[0]["function"]["arguments"]) == {"actions": ["do"]}
    assert parse_tool_calls("<tool_call>{not json}</tool_call>") == ("<tool_call>{not json}</tool_call>", [])
    assert parse_tool_calls("Action: go north") == ("Action: go north", [])


def test_bad_requests_are_400_with_openai_errors(served) -> None:
    server, _ = served
    cases = [
        {"messages": []},
        {"messages": MESSAGES, "n": 0},
        {"messages": MESSAGES, "temperature": -1},
        {"messages": MESSAGES, "stream": True},
        {"messages": MESSAGES, "max_tokens": 100_000},
        {"messages": [{"role": "wizard", "content": "x"}]},
        {"messages": MESSAGES, "top_logprobs": 3},
    ]
    for body in cases:
        r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["message"], body
    r = chat(server, model="other")
    assert r.status_code == 404 and "does not exist" in r.json()["error"]["message"]
    body = {"method": "reload_weights", "kwargs": {"weights_path": "/nonexistent"}}
    r = httpx.post(f"{server.base_url}/collective_rpc", json=body, timeout=30)
    assert r.status_code == 400 and "/nonexistent" in r.json()["error"]["message"]
    r = httpx.post(f"{server.base_url}/collective_rpc", json={"method": "format_disk"}, timeout=30)
    assert r.status_code == 400 and "format_disk" in r.json()["error"]["message"]


def test_weights_reload_in_place_through_vllms_rl_routes(served, tmp_path: Path) -> None:
    """The trainer's weight sync (`WeightSync.load`: pause, reload, name the version, resume)."""
    from training.llm.weight_sync import WeightSync, WeightSyncError

    server, engine = served
    other = make_tiny_model(tmp_path / "other", seed=1)
    before = chat(server, seed=1, max_tokens=8, logprobs=True, return_token_ids=True).json()
    sync = WeightSync(server.base_url)
    assert sync.version() == "default"
    sync.load(other, 7)
    assert sync.version() == "7" and httpx.get(f"{server.base_url}/is_paused").json() == {"is_paused": False}
    after = chat(server, seed=1, max_tokens=8, logprobs=True, return_token_ids=True).json()
    health = httpx.get(f"{server.base_url}/health").json()
    assert health["weight_version"] == "7" and health["weights_path"] == str(other.resolve())
    lp = lambda b: [e["logprob"] for e in b["choices"][0]["logprobs"]["content"]]  # noqa: E731
    assert lp(before) != lp(after)
    with pytest.raises(WeightSyncError, match="not a checkpoint"):
        sync.load(tmp_path / "missing", 8)
    assert sync.version() == "7"


def test_modal_proxy_auth_headers_reach_the_server(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``MODAL_PROXY_TOKEN_*`` set, the task app's inference client and the trainer's weight
    sync pass a server that, like Modal's proxy in front of ``modal_vllm.py``, answers 401 without
    ``Modal-Key`` and ``Modal-Secret``."""
    from fastapi.responses import JSONResponse

    from inference.openai_client import InferenceClient, proxy_auth_headers
    from training.llm.weight_sync import WeightSync, WeightSyncError

    engine = ModelEngine(model_dir, served_name="tiny")
    app = create_model_app(engine)
    seen: list[str | None] = []

    @app.middleware("http")
    async def modal_proxy(request, call_next):  # noqa: ANN001, ANN202
        seen.append(request.headers.get("modal-key"))
        if (request.headers.get("modal-key"), request.headers.get("modal-secret")) != ("wk-1", "ws-2"):
            return JSONResponse({"detail": "missing credentials for proxy authorization"}, status_code=401)
        return await call_next(request)

    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4}
    with ServerThread(app, name="proxied-model") as server:
        with pytest.raises(WeightSyncError, match="401"):
            WeightSync(server.base_url).version()
        monkeypatch.setenv("MODAL_PROXY_TOKEN_ID", "wk-1")
        monkeypatch.setenv("MODAL_PROXY_TOKEN_SECRET", "ws-2")
        assert proxy_auth_headers() == {"Modal-Key": "wk-1", "Modal-Secret": "ws-2"}
        sync = WeightSync(server.base_url)
        sync.load(model_dir, 3)
        assert sync.version() == "3"

        async def complete() -> int:
            client = InferenceClient(server.base_url, timeout_s=60)
            try:
                return len((await client.chat(body, return_token_ids=True)).completion_token_ids)
            finally:
                await client.aclose()

        assert asyncio.run(complete()) >= 1
    engine.close()
    assert seen[0] is None and set(seen[1:]) == {"wk-1"}
    monkeypatch.delenv("MODAL_PROXY_TOKEN_SECRET")
    with pytest.raises(ValueError, match="MODAL_PROXY_TOKEN_SECRET"):
        proxy_auth_headers()
