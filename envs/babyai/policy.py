"""``babyai-agent``: the LLM agent playing BabyAI.

A configuration of `envs.text_agent.TextGameAgent`.
"""

from __future__ import annotations

from envs.babyai.prompt import INSTRUCTION
from envs.base import register_policy
from envs.text_agent import TextGameAgent


@register_policy
class BabyAIAgent(TextGameAgent):
    name = "babyai-agent"
    env_name = "babyai"
    description = "LLM agent for BabyAI: AgentGym's conversation ('Action: ...' replies) or the 'act' tool."
    instruction = INSTRUCTION
    action_help = 'One BabyAI action from the available actions, e.g. "go to red ball 1" or "turn left".'
    clean_symbols = True
