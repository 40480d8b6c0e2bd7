"""Rollouts: the coordinator (runs, groups, deadlines, abort), the episode loop it runs for each
rollout, the run bookkeeping, and the records a rollout returns."""

from grpo_service.rollout.coordinator import RolloutCoordinator
from grpo_service.rollout.records import llm_record, records_tokens

__all__ = ["RolloutCoordinator", "llm_record", "records_tokens"]
