"""SciWorld (AgentGym): the environment on a pool of ScienceWorld JVMs, and its gold paths as oracle."""

from envs.sciworld import env, policy  # noqa: F401  (registration on import)
