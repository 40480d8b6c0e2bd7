"""`init-model` makes a Qwen3 whose tokenizer carries Qwen3's own chat template: the text TRL
recognises, so TRL takes the checkpoint as it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grpo_service.cli import app
from training.llm.model import load


@pytest.mark.slow
def test_init_model_makes_a_qwen3_that_trl_recognises(tmp_path: Path) -> None:
    from trl.chat_template_utils import add_response_schema, qwen3_chat_template

    out = tmp_path / "model"
    args = ["init-model", str(out), "--env", "babyai", "--corpus-seeds", "1", "--vocab-size", "400"]
    args += ["--hidden-size", "64", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--head-dim", "64"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["head_dim"] == 64
    model, tokenizer = load(out)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert tokenizer.chat_template == qwen3_chat_template  # byte for byte
    for marker in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>"):
        assert len(tokenizer.encode(marker, add_special_tokens=False)) == 1, marker
    add_response_schema(tokenizer)  # raises "Unrecognized chat template" for any other text
    call = '<tool_call>\n{"name": "act", "arguments": {"action": "go"}}\n</tool_call>'
    reply = f"<think>\nahead\n</think>\n\n{call}"
    parsed = tokenizer.parse_response(reply + "<|im_end|>", prefix="")
    assert parsed["tool_calls"][0]["function"] == {"name": "act", "arguments": {"action": "go"}}
    assert parsed.get("reasoning_content") == "ahead"

    bad = CliRunner().invoke(app, ["init-model", str(tmp_path / "x"), "--heads", "3", "--kv-heads", "2"])
    assert bad.exit_code != 0 and "kv-heads" in bad.output
