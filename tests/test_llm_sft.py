"""SFT on chat JSONL: assistant-only loss, checkpoints, exact resume, metrics and curves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.llm_helpers import make_tiny_model
from training.llm.config import SFTConfig
from training.llm.model import load
from training.llm.run import ConfigError, load_config
from training.llm.sft import load_examples, train_sft

TOOLS = [{"type": "function", "function": {"name": "act", "parameters": {"type": "object"}}}]


class StopAfter:
    """A job context that asks the run to stop after ``n`` reported steps."""

    def __init__(self, n: int) -> None:
        self.n, self.reports = n, []

    def report(self, current: int, total: int, metrics: dict) -> None:
        self.reports.append((current, total, metrics))

    def stop_reason(self) -> str | None:
        return "stopped" if len(self.reports) >= self.n else None


def example(i: int) -> dict:
    call = {
        "id": f"c{i}",
        "type": "function",
        "function": {"name": "act", "arguments": json.dumps({"action": ["left", "right"][i % 2]})},
    }
    return {
        "messages": [
            {"role": "system", "content": "Pick a side."},
            {"role": "user", "content": f"The coin is {['left', 'right'][i % 2]}."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
        ],
        "tools": TOOLS,
    }


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sft")
    data = root / "data.jsonl"
    rows = [example(i) for i in range(12)] + [{"messages": [{"role": "user", "content": "no answer"}]}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    return make_tiny_model(root / "model", [json.dumps(r) for r in rows]), data


def test_loss_is_on_assistant_tokens_only(setup) -> None:
    model_dir, data = setup
    _, tokenizer = load(model_dir)
    examples, skipped = load_examples(data, tokenizer, max_length=4096)
    assert len(examples) == 12 and skipped == {"no_assistant_tokens": 1, "invalid: JSONDecodeError": 1}
    first = examples[0]
    trained = tokenizer.decode([t for t, m in zip(first.input_ids, first.assistant_mask, strict=True) if m])
    # Qwen3's template gives the reply its (empty) <think> block: what the model emits at inference.
    call = '<tool_call>\n{"name": "act", "arguments": {"action": "left"}}\n</tool_call>'
    assert trained == f"<think>\n\n</think>\n\n{call}<|im_end|>"
    assert load_examples(data, tokenizer, max_length=20)[1]["too_long"] == 12


# A ChatML template with {% generation %} markers: transformers computes its assistant mask itself.
MARKED_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}<|im_end|>{% endgeneration %}"
    "{% else %}{{ m.content }}<|im_end|>{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
DIALOGUE = [
    {"role": "user", "content": "Go to the key."},
    {"role": "assistant", "content": "OK."},
    {"role": "user", "content": "A key is 2 steps ahead."},
    {"role": "assistant", "content": "Action: go forward", "reasoning_content": "The key is ahead."},
]


def masked_text(tokenizer, ids: list[int], mask: list[int]) -> list[str]:
    """The masked spans, decoded."""
    spans, current = [], []
    for token, bit in zip(ids, mask, strict=True):
        if bit:
            current.append(token)
        elif current:
            spans, current = [*spans, tokenizer.decode(current)], []
    return spans + ([tokenizer.decode(current)] if current else [])


def test_assistant_mask_by_prefix_rendering_fits_both_templates(setup) -> None:
    """Qwen3's own template has no {% generation %} markers: the mask comes from rendering the
    turns before each reply. It equals transformers' mask on a marked template, and with Qwen3's
    the last reply carries its reasoning in <think> while earlier ones carry none (as rendered)."""
    from training.llm.sft import assistant_mask

    model_dir, _ = setup
    _, tokenizer = load(model_dir)
    ids, mask = assistant_mask(tokenizer, DIALOGUE)
    assert masked_text(tokenizer, ids, mask) == [
        "OK.<|im_end|>",
        "<think>\nThe key is ahead.\n</think>\n\nAction: go forward<|im_end|>",
    ]
    tokenizer.chat_template = MARKED_TEMPLATE
    ids, mask = assistant_mask(tokenizer, DIALOGUE)
    marked = tokenizer.apply_chat_template(
        DIALOGUE, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    assert ids == list(marked["input_ids"]) and mask == list(marked["assistant_masks"])
    assert masked_text(tokenizer, ids, mask) == ["OK.<|im_end|>", "Action: go forward<|im_end|>"]


def test_sft_learns_checkpoints_and_resumes_exactly(setup, tmp_path: Path) -> None:
    model_dir, data = setup
    base = {
        "model": str(model_dir),
        "dataset": str(data),
        "batch_size": 4,
        "lr": 1e-2,
        "save_every": 2,
        "threads": 1,
        "epochs": 2,
    }
    whole = train_sft(SFTConfig(**base, out=str(tmp_path / "whole")))
    assert whole["steps"] == 6 and whole["last_loss"] < whole["first_loss"]
    run = tmp_path / "whole"
    assert (run / "curves.png").stat().st_size > 1000 and (run / "final" / "config.json").exists()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-4", "step-6"]  # keeps 2
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3, 4, 5, 6] and all(m["assistant_tokens"] > 0 for m in lines)

    # Stopped after 2 steps (as a job is), then run again: it resumes and ends where `whole` did.
    train_sft(SFTConfig(**base, out=str(tmp_path / "split")), StopAfter(2))
    assert (tmp_path / "split" / "checkpoints" / "step-2").is_dir()
    resumed = train_sft(SFTConfig(**base, out=str(tmp_path / "split")))
    assert resumed["steps"] == 6
    a = load_file(run / "final" / "model.safetensors")
    b = load_file(tmp_path / "split" / "final" / "model.safetensors")
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    split_lines = (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in split_lines] == [1, 2, 3, 4, 5, 6]


def test_config_errors_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[sft]\nmodel = "m"\nlr = -1\nbogus = 1\n')
    with pytest.raises(ConfigError, match="lr") as info:
        load_config(SFTConfig, bad, "sft")
    assert "bogus" in str(info.value)
    bad.write_text("model = \n")
    with pytest.raises(ConfigError, match="bad.toml"):
        load_config(SFTConfig, bad, "sft")


@pytest.mark.slow
def test_an_sft_job_through_the_job_api(setup, start_server, tmp_path: Path) -> None:
    """``POST /train {"type": "sft"}`` runs the same trainer in a job process, writes the run under
    the state directory's ``models/<model_name>/`` and reports its steps; a missing model is a 4xx."""
    import shutil
    import time

    import httpx

    model_dir, data = setup
    server = start_server(training_max_jobs=1)
    state = tmp_path / "state"  # the start_server fixture's state directory
    # The job API reads names inside the service's own directories, never a path the body names.
    shutil.copytree(model_dir, state / "models" / "tiny")
    (state / "datasets").mkdir(parents=True)
    shutil.copy(data, state / "datasets" / "chat.jsonl")
    with httpx.Client(base_url=server.base_url, timeout=90) as client:
        body = {
            "type": "sft",
            "model": "tiny",
            "dataset": "chat.jsonl",
            "max_steps": 3,
            "model_name": "s1",
        }
        answer = client.post("/train", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["config"]["type"] == "sft"
        job_id = answer.json()["job_id"]
        deadline = time.monotonic() + 120
        while (status := client.get(f"/training/{job_id}/status").json())["status"] not in (
            "completed",
            "failed",
            "stopped",
        ):
            assert time.monotonic() < deadline, status
            time.sleep(0.2)
        assert status["status"] == "completed", status
        assert status["job_type"] == "sft" and status["current_timesteps"] == status["total_timesteps"] == 3
        run = state / "models" / "s1"
        assert (run / "final" / "config.json").exists() and (run / "metrics.jsonl").exists()
        unknown = client.post("/train", json={"type": "sft", "dataset": str(data)})
        assert unknown.status_code == 422 and "model" in unknown.text
