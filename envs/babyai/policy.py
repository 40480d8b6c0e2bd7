"""``babyai-agent``: the LLM agent playing BabyAI: a `TextGameAgent` configuration."""

from __future__ import annotations

from envs.babyai.prompt import INSTRUCTION
from envs.base import register_policy
from envs.text_agent import TextGameAgent


@register_policy
class BabyAIAgent(TextGameAgent, game="babyai", title="BabyAI"):
    instruction = INSTRUCTION
    clean_symbols = True
