"""TRL's ``AsyncGRPOTrainer`` (``trl.experimental.async_grpo``, built on trl==1.16.0) on the task app.

    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
    from grpo_service.client import trl_async

    worker = trl_async.TaskAppRolloutWorker("http://127.0.0.1:8000", stream_request)
    transfer = trl_async.TaskAppWeightTransfer(vllm_url, model_dir, out_dir, on_version=worker.note_version)
    args = AsyncGRPOConfig(..., temperature=1.0, token_budget=4096, bf16=False)
    with trl_async.cpu_shims():  # only on a machine without CUDA
        trainer = AsyncGRPOTrainer(model=model_dir, args=args, train_dataset=placeholder,
                                   rollout_worker=worker, weight_transfer=transfer)
        trainer.train()

- `TaskAppRolloutWorker` (TRL's ``RolloutWorkerProtocol``) takes finished groups from the task app's
  stream of groups (``/rollout/stream``: the trainer's ``max_staleness``-bounded, back-pressured
  flow of GRPO groups) and turns them into TRL ``RolloutSample``s with the service's advantages
  (``group``: GRPO's; ``tree``: per-turn credit of a fork plan): `decision_samples`, one sample per
  decision, the sampler's own token ids and logprobs, ``model_version`` the weights that sampled it.
  That function is the one place that shapes samples: a per-episode token stream replaces it.
- `TaskAppWeightTransfer` (TRL's ``WeightTransferProtocol``) writes the weights TRL sends (full
  fp32 tensors of the trainable parameters, **without a tied ``lm_head.weight``**, which it adds)
  as a checkpoint and reloads them into the running vLLM in place through the RL routes
  (`training.llm.weight_sync.WeightSync`: pause, ``reload_weights``, version, resume). TRL never
  tells the transfer the version: it counts sends (TRL's first sync at train start is version 1).
  Before vLLM resumes, ``on_version`` tells the stream, so every LLM call is tagged exactly.
- `cpu_shims` replaces the two CUDA-only spots of TRL 1.16's trainer for a CPU run, and nothing
  else: its peak-FLOPs probe (``get_peak_flops_per_device`` calls ``torch.cuda``; the shim answers
  "unknown device", which turns MFU off as TRL does for unknown GPUs) and the flash-attn3 kernel
  behind its tree-packing attention (fetched from the Hub, CUDA only; the shim computes the same
  varlen causal attention per segment with PyTorch's SDPA). On a GPU, use TRL as it is.

Sampling must be at temperature 1 (TRL divides its own logprobs by ``args.temperature`` and uses
the sampler's as they are) and ``token_budget`` must be set (else TRL asks vLLM's ``/v1/models``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

from grpo_service import models
from grpo_service.client.group_stream import GroupStreamClient
from grpo_service.client.task_app import AsyncTaskAppClient

TRL_VERSION = "1.16.0"  # the release these contracts and shims were read from and tested with
NOTE_TIMEOUT_S = 30.0


# ------------------------------------------------------------------------------- the samples


def credit_config(
    advantage: Literal["group", "tree"], scale_by_std: bool, format_penalty: float, max_turns: int
) -> Any:
    """The fields of `training.llm.config.RLConfig` the service's credit assignment reads."""
    from training.llm.config import RLConfig

    return RLConfig(
        model=".",
        advantage=advantage,
        scale_by_std=scale_by_std,
        format_penalty=format_penalty,
        max_turns=max_turns,
        max_staleness=1_000_000,  # the stream and TRL bound staleness
        kl_coef=0.0,
        # one TRL sample per episode token stream when the policy played one (one advantage per
        # sample: per-turn tree credit stays one sample per decision)
        sequences="stream" if advantage == "group" else "decision",
    )


