"""Branching: fork live envs and policies into several exact copies that then diverge.

Each parent is snapshotted once to the store (so the lineage id names a real, restorable
snapshot), then copied ``num_children`` times in memory. A child policy is bound to the child
env of the same index when its parent's bound env is branched in the same call.

All or nothing: the capacity for every child is checked before anything is written, and if a
later step fails (a table filled up meanwhile, a parent was terminated), every child created and
every snapshot written by this call is removed before the error is answered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpo_service.core.env_manager import EnvManager
from grpo_service.core.policy_manager import PolicyManager
from grpo_service.core.registry import EnvHandle, PolicyHandle, SnapshotMeta
from grpo_service.models import BranchChild, BranchRequest, BranchResponse


async def branch(req: BranchRequest, envs: EnvManager, policies: PolicyManager) -> BranchResponse:
    # Resolve every id first, so an unknown one fails the call before anything is created.
    env_parents = [envs.get(env_id) for env_id in dict.fromkeys(req.env_ids)]
    policy_parents = [policies.get(policy_id) for policy_id in dict.fromkeys(req.policy_ids)]
    envs.registry.envs.reserve(len(env_parents) * req.num_children)
    policies.registry.policies.reserve(len(policy_parents) * req.num_children)

    made = _Made()
    try:
        return await _branch(req, envs, policies, env_parents, policy_parents, made)
    except BaseException:
        for policy in made.policies:
            await policies.discard(policy)
        for env in made.envs:
            await envs.discard(env)
        for snap in made.snapshots:
            await envs.snapshots.discard(snap)
        raise


@dataclass
class _Made:
    """What a branch call has created so far (removed again if the call fails)."""

    envs: list[EnvHandle] = field(default_factory=list)
    policies: list[PolicyHandle] = field(default_factory=list)
    snapshots: list[SnapshotMeta] = field(default_factory=list)


async def _branch(
    req: BranchRequest,
    envs: EnvManager,
    policies: PolicyManager,
    env_parents: list[EnvHandle],
    policy_parents: list[PolicyHandle],
    made: _Made,
) -> BranchResponse:
    env_branches: dict[str, list[str]] = {}
    policy_branches: dict[str, list[str]] = {}
    children: list[BranchChild] = []
    for parent in env_parents:
        snap = await envs.snapshot(parent.id, req.rl_run_id)
        made.snapshots.append(snap)
        kids = await envs.fork(parent, req.num_children, snap.snapshot_id)
        made.envs += kids
        env_branches[parent.id] = [k.id for k in kids]
        children += [
            BranchChild(id=k.id, parent_id=parent.id, parent_snapshot_id=snap.snapshot_id, child_index=i)
            for i, k in enumerate(kids)
        ]
    for parent in policy_parents:
        snap = await policies.snapshot(parent.id, req.rl_run_id)
        made.snapshots.append(snap)
        bound_kids = env_branches.get(parent.bound_env_id or "")
        bound = bound_kids if bound_kids else [parent.bound_env_id] * req.num_children
        kids = await policies.fork(parent, bound, snap.snapshot_id)
        made.policies += kids
        policy_branches[parent.id] = [k.id for k in kids]
        children += [
            BranchChild(
                id=k.id,
                parent_id=parent.id,
                parent_snapshot_id=snap.snapshot_id,
                child_index=i,
                bound_env_id=k.bound_env_id,
            )
            for i, k in enumerate(kids)
        ]
    return BranchResponse(env_branches=env_branches, policy_branches=policy_branches, children=children)
