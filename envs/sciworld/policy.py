"""``sciworld-agent``: the LLM agent playing SciWorld.

A configuration of `envs.text_agent.TextGameAgent`.
"""

from __future__ import annotations

from envs.base import register_policy
from envs.sciworld.prompt import INSTRUCTION
from envs.text_agent import TextGameAgent


@register_policy
class SciWorldAgent(TextGameAgent):
    name = "sciworld-agent"
    env_name = "sciworld"
    description = "LLM agent for SciWorld: AgentGym's conversation ('Action: ...' replies) or the 'act' tool."
    instruction = INSTRUCTION
    action_help = (
        'One ScienceWorld command, e.g. "open door to kitchen" or "focus on substance in metal pot".'
    )
    clean_symbols = False
