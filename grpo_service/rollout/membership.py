"""`Membership`: how a group member starts and where it sits in its group (and tree)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from grpo_service.core.registry import EnvHandle, PolicyHandle

if TYPE_CHECKING:
    from grpo_service.rollout.episode import EpisodeLoop


@dataclass
class Membership:
    """A group member: the env it adopts (and, for a fork's continuation, the policy copy), its
    index, and for a continuation its parent and the turn it forked at."""

    group_id: str
    group_index: int
    env: EnvHandle
    policy: PolicyHandle | None = None
    parent_index: int | None = None
    fork_turn: int | None = None
    deadline: float | None = None
    """The group's deadline (monotonic), when it is nearer than the member's own."""
    before_decision: Callable[[EpisodeLoop, int], Awaitable[None]] | None = None
