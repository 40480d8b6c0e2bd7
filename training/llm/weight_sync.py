"""Pushing a trainer's new weights into the running inference server, through vLLM's RL API.

vLLM (0.32, started with ``VLLM_SERVER_DEV_MODE=1``; ``grpo-service serve-vllm`` does) and
``grpo-service serve-model`` answer the same routes, so one code path serves both, on a CPU here
and on a GPU: pause generation (``POST /pause?mode=wait``: requests in flight finish first),
reload the weights from a checkpoint directory in place (``POST /collective_rpc`` with the
worker method ``reload_weights``: no restart, the port and the KV cache stay), name the new
version (``POST /update_weight_version``), resume, and read it back (``GET /weight_info``).

A completion does not say which weights made it. Because generation is paused across the
switch, the version the trainer set is exact for every request sent after it returns: the
trainer passes it to the policies (``policy.config.weights_version``), which record it in
every LLM call, and samples older than ``max_staleness`` versions are dropped.

vLLM's transfer engines (``/init_weight_transfer_engine`` + ``/update_weights``, NCCL or CUDA
IPC) move weights GPU to GPU without a file; they are CUDA-only, so this module uses the
file-based reload, which works on both (docs/training.md, "Weight sync").
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from inference.openai_client import proxy_auth_headers
from training.llm.run import TIED_OUTPUT_FILE


class WeightSyncError(RuntimeError):
    """The inference server refused or failed a step of the weight update."""


class WeightSync:
    """The trainer's handle on the inference server that samples its rollouts."""

    def __init__(self, base_url: str, timeout_s: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.timeout_s = timeout_s
        self.headers = proxy_auth_headers()  # a Modal vLLM app serves its RL routes behind them

    def served(self) -> dict[str, Any]:
        """The model card of the served model (``GET /v1/models``: ``id``, ``root``, ...)."""
        return self._call("GET", "/v1/models")["data"][0]

    def version(self) -> str | None:
        """The version the server reports (``"default"`` until a trainer names one)."""
        return self._call("GET", "/weight_info").get("weight_version")

    def load(self, weights: Path, version: int, before_resume: Callable[[], Any] | None = None) -> float:
        """Load the checkpoint directory ``weights`` into the running server as ``version``;
        the seconds it took. Generation is paused meanwhile and resumed whatever happens.
        ``before_resume`` runs once the new weights serve and before generation resumes (a stream
        of groups is told the new version there, so that every call it tags is exact)."""
        check_checkpoint(weights)
        started = time.monotonic()
        self.pause()
        try:
            self.reload(weights, version)
            if before_resume is not None:
                before_resume()
        finally:
            self.resume()
        self.check_version(version)
        return time.monotonic() - started

    def pause(self) -> None:
        """Pause generation; requests in flight finish first (``mode=wait``)."""
        # a JSON body (`{}`): serve-model refuses a bodiless /pause (a web page could send one);
        # vLLM reads only the query
        self._call("POST", "/pause", params={"mode": "wait"}, json={})

    def reload(self, weights: Path, version: int) -> None:
        """Reload the (paused) server's weights in place from ``weights`` and name them ``version``."""
        weights = check_checkpoint(weights)
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(weights)}}
        self._call("POST", "/collective_rpc", json=body)
        self._call("POST", "/update_weight_version", json={"new_version": str(version)})

    def resume(self) -> None:
        self._call("POST", "/resume", json={})

    def check_version(self, version: int) -> None:
        reported = self.version()
        if reported != str(version):
            raise WeightSyncError(f"the server reports weights version {reported!r} after loading {version}")

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        url = self.base_url + path
        try:
            r = httpx.request(method, url, timeout=self.timeout_s, headers=self.headers, **kwargs)
        except httpx.HTTPError as exc:
            raise WeightSyncError(f"{method} {url}: {type(exc).__name__}: {exc}") from None
        if r.status_code == 404 and path != "/v1/models":
            raise WeightSyncError(
                f"{method} {url}: 404; a vLLM server exposes its weight-sync routes only when started "
                "with VLLM_SERVER_DEV_MODE=1 (grpo-service serve-vllm does)"
            )
        if r.status_code != 200:
            raise WeightSyncError(f"{method} {url}: {r.status_code} {r.text[:300]}")
        return r.json() if r.content else {}


def check_checkpoint(weights: Path) -> Path:
    """``weights`` resolved, or `WeightSyncError` when vLLM could not reload it as it is."""
    weights = Path(weights).resolve()
    # vLLM takes a path that does not exist for a hub repo id (and answers 500): check here.
    if not (weights / "config.json").is_file() or not any(weights.glob("*.safetensors")):
        raise WeightSyncError(f"{weights} is not a checkpoint directory with safetensors weights")
    config = json.loads((weights / "config.json").read_text())
    if config.get("tie_word_embeddings") and not (weights / TIED_OUTPUT_FILE).is_file():
        raise WeightSyncError(
            f"{weights} ties its output layer to its embeddings but does not write it out: vLLM's "
            "in-place reload would leave that layer stale; save it with training.llm.run.save_weights"
        )
    return weights
