"""``textcraft-agent``: the LLM agent playing TextCraft.

A configuration of `envs.text_agent.TextGameAgent`.
"""

from __future__ import annotations

from envs.base import register_policy
from envs.text_agent import TextGameAgent
from envs.textcraft.prompt import INSTRUCTION


@register_policy
class TextCraftAgent(TextGameAgent):
    name = "textcraft-agent"
    env_name = "textcraft"
    description = (
        "LLM agent for TextCraft: AgentGym's conversation ('Action: ...' replies) or the 'act' tool."
    )
    instruction = INSTRUCTION
    action_help = 'One TextCraft command: "get N item", "craft N item using N item, ...", or "inventory".'
    clean_symbols = True
