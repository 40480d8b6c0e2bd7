"""BabyAI (AgentGym): the environment, AgentGym's text view and actions, and minigrid's bot as oracle."""

from envs.babyai import env, policy  # noqa: F401  (registration on import)
