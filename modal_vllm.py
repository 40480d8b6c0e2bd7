"""A Qwen3 model behind vLLM's OpenAI-compatible server on a Modal GPU.

    modal secret create grpo-vllm-secrets VLLM_API_KEY=<key>
    modal deploy modal_vllm.py

Then point the task app at it (docs/modal.md): ``VLLM_BASE_URL`` = this function's URL,
``DEFAULT_MODEL`` = ``MODEL``, ``INFERENCE_API_KEY`` = the key above.

Configured at deploy time by ``GRPO_VLLM_MODEL``, ``GRPO_VLLM_REVISION``, ``GRPO_VLLM_GPU`` and
``GRPO_VLLM_WEIGHT_SYNC``. They are baked into the image's environment, so the container, which
imports this file again, serves what was deployed.

The server is the one the suite runs on the CPU (`inference.vllm_server`): the same vLLM
release (the CPU build there, the CUDA one here) with the same flags. ``GRPO_VLLM_WEIGHT_SYNC=1``
turns on vLLM's RL routes (``/pause``, ``/collective_rpc``, ``/update_weight_version``, ...)
for a GRPO trainer (`training.llm.weight_sync`, docs/modal.md). vLLM's API key guards only
``/v1/...``, so these routes are then put behind Modal's proxy auth (``Modal-Key`` and
``Modal-Secret`` headers on every request) as well. Not run here (no GPU, no Modal account):
the Modal calls are checked against modal 1.6's API (tests/test_modal.py).
"""

from __future__ import annotations

import os
import subprocess

import modal

from inference.vllm_server import VLLM_VERSION, serve_args, serve_env

MODEL = os.environ.get("GRPO_VLLM_MODEL", "Qwen/Qwen3-4B")
MODEL_REVISION = os.environ.get("GRPO_VLLM_REVISION", "")  # a commit hash pins the weights
GPU = os.environ.get("GRPO_VLLM_GPU", "L40S")  # 48 GB: a 4B model in bf16 plus a large KV cache
WEIGHT_SYNC = os.environ.get("GRPO_VLLM_WEIGHT_SYNC", "") == "1"

APP_NAME = "grpo-vllm"
SECRET_NAME = "grpo-vllm-secrets"  # VLLM_API_KEY: vLLM then requires it as a Bearer token
PORT = 8000
MINUTES = 60
MAX_INPUTS = 256  # concurrent requests per replica; vLLM batches them on the GPU

vllm_image = (
    modal.Image.debian_slim(python_version="3.12")
    .uv_pip_install(f"vllm=={VLLM_VERSION}")
    .env(
        {
            "GRPO_VLLM_MODEL": MODEL,
            "GRPO_VLLM_REVISION": MODEL_REVISION,
            "GRPO_VLLM_GPU": GPU,
            "GRPO_VLLM_WEIGHT_SYNC": "1" if WEIGHT_SYNC else "",
        }
    )
    .add_local_python_source("inference")  # the flags, shared with `grpo-service serve-vllm`
)
hf_cache = modal.Volume.from_name("huggingface-cache", create_if_missing=True)
vllm_cache = modal.Volume.from_name("vllm-cache", create_if_missing=True)

app = modal.App(APP_NAME)


def vllm_command(model: str = MODEL, revision: str = MODEL_REVISION, port: int = PORT) -> list[str]:
    args = serve_args(model, served_model_name=model, host="0.0.0.0", port=port, revision=revision or None)
    return ["python", "-m", "vllm.entrypoints.openai.api_server", *args]


@app.function(
    image=vllm_image,
    gpu=GPU,
    volumes={"/root/.cache/huggingface": hf_cache, "/root/.cache/vllm": vllm_cache},
    secrets=[modal.Secret.from_name(SECRET_NAME)],
    scaledown_window=15 * MINUTES,
    timeout=10 * MINUTES,
    # Every replica must serve the same weights (on-policy sampling, LoRA updates): one by default.
    max_containers=1,
)
@modal.concurrent(max_inputs=MAX_INPUTS)
# First boot downloads the weights. With weight sync on, every route needs Modal's proxy auth too.
@modal.web_server(port=PORT, startup_timeout=20 * MINUTES, requires_proxy_auth=WEIGHT_SYNC)
def serve() -> None:
    if not os.environ.get("VLLM_API_KEY"):
        raise RuntimeError(f"VLLM_API_KEY is missing from the Modal secret {SECRET_NAME!r}")
    subprocess.Popen(vllm_command(), env={**os.environ, **serve_env(weight_sync=WEIGHT_SYNC)})


@app.local_entrypoint()
def smoke_test() -> None:
    """`modal run modal_vllm.py`: one tool call with token ids and logprobs."""
    import httpx

    key = os.environ.get("VLLM_API_KEY")
    if not key:
        raise SystemExit("set VLLM_API_KEY locally to the key in the Modal secret")
    url = serve.get_web_url()
    headers = {"Authorization": f"Bearer {key}"}
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Move left twice."}],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "interact",
                    "parameters": {
                        "type": "object",
                        "properties": {"actions": {"type": "array", "items": {"type": "string"}}},
                        "required": ["actions"],
                    },
                },
            }
        ],
        "tool_choice": "auto",
        "logprobs": True,
        "return_token_ids": True,
        "chat_template_kwargs": {"enable_thinking": False},
        "max_tokens": 128,
    }
    with httpx.Client(base_url=url, headers=headers, timeout=20 * MINUTES, follow_redirects=True) as client:
        client.get("/health").raise_for_status()
        reply = client.post("/v1/chat/completions", json=body).raise_for_status().json()
    choice = reply["choices"][0]
    print("tool calls:", choice["message"].get("tool_calls"))
    print("prompt tokens:", len(reply["prompt_token_ids"]), "completion tokens:", len(choice["token_ids"]))
