"""``babyai-agent``: the LLM agent playing BabyAI: a `TextGameAgent` configuration."""

from __future__ import annotations

from envs.babyai.prompt import INSTRUCTION
from envs.base import register_policy
from envs.text_agent import TextGameAgent


@register_policy
class BabyAIAgent(TextGameAgent, game="babyai", title="BabyAI"):
    instruction = INSTRUCTION
    action_help = 'One BabyAI action from the available actions, e.g. "go to red ball 1" or "turn left".'
    clean_symbols = True
