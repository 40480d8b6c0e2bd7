"""The generic LLM agent: one policy loop that every environment configures with small hooks.

See `envs.agent.llm_agent` for the hooks and `envs.agent.formats` for the two prompt formats
(``tool_calls`` and AgentGym's ``Action: ...`` conversation).
"""

from envs.agent.formats import (
    AGENTGYM_ACK,
    TEXT_ACTION_TOOL,
    ParsedReply,
    PromptFormatName,
    Turn,
    text_action_tool,
    text_actions,
)
from envs.agent.llm_agent import LLMAgent, LLMAgentConfig

__all__ = [
    "AGENTGYM_ACK",
    "TEXT_ACTION_TOOL",
    "LLMAgent",
    "LLMAgentConfig",
    "ParsedReply",
    "PromptFormatName",
    "Turn",
    "text_action_tool",
    "text_actions",
]