def decision_samples(
    taken: models.StreamGroup, credit: Any, *, keep_zero_advantage: bool = False
) -> list[Any]:
    """TRL ``RolloutSample``s of a finished group: one per episode token stream (when the policy
    played one and the credit is per rollout) or per decision: the tokens as the sampler saw them,
    the sampled ones masked in, the sampler's logprobs (0 elsewhere), the advantage, and the
    version of the weights that sampled it (a stream's oldest span's). Samples with no tokens are
    left out, and so are those with no advantage (no gradient) unless ``keep_zero_advantage``:
    then a group played as streams gives one sample per episode, so TRL's fixed-count batching
    (``token_budget=0``) makes each optimizer step a fixed number of groups
    (`training.llm.rl.build_batch` counts what it leaves out)."""
    import numpy as np
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    from training.llm.rl import build_batch

    group = taken.group.model_dump(mode="json")
    batch = build_batch(
        [group], credit, version=taken.newest_version or 0, keep_zero_advantage=keep_zero_advantage
    )
    reward_mean = sum(batch.rewards) / len(batch.rewards) if batch.rewards else 0.0
    now = time.time()
    out = []
    for s in batch.samples:
        row = s.row()
        advantages = {a for a, m in zip(row.advantages, row.mask, strict=True) if m}
        if len(advantages) != 1:  # TRL takes one advantage per sample
            continue
        out.append(
            RolloutSample(
                prompt=[],
                completion=[],
                input_ids=np.asarray(row.ids, dtype=np.int64),
                completion_mask=np.asarray([int(m) for m in row.mask], dtype=np.int64),
                old_log_probs=np.asarray(row.old_logprobs, dtype=np.float32),
                advantage=float(advantages.pop()),
                model_version=int(s.weights_version if s.weights_version is not None else 0),
                group_id=taken.index,
                metrics={"reward": reward_mean},
                enqueued_at=now,
            )
        )
    return out


# ------------------------------------------------------------------------------ the worker


class TaskAppRolloutWorker:
    """TRL's rollout worker over the task app's stream of groups (a thread with its own event loop).

    ``stream``: the `StreamOpenRequest` (group template, seeds, ``in_flight``, ``max_staleness``,
    ``stale_policy``); its ``weights_version`` is replaced by the trainer's. ``to_samples`` turns one
    finished group into samples (`decision_samples` by default)."""

    def __init__(
        self,
        base_url: str,
        stream: models.StreamOpenRequest | dict[str, Any],
        *,
        api_key: str | None = None,
        advantage: Literal["group", "tree"] = "group",
        scale_by_std: bool = True,
        format_penalty: float = 0.0,
        queue_maxsize: int = 4096,
        to_samples: Callable[[models.StreamGroup, Any], list[Any]] = decision_samples,
    ) -> None:
        self.base_url, self.api_key = base_url, api_key
        self.stream_request = (
            stream
            if isinstance(stream, models.StreamOpenRequest)
            else models.StreamOpenRequest.model_validate(stream)
        )
        max_turns = self.stream_request.group.max_turns or 1
        self.credit = credit_config(advantage, scale_by_std, format_penalty, max_turns)
        self.to_samples = to_samples
        self.rollout_buffer: queue.Queue[Any] = queue.Queue(maxsize=queue_maxsize)
        self.metrics_queue: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=10_000)
        self.version = 0
        self.groups = 0
        self.last_progress = time.monotonic()
        self.info: models.StreamInfo | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._opened = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stream: GroupStreamClient | None = None

    # TRL's protocol ------------------------------------------------------------------------

    def start(self) -> None:
        self.last_progress = time.monotonic()
        self._thread = threading.Thread(target=self._main, name="taskapp-rollouts", daemon=True)
        self._thread.start()
        if not self._opened.wait(60) and self.error is None:
            raise TimeoutError("the task app's stream did not open within 60 s")
        if self.error is not None:
            raise RuntimeError(f"the task app's stream could not open: {self.error}") from self.error

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def update_model_version(self, model_version: int) -> None:
        """TRL calls this after vLLM resumed; the stream was told already (`note_version`)."""
        if model_version != self.version:
            self.note_version(model_version)

    def check_health(self, stale_after_s: float) -> None:
        if self.error is not None:
            raise RuntimeError(f"the task app rollout worker failed: {self.error}") from self.error
        if self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            raise RuntimeError("the task app rollout worker stopped (its stream ended)")
        if time.monotonic() - self.last_progress > stale_after_s:
            raise RuntimeError(f"no group from the task app for {stale_after_s:.0f} s (stream: {self.info})")

    # the weight transfer's hook -------------------------------------------------------------

    def note_version(self, version: int) -> None:
        """Tell the stream the sampler serves ``version`` (before it resumes generating)."""
        self.version = version
        if self._loop is None or self._stream is None or not self._opened.is_set():
            return  # not open yet: it opens at this version
        note = asyncio.run_coroutine_threadsafe(self._stream.set_version(version), self._loop)
        self.info = note.result(timeout=NOTE_TIMEOUT_S)

    # the thread ------------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # reported to TRL by check_health
            self.error = exc
        finally:
            self._opened.set()

    async def _run(self) -> None:
        request = self.stream_request.model_copy(update={"weights_version": self.version})
        async with (
            AsyncTaskAppClient(self.base_url, self.api_key) as app,
            GroupStreamClient(app, request, wait_s=1.0) as stream,
        ):
            self._loop, self._stream = asyncio.get_running_loop(), stream
            self._opened.set()
            while not self._stop.is_set():
                taken = await stream.take_many(1)
                if not taken:
                    if stream.info is not None and stream.info.status != "running":
                        return
                    continue
                self.info = stream.info
                self.last_progress = time.monotonic()
                for group in taken:
                    self.groups += 1
                    for sample in self.to_samples(group, self.credit):
                        await self._put(sample)
                    self._metrics(group)

    async def _put(self, sample: Any) -> None:
        while not self._stop.is_set():  # TRL's queue is full: wait (the stream then holds its groups)
            try:
                self.rollout_buffer.put_nowait(sample)
                return
            except queue.Full:
                await asyncio.sleep(0.05)

    def _metrics(self, group: models.StreamGroup) -> None:
        counters = self.info.counters if self.info is not None else None
        item: dict[str, Any] = {"taskapp/group_staleness": float(group.staleness)}
        if counters is not None:
            item["taskapp/dropped_stale"] = float(counters.dropped_stale)
            item["taskapp/restarted_stale"] = float(counters.restarted_stale)
        with contextlib.suppress(queue.Full):
            self.metrics_queue.put_nowait(item)


