"""Environment and policy plug-ins. Importing this package registers every built-in one."""

from envs import crafter  # noqa: F401  (registers crafter, crafter-react, crafter-random, ...)
from envs.base import ENVIRONMENTS, POLICIES, environment_class, policy_class

__all__ = ["ENVIRONMENTS", "POLICIES", "environment_class", "policy_class"]
