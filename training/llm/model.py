"""A small causal LM made here: a byte-level BPE tokenizer trained on the environments' own text,
carrying Qwen3's own chat template, and a randomly initialised ``Qwen3ForCausalLM`` from a config:
the model class and template vLLM and TRL run for Qwen3-0.6B, at a size a CPU trains in minutes.

``load(path)`` reads any local transformers checkpoint the same way (one made here, or a real
one such as a Qwen3 download); nothing is fetched from a hub.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import training.llm  # noqa: F401  (offline environment variables before transformers loads)


@dataclass
class ModelSpec:
    """Size of a model made here. The default has about 2 M parameters.

    ``head_dim`` is set apart from ``hidden_size / num_heads`` as Qwen3 allows; keep it in vLLM's
    supported sizes (32, 64, 80, 96, 112, 128, ...): its CPU attention kernels have no others."""

    vocab_size: int = 4096
    hidden_size: int = 192
    num_layers: int = 4
    num_heads: int = 6
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 512
    max_positions: int = 4096
    seed: int = 0


# ------------------------------------------------------------------------------------- corpus


def environment_corpus(seeds: int = 3, steps: int = 12, env_names: list[str] | None = None) -> Iterator[str]:
    """Text of every registered environment and LLM policy: observations over a few seeds and
    random steps, and each policy's full request (system prompt, tools, turns) rendered as JSON."""
    import envs  # noqa: F401  (registers the plug-ins)
    from envs.base import ENVIRONMENTS, POLICIES, PolicyContext
    from envs.errors import PluginError

    rng = random.Random(0)
    for name, env_cls in sorted(ENVIRONMENTS.items()):
        if env_names and name not in env_names:
            continue
        policies = [p for p in POLICIES.values() if p.uses_inference and p.env_name in (name, None)]
        for seed in range(seeds):
            try:
                env = env_cls.create({}, seed)
                result = env.reset(seed)
            except Exception:  # an environment that cannot start here (missing runtime) adds nothing
                continue
            try:
                for _ in range(steps):
                    yield str(result.observation.get("text", ""))
                    for policy_cls in policies:
                        yield from _policy_text(policy_cls, result.observation, PolicyContext(model="m"))
                    if result.done:
                        break
                    try:
                        result = env.step([rng.randrange(8)])
                    except PluginError:
                        break
            finally:
                env.close()


def _policy_text(policy_cls: Any, observation: dict[str, Any], context: Any) -> Iterator[str]:
    import asyncio

    from envs.base import DRY_RUN

    try:
        policy = policy_cls.create({}, context)
        decision = asyncio.run(policy.step(observation, DRY_RUN))
    except Exception:
        return
    request = decision.meta.get("inference_request") or {}
    for message in request.get("messages") or []:
        if isinstance(message.get("content"), str):
            yield message["content"]
    for tool in request.get("tools") or []:
        yield json.dumps(tool.get("function", tool))


def jsonl_corpus(paths: Iterable[Path]) -> Iterator[str]:
    """Message texts and tool calls of chat JSONL files (e.g. ``export-sft`` output)."""
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                example = json.loads(line)
                for message in example.get("messages", []):
                    if isinstance(message.get("content"), str):
                        yield message["content"]
                    for call in message.get("tool_calls") or []:
                        yield json.dumps(call.get("function", call))


# ---------------------------------------------------------------------------------- tokenizer


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Any:
    """A byte-level BPE (any text round-trips) with ChatML specials and the tool-call markers as
    single tokens, wrapped as a transformers tokenizer carrying the chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from training.llm.chat import CHAT_TEMPLATE, END_OF_TEXT, FORMAT_TOKENS, IM_END, SPECIAL_TOKENS

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.add_tokens([AddedToken(t, normalized=False) for t in FORMAT_TOKENS])
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        bos_token=None,
        unk_token=None,
        chat_template=CHAT_TEMPLATE,
    )
    return wrapped


# -------------------------------------------------------------------------------------- model


def init_model(out: Path, texts: Iterable[str], spec: ModelSpec | None = None) -> dict[str, Any]:
    """Train the tokenizer, build a random Qwen3 from ``spec`` and save both to ``out``."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    spec = spec or ModelSpec()
    tokenizer = train_tokenizer(texts, spec.vocab_size)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        use_cache=True,
    )
    torch.manual_seed(spec.seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    from training.llm.run import save_weights

    save_weights(out, model, tokenizer)
    info = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "spec": asdict(spec),
    }
    (out / "made_here.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def load(path: str | Path, *, dtype: Any = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a local checkpoint directory, in eval mode, fp32 by default."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a model checkpoint directory (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype or torch.float32)
    model.eval()
    return model, tokenizer


def end_of_turn_ids(tokenizer: Any) -> set[int]:
    """Token ids that end a turn: the chat's end-of-turn and the tokenizer's EOS."""
    from training.llm.chat import END_OF_TEXT, IM_END

    ids: set[int] = set()
    for token in (IM_END, END_OF_TEXT, tokenizer.eos_token):
        token_id = tokenizer.convert_tokens_to_ids(token) if token else None
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            ids.add(token_id)
    return ids


def stop_token_ids(tokenizer: Any, model: Any) -> set[int]:
    """Token ids that end a completion: the model's EOS ids and the chat's end-of-turn."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    return end_of_turn_ids(tokenizer) | set(
        eos if isinstance(eos, list) else [eos] if eos is not None else []
    )
