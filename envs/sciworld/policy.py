"""``sciworld-agent``: the LLM agent playing SciWorld: a `TextGameAgent` configuration."""

from __future__ import annotations

from envs.base import register_policy
from envs.sciworld.prompt import INSTRUCTION
from envs.text_agent import TextGameAgent


@register_policy
class SciWorldAgent(TextGameAgent, game="sciworld", title="SciWorld"):
    instruction = INSTRUCTION
    clean_symbols = False
