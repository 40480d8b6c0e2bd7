"""Crafter: the environment and the policies that play it (ReAct over an LLM, random, heuristic)."""

from envs.crafter import baselines, env, policy  # noqa: F401  (registration on import)
