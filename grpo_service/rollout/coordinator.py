"""`RolloutCoordinator`: rollouts, alone or in GRPO groups, from request to response and trace.

Every wait has a deadline (``safety.max_time_s``; each LLM call also has its own timeout),
an abort stops a rollout at once (the pending LLM call is cancelled, the partial trajectory is
kept), and a failed member never sinks its group. A policy failure (no tool call, invalid
action, inference error) ends the rollout with ``stop_reason = "policy_error:<kind>"`` and is
recorded in the trajectory; it is data for the trainer, not an HTTP error.

The pieces: `RunBook` (runs.py) keeps the runs, `EpisodeLoop` (episode.py) plays one rollout,
records.py builds its steps, trajectories and metrics; this module ties them together.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from typing import Any

from grpo_service.config import Settings
from grpo_service.environments import EnvManager
from grpo_service.errors import Unprocessable
from grpo_service.models import (
    GroupMember,
    GroupMetrics,
    RolloutEnvSpec,
    RolloutGroupRequest,
    RolloutGroupResponse,
    RolloutPolicySpec,
    RolloutRequest,
    RolloutResponse,
)
from grpo_service.policies import PolicyManager, check_plays
from grpo_service.registry import EnvHandle, Registry, RunHandle, new_instance_id
from grpo_service.rollout.episode import EpisodeLoop, unshared
from grpo_service.rollout.forks import ForkingGroup, admit_tree, check_forkable
from grpo_service.rollout.membership import Membership
from grpo_service.rollout.records import final_record, metrics, trajectory, untrainable_warning
from grpo_service.rollout.runs import RunBook, error_message
from grpo_service.tracing.traces import RolloutTrace, TraceSink

TERMINATED = ("env_terminated", "policy_terminated")  # stop reasons: a caller ended what it played


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
        self.runs = RunBook(registry)

    # ---------------------------------------------------------------------------- public API

    async def rollout(self, req: RolloutRequest) -> RolloutResponse:
        run = self._register_rollout(req)
        return await self._run_registered(run, req)

    def start_rollout(self, req: RolloutRequest) -> RunHandle:
        run = self._register_rollout(req)
        return _in_background(run, self._run_registered(run, req))

    async def group(self, req: RolloutGroupRequest, members: list[int] | None = None) -> RolloutGroupResponse:
        """The group, or only its members ``members`` (a share of a group spread over Ray hosts;
        a group with a fork plan is never spread)."""
        run = self._register_group(req, members)
        return await self._run_group(run, req)

    def start_group(self, req: RolloutGroupRequest, members: list[int] | None = None) -> RunHandle:
        run = self._register_group(req, members)
        return _in_background(run, self._run_group(run, req))

    def abort(self, run_id: str) -> RunHandle:
        return self.runs.abort(run_id)

    # ------------------------------------------------------------------------------ single

    def _register_rollout(self, req: RolloutRequest) -> RunHandle:
        return self.runs.register(
            req.run_id or new_instance_id(), "rollout", len(req.op_list()), req.rl_run_id
        )

    async def _run_registered(
        self, run: RunHandle, req: RolloutRequest, member: Membership | None = None
    ) -> RolloutResponse:
        try:
            response = await self._execute(run, req, member)
        except BaseException as exc:
            self.runs.fail(run, exc)
            raise
        self.runs.finish(run, response.status, result=response, error=response.error)
        return response

    async def _resolve_env(self, spec: RolloutEnvSpec, rl_run_id: str) -> tuple[EnvHandle, bool]:
        """The env to play and whether this rollout owns it (and must terminate it)."""
        if spec.env_id is not None:
            return unshared(self.envs.get(spec.env_id), "env"), False
        if spec.snapshot_id is not None:
            return await self.envs.restore(spec.snapshot_id), True
        assert spec.env_name is not None
        return await self.envs.create(spec.env_name, spec.config, spec.seed, rl_run_id), True

    async def _execute(
        self, run: RunHandle, req: RolloutRequest, member: Membership | None
    ) -> RolloutResponse:
        started_wall, started = time.time(), time.monotonic()
        if member is None and req.policy.policy_name and req.env.env_name:
            check_plays(req.policy.policy_name, req.env.env_name, "the rollout's env")  # before creating it
        env, owns_env = (
            (member.env, True) if member is not None else await self._resolve_env(req.env, req.rl_run_id)
        )
        own_deadline = started + req.safety.max_time_s
        loop = EpisodeLoop(
            run,
            req,
            env,
            owns_env,
            self.envs,
            self.policies,
            llm_timeout_s=req.safety.llm_timeout_s or self.settings.inference_timeout_s,
            deadline=min(own_deadline, member.deadline) if member and member.deadline else own_deadline,
            policy=member.policy if member else None,
            first_turn=(member.fork_turn or 0) if member else 0,
            before_decision=member.before_decision if member else None,
        )
        try:
            await loop.play()
        finally:
            await loop.close()
        response = self._response(loop, member, time.monotonic() - started)
        policy = loop.policy
        trace = RolloutTrace(
            request=req,
            response=response,
            env_name=env.env_name,
            policy_name=policy.policy_name if policy else (req.policy.policy_name or ""),
            policy_config=self.policies.public_config(policy) if policy else {},
            seed=self.envs.seed(env),
            started_at=started_wall,
            finished_at=time.time(),
            decisions=loop.decisions,
            env_config=self.envs.config(env),
        )
        if req.record.return_trace:
            response.trace = trace.to_dict()
        if self.tracer is not None:
            self.tracer.submit(trace)
        return response

    @staticmethod
    def _response(loop: EpisodeLoop, member: Membership | None, wall_s: float) -> RolloutResponse:
        env, policy, episodes, stop_reason = loop.env, loop.policy, loop.episodes, loop.stop_reason
        last = episodes[-1] if episodes else None
        if last is not None and last.stop_reason == "running":
            last.stop_reason = stop_reason
            last.final = final_record(env.last, loop.req.record) if env.last else None
            if not last.steps and len(episodes) > 1:
                episodes.pop()  # an episode reset into and never played
        record = loop.req.record
        trajectories = [trajectory(ep, env, policy) for ep in episodes] if record.trajectories else []
        status = (
            "aborted"
            if stop_reason in ("aborted", *TERMINATED)
            else ("failed" if stop_reason == "error" else "completed")
        )
        summary = metrics(episodes, loop.decisions, loop.run, wall_s, loop.with_tokens)
        return RolloutResponse(
            run_id=loop.run.id,
            status=status,
            trajectories=trajectories,
            metrics=summary,
            warnings=[untrainable_warning(summary)] if summary.llm_calls_without_tokens else [],
            aborted=stop_reason in ("aborted", "time_limit", *TERMINATED),
            ops_executed=loop.ops_executed,
            stop_reason=stop_reason,
            error=loop.error,
            env_id=None if loop.owns_env else env.id,
            policy_id=None if (loop.owns_policy or policy is None) else policy.id,
            group_id=member.group_id if member else None,
            group_index=member.group_index if member else None,
            parent_index=member.parent_index if member else None,
            fork_turn=member.fork_turn if member else None,
        )

    # ------------------------------------------------------------------------------- groups

    def _register_group(self, req: RolloutGroupRequest, members: list[int] | None = None) -> RunHandle:
        """The group's run and its members' runs, admitted together or not at all (a group that
        took the slots its members need later would leave them half-registered for good)."""
        if req.group_size > self.settings.max_group_size:
            raise Unprocessable(  # a retry cannot succeed: not a 429
                f"group_size {req.group_size} exceeds max_group_size {self.settings.max_group_size}",
                code="group_too_large",
            )
        if req.policy.policy_name and req.env.env_name:  # before G envs are built for nothing
            check_plays(req.policy.policy_name, req.env.env_name, "the group's env")
        if req.policy.policy_name:  # a config the policy refuses is the caller's 422, not G failed members
            self.policies.check_config(req.policy.policy_name, req.policy.config)
        if req.fork is not None:
            admit_tree(req, self.settings, self.registry)
        group_id = req.group_id or new_instance_id()
        indices = range(req.tree_size()) if members is None or req.fork is not None else members
        member_ids = [f"{group_id}.{i}" for i in indices]
        self.runs.admit([group_id, *member_ids])
        member_ops = len(_member_request(req, "x", None).op_list())
        # A continuation's ops are known when it forks; until then, the most it may play.
        ops = [member_ops if i < req.group_size else member_ops - 2 for i in indices]
        run = self.runs.add(group_id, "group", sum(ops), req.rl_run_id)
        run.member_ids = member_ids
        run.member_runs = [
            self.runs.add(member_id, "rollout", n, req.rl_run_id)
            for member_id, n in zip(member_ids, ops, strict=True)
        ]
        return run

    async def _run_group(self, run: RunHandle, req: RolloutGroupRequest) -> RolloutGroupResponse:
        started = time.monotonic()
        members_runs = run.member_runs
        try:
            start_envs = await self._group_start_envs(req, min(req.group_size, len(members_runs)))
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
                        self.play_member(member, req, Membership(run.id, member_index(member.id), env))
                        for member, env in zip(members_runs, start_envs, strict=True)
                    )
                )
            )
        else:
            forking = ForkingGroup(self, run, req, deadline=started + req.safety.max_time_s)
            members, tree = await forking.play(start_envs)
        response = group_response(run.id, members, time.monotonic() - started, req.group_size, tree)
        # The group's own counters: its members' totals (live, /run/status sums the members).
        run.ops_executed = sum(m.ops_executed for m in members_runs)
        run.llm_s = sum(m.llm_s for m in members_runs)
        run.env_s = sum(m.env_s for m in members_runs)
        self.runs.finish(run, "aborted" if run.abort.is_set() else "completed", result=response)
        return response

    async def play_member(self, run: RunHandle, req: RolloutGroupRequest, member: Membership) -> GroupMember:
        """Play one member of a group (``run`` is its registered run); a failure is the member's,
        not the group's."""
        index = member.group_index
        member_req = _member_request(req, run.id, index)
        if member.fork_turn:
            member_req = member_req.model_copy(update={"max_turns": (req.max_turns or 0) - member.fork_turn})
        try:
            result = await self._run_registered(run, member_req, member)
        except Exception as exc:
            return GroupMember(group_index=index, run_id=run.id, status="failed", error=error_message(exc))
        return GroupMember(group_index=index, run_id=run.id, status=result.status, result=result)

    async def _group_start_envs(self, req: RolloutGroupRequest, count: int) -> list[EnvHandle]:
        """``count`` identical starting envs: resets of one seed, or restores of one snapshot."""
        spec = req.env
        if spec.snapshot_id is not None:
            envs = await self.envs.restore_many(spec.snapshot_id, count)
            if req.fork is not None:  # the snapshot's plug-in is known only now
                try:
                    check_forkable(type(envs[0].env))
                except Unprocessable:
                    for env in envs:
                        await self.envs.discard(env)
                    raise
            return envs
        assert spec.env_name is not None
        return await self.envs.create_many(spec.env_name, spec.config, spec.seed, req.rl_run_id, count)


