"""`RolloutPlayer`: plays one registered rollout, alone or as a group member, from its env and
policy to its response and trace. The coordinator and the forking groups call it; it calls
nothing above it.

`EpisodeLoop` (episode.py) runs the turns; records.py builds the steps, trajectories and
metrics; this module resolves the env, bounds the rollout by its deadline and hands the
finished rollout to the tracer.
"""

from __future__ import annotations

import time

from grpo_service.config import Settings
from grpo_service.core.env_manager import EnvManager
from grpo_service.core.policy_manager import PolicyManager, check_plays
from grpo_service.core.registry import EnvHandle, Registry, RunHandle
from grpo_service.models import (
    GroupMember,
    RolloutEnvSpec,
    RolloutGroupRequest,
    RolloutPolicySpec,
    RolloutRequest,
    RolloutResponse,
)
from grpo_service.rollout.episode import EpisodeLoop, unshared
from grpo_service.rollout.membership import Membership
from grpo_service.rollout.records import final_record, metrics, trajectory, untrainable_warning
from grpo_service.rollout.run_book import RunBook, error_message
from grpo_service.tracing.traces import RolloutTrace, TraceSink

TERMINATED = ("env_terminated", "policy_terminated")  # stop reasons: a caller ended what it played


class RolloutPlayer:
    def __init__(
        self,
        envs: EnvManager,
        policies: PolicyManager,
        registry: Registry,
        runs: RunBook,
        settings: Settings,
        tracer: TraceSink | None = None,
    ) -> None:
        self.envs = envs
        self.policies = policies
        self.registry = registry
        self.runs = runs
        self.settings = settings
        self.tracer = tracer

    async def play(
        self, run: RunHandle, req: RolloutRequest, member: Membership | None = None
    ) -> RolloutResponse:
        try:
            response = await self._execute(run, req, member)
        except BaseException as exc:
            self.runs.fail(run, exc)
            raise
        self.runs.finish(run, response.status, result=response, error=response.error)
        return response

    async def _resolve_env(self, spec: RolloutEnvSpec, run: RunHandle) -> tuple[EnvHandle, bool]:
        """The env to play (made in the slot the run's claim holds) and whether this rollout owns
        it (and must terminate it)."""
        if spec.env_id is not None:
            return unshared(self.envs.get(spec.env_id), "env"), False
        hold = run.claim.envs if run.claim is not None else None
        if spec.snapshot_id is not None:
            return await self.envs.restore(spec.snapshot_id, hold=hold), True
        assert spec.env_name is not None
        return await self.envs.create(spec.env_name, spec.config, spec.seed, run.rl_run_id, hold), True

    async def _execute(
        self, run: RunHandle, req: RolloutRequest, member: Membership | None
    ) -> RolloutResponse:
        started_wall, started = time.time(), time.monotonic()
        if member is None and req.policy.policy_name and req.env.env_name:
            check_plays(req.policy.policy_name, req.env.env_name, "the rollout's env")  # before creating it
        env, owns_env = (member.env, True) if member is not None else await self._resolve_env(req.env, run)
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

    async def play_member(self, run: RunHandle, req: RolloutGroupRequest, member: Membership) -> GroupMember:
        """Play one member of a group (``run`` is its registered run); a failure is the member's,
        not the group's."""
        index = member.group_index
        member_req = member_request(req, run.id, index)
        if member.fork_turn:
            member_req = member_req.model_copy(update={"max_turns": (req.max_turns or 0) - member.fork_turn})
        try:
            result = await self.play(run, member_req, member)
        except Exception as exc:
            return GroupMember(group_index=index, run_id=run.id, status="failed", error=error_message(exc))
        return GroupMember(group_index=index, run_id=run.id, status=result.status, result=result)


def member_request(req: RolloutGroupRequest, run_id: str, index: int | None) -> RolloutRequest:
    config = dict(req.policy.config)
    if req.vary_policy_seed and index is not None and isinstance(config.get("seed"), int):
        config["seed"] = config["seed"] + index
    return RolloutRequest(
        run_id=run_id,
        env=RolloutEnvSpec(env_id="adopted"),
        policy=RolloutPolicySpec(policy_name=req.policy.policy_name, config=config),
        **req.plan(),
    )
