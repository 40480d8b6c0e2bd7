"""`serve-model`'s server: vLLM's response shape, sampling controls, batching, weight reloads,
and the fidelity of its logprobs to the trainer's."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from inference.tool_calls import parse_tool_calls
from tests.llm_helpers import make_tiny_model
from tools.server_thread import ServerThread
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


# ---- reload: a checkpoint is checked in full before any weight changes --------------------------


def _checkpoint(src: Path, dest: Path, edit=None, tied_file: bool = True) -> Path:  # noqa: ANN001
    """A copy of checkpoint ``src`` at ``dest`` whose ``model.safetensors`` is ``edit(tensors)``."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dest)
    if not tied_file:
        (dest / "lm_head.safetensors").unlink()
    if edit is not None:
        tensors = load_file(str(dest / "model.safetensors"))
        save_file(edit(tensors), str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def _reload(server: ServerThread, path: Path) -> httpx.Response:
    body = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
    return httpx.post(f"{server.base_url}/collective_rpc", json=body, timeout=60)


def _greedy(server: ServerThread) -> tuple[list[int], list[float]]:
    choice = chat(server, temperature=0, max_tokens=8, logprobs=True, return_token_ids=True).json()
    choice = choice["choices"][0]
    return choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]]


def test_a_refused_reload_is_a_400_and_leaves_the_model_exactly_as_it_was(served, tmp_path: Path) -> None:
    """Wrong shapes, missing tensors, NaN or inf, unreadable files and non-float tensors are each
    refused with a 400 naming the fault before any weight changes: the same state, the same greedy
    output, and `/health` still names the weights being served."""
    server, engine = served
    donor = make_tiny_model(tmp_path / "donor", seed=5)  # other values: a partial copy would show

    def reshaped(t: dict) -> dict:  # the last tensor in file order has the wrong shape
        last = sorted(t)[-1]
        return {**t, last: torch.zeros(t[last].shape[0] + 1, *t[last].shape[1:])}

    def with_nan(t: dict) -> dict:
        name = "model.layers.1.mlp.down_proj.weight"
        bad = t[name].clone()
        bad[0, 0] = float("nan")
        return {**t, name: bad}

    def with_inf(t: dict) -> dict:
        name = "model.norm.weight"
        return {**t, name: torch.full_like(t[name], float("inf"))}

    def as_int(t: dict) -> dict:
        name = "model.norm.weight"
        return {**t, name: t[name].to(torch.int32)}

    def embeddings_only(t: dict) -> dict:
        return {"model.embed_tokens.weight": t["model.embed_tokens.weight"]}

    def garble(path: Path) -> Path:
        (path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
        return path

    def truncate(path: Path) -> Path:
        data = (path / "model.safetensors").read_bytes()
        (path / "model.safetensors").write_bytes(data[: len(data) // 2])
        return path

    def bad_config(path: Path) -> Path:
        (path / "config.json").write_text("{not json")
        return path

    def no_weights(path: Path) -> Path:
        for file in path.glob("*.safetensors"):
            file.unlink()
        return path

    def untied(t: dict) -> dict:  # a tied model cannot take an output layer unlike its embeddings
        return t

    cases = {
        "shape": (_checkpoint(donor, tmp_path / "shape", reshaped), "has shape"),
        "nan": (_checkpoint(donor, tmp_path / "nan", with_nan), "down_proj.weight has non-finite"),
        "inf": (_checkpoint(donor, tmp_path / "inf", with_inf), "model.norm.weight has non-finite"),
        "int": (_checkpoint(donor, tmp_path / "int", as_int), "model.norm.weight is int32"),
        "embeddings": (_checkpoint(donor, tmp_path / "emb", embeddings_only, tied_file=False), "lacks"),
        "garbled": (garble(_checkpoint(donor, tmp_path / "garbled")), "cannot read"),
        "truncated": (truncate(_checkpoint(donor, tmp_path / "truncated")), "cannot read"),
        "config": (bad_config(_checkpoint(donor, tmp_path / "config")), "config.json"),
        "no weights": (no_weights(_checkpoint(donor, tmp_path / "empty")), "has no weights"),
    }
    # an output layer that is not the embeddings, for a model that ties them
    untie = _checkpoint(donor, tmp_path / "untied", untied)
    from safetensors.torch import load_file, save_file

    head = load_file(str(untie / "lm_head.safetensors"))
    save_file({"lm_head.weight": head["lm_head.weight"] + 1}, str(untie / "lm_head.safetensors"))
    cases["untied"] = (untie, "ties")

    served_path = httpx.get(f"{server.base_url}/health").json()["weights_path"]
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    output = _greedy(server)
    for case, (path, fault) in cases.items():
        r = _reload(server, path)
        assert r.status_code == 400, (case, r.status_code, r.text)
        message = r.json()["error"]["message"]
        assert fault in message and str(path) in message, (case, message)
        assert all(torch.equal(v, state[k]) for k, v in engine.model.state_dict().items()), case
        assert httpx.get(f"{server.base_url}/health").json()["weights_path"] == served_path, case
    assert _greedy(server) == output


def test_a_tied_checkpoint_without_its_output_layer_reloads_whole(served, tmp_path: Path) -> None:
    """transformers' `save_pretrained` leaves a tied `lm_head.weight` out: such a checkpoint is
    valid, and every served tensor (the output layer through its tie) takes the new values."""
    from safetensors.torch import load_file

    server, engine = served
    donor = _checkpoint(make_tiny_model(tmp_path / "donor", seed=6), tmp_path / "bare", tied_file=False)
    assert _reload(server, donor).status_code == 200
    saved = load_file(str(donor / "model.safetensors"))
    live = engine.model.state_dict()
    assert "lm_head.weight" not in saved
    assert all(torch.equal(live[k], v) for k, v in saved.items())
    assert torch.equal(live["lm_head.weight"], saved["model.embed_tokens.weight"])
    assert httpx.get(f"{server.base_url}/health").json()["weights_path"] == str(donor)
    assert chat(server, max_tokens=4).status_code == 200


# ---- request templates, the event loop, control routes, the pause deadline, the bind -------------

TEMPLATE = "{% for m in messages %}{{ m['content'] }}|{% endfor %}"


def test_a_request_chat_template_needs_the_trust_flag(served) -> None:
    """As vLLM: a template in the request (top level or in `chat_template_kwargs`) is a 400 naming
    `--trust-request-chat-template`; a server started with it renders the request's template."""
    server, engine = served
    for body in ({"chat_template": TEMPLATE}, {"chat_template_kwargs": {"chat_template": TEMPLATE}}):
        r = chat(server, max_tokens=2, **body)
        assert r.status_code == 400, r.text
        assert "--trust-request-chat-template" in r.json()["error"]["message"]
    assert chat(server, max_tokens=2, chat_template_kwargs={"enable_thinking": False}).status_code == 200
    with ServerThread(
        create_model_app(engine, trust_request_chat_template=True), name="trusting"
    ) as trusting:
        r = chat(trusting, max_tokens=2, chat_template=TEMPLATE, return_token_ids=True)
        assert r.status_code == 200, r.text
        expected = engine.tokenizer.encode("You play.|Facing down: grass.|", add_special_tokens=False)
        assert r.json()["prompt_token_ids"] == expected


def test_templates_render_off_the_event_loop(served, monkeypatch: pytest.MonkeyPatch) -> None:
    """While one chat's prompt is being rendered (held here for seconds), `/health` answers at once."""
    import threading

    server, engine = served
    rendering, release = threading.Event(), threading.Event()
    real = engine.prompt_ids

    def slow(req):  # noqa: ANN001, ANN202
        rendering.set()
        release.wait(20)
        return real(req)

    monkeypatch.setattr(engine, "prompt_ids", slow)
    answers: list[int] = []
    waiting = threading.Thread(target=lambda: answers.append(chat(server, max_tokens=2).status_code))
    waiting.start()
    try:
        assert rendering.wait(20)
        health = httpx.get(f"{server.base_url}/health", timeout=3)  # a blocked loop: ReadTimeout
        assert health.status_code == 200
    finally:
        release.set()
        waiting.join(60)
    assert answers == [200]


def test_pause_and_resume_need_a_json_content_type(served) -> None:
    """A bodiless or `text/plain` POST (what a web page may send cross-origin without a preflight)
    neither pauses nor resumes: 415. The trainer's `{}` body does."""
    server, _ = served
    url = server.base_url
    for route in ("/pause", "/resume"):
        for kwargs in ({}, {"content": "x", "headers": {"content-type": "text/plain"}}):
            r = httpx.post(f"{url}{route}?mode=wait", timeout=10, **kwargs)
            assert r.status_code == 415 and "application/json" in r.json()["error"]["message"], r.text
            assert httpx.get(f"{url}/is_paused").json() == {"is_paused": False}
    assert httpx.post(f"{url}/pause?mode=wait", json={}, timeout=30).json() == {"status": "paused"}
    assert httpx.get(f"{url}/is_paused").json() == {"is_paused": True}
    assert httpx.post(f"{url}/resume", json={}, timeout=30).json() == {"status": "resumed"}
    assert httpx.get(f"{url}/is_paused").json() == {"is_paused": False}


def test_a_chat_waits_a_bounded_time_while_paused(served, monkeypatch: pytest.MonkeyPatch) -> None:
    """Paused longer than `pause_wait_s`, a chat is answered 503 with Retry-After (and is not
    decoded later); after the resume chats are served again."""
    import time

    server, engine = served
    monkeypatch.setattr(engine, "pause_wait_s", 0.5, raising=False)
    httpx.post(f"{server.base_url}/pause", json={}, timeout=30).raise_for_status()
    try:
        started = time.monotonic()
        body = {"messages": MESSAGES, "max_tokens": 2}
        r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=15)  # was: forever
        took = time.monotonic() - started
    finally:
        httpx.post(f"{server.base_url}/resume", json={}, timeout=30).raise_for_status()
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    assert "paused" in r.json()["error"]["message"] and 0.4 < took < 10, took
    batches = engine.batches
    assert chat(server, max_tokens=2).status_code == 200
    assert engine.batches == batches + 1  # the dropped chat was never decoded


def test_serve_model_refuses_a_public_bind(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`serve-model --host 0.0.0.0` is refused before anything loads, as `serve` and `view`
    refuse a keyless public bind; `--insecure` allows it."""
    import uvicorn
    from typer.testing import CliRunner

    from grpo_service.cli import app as cli_app

    served_on: list[str] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, host, port, **kw: served_on.append(host))
    done = CliRunner().invoke(cli_app, ["serve-model", str(model_dir), "--host", "0.0.0.0"])
    assert done.exit_code != 0 and "refusing to serve on 0.0.0.0" in done.output, done.output
    assert served_on == []
    done = CliRunner().invoke(cli_app, ["serve-model", str(model_dir), "--host", "::1"])
    assert done.exit_code == 0 and served_on == ["::1"], done.output
    done = CliRunner().invoke(cli_app, ["serve-model", str(model_dir), "--host", "0.0.0.0", "--insecure"])
    assert done.exit_code == 0 and served_on == ["::1", "0.0.0.0"], done.output


def test_completions_take_a_token_id_prompt_and_refuse_bad_ones(served) -> None:
    """Token in, token out (vLLM's completions API): the ids are sampled on as sent, the reply
    carries the completion's ids and one logprob each, and the trainer's pass agrees; the client's
    `complete_tokens` reads it."""
    from inference.openai_client import InferenceClient

    server, engine = served
    prompt = engine.tokenizer.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    body = {"prompt": prompt, "max_tokens": 6, "seed": 3, "logprobs": 1, "return_token_ids": True}
    r = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    (choice,) = r.json()["choices"]
    assert choice["prompt_token_ids"] == prompt and r.json()["object"] == "text_completion"
    lps = choice["logprobs"]["token_logprobs"]
    assert len(lps) == len(choice["token_ids"]) == len(choice["logprobs"]["tokens"])
    mine = completion_logprobs(engine.model, [prompt], [choice["token_ids"]], 0)[0]
    assert max(abs(a - b) for a, b in zip(mine, lps, strict=True)) < 1e-5
    text = httpx.post(f"{server.base_url}/v1/completions", json={**body, "prompt": "hello"}, timeout=60)
    assert text.status_code == 200 and text.json()["choices"][0]["prompt_token_ids"]

    async def through_the_client() -> Any:
        client = InferenceClient(server.base_url)
        try:
            return await client.complete_tokens(prompt, {"model": "tiny", "max_tokens": 6, "seed": 3})
        finally:
            await client.aclose()

    call = asyncio.run(through_the_client())
    assert call.prompt_token_ids == prompt and call.completion_token_ids == choice["token_ids"]
    assert call.completion_logprobs == lps and call.finish_reason == choice["finish_reason"]
    for bad, named in (
        ({"prompt": [len(engine.tokenizer) + 5]}, "out of vocabulary"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ""}, "empty"),
        ({"prompt": [1.5]}, "prompt"),
        ({"prompt": prompt, "echo": True}, "echo"),
    ):
        r = httpx.post(f"{server.base_url}/v1/completions", json=bad, timeout=60)
        assert r.status_code == 400 and named in r.json()["error"]["message"], (bad, r.text)
