"""``grpo-service init-model`` and ``grpo-service serve-model``: a small Qwen3 made here, and
a CPU model server in vLLM's shape for it (or for any local transformers checkpoint)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from training.llm.model import ModelSpec

console = Console()
DEFAULT_SPEC = ModelSpec()


def init_model_command(
    out: Annotated[Path, typer.Argument(file_okay=False, help="Directory to write the checkpoint to.")],
    corpus: Annotated[
        list[Path] | None,
        typer.Option(
            "--corpus", exists=True, dir_okay=False, help="Chat JSONL (e.g. export-sft output) to add."
        ),
    ] = None,
    corpus_seeds: Annotated[int, typer.Option(min=1, help="Seeds per environment for the corpus.")] = 3,
    env: Annotated[
        list[str] | None, typer.Option("--env", help="Environments whose text to use (default: all).")
    ] = None,
    vocab_size: Annotated[
        int, typer.Option(min=300, help="BPE vocabulary size (at most).")
    ] = DEFAULT_SPEC.vocab_size,
    hidden_size: Annotated[int, typer.Option(min=16)] = DEFAULT_SPEC.hidden_size,
    layers: Annotated[int, typer.Option(min=1)] = DEFAULT_SPEC.num_layers,
    heads: Annotated[int, typer.Option(min=1)] = DEFAULT_SPEC.num_heads,
    kv_heads: Annotated[int, typer.Option(min=1)] = DEFAULT_SPEC.num_kv_heads,
    head_dim: Annotated[
        int, typer.Option(min=8, help="Attention head size (vLLM's CPU kernels take 32, 64, 80, 96, 128...).")
    ] = DEFAULT_SPEC.head_dim,
    intermediate_size: Annotated[int, typer.Option(min=16)] = DEFAULT_SPEC.intermediate_size,
    max_positions: Annotated[int, typer.Option(min=64, help="Context length.")] = DEFAULT_SPEC.max_positions,
    seed: Annotated[int, typer.Option(min=0, help="Initialization seed.")] = DEFAULT_SPEC.seed,
) -> None:
    """Make a small Qwen3 here: a tokenizer trained on the environments' text carrying Qwen3's own
    chat template, and random weights."""
    from training.llm.model import environment_corpus, init_model, jsonl_corpus

    if heads % kv_heads:
        raise typer.BadParameter("heads must divide by kv-heads")
    texts = list(environment_corpus(seeds=corpus_seeds, env_names=env))
    if corpus:
        texts.extend(jsonl_corpus(corpus))
    spec = ModelSpec(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate_size,
        max_positions=max_positions,
        seed=seed,
    )
    info = init_model(out, texts, spec)
    console.print(
        f"[green]model[/] {out}: {info['parameters']:,} parameters, vocabulary {info['vocab_size']:,} "
        f"(tokenizer trained on {len(texts):,} texts, {sum(map(len, texts)):,} characters)"
    )


def serve_model_command(
    path: Annotated[Path, typer.Argument(exists=True, file_okay=False, help="A local checkpoint directory.")],
    host: Annotated[str, typer.Option(help="Bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8001,
    served_model_name: Annotated[
        str | None, typer.Option(help="The model name clients use (default: the directory's name).")
    ] = None,
    max_batch_rows: Annotated[
        int, typer.Option(min=1, help="Most sequences decoded together (requests x n).")
    ] = 32,
    threads: Annotated[
        int, typer.Option(min=1, help="torch threads (1 is fastest on a shared or small CPU).")
    ] = 1,
    pause_wait_s: Annotated[
        float,
        typer.Option(min=0.01, help="While paused, a chat waits this long, then gets 503 + Retry-After."),
    ] = 30.0,
    trust_request_chat_template: Annotated[
        bool,
        typer.Option(
            "--trust-request-chat-template",
            help="Render a chat template sent in a request (refused by default, as vLLM does).",
        ),
    ] = False,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            envvar="ALLOW_INSECURE",
            help="Allow a non-loopback bind (serve-model has no authentication).",
        ),
    ] = False,
    header_timeout_s: Annotated[
        float | None,
        typer.Option(
            min=0.01, help="A request's headers must arrive within this, else 408 and a close [default: 10]."
        ),
    ] = None,
) -> None:
    """Serve a checkpoint on the CPU with vLLM's chat API, token ids, logprobs and weight reloads."""
    from grpo_service.api.auth import is_loopback

    if not (insecure or is_loopback(host)):  # the rule `serve` and `view` apply; this server has no key
        raise SystemExit(
            f"refusing to serve on {host}: serve-model has no authentication (anyone who reaches it can "
            "reload its weights); bind to 127.0.0.1, or pass --insecure (ALLOW_INSECURE=1) if you "
            "really mean it"
        )
    import torch
    import uvicorn

    from grpo_service.serving import HEADER_TIMEOUT_S, uvicorn_config
    from training.llm.server import ModelEngine, create_model_app

    torch.set_num_threads(threads)
    engine = ModelEngine(
        path, max_batch_rows=max_batch_rows, served_name=served_model_name, pause_wait_s=pause_wait_s
    )
    app = create_model_app(engine, trust_request_chat_template=trust_request_chat_template)
    console.print(f"serving [bold]{engine.served_name}[/] from {path} on http://{host}:{port}/v1")
    try:
        with contextlib.suppress(KeyboardInterrupt):
            # The header deadline, and on loopback the Host check (this server has no key).
            config = uvicorn_config(
                app,
                host,
                port,
                keyed=False,
                header_timeout_s=header_timeout_s or HEADER_TIMEOUT_S,
                log_level="warning",
            )
            uvicorn.Server(config).run()
    finally:
        engine.close()


