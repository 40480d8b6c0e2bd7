"""Real vLLM (CPU build) against the two stand-ins the suite uses elsewhere (`serve-model` and the
vLLM-shaped fake): the same requests, the same answer shapes, the same errors; and the sampling
controls (`n`, `seed`, `temperature`, `max_tokens`) behave as the service assumes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.vllm_helpers import SERVED, RealVLLM
from tools.fake_server import FakeConfig, FakeInferenceServer
from tools.server_thread import ServerThread
from training.llm.server import ModelEngine, create_model_app

MESSAGES = [{"role": "system", "content": "You play a game."}, {"role": "user", "content": "What now?"}]
ACT = {
    "type": "function",
    "function": {
        "name": "act",
        "description": "Take an action.",
        "parameters": {
            "type": "object",
            "properties": {"action": {"type": "string"}},
            "required": ["action"],
        },
    },
}
TOKENS = {"logprobs": True, "return_token_ids": True}
# The fields of a message the service reads (vLLM adds refusal, annotations, audio, function_call).
MESSAGE_FIELDS = ("role", "content", "tool_calls", "reasoning")


@pytest.fixture(scope="module")
def servers(real_vllm: RealVLLM) -> Iterator[dict[str, str]]:
    engine = ModelEngine(real_vllm.checkpoint, served_name=SERVED)
    fake_config = FakeConfig(model=SERVED, strict_model=True, max_model_len=4096)
    with ServerThread(create_model_app(engine)) as serve_model, FakeInferenceServer(fake_config) as fake:
        yield {"vllm": real_vllm.base_url, "serve-model": serve_model.base_url, "fake": fake.base_url}
    engine.close()


def post(base_url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{base_url}/v1/chat/completions", json={"model": SERVED, **body}, timeout=120)


def shape(r: httpx.Response) -> dict[str, Any]:
    """What the service depends on in an answer, independent of the sampled text."""
    body = r.json()
    if r.status_code != 200:
        error = body["error"]
        assert isinstance(error["message"], str) and error["message"]
        return {"status": r.status_code, "type": error["type"], "code": error["code"]}
    choices = []
    for c in body["choices"]:
        message = c["message"]
        entry = {
            "finish_reason": c["finish_reason"],
            "message": sorted(k for k in MESSAGE_FIELDS if k in message),
            "content": type(message["content"]).__name__,
            "tool_calls": len(message.get("tool_calls") or []),
        }
        if c.get("logprobs") is not None:
            logprobs = c["logprobs"]["content"]
            assert len(logprobs) == len(c["token_ids"]) and all(e["logprob"] <= 0 for e in logprobs)
            entry["logprob_entry"] = sorted(logprobs[0])
            entry["token_ids"] = "as many as logprobs"
        choices.append(entry)
    has_prompt_ids = isinstance(body.get("prompt_token_ids"), list) and len(body["prompt_token_ids"]) > 0
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    return {"status": 200, "object": body["object"], "prompt_token_ids": has_prompt_ids, "choices": choices}


CASES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    # name: (request, the servers compared; serve-model samples tool calls freely, vLLM guides them)
    "tokens": ({"messages": MESSAGES, "max_tokens": 4, "seed": 1, **TOKENS}, ("serve-model", "fake")),
    "n": ({"messages": MESSAGES, "max_tokens": 3, "n": 3, "seed": 2, **TOKENS}, ("serve-model", "fake")),
    "no tokens asked": ({"messages": MESSAGES, "max_tokens": 3}, ("serve-model", "fake")),
    "overlong prompt": ({"messages": [{"role": "user", "content": "word " * 5000}]}, ("serve-model", "fake")),
    "max_tokens above the context": ({"messages": MESSAGES, "max_tokens": 5000}, ("serve-model", "fake")),
    "unknown model": ({"messages": MESSAGES, "model": "nope"}, ("serve-model", "fake")),
    "negative temperature": ({"messages": MESSAGES, "temperature": -1}, ("serve-model", "fake")),
    "named tool choice": (
        {
            "messages": MESSAGES,
            "tools": [ACT],
            "tool_choice": {"type": "function", "function": {"name": "act"}},
            "max_tokens": 200,
            "seed": 3,
            **TOKENS,
        },
        ("fake",),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_stand_ins_answer_as_vllm_does(servers: dict[str, str], case: str) -> None:
    body, others = CASES[case]
    expected = shape(post(servers["vllm"], body))
    for name in others:
        assert shape(post(servers[name], body)) == expected, name
    if case == "named tool choice":  # vLLM's guided decoding makes the call even for a random model
        assert expected["choices"][0]["tool_calls"] == 1 and expected["choices"][0]["content"] == "str"
        assert expected["choices"][0]["finish_reason"] == "stop"  # OpenAI's rule for a named choice


def test_a_completion_that_does_not_fit_is_cut_at_the_context_end(servers: dict[str, str]) -> None:
    """vLLM does not refuse a prompt that fits with less room than max_tokens asks: it samples
    what fits; the stand-ins do the same."""
    for name, url in servers.items():

        def ask(words: int, max_tokens: int, url: str = url) -> httpx.Response:
            return post(
                url, {"messages": [{"role": "user", "content": "word " * words}], "max_tokens": max_tokens}
            )

        per_1000 = ask(1000, 1).json()["usage"]["prompt_tokens"]
        words = int(1000 * (4096 - 40) / per_1000)  # a prompt about 40 tokens short of the context
        r = ask(words, 200)
        assert r.status_code == 200, (name, r.text)
        usage = r.json()["usage"]
        assert usage["prompt_tokens"] > 4096 - 200 and usage["total_tokens"] <= 4096, (name, usage)


def test_sampling_controls_behave_as_the_service_assumes(real_vllm: RealVLLM) -> None:
    def ids(**extra: Any) -> list[list[int]]:
        r = post(real_vllm.base_url, {"messages": MESSAGES, **TOKENS, **extra})
        assert r.status_code == 200, r.text
        return [c["token_ids"] for c in r.json()["choices"]]

    # A seed reproduces a sample; greedy decoding needs none.
    assert ids(seed=5, max_tokens=12) == ids(seed=5, max_tokens=12)
    assert ids(temperature=0, max_tokens=12) == ids(temperature=0, max_tokens=12)
    assert ids(seed=5, max_tokens=12) != ids(seed=6, max_tokens=12)
    # n choices, each its own sample; max_tokens is exact when nothing stops earlier.
    group = ids(n=4, seed=7, max_tokens=6, temperature=1.0)
    assert len(group) == 4 and len({tuple(g) for g in group}) > 1
    r = post(real_vllm.base_url, {"messages": MESSAGES, "max_tokens": 5, "seed": 8, **TOKENS})
    choice = r.json()["choices"][0]
    assert len(choice["token_ids"]) <= 5 and (choice["finish_reason"] == "length") == (
        len(choice["token_ids"]) == 5
    )


TRANSPORT_CASES = {
    "tokens": {"messages": MESSAGES, "max_tokens": 4, "seed": 1, "temperature": 0},
    "n": {"messages": MESSAGES, "max_tokens": 3, "n": 2, "seed": 2},
    "unknown model": {"messages": MESSAGES, "model": "nope"},
    "negative temperature": {"messages": MESSAGES, "temperature": -1},
    "overlong prompt": {"messages": [{"role": "user", "content": "word " * 5000}]},
}


@pytest.mark.parametrize("case", list(TRANSPORT_CASES))
async def test_lean_and_sdk_transports_answer_alike(servers: dict[str, str], case: str) -> None:
    """The same request through the lean transport and the openai SDK's, to real vLLM and
    `serve-model`: the same token ids (seeded), the same errors (tests/test_transport_parity.py
    compares them on the fake)."""
    from inference import InferenceClient, InferenceError

    for name in ("vllm", "serve-model"):
        seen = []
        for transport in ("lean", "sdk"):
            client = InferenceClient(servers[name], timeout_s=120, max_retries=0, transport=transport)
            try:
                call = await client.chat({"model": SERVED, **TRANSPORT_CASES[case]}, return_token_ids=True)
                seen.append(
                    (call.prompt_token_ids, call.completion_token_ids, call.finish_reason, call.usage)
                )
            except InferenceError as exc:
                seen.append((exc.kind, exc.status_code, exc.attempts, exc.detail))
            finally:
                await client.aclose()
        assert seen[0] == seen[1], (name, seen)


# ---- token in, token out: /v1/completions with a token-id prompt ------------------------------


def complete(base_url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{base_url}/v1/completions", json={"model": SERVED, **body}, timeout=120)


def completion_shape(r: httpx.Response, sent: list[int] | None) -> dict[str, Any]:
    body = r.json()
    if r.status_code != 200:  # vLLM names a malformed body's type "Bad Request", the others not
        assert body["error"]["message"]
        return {"status": r.status_code}
    choices = []
    for c in body["choices"]:
        assert isinstance(c["text"], str)
        if sent is not None:
            assert c["prompt_token_ids"] == sent  # echoed unchanged, never re-tokenized
        if c.get("logprobs") is not None:
            lp = c["logprobs"]
            assert len(lp["token_logprobs"]) == len(c["token_ids"]) == len(lp["tokens"])
            assert all(v <= 0 for v in lp["token_logprobs"])
        choices.append(
            {
                "keys": sorted(k for k in ("text", "token_ids", "prompt_token_ids", "logprobs") if k in c),
                "logprobs": sorted(c["logprobs"]) if c.get("logprobs") else None,
                "finish_reason": c["finish_reason"],
            }
        )
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    return {"status": 200, "object": body["object"], "choices": choices}


def test_a_token_id_prompt_is_answered_as_vllm_answers_it(servers: dict[str, str]) -> None:
    """The completions API takes the prompt as token ids and answers with the completion's ids and
    logprobs (vLLM 0.32): serve-model and the fake answer that path the same way."""
    prompt = post(servers["vllm"], {"messages": MESSAGES, "max_tokens": 1, **TOKENS}).json()[
        "prompt_token_ids"
    ]
    cases = {
        "tokens": {"prompt": prompt, "max_tokens": 4, "seed": 1, "logprobs": 1, "return_token_ids": True},
        "no logprobs": {"prompt": prompt, "max_tokens": 3, "seed": 1, "return_token_ids": True},
        "not ids": {"prompt": [1.5, 2], "max_tokens": 3},
        "overlong": {"prompt": prompt * 400, "max_tokens": 3},
    }
    for name, body in cases.items():
        sent = body["prompt"] if body.get("return_token_ids") else None
        expected = completion_shape(complete(servers["vllm"], body), sent)
        for server in ("serve-model", "fake"):
            assert completion_shape(complete(servers[server], body), sent) == expected, (name, server)


def test_an_extended_stream_reproduces_the_samplers_logprobs(
    servers: dict[str, str], real_vllm: RealVLLM
) -> None:
    """Turn 1's prompt ids + its completion ids + the next turn's tokens, sent again as ids: one
    fp32 forward over the whole stream gives every sampled token's logprob as vLLM and serve-model
    reported it (≤ 1e-5)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(real_vllm.checkpoint, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        real_vllm.checkpoint, local_files_only=True, dtype=torch.float32
    )
    first = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    between = "\n<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n"
    for name in ("vllm", "serve-model"):
        stream = list(tokenizer.encode(first, add_special_tokens=False))
        sampled: list[tuple[int, float]] = []  # (position, logprob)
        for turn in range(2):
            body = {
                "prompt": stream,
                "max_tokens": 12,
                "seed": 11 + turn,
                "logprobs": 1,
                "return_token_ids": True,
            }
            choice = complete(servers[name], body).json()["choices"][0]
            assert choice["prompt_token_ids"] == stream
            ids, lps = choice["token_ids"], choice["logprobs"]["token_logprobs"]
            sampled += [(len(stream) + i, lp) for i, lp in enumerate(lps)]
            stream = stream + ids
            if not ids or ids[-1] != tokenizer.convert_tokens_to_ids("<|im_end|>"):
                stream += tokenizer.encode("<|im_end|>", add_special_tokens=False)
            stream += tokenizer.encode(between, add_special_tokens=False)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([stream])).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        worst = max(abs(float(logprobs[pos - 1, stream[pos]]) - lp) for pos, lp in sampled)
        assert worst <= 1e-5, (name, worst)
