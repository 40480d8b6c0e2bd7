"""Token streams against per-decision sequences: what the trainer pays, and how often a
re-rendered prompt breaks the prefix.

    python scripts/bench_token_streams.py --out docs/bench/token-streams.json

Everything runs here on 127.0.0.1: a Qwen3 made by ``init-model`` (its tokenizer trained on the
environments' text, Qwen3's own chat template), ``serve-model`` as the sampler, the task app.

1. ``tokens``: GRPO groups on Crafter (30 turns) and BabyAI played as token streams; the same
   episodes trained once as one sequence per stream and once as one sequence per decision (each
   decision's prompt + completion, as the per-step records hold them): tokens the trainer's
   forward pass processes per episode, and wall time of one GRPO update on the batch.
2. ``prefix_breaks``: per 1,000 turns, how often turn t+1's prompt does not start with turn t's
   prompt + completion, under each way of building prompts: per-decision chat (the server renders
   each prompt from messages), the exact stream (never, by construction; the turns where the
   template would have rendered differently are counted as ``template_differs``), and ``segment``
   (a new segment there). For Qwen3's template with thinking on and off.

GRPO on streams against per decision, from SFT to held-out success: ``scripts/bench_llm_loop.py
--token-stream``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grpo_service import Settings, create_app  # noqa: E402
from tools.server_thread import ServerThread  # noqa: E402
from training.llm.config import RLConfig  # noqa: E402
from training.llm.model import ModelSpec, environment_corpus, init_model, load  # noqa: E402
from training.llm.rl import build_batch, update  # noqa: E402
from training.llm.server import ModelEngine, create_model_app  # noqa: E402

SPEC = ModelSpec(
    vocab_size=1024,
    hidden_size=64,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=32,
    intermediate_size=128,
    max_positions=32_768,
)
GAMES = {  # env: (policy, turns, policy config)
    "crafter": ("crafter-react", 30, {"history_window": 64, "max_tokens": 24}),
    "babyai": ("babyai-agent", 20, {"max_tokens": 16}),
    "textcraft": ("textcraft-agent", 20, {"max_tokens": 16}),
}


def rl_config(model: Path, env: str, urls: tuple[str, str], **extra: Any) -> RLConfig:
    policy, turns, config = GAMES[env]
    return RLConfig(
        model=str(model),
        task_app_url=urls[0],
        model_server_url=urls[1],
        env_name=env,
        policy_name=policy,
        policy_config={**config, "temperature": 1.0},
        max_turns=turns,
        format_penalty=1.0,
        kl_coef=0.05,  # every sequence has a gradient: the two batches train the same tokens
        micro_batch=4,
        **extra,
    )


def group(app: str, config: RLConfig, seed: int, size: int, **policy: Any) -> dict[str, Any]:
    body = {
        "group_size": size,
        "env": {"env_name": config.env_name, "seed": seed},
        "policy": {"policy_name": config.policy_name, "config": {**config.policy_config, **policy}},
        "max_turns": config.max_turns,
        "on_done": "terminate",
    }
    r = httpx.post(f"{app}/rollout/group", json=body, timeout=3600)
    r.raise_for_status()
    return r.json()


def timed_update(model_dir: Path, samples: list[Any], config: RLConfig) -> tuple[float, dict[str, float]]:
    model, _ = load(model_dir)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    started = time.perf_counter()
    metrics = update(model, None, optimizer, samples, config, 0)
    return time.perf_counter() - started, metrics


def tokens_part(model_dir: Path, urls: tuple[str, str], seeds: list[int], size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for env in ("crafter", "babyai"):
        config = rl_config(model_dir, env, urls)
        groups = [group(urls[0], config, seed, size, tokenizer=str(model_dir)) for seed in seeds]
        episodes = sum(len(m["result"]["trajectories"]) for g in groups for m in g["members"])
        turns = sum(
            len(t["steps"]) for g in groups for m in g["members"] for t in m["result"]["trajectories"]
        )
        row: dict[str, Any] = {"episodes": episodes, "turns": turns}
        for sequences in ("stream", "decision"):
            batch = build_batch(groups, config.model_copy(update={"sequences": sequences}), version=0)
            seconds, metrics = timed_update(model_dir, batch.samples, config)
            row[sequences] = {
                "sequences": len(batch.samples),
                "forward_tokens_per_episode": round(metrics["forward_tokens"] / episodes, 1),
                "trained_tokens": metrics["trained_tokens"],
                "update_s": round(seconds, 3),
                "logprob_max_abs_diff": metrics["logprob_max_abs_diff"],
            }
        row["forward_tokens_ratio"] = round(
            row["decision"]["forward_tokens_per_episode"] / row["stream"]["forward_tokens_per_episode"], 2
        )
        row["update_s_ratio"] = round(row["decision"]["update_s"] / row["stream"]["update_s"], 2)
        out[env] = row
        print(env, json.dumps(row), flush=True)
    return out


def chat_breaks(result: dict[str, Any]) -> int:
    breaks = 0
    for trajectory in result["trajectories"]:
        previous: list[int] | None = None
        for step in trajectory["steps"]:
            llm = step.get("llm") or {}
            prompt, completion = llm.get("prompt_token_ids"), llm.get("completion_token_ids")
            if prompt is None or completion is None:
                previous = None
                continue
            if previous is not None and prompt[: len(previous)] != previous:
                breaks += 1
            previous = prompt + completion
    return breaks


def breaks_part(model_dir: Path, urls: tuple[str, str], seeds: list[int], size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for thinking in (False, True):
        for env in GAMES:
            config = rl_config(model_dir, env, urls)
            for mode in ("chat", "exact", "segment"):
                policy: dict[str, Any] = {"enable_thinking": thinking}
                if mode != "chat":
                    policy.update(tokenizer=str(model_dir), token_stream=mode)
                results = [
                    m["result"] for s in seeds for m in group(urls[0], config, s, size, **policy)["members"]
                ]
                turns = sum(r["metrics"]["num_decisions"] for r in results)
                episodes = sum(r["metrics"]["num_episodes"] for r in results)
                if mode == "chat":
                    breaks = sum(chat_breaks(r) for r in results)
                else:
                    breaks = sum(r["metrics"]["stream_segments"] for r in results) - episodes
                differs = sum(r["metrics"]["template_differs"] for r in results)
                key = f"{'thinking' if thinking else 'no_thinking'}.{env}.{mode}"
                row = {
                    "turns": turns,
                    "prefix_breaks": breaks,
                    "breaks_per_1000_turns": round(1000 * breaks / max(1, turns - episodes), 1),
                    "template_differs_per_1000_turns": round(1000 * differs / max(1, turns - episodes), 1),
                }
                out.setdefault("thinking" if thinking else "no_thinking", {}).setdefault(env, {})[mode] = row
                print(key, json.dumps(row), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("docs/bench/token-streams.json"))
    parser.add_argument("--work", type=Path, default=Path("bench_token_streams"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--parts", nargs="+", default=["tokens", "prefix_breaks"])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    model_dir = args.work / "model"
    if not (model_dir / "config.json").is_file():
        texts = list(environment_corpus(seeds=1, steps=6, env_names=list(GAMES)))
        init_model(model_dir, texts, SPEC)
    engine = ModelEngine(model_dir, served_name="tiny")
    report: dict[str, Any] = {
        "machine": {"cpus": torch.get_num_threads(), "platform": platform.platform()},
        "model": {k: getattr(SPEC, k) for k in ("vocab_size", "hidden_size", "num_layers", "max_positions")},
        "seeds": args.seeds,
        "group_size": args.group_size,
    }
    started = time.perf_counter()

    def save() -> None:  # after each part: a run cut short keeps what it measured
        report["wall_s"] = round(time.perf_counter() - started, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")

    with ServerThread(create_model_app(engine), name="model-server") as served:
        settings = Settings(
            _env_file=None,
            state_dir=args.work / "state",
            snapshot_secret="bench-" + "x" * 32,
            vllm_base_url=served.base_url,
            default_model="tiny",
        )
        with ServerThread(create_app(settings), name="task-app") as app:
            urls = (app.base_url, served.base_url)
            if "tokens" in args.parts:
                report["tokens"] = tokens_part(model_dir, urls, args.seeds, args.group_size)
                save()
            if "prefix_breaks" in args.parts:
                report["prefix_breaks"] = breaks_part(model_dir, urls, args.seeds, args.group_size)
    engine.close()
    save()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
