"""TRL's AsyncGRPOTrainer on the task app (`grpo_service.client.trl_async`): the CPU attention shim
against an eager forward, the checkpoint a weight send becomes (tied head included), and (slow)
the trainer itself against the served task app and the running vLLM: optimizer steps with the
weights version advancing, and vLLM's logprobs equal to the trainer's weights after a sync.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

pytest.importorskip("trl")

from grpo_service.client import trl_async  # noqa: E402
from tests.llm_helpers import make_tiny_model  # noqa: E402
from training.llm.logprobs import completion_logprobs  # noqa: E402
from training.llm.model import load  # noqa: E402
from training.llm.run import TIED_OUTPUT_FILE  # noqa: E402


def test_the_cpu_attention_shim_packs_a_tree_as_an_eager_forward_does(tmp_path: Path) -> None:
    """Two samples sharing a prefix, packed by TRL's TreeRow and run through TRL's tree attention
    with the shim: every trained token's logprob equals a plain forward of its own sample."""
    from transformers import AutoModelForCausalLM
    from trl.experimental.async_grpo.packing import TREE_ATTENTION, TreeRow, register_tree_attention

    path = make_tiny_model(tmp_path / "m")
    eager = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    register_tree_attention()
    tree = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation=TREE_ATTENTION
    ).eval()
    samples = []
    for tail in ([7, 8, 9, 10], [7, 11, 12]):
        ids = [3, 4, 5, 6, *tail]
        samples.append(
            {
                "input_ids": torch.tensor(ids),
                "completion_mask": torch.tensor([0] * 4 + [1] * len(tail)),
                "old_log_probs": torch.zeros(len(ids)),
                "advantage": 1.0,
                "group_id": 0,
            }
        )
    row = TreeRow()
    for s in samples:
        row.add(s)
    packed = row.pack()
    assert len(packed["input_ids"]) < sum(len(s["input_ids"]) for s in samples)  # the prefix is shared
    with trl_async.cpu_shims(), torch.no_grad():
        logits = tree(
            input_ids=packed["input_ids"][None],
            position_ids=packed["position_ids"][None],
            tree_kv_index=packed["tree_kv_index"],
            tree_cu_seqlens_q=packed["tree_cu_seqlens_q"],
            tree_cu_seqlens_k=packed["tree_cu_seqlens_k"],
            tree_max_seqlen_q=int(packed["tree_max_seqlens"][0]),
            tree_max_seqlen_k=int(packed["tree_max_seqlens"][1]),
        ).logits[0]
    packed_lp = torch.log_softmax(logits, -1)[
        packed["token_index"], packed["shift_labels"][packed["token_index"]]
    ]
    expected = []
    with torch.no_grad():
        for s in samples:
            ids = s["input_ids"]
            lp = torch.log_softmax(eager(input_ids=ids[None]).logits[0], -1)
            expected += [float(lp[p - 1, ids[p]]) for p in range(1, len(ids)) if s["completion_mask"][p]]
    assert torch.allclose(packed_lp, torch.tensor(expected), atol=1e-5), (packed_lp, expected)


def test_a_weight_send_becomes_a_reloadable_checkpoint_with_the_tied_head(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path / "m")
    model, _ = load(path)
    assert json.loads((path / "config.json").read_text()).get("tie_word_embeddings")
    sent = ((n, p) for n, p in model.named_parameters() if n != "lm_head.weight")  # as TRL sends them
    out = trl_async.write_checkpoint(tmp_path / "v1", sent, path)
    assert (out / TIED_OUTPUT_FILE).is_file() and (out / "config.json").is_file()
    reloaded, _ = load(out)
    for (name, a), (_, b) in zip(model.state_dict().items(), reloaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    from training.llm.weight_sync import check_checkpoint

    assert check_checkpoint(out) == out.resolve()


# ------------------------------------------------------------------- against vLLM (slow)


@pytest.fixture(scope="module")
def vllm_task_app(real_vllm: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from grpo_service import create_app
    from tests.conftest import make_settings
    from tests.llm_toy import toy_plugins
    from tests.vllm_helpers import SERVED
    from tools.server_thread import ServerThread

    root = tmp_path_factory.mktemp("trl-async")
    settings = make_settings(root, vllm_base_url=real_vllm.base_url, default_model=SERVED)
    # toy-words: its graded reward varies within a group even for an untrained model (a signal)
    with toy_plugins(), ServerThread(create_app(settings), name="task-app") as server:
        yield server


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_trls_async_grpo_trains_on_the_stream_and_vllm_serves_its_weights(
    vllm_task_app: Any, real_vllm: Any, tmp_path: Path
) -> None:
    from datasets import Dataset
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from tests.test_vllm_service import sampled
    from training.llm.weight_sync import WeightSync

    torch.set_num_threads(1)
    stream = {
        "group": {
            "group_size": 4,
            "env": {"env_name": "toy-words", "seed": 0},
            "policy": {"policy_name": "toy-say", "config": {"max_tokens": 16, "temperature": 1.0}},
            "max_turns": 1,
            "record": {"logprobs": True},
        },
        "in_flight": 2,
        "max_staleness": 1,
    }
    worker = trl_async.TaskAppRolloutWorker(vllm_task_app.base_url, stream)
    transfer = trl_async.TaskAppWeightTransfer(
        real_vllm.base_url, real_vllm.checkpoint, tmp_path / "weights", on_version=worker.note_version
    )
    args = AsyncGRPOConfig(
        output_dir=str(tmp_path / "trl"),
        max_steps=2,
        bf16=False,
        dtype="float32",
        learning_rate=1e-3,
        temperature=1.0,
        token_budget=1024,
        max_staleness=1,
        weight_sync_steps=1,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
    )
    placeholder = Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * 4})
    try:
        with trl_async.cpu_shims():
            trainer = AsyncGRPOTrainer(
                model=str(real_vllm.checkpoint),
                args=args,
                train_dataset=placeholder,
                rollout_worker=worker,
                weight_transfer=transfer,
            )
            trainer.train()
        assert trainer.state.global_step == 2
        assert transfer.version == trainer.model_version == 3  # the start sync, then one per step
        assert worker.info is not None and worker.info.weights_version >= 2
        assert WeightSync(real_vllm.base_url).version() == "3"

        # The last version written is the trainer's live weights (the tied head included) ...
        last, _ = load(tmp_path / "weights" / "v3")
        live = trainer.model.state_dict()  # the tied head is the embedding
        for name, tensor in last.state_dict().items():
            assert torch.equal(tensor, live[name]), name
        start, _ = load(real_vllm.checkpoint)
        assert not torch.equal(
            start.state_dict()["model.norm.weight"], last.state_dict()["model.norm.weight"]
        ) or any(not torch.equal(a, b) for a, b in zip(start.parameters(), last.parameters(), strict=True))
        # ... and vLLM serves exactly them: its logprobs are the trainer's to fp32 precision.
        worst = 0.0
        for seed in range(3):
            prompt, completion, logprobs = sampled(real_vllm.base_url, seed)
            mine = completion_logprobs(last, [prompt], [completion], 0)[0]
            worst = max(worst, max(abs(a - b) for a, b in zip(mine, logprobs, strict=True)))
        print(
            f"TRL async: versions {transfer.version}, syncs {transfer.seconds}, vLLM vs trainer {worst:.2e}"
        )
        assert worst <= 1e-5
    finally:
        worker.stop()
        WeightSync(real_vllm.base_url).load(real_vllm.checkpoint, 0)
        httpx.get(vllm_task_app.base_url + "/health", timeout=10)
