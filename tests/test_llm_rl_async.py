"""`train --type rl` in async mode (``mode = "async"``): the groups come from the task app's stream
while the trainer trains, every push advances the stream's version before the sampler resumes,
the staleness of what is trained on stays within ``max_staleness``, and each decision is checked
against the weights that sampled it. A model made here, served by serve-model, on ``toy-words``;
and `span_fidelity` on a token stream that crossed a push, each span under its own weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch

from grpo_service import create_app
from grpo_service.training_api.llm_jobs import TaskAppGroups
from tests.conftest import make_settings
from tests.llm_helpers import TINY, make_tiny_model
from tests.llm_toy import toy_plugins
from tools.server_thread import ServerThread
from training.llm.config import RLConfig
from training.llm.logprobs import TokenBatch, token_logprobs
from training.llm.model import environment_corpus, init_model, load
from training.llm.rl import Sample, StreamSample, train_rl
from training.llm.rl_async import span_fidelity
from training.llm.server import ModelEngine, create_model_app
from training.llm.streams import Span, TokenStream, stream_row


@pytest.mark.slow
def test_async_grpo_trains_on_the_stream_with_bounded_staleness(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    with toy_plugins():
        model_dir = tmp_path / "model"
        init_model(model_dir, list(environment_corpus(seeds=1, steps=3, env_names=["toy-words"])) * 3, TINY)
        engine = ModelEngine(model_dir, served_name="tiny")
        with (
            ServerThread(create_model_app(engine), name="model-server") as model_server,
            ServerThread(
                create_app(make_settings(tmp_path, vllm_base_url=model_server.base_url)), name="task-app"
            ) as app,
        ):
            config = RLConfig(
                model=str(model_dir),
                out=str(tmp_path / "rl"),
                task_app_url=app.base_url,
                model_server_url=model_server.base_url,
                env_name="toy-words",
                policy_name="toy-say",
                policy_config={"max_tokens": 16, "temperature": 1.0},
                steps=3,
                groups_per_step=2,
                group_size=4,
                max_turns=1,
                lr=1e-2,
                mode="async",
                sequences="decision",  # toy-say plays no token stream
                in_flight=4,
                max_staleness=1,
                save_every=10,
            )
            result = train_rl(config, task_app=TaskAppGroups(app.base_url))
            streams = httpx.get(f"{app.base_url}/run/list", params={"limit": 100}).json()["runs"]
        engine.close()
    rows = [json.loads(x) for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "loss" in r]
    assert len(rows) == 3 and trained, rows
    assert result["weights_version_last"] == len(trained) and engine.weights_version == str(len(trained))
    for r in trained:
        assert r["logprob_max_abs_diff"] < 1e-4, r  # each decision under the weights that sampled it
        assert r["fidelity_checked_spans"] == r["samples"] and not r.get("fidelity_unchecked_spans")
    for r in rows:
        assert r["groups"] == 2 and r["stream_staleness_max"] <= 1
    assert any(r["stream_staleness_max"] == 1 for r in rows[1:]), rows  # sampled while the trainer trained
    assert any(r["logprob_gap_to_current"] > 0 for r in trained[1:])
    assert not [r for r in streams if r["kind"] == "group" and r["status"] == "running"]  # closed


def test_span_fidelity_scores_each_span_of_a_stream_under_the_weights_that_sampled_it(
    tmp_path: Path,
) -> None:
    """A stream begun under version 0 and finished under 1 (the live model), with ``step-0``
    saved: each span is compared under its own version's weights, and a wrong logprob in the old
    span is caught; without ``step-0`` its spans are counted unchecked."""
    torch.set_num_threads(1)
    weights = tmp_path / "weights"
    old, _ = load(make_tiny_model(weights / "step-0"))
    live, _ = load(weights / "step-0")
    torch.manual_seed(0)
    with torch.no_grad():  # version 1: the same shape, other weights
        for p in live.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ids = [(7 * i + 3) % TINY.vocab_size for i in range(40)]
    spans = [Span(8, 14, 0, 0), Span(20, 26, 1, 0), Span(32, 40, 2, 1)]  # the push after turn 1
    with torch.no_grad():
        by = {
            v: token_logprobs(m, TokenBatch.from_rows([ids], [[1.0] * len(ids)], 0))[0]
            for v, m in ((0, old), (1, live))
        }
    logprobs = [0.0] * len(ids)
    for span in spans:
        logprobs[span.start : span.end] = by[span.weights_version][span.start : span.end].tolist()
    sampled = [int(any(s.start <= i < s.end for s in spans)) for i in range(len(ids))]

    def samples(lps: list[float]) -> list[StreamSample | Sample]:
        row, _ = stream_row(TokenStream(ids, sampled, lps, spans), lambda turn: 1.0, lambda span: True)
        assert row is not None
        decision = Sample(ids[:8], ids[8:14], lps[8:14], 1.0, 0, 1, 0, "r1", 0)  # shorter: padded
        return [StreamSample(row, 0, 0, 0, "r0", 0), decision]

    gap, stats = span_fidelity(samples(logprobs), 1, live, weights, 0)
    assert gap <= 1e-5 and stats == {"fidelity_checked_spans": 4}
    tampered = list(logprobs)
    tampered[22] -= 0.01
    gap, _ = span_fidelity(samples(tampered), 1, live, weights, 0)
    assert 0.009 < gap < 0.011
    all_live = [Span(s.start, s.end, s.turn, 1) for s in spans]  # every span scored by the live model
    row, _ = stream_row(TokenStream(ids, sampled, logprobs, all_live), lambda turn: 1.0, lambda span: True)
    assert (
        row is not None
        and span_fidelity([StreamSample(row, 0, 0, 1, "r0", 0)], 1, live, weights, 0)[0] > 1e-3
    )
    gap, stats = span_fidelity(samples(logprobs), 1, live, tmp_path / "gone", 0)
    assert gap <= 1e-5 and stats == {"fidelity_checked_spans": 1, "fidelity_unchecked_spans": 3}

    # A reply sampled by version 0 but read after version 1 was told: tagged 1, sent under 0.
    # Scored under both, it matches the weights that sampled it; tagged 1 alone, it does not.
    def tagged(sent: int | None) -> list[StreamSample]:
        crossed = [spans[0], Span(20, 26, 1, 1, None, sent), spans[2]]
        row, _ = stream_row(TokenStream(ids, sampled, logprobs, crossed), lambda turn: 1.0, lambda span: True)
        assert row is not None
        return [StreamSample(row, 0, 0, 0, "r0", 0)]

    gap, stats = span_fidelity(tagged(0), 1, live, weights, 0)
    assert gap <= 1e-5 and stats == {"fidelity_checked_spans": 3, "fidelity_crossed_spans": 1}
    assert span_fidelity(tagged(None), 1, live, weights, 0)[0] > 1e-3
