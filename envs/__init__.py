"""Environment and policy plug-ins. Importing this package registers every built-in one."""

from envs import babyai, crafter, oracle, sciworld, textcraft  # noqa: F401  (registers each plug-in)
from envs.base import ENVIRONMENTS, POLICIES, environment_class, policy_class

__all__ = ["ENVIRONMENTS", "POLICIES", "environment_class", "policy_class"]
