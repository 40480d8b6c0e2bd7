"""Where the GRPO loop's groups come from: each step's own requests (``mode = "sync"``), or the
task app's stream of groups (``mode = "async"``), which keeps ``in_flight`` groups playing while
the trainer trains and pushes.

Async, step by step: take ``groups_per_step`` finished groups from the stream (in completion
order; waiting only when none is ready), train on them, save the weights, and load them into the
sampler; between the reload and the sampler's resume the stream is told the new version, so the
calls it tags afterwards are the new weights' and a group that spans the push carries both
versions, decision by decision. Staleness is the stream's: a group whose oldest span is more than
``max_staleness`` versions behind is dropped or restarted there (``stale_policy``), and the batch
builder still drops any decision beyond it. The fidelity check recomputes each span (a decision,
or one completion of a token stream) under the weights that sampled it, not the current ones
(`span_fidelity`: a stream that crossed a push is run once per version; versions no longer on
disk are counted unchecked).

`training` never imports `grpo_service`: the task app comes in as an object with
``open_stream(body) -> GroupStream`` (`StreamingTaskApp`;
`grpo_service.training_api.llm_jobs.TaskAppGroups` is one, over HTTP).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from training.llm.config import RLConfig
from training.llm.logprobs import TokenBatch, token_logprobs
from training.llm.model import load
from training.llm.streams import TrainRow

TAKE_WAIT_S = 30.0  # one long poll; a step waits up to the rollout timeout in all


class GroupStream(Protocol):
    """The task app's stream (``/rollout/stream/{id}``), as the trainer uses it."""

    def take(self, count: int, wait_s: float) -> dict[str, Any]: ...  # a StreamBatch

    def set_version(self, version: int) -> dict[str, Any]: ...  # a StreamInfo

    def close(self) -> dict[str, Any]: ...


class StreamingTaskApp(Protocol):
    def open_stream(self, body: dict[str, Any]) -> GroupStream: ...


class GroupSource(Protocol):
    keep_weights: int

    def collect(self, step: int, version: int) -> tuple[list[dict[str, Any]], list[str], dict[str, Any]]: ...

    def pushed(self, version: int) -> None: ...

    def close(self) -> None: ...


StepCollector = Callable[[int, int], Awaitable[tuple[list[dict[str, Any]], list[str]]]]
"""(step, version) -> the step's groups and the errors of its failed requests (`training.llm.rl.collect`)."""
GroupTemplate = Callable[[int], dict[str, Any]]
"""k -> the body of the loop's k-th group request (`training.llm.rl.group_request`)."""


class StepGroups:
    """Sync: each step requests its groups and waits for all of them."""

    keep_weights = 2

    def __init__(self, collect_step: StepCollector) -> None:
        self.collect_step = collect_step

    def collect(self, step: int, version: int) -> tuple[list[dict[str, Any]], list[str], dict[str, Any]]:
        groups, errors = asyncio.run(self.collect_step(step, version))
        return groups, errors, {}

    def pushed(self, version: int) -> None:
        pass

    def close(self) -> None:
        pass


def stream_request(
    config: RLConfig, template: GroupTemplate, version: int, first_group: int
) -> dict[str, Any]:
    """The stream's open body: the sync loop's group request as the template (without the id and
    version the stream sets), the seeds from ``first_group`` on (a resumed run goes on), the bounds."""
    template = {**template(first_group)}
    template.pop("group_id")
    template.pop("weights_version")
    seeds = None
    if config.seeds:
        k = first_group % len(config.seeds)
        seeds = config.seeds[k:] + config.seeds[:k]
    return {
        "group": template,
        **({"seeds": seeds} if seeds else {}),
        "in_flight": config.in_flight or 2 * config.groups_per_step,
        "max_staleness": config.max_staleness,
        "stale_policy": config.stale_policy,
        "weights_version": version,
        "idle_timeout_s": config.rollout_timeout_s + 600,
    }


