"""The real vLLM server (its CPU build, installed by scripts/install-vllm.sh) on a tiny checkpoint
made here, started once per test session and shared by every test that needs it.

The suite's command installs vLLM, so CI (``CI`` set) fails when it is missing; a developer who
has not run the install script sees these tests skipped with the command to run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from inference.vllm_server import VLLMServer, find_python, serve_args, serve_env
from tests.conftest import free_port
from tests.llm_helpers import CORPUS
from training.llm.model import ModelSpec, environment_corpus, init_model

# vLLM's CPU attention supports head sizes 32, 64, 80, ... only (16 kills its engine): 64 / 2 = 32.
VLLM_SPEC = ModelSpec(
    vocab_size=768,
    hidden_size=64,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=128,
    max_positions=4096,
)
SERVED = "tiny-vllm"


@dataclass
class RealVLLM:
    server: VLLMServer
    checkpoint: Path  # the weights it was started with (tests that load others load these back)
    name: str = SERVED

    @property
    def base_url(self) -> str:
        return self.server.base_url


def vllm_python() -> Path:
    try:
        return find_python()
    except FileNotFoundError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"vLLM is part of the test suite: {exc}")
        pytest.skip(str(exc))


def make_vllm_checkpoint(path: Path, seed: int = 0) -> Path:
    """A tiny model whose tokenizer saw the text of the envs the tests play."""
    texts = list(environment_corpus(seeds=1, steps=4, env_names=["crafter", "babyai", "textcraft"]))
    init_model(path, texts + CORPUS * 20, ModelSpec(**{**VLLM_SPEC.__dict__, "seed": seed}))
    return path


def start_vllm(checkpoint: Path, log: Path) -> VLLMServer:
    args = serve_args(
        str(checkpoint), served_model_name=SERVED, port=free_port(), dtype="float32", max_model_len=4096
    )
    # Eager: torch.compile's warm-up is about 20 s of a start, and this model is too small to gain.
    args.append("--enforce-eager")
    # 1 GiB of KV cache (vLLM's smallest) holds about 2M tokens of this model.
    return VLLMServer(vllm_python(), args, env=serve_env(kv_cache_gib=1), log_path=log).start()
