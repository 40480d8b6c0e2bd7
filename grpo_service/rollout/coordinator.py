"""`RolloutCoordinator`: rollouts, alone or in GRPO groups, from request to response and trace.

Every wait has a deadline (``safety.max_time_s``; each LLM call also has its own timeout),
an abort stops a rollout at once (the pending LLM call is cancelled, the partial trajectory is
kept), and a failed member never sinks its group. An invalid reply is answered with the env's
feedback by default (the agent's ``on_invalid_reply``); a policy failure that ends the rollout
(an inference error, or an invalid reply under ``on_invalid_reply: "end"``) sets ``stop_reason =
"policy_error:<kind>"`` and is recorded in the trajectory: data for the trainer, not an HTTP error.

The pieces, each called from above only: `RunBook` (run_book.py) keeps the runs,
`RolloutPlayer` (player.py) plays one registered rollout or group member, `ForkingGroup`
(forks.py) plays a group with a fork plan through the same player; this module admits
rollouts and groups and ties their answers together.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from grpo_service.config import Settings
from grpo_service.core.env_manager import EnvManager
from grpo_service.core.policy_manager import PolicyManager, check_plays
from grpo_service.core.registry import Claim, EnvHandle, Hold, Registry, RunHandle, new_instance_id
from grpo_service.errors import Unprocessable
from grpo_service.models import (
    RolloutGroupRequest,
    RolloutGroupResponse,
    RolloutRequest,
    RolloutResponse,
)
from grpo_service.rollout.forks import ForkingGroup, admit_tree, check_forkable
from grpo_service.rollout.group_answer import group_response
from grpo_service.rollout.membership import Membership
from grpo_service.rollout.player import RolloutPlayer, member_request
from grpo_service.rollout.run_book import RunBook
from grpo_service.tracing.traces import TraceSink

T = TypeVar("T")


class RolloutCoordinator:
    def __init__(
        self,
        envs: EnvManager,
        policies: PolicyManager,
        registry: Registry,
        settings: Settings,
        tracer: TraceSink | None = None,
    ):
        self.envs = envs
        self.policies = policies
        self.registry = registry
        self.settings = settings
        self.tracer = tracer
        self.runs = RunBook(registry, settings.max_finished_result_bytes)
        self.player = RolloutPlayer(envs, policies, registry, self.runs, settings, tracer)

    # ---------------------------------------------------------------------------- public API

    async def rollout(self, req: RolloutRequest, claim: Claim | None = None) -> RolloutResponse:
        """Play one rollout; ``claim``: the slots a batch holds for its rollouts (else the rollout
        holds its own env and policy slot from its admission on)."""
        run, own = self._register_rollout(req, claim)
        return await _released(own, self.player.play(run, req))

    def start_rollout(self, req: RolloutRequest) -> RunHandle:
        run, own = self._register_rollout(req)
        return _in_background(run, _released(own, self.player.play(run, req)))

    async def group(self, req: RolloutGroupRequest, members: list[int] | None = None) -> RolloutGroupResponse:
        """The group, or only its members ``members`` (a share of a group spread over Ray hosts;
        a group with a fork plan is never spread)."""
        run = self._register_group(req, members)
        return await _released(run.claim, self._run_group(run, req))

    def start_group(self, req: RolloutGroupRequest, members: list[int] | None = None) -> RunHandle:
        run = self._register_group(req, members)
        return _in_background(run, _released(run.claim, self._run_group(run, req)))

    def abort(self, run_id: str) -> RunHandle:
        return self.runs.abort(run_id)

    # ------------------------------------------------------------------------------ single

    def _register_rollout(
        self, req: RolloutRequest, claim: Claim | None = None
    ) -> tuple[RunHandle, Claim | None]:
        """The rollout's run, with the slots it will create its env and policy in: ``claim``'s,
        or its own (returned, for the caller to release when the rollout ends)."""
        check_turns(req.turns_per_rollout(), "the rollout", self.settings)
        run_id = req.run_id or new_instance_id()
        hold = claim.runs if claim is not None else None
        self.runs.admit([run_id], hold)
        own = None
        if claim is None:
            creates = (int(req.env.env_id is None), int(req.policy.policy_id is None))
            own = self.registry.claim("the rollout", envs=creates[0], policies=creates[1])
        run = self.runs.add(run_id, "rollout", len(req.op_list()), req.rl_run_id, hold)
        run.claim = claim or own
        return run, own

    # ------------------------------------------------------------------------------- groups

    def _register_group(self, req: RolloutGroupRequest, members: list[int] | None = None) -> RunHandle:
        """The group's run and its members' runs, admitted together or not at all (a group that
        took the slots its members need later would leave them half-registered for good)."""
        if req.group_size > self.settings.max_group_size:
            raise Unprocessable(  # a retry cannot succeed: not a 429
                f"group_size {req.group_size} exceeds max_group_size {self.settings.max_group_size}",
                code="group_too_large",
            )
        per = req.turns_per_rollout()
        asked = (
            f"the group ({req.group_size} members × {per:,} turns)"
            if req.fork is None
            else f"the fork tree ({req.group_size} roots × {per:,} turns and up to "
            f"{req.tree_size() - req.group_size} continuations)"
        )
        check_turns(req.turns_at_most(), asked, self.settings)
        if req.policy.policy_name and req.env.env_name:  # before G envs are built for nothing
            check_plays(req.policy.policy_name, req.env.env_name, "the group's env")
        if req.policy.policy_name:  # a config the policy refuses is the caller's 422, not G failed members
            self.policies.check_config(req.policy.policy_name, req.policy.config)
        if req.fork is not None:
            admit_tree(req, self.settings)
        group_id = req.group_id or new_instance_id()
        indices = range(req.tree_size()) if members is None or req.fork is not None else members
        member_ids = [f"{group_id}.{i}" for i in indices]
        self.runs.admit([group_id, *member_ids])
        # Every member's env and policy slot is held now: a member never fails for want of room.
        size = len(member_ids)
        what = (
            f"the fork tree (up to {size} members)" if req.fork is not None else f"the group ({size} members)"
        )
        claim = self.registry.claim(what, envs=size, policies=size)
        member_ops = len(member_request(req, "x", None).op_list())
        # A continuation's ops are known when it forks; until then, the most it may play.
        ops = [member_ops if i < req.group_size else member_ops - 2 for i in indices]
        run = self.runs.add(group_id, "group", sum(ops), req.rl_run_id)
        run.member_ids = member_ids
        if members is not None and req.fork is None:
            run.share_of = req.group_size
        run.member_runs = [
            self.runs.add(member_id, "rollout", n, req.rl_run_id)
            for member_id, n in zip(member_ids, ops, strict=True)
        ]
        for member_run in (run, *run.member_runs):
            member_run.claim = claim
        return run

    async def _run_group(self, run: RunHandle, req: RolloutGroupRequest) -> RolloutGroupResponse:
        started = time.monotonic()
        members_runs = run.member_runs
        try:
            count = min(req.group_size, len(members_runs))
            start_envs = await self._group_start_envs(req, count, run.claim.envs if run.claim else None)
        except BaseException as exc:
            for member in members_runs:
                self.runs.fail(member, exc, prefix="the group could not start: ")
            self.runs.fail(run, exc)
            raise

        tree = None
        if req.fork is None:
            members = list(
                await asyncio.gather(
                    *(
                        self.player.play_member(member, req, Membership(run.id, member_index(member.id), env))
                        for member, env in zip(members_runs, start_envs, strict=True)
                    )
                )
            )
        else:
            forking = ForkingGroup(self.player, run, req, deadline=started + req.safety.max_time_s)
            members, tree = await forking.play(start_envs)
        response = group_response(run.id, members, time.monotonic() - started, req.group_size, tree)
        # The group's own counters: its members' totals (live, /run/status sums the members).
        run.ops_executed = sum(m.ops_executed for m in members_runs)
        run.llm_s = sum(m.llm_s for m in members_runs)
        run.env_s = sum(m.env_s for m in members_runs)
        self.runs.finish(run, "aborted" if run.abort.is_set() else "completed", result=response)
        return response

    async def _group_start_envs(
        self, req: RolloutGroupRequest, count: int, hold: Hold | None
    ) -> list[EnvHandle]:
        """``count`` identical starting envs: resets of one seed, or restores of one snapshot."""
        spec = req.env
        if spec.snapshot_id is not None:
            envs = await self.envs.restore_many(spec.snapshot_id, count, hold)
            if req.fork is not None:  # the snapshot's plug-in is known only now
                try:
                    check_forkable(type(envs[0].env))
                except Unprocessable:
                    for env in envs:
                        await self.envs.discard(env)
                    raise
            return envs
        assert spec.env_name is not None
        return await self.envs.create_many(spec.env_name, spec.config, spec.seed, req.rl_run_id, count, hold)


def check_turns(turns: int, asked: str, settings: Settings) -> None:
    """Refuse (422) a request that may play more turns than ``max_request_turns``: its result holds
    every turn in memory until it is answered (a retry cannot succeed: not a 429)."""
    if turns > settings.max_request_turns:
        raise Unprocessable(
            f"{asked} may play up to {turns:,} turns; MAX_REQUEST_TURNS is {settings.max_request_turns:,} "
            "(a result holds every turn in memory until it is answered): ask for fewer members or turns",
            code="too_many_turns",
        )


def member_index(member_id: str) -> int:
    """A group member's index, from its run id ``{group_id}.{index}``."""
    return int(member_id.rsplit(".", 1)[1])


async def _released(claim: Claim | None, work: Awaitable[T]) -> T:
    """``work``'s outcome; then the slots ``claim`` still holds go back (the request has ended)."""
    try:
        return await work
    finally:
        if claim is not None:
            claim.release()


def _in_background(run: RunHandle, work: Awaitable[Any]) -> RunHandle:
    run.task = asyncio.create_task(_discarding(work))
    run.task.add_done_callback(_consume_exception)
    return run


async def _discarding(work: Awaitable[Any]) -> None:
    """Run ``work`` for its effects: the run keeps its result as JSON (`RunBook.finish`), and a
    task that returned the response would keep every object of it alive as long as the run."""
    await work


def _consume_exception(task: asyncio.Task[Any]) -> None:
    """Background runs report through /run/status; keep asyncio from logging them as lost."""
    if not task.cancelled():
        task.exception()
