"""The LLM agent of AgentGym's text games: the generic agent (`envs.agent`) configured with
AgentGym's conversation as its default prompt format (the task instruction, "OK. ...", then
observations and ``Action: ...`` replies), the whole conversation replayed, and the ``act`` tool
for the tool-calling format. Each game supplies its instruction and how a reply's action reads.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from envs.agent import LLMAgent, LLMAgentConfig, PromptFormatName
from envs.base import environment_class
from envs.text_game import clean_action


class TextGameAgentConfig(LLMAgentConfig):
    history_window: int = Field(
        default=64, ge=0, le=64, description="Past turns replayed to the model (AgentGym replays them all)."
    )


class TextGameAgent(LLMAgent[TextGameAgentConfig]):
    config_model = TextGameAgentConfig
    prompt_formats: ClassVar[tuple[PromptFormatName, ...]] = ("agentgym", "tool_calls")
    instruction: ClassVar[str]
    # TextCraft's and BabyAI's clients keep only letters, digits, commas and spaces of the action;
    # SciWorld's takes the text as written.
    clean_symbols: ClassVar[bool] = True

    def __init_subclass__(cls, *, game: str, title: str, **kwargs: Any) -> None:
        """``class BabyAIAgent(TextGameAgent, game="babyai", title="BabyAI")``: the policy
        ``babyai-agent``, which plays the env ``babyai``."""
        super().__init_subclass__(**kwargs)
        cls.name, cls.env_name = f"{game}-agent", game
        cls.description = (
            f"LLM agent for {title}: AgentGym's conversation ('Action: ...' replies) or the 'act' tool."
        )

    def system_prompt(self) -> str:
        return self.instruction

    def tools(self) -> list[dict]:
        return environment_class(self.env_name).tools()  # type: ignore[arg-type]

    def clean_text_action(self, text: str) -> str:
        return clean_action(text) if self.clean_symbols else text.strip()