def serve_vllm_command(
    path: Annotated[
        str, typer.Argument(help="A local checkpoint directory (init-model, train output, a real Qwen3).")
    ],
    host: Annotated[str, typer.Option(help="Bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8001,
    served_model_name: Annotated[
        str | None, typer.Option(help="The model name clients use (default: the directory's name).")
    ] = None,
    dtype: Annotated[str, typer.Option(help="vLLM's --dtype (float32 matches the trainer's logprobs).")] = (
        "float32"
    ),
    max_model_len: Annotated[
        int | None, typer.Option(min=64, help="Context length (default: the checkpoint's).")
    ] = None,
    kv_cache_gib: Annotated[int, typer.Option(min=1, help="CPU KV cache size (whole GiB).")] = 1,
    weight_sync: Annotated[
        bool,
        typer.Option(help="Expose vLLM's RL routes (/pause, /collective_rpc, ...) for `train --type rl`."),
    ] = True,
    python: Annotated[
        Path | None,
        typer.Option(
            help="The vLLM install's python (default: GRPO_VLLM_PYTHON, else GRPO_VLLM_VENV/bin/python, "
            "else .venv-vllm/bin/python)."
        ),
    ] = None,
    startup_timeout_s: Annotated[float, typer.Option(min=1, help="Wait this long for /health.")] = 900.0,
) -> None:
    """Serve a checkpoint with the real vLLM (CPU build), with the flags the task app needs."""
    from inference.vllm_server import VLLMServer, find_python, serve_args, serve_env

    checkpoint = Path(path)
    if not (checkpoint / "config.json").is_file():
        raise typer.BadParameter(f"{path} is not a checkpoint directory (no config.json)", param_hint="PATH")
    try:
        vllm_python = find_python(python)
    except FileNotFoundError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    args = serve_args(
        str(checkpoint.resolve()),
        served_model_name=served_model_name or checkpoint.resolve().name,
        host=host,
        port=port,
        dtype=dtype,
        max_model_len=max_model_len,
    )
    server = VLLMServer(
        vllm_python,
        args,
        env=serve_env(weight_sync=weight_sync, kv_cache_gib=kv_cache_gib),
        startup_timeout_s=startup_timeout_s,
    )
    console.print(f"starting vLLM ({vllm_python}) on {checkpoint}; this takes about a minute on a CPU")
    try:
        server.start()
        console.print(
            f"serving [bold]{args[args.index('--served-model-name') + 1]}[/] on {server.base_url}/v1"
        )
        with contextlib.suppress(KeyboardInterrupt):
            code = server.wait()
        if code:
            raise typer.Exit(code)
    finally:
        server.stop()