class StreamGroups:
    """Async: the groups of each step are the next finished ones of the task app's stream."""

    def __init__(
        self, config: RLConfig, task_app: StreamingTaskApp, template: GroupTemplate, version: int, step: int
    ) -> None:
        self.config = config
        self.keep_weights = config.max_staleness + 2
        body = stream_request(config, template, version, step * config.groups_per_step)
        self.stream = task_app.open_stream(body)
        self.info: dict[str, Any] = {}

    def collect(self, step: int, version: int) -> tuple[list[dict[str, Any]], list[str], dict[str, Any]]:
        want = self.config.groups_per_step
        taken: list[dict[str, Any]] = []
        deadline = time.monotonic() + self.config.rollout_timeout_s + 60
        while len(taken) < want and time.monotonic() < deadline:
            wait = min(TAKE_WAIT_S, max(0.0, deadline - time.monotonic()))
            batch = self.stream.take(want - len(taken), wait)
            taken += batch["groups"]
            self.info = batch["info"]
            if batch["done"]:
                break
        errors = []
        if len(taken) < want:
            status = self.info.get("status")
            errors.append(
                f"the stream delivered {len(taken)} of {want} groups (status {status}, "
                f"error {self.info.get('error')})"
            )
        staleness = [g["staleness"] for g in taken]
        counters = self.info.get("counters", {})
        stats = {
            "stream_staleness_max": max(staleness, default=0),
            "stream_staleness_mean": round(sum(staleness) / len(staleness), 4) if staleness else 0.0,
            "stream_staleness_counts": {str(k): v for k, v in sorted(Counter(staleness).items())},
            "stream_spanning_groups": sum(1 for g in taken if g["oldest_version"] != g["newest_version"]),
            "stream_dropped_stale": counters.get("dropped_stale", 0),
            "stream_restarted_stale": counters.get("restarted_stale", 0),
            "stream_over_staleness": counters.get("delivered_over_staleness", 0),
            "stream_sampler_busy_s": self.info.get("busy_s", 0.0),
            "stream_open_s": self.info.get("open_s", 0.0),
        }
        return [g["group"] for g in taken], errors, stats

    def pushed(self, version: int) -> None:
        self.stream.set_version(version)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # already gone: its idle timeout, or the task app restarted
            self.stream.close()


def group_source(
    config: RLConfig,
    task_app: Any,
    version: int,
    step: int,
    collect_step: StepCollector,
    template: GroupTemplate,
) -> GroupSource:
    """``mode = "async"``: the stream (``template`` makes its group template); else each step's own
    requests (``collect_step``)."""
    if config.mode == "async":
        return StreamGroups(config, task_app, template, version, step)
    return StepGroups(collect_step)


def span_fidelity(
    samples: list[Any], version: int, model: Any, weights_dir: Path, pad_id: int
) -> tuple[float, Counter[str]]:
    """The largest |sampler logprob − trainer logprob| over the spans ``samples`` train on, each
    span recomputed under the weights of the version that sampled it: the live ``model`` for
    ``version`` (and for a span that names none), the saved ``weights_dir/step-{v}`` for an older
    ``v``, loaded once. A sequence whose spans come from several versions (a token stream that
    crossed a push) is run once under each. A span whose call itself crossed a push
    (``weights_version_sent``) is run under both versions and matched by the closer one, which is
    the version that sampled it (``fidelity_crossed_spans``). Counted in spans (a decision is one):
    ``fidelity_checked_spans``, and ``fidelity_unchecked_spans`` for the spans none of whose
    versions is on disk any more."""
    rows: list[TrainRow] = [s.row() for s in samples]
    wanted: dict[int, list[int]] = {}  # version -> the rows with a span it may have sampled
    for i, row in enumerate(rows):
        for v in {v for span in row.spans for v in span.versions(version)}:
            wanted.setdefault(v, []).append(i)
    gaps: dict[tuple[int, int], torch.Tensor] = {}  # (row, version) -> |new - old| per token
    for v, indices in sorted(wanted.items()):
        if v == version:
            scorer = model
        elif (weights_dir / f"step-{v}" / "config.json").is_file():
            scorer = load(weights_dir / f"step-{v}")[0]
        else:
            continue
        with torch.no_grad():
            for k in range(0, len(indices), 8):
                chunk = indices[k : k + 8]
                batch = [rows[i] for i in chunk]
                tokens = TokenBatch.from_rows([r.ids for r in batch], [r.mask for r in batch], pad_id)
                new = token_logprobs(scorer, tokens)
                for j, i in enumerate(chunk):
                    n = len(rows[i].ids)
                    old = torch.tensor(rows[i].old_logprobs, dtype=new.dtype)
                    gaps[(i, v)] = (new[j, :n] - old).abs()
    stats: Counter[str] = Counter()
    worst = 0.0
    for i, row in enumerate(rows):
        for span in row.spans:
            candidates = span.versions(version)
            per_version = [
                float(gaps[(i, v)][span.start : span.end].max()) if span.end > span.start else 0.0
                for v in candidates
                if (i, v) in gaps
            ]
            if not per_version:
                stats["fidelity_unchecked_spans"] += 1
                continue
            stats["fidelity_checked_spans"] += 1
            if len(candidates) > 1:
                stats["fidelity_crossed_spans"] += 1
            worst = max(worst, min(per_version))
    return worst, stats