def member_index(member_id: str) -> int:
    """A group member's index, from its run id ``{group_id}.{index}``."""
    return int(member_id.rsplit(".", 1)[1])


def group_response(
    group_id: str, members: list[GroupMember], wall_s: float, group_size: int, tree: Any = None
) -> RolloutGroupResponse:
    """A group's answer from its members (in index order): the GRPO returns (of the
    ``group_size`` first members; fork continuations follow them) and their statistics."""
    returns = [m.result.metrics.mean_return if m.result else None for m in members]
    valid = [r for r in returns[:group_size] if r is not None and math.isfinite(r)]
    return RolloutGroupResponse(
        group_id=group_id,
        members=members,
        tree=tree,
        metrics=GroupMetrics(
            returns=returns,
            mean_return=statistics.fmean(valid) if valid else None,
            std_return=statistics.pstdev(valid) if valid else None,
            completed=sum(1 for m in members if m.status == "completed"),
            failed=sum(1 for m in members if m.status == "failed"),
            wall_time_s=round(wall_s, 6),
            llm_calls_without_tokens=sum(
                m.result.metrics.llm_calls_without_tokens for m in members if m.result
            ),
        ),
        warnings=list(dict.fromkeys(w for m in members if m.result for w in m.result.warnings)),
    )


def _member_request(req: RolloutGroupRequest, run_id: str, index: int | None) -> RolloutRequest:
    config = dict(req.policy.config)
    if req.vary_policy_seed and index is not None and isinstance(config.get("seed"), int):
        config["seed"] = config["seed"] + index
    return RolloutRequest(
        run_id=run_id,
        env=RolloutEnvSpec(env_id="adopted"),
        policy=RolloutPolicySpec(policy_name=req.policy.policy_name, config=config),
        **req.plan(),
    )


def _in_background(run: RunHandle, work: Any) -> RunHandle:
    run.task = asyncio.create_task(work)
    run.task.add_done_callback(_consume_exception)
    return run


def _consume_exception(task: asyncio.Task[Any]) -> None:
    """Background runs report through /run/status; keep asyncio from logging them as lost."""
    if not task.cancelled():
        task.exception()
