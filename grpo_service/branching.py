"""Branching: fork live envs and policies into several exact copies that then diverge.

Each parent is snapshotted once to the store (so the lineage id names a real, restorable
snapshot), then copied ``num_children`` times in memory. A child policy is bound to the child
env of the same index when its parent's bound env is branched in the same call.
"""

from __future__ import annotations

from grpo_service.environments import EnvManager
from grpo_service.models import BranchChild, BranchRequest, BranchResponse
from grpo_service.policies import PolicyManager


async def branch(req: BranchRequest, envs: EnvManager, policies: PolicyManager) -> BranchResponse:
    # Resolve every id first, so an unknown one fails the call before anything is created.
    env_parents = [envs.get(env_id) for env_id in dict.fromkeys(req.env_ids)]
    policy_parents = [policies.get(policy_id) for policy_id in dict.fromkeys(req.policy_ids)]
    envs.registry.envs.reserve()
    policies.registry.policies.reserve()

    env_branches: dict[str, list[str]] = {}
    policy_branches: dict[str, list[str]] = {}
    children: list[BranchChild] = []
    for parent in env_parents:
        snap = await envs.snapshot(parent.id, req.rl_run_id)
        kids = await envs.fork(parent, req.num_children, snap.id)
        env_branches[parent.id] = [k.id for k in kids]
        children += [
            BranchChild(id=k.id, parent_id=parent.id, parent_snapshot_id=snap.id, child_index=i)
            for i, k in enumerate(kids)
        ]
    for parent in policy_parents:
        snap = await policies.snapshot(parent.id, req.rl_run_id)
        env_kids = env_branches.get(parent.bound_env_id or "")
        bound = env_kids if env_kids else [parent.bound_env_id] * req.num_children
        kids = await policies.fork(parent, bound, snap.id)
        policy_branches[parent.id] = [k.id for k in kids]
        children += [
            BranchChild(
                id=k.id,
                parent_id=parent.id,
                parent_snapshot_id=snap.id,
                child_index=i,
                bound_env_id=k.bound_env_id,
            )
            for i, k in enumerate(kids)
        ]
    return BranchResponse(env_branches=env_branches, policy_branches=policy_branches, children=children)