# ---------------------------------------------------------------------------- the transfer


class TaskAppWeightTransfer:
    """TRL's weight transfer into a running vLLM (or serve-model) through a checkpoint on disk.

    ``model_dir``: the start checkpoint (its ``config.json`` and tokenizer are copied next to each
    version's weights). ``out_dir``: where versions are written (``v1``, ``v2``, ...; the last
    ``keep`` kept). ``on_version(v)``: called once vLLM serves version ``v`` and before it resumes."""

    def __init__(
        self,
        vllm_base_url: str,
        model_dir: str | Path,
        out_dir: str | Path,
        *,
        on_version: Callable[[int], None] | None = None,
        keep: int = 2,
    ) -> None:
        from training.llm.weight_sync import WeightSync

        self.sync = WeightSync(vllm_base_url)
        self.model_dir, self.out_dir = Path(model_dir), Path(out_dir)
        self.on_version, self.keep = on_version, keep
        self.version = 0
        self.seconds: list[float] = []
        self._started = 0.0

    def init_weight_transfer(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.sync.served()  # reachable, or a clear error now

    def pause(self) -> None:
        self._started = time.monotonic()
        self.sync.pause()

    def send_weights(self, iterator: Iterator[tuple[str, Any]]) -> None:
        version = self.version + 1
        path = write_checkpoint(self.out_dir / f"v{version}", iterator, self.model_dir)
        self.sync.reload(path, version)
        self.version = version
        for old in sorted(self.out_dir.glob("v*"), key=_version_of)[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    def resume(self) -> None:
        try:
            if self.on_version is not None:
                self.on_version(self.version)
        finally:
            self.sync.resume()
        self.sync.check_version(self.version)
        self.seconds.append(time.monotonic() - self._started)

    def destroy(self) -> None:
        pass


def _version_of(path: Path) -> int:
    return int(path.name[1:]) if path.name[1:].isdigit() else -1


def write_checkpoint(path: Path, weights: Iterator[tuple[str, Any]], model_dir: Path) -> Path:
    """A checkpoint vLLM can reload in place: ``weights`` (copied: TRL's tensors share storage with
    the live parameters) as ``model.safetensors``, the tied output layer that TRL does not send as
    ``lm_head.safetensors`` (`training.llm.run.TIED_OUTPUT_FILE`), and the start model's config and
    tokenizer files."""
    from safetensors.torch import save_file

    from training.llm.run import TIED_OUTPUT_FILE

    tensors = {name: tensor.detach().to("cpu").contiguous().clone() for name, tensor in weights}
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for source in model_dir.iterdir():
        weights_file = source.suffix in (".safetensors", ".pt") or source.name.endswith(".index.json")
        if source.is_file() and not weights_file:
            shutil.copy2(source, tmp / source.name)
    config = json.loads((model_dir / "config.json").read_text())
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    if config.get("tie_word_embeddings") and "lm_head.weight" not in tensors:
        embedding = next((t for n, t in tensors.items() if n.endswith("embed_tokens.weight")), None)
        if embedding is None:
            raise ValueError("a tied output layer, but no `embed_tokens.weight` among the weights sent")
        save_file({"lm_head.weight": embedding}, str(tmp / TIED_OUTPUT_FILE), metadata={"format": "pt"})
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path


# ---------------------------------------------------------------------------- the CPU shims


def sdpa_varlen(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: Any = None,
    max_seqlen_k: Any = None,
    softmax_scale: float | None = None,
    causal: bool = True,
    window_size: tuple[int, int] = (-1, -1),
    **unused: Any,
) -> Any:
    """flash-attn's ``flash_attn_varlen_func`` for TRL's tree packing, with PyTorch's SDPA, one
    segment at a time: ``q`` (tokens, heads, dim), ``k``/``v`` (path tokens, kv heads, dim); a
    segment's queries are the last of its path, causal aligned bottom-right as flash-attn's."""
    import torch
    import torch.nn.functional as F

    if window_size != (-1, -1) or unused.get("softcap"):
        raise NotImplementedError("the CPU attention shim has no sliding window and no softcap")
    out = torch.empty_like(q)
    groups = q.shape[1] // k.shape[1]
    for s in range(len(cu_seqlens_q) - 1):
        q0, q1 = int(cu_seqlens_q[s]), int(cu_seqlens_q[s + 1])
        k0, k1 = int(cu_seqlens_k[s]), int(cu_seqlens_k[s + 1])
        qs, ks, vs = q[q0:q1].transpose(0, 1), k[k0:k1].transpose(0, 1), v[k0:k1].transpose(0, 1)
        if groups > 1:
            ks, vs = ks.repeat_interleave(groups, 0), vs.repeat_interleave(groups, 0)
        lq, lk = q1 - q0, k1 - k0
        mask = None
        if causal:
            rows = torch.arange(lq).unsqueeze(1) + (lk - lq)
            mask = torch.arange(lk).unsqueeze(0) <= rows
        out[q0:q1] = F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=mask, scale=softmax_scale
        ).transpose(0, 1)
    return out


@contextlib.contextmanager
def cpu_shims() -> Iterator[None]:
    """TRL 1.16's AsyncGRPOTrainer on a CPU: its two CUDA-only internals replaced while the block
    runs (construct and train the trainer inside it), restored after."""
    import trl
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    if trl.__version__ != TRL_VERSION:  # the two internals replaced here were read from that release
        raise RuntimeError(f"cpu_shims is written for trl=={TRL_VERSION}; this is trl {trl.__version__}")
    saved = (async_grpo_trainer.get_peak_flops_per_device, packing._flash_attn)
    async_grpo_trainer.get_peak_flops_per_device = lambda accelerator, dtype: None  # MFU off
    packing._flash_attn = lambda: SimpleNamespace(flash_attn_varlen_func=sdpa_varlen)
    try:
        yield
    finally:
        async_grpo_trainer.get_peak_flops_per_device, packing._flash_attn = saved
