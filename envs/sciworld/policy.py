"""``sciworld-agent``: the LLM agent playing SciWorld: a `TextGameAgent` configuration."""

from __future__ import annotations

from envs.base import register_policy
from envs.sciworld.prompt import INSTRUCTION
from envs.text_agent import TextGameAgent


@register_policy
class SciWorldAgent(TextGameAgent, game="sciworld", title="SciWorld"):
    instruction = INSTRUCTION
    action_help = (
        'One ScienceWorld command, e.g. "open door to kitchen" or "focus on substance in metal pot".'
    )
    clean_symbols = False
