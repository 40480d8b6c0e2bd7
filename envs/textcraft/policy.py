"""``textcraft-agent``: the LLM agent playing TextCraft: a `TextGameAgent` configuration."""

from __future__ import annotations

from envs.base import register_policy
from envs.text_agent import TextGameAgent
from envs.textcraft.prompt import INSTRUCTION


@register_policy
class TextCraftAgent(TextGameAgent, game="textcraft", title="TextCraft"):
    instruction = INSTRUCTION
    clean_symbols = True
