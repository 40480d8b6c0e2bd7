"""`grpo-service --help` (and each subcommand's) imports only the CLI framework: no app, no HTTP
client, no environment, no SQLite driver. The time it takes is measured by
``scripts/measure_cli_startup.py`` (a figure, not a timed test)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

# Modules that cost tenths of a second to seconds each, none of which printing help needs.
HEAVY = (
    "fastapi",
    "uvicorn",
    "httpx",
    "openai",
    "aiohttp",
    "pydantic_settings",
    "numpy",
    "crafter",
    "envs",
    "inference",
    "torch",
    "grpo_service.app",
    "grpo_service.client.eval",
    "grpo_service.tracing.export",
    "tools.bench.run",
)

PROBE = """
import sys
from grpo_service.cli import app
try:
    app(sys.argv[1:])
except SystemExit as exit:
    assert exit.code in (0, None), exit.code
print("--- modules ---")
print("\\n".join(sorted(sys.modules)))
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["serve", "--help"],
        ["rollout", "--help"],
        ["export-sft", "--help"],
        ["eval", "--help"],
        ["eval-report", "--help"],
        ["view", "--help"],
        ["traces", "--help"],
        ["traces", "show", "--help"],
        ["init-model", "--help"],
        ["serve-model", "--help"],
        ["train", "--help"],
    ],
)
def test_help_imports_no_heavy_module(argv: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    help_text, _, modules = out.partition("--- modules ---")
    loaded = set(modules.split())
    assert "Usage:" in help_text
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY or m in HEAVY)
    assert heavy == [], f"{' '.join(argv)} imported {heavy}"
