"""`RolloutCoordinator`: runs the policy-step → env-step loop, alone or in GRPO groups.

Every wait has a deadline (``safety.max_time_s``; each LLM call also has its own timeout),
an abort stops a rollout at once (the pending LLM call is cancelled, the partial trajectory is
kept), and a failed member never sinks its group. A policy failure (no tool call, invalid
action, inference error) ends the rollout with ``stop_reason = "policy_error:<kind>"`` and is
recorded in the trajectory; it is data for the trainer, not an HTTP error.
"""

from __future__ import annotations

import asyncio
import logging
import math
import statistics
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from envs.base import PluginError, PolicyDecision, StepResult
from grpo_service.config import Settings
from grpo_service.environments import EnvManager
from grpo_service.errors import CapacityExceeded, Conflict, NotFound, ServiceError, Unprocessable
from grpo_service.models import (
    GroupMember,
    GroupMetrics,
    LLMCallRecord,
    RolloutEnvSpec,
    RolloutGroupRequest,
    RolloutGroupResponse,
    RolloutMetrics,
    RolloutPolicySpec,
    RolloutRequest,
    RolloutResponse,
    RolloutStep,
    Trajectory,
)
from grpo_service.policies import PolicyManager
from grpo_service.registry import EnvHandle, PolicyHandle, Registry, RunHandle, new_instance_id
from inference import LLMCall, compact_response

log = logging.getLogger(__name__)
T = TypeVar("T")
H = TypeVar("H", EnvHandle, PolicyHandle)

IMAGE_KEYS = ("image_png_base64", "image")
TERMINATED = ("env_terminated", "policy_terminated")  # stop reasons: a caller ended what it played


# ----------------------------------------------------------------------------------- traces


@dataclass
class DecisionTrace:
    """One agent decision with everything the trace DB and SFT export need."""

    turn: int
    observation: dict[str, Any]
    decision: PolicyDecision
    result: StepResult | None = None
    env_ms: float = 0.0


@dataclass
class RolloutTrace:
    request: RolloutRequest
    response: RolloutResponse
    env_name: str
    policy_name: str
    policy_config: dict[str, Any]
    seed: int | None
    started_at: float
    finished_at: float
    decisions: list[DecisionTrace] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A compact JSON form: per turn, the messages sent and the reply (for ``return_trace``)."""
        turns = []
        for d in self.decisions:
            call = d.decision.llm_call
            turns.append(
                {
                    "turn": d.turn,
                    "messages": (call.request.get("messages") if call else None),
                    "response": call.response if call else None,
                    "tool_calls": d.decision.tool_calls,
                    "error": d.decision.error,
                    "reward": d.result.reward if d.result else None,
                    "done": d.result.done if d.result else None,
                    "achievements_unlocked": (
                        d.result.info.get("achievements_unlocked") if d.result else None
                    ),
                }
            )
        return {
            "run_id": self.response.run_id,
            "group_id": self.response.group_id,
            "group_index": self.response.group_index,
            "env_name": self.env_name,
            "policy_name": self.policy_name,
            "seed": self.seed,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "stop_reason": self.response.stop_reason,
            "turns": turns,
        }


class TraceSink(Protocol):
    """Receives every finished rollout. ``submit`` must not block (enqueue and return)."""

    def submit(self, trace: RolloutTrace) -> None: ...


# ------------------------------------------------------------------------------ the loop


class _Stop(Exception):
    def __init__(self, reason: str):
        self.reason = reason


@dataclass
class _Episode:
    index: int
    seed: int | None
    steps: list[RolloutStep] = field(default_factory=list)
    total_reward: float = 0.0
    achievements: list[str] = field(default_factory=list)
    done: bool = False
    truncated: bool = False
    stop_reason: str = "running"
    final: dict[str, Any] | None = None


def _strip_images(observation: dict[str, Any]) -> dict[str, Any]:
    if not any(k in observation for k in IMAGE_KEYS):
        return observation
    return {k: v for k, v in observation.items() if k not in IMAGE_KEYS}


def llm_record(call: LLMCall | None, with_tokens: bool) -> LLMCallRecord | None:
    if call is None:
        return None
    return LLMCallRecord(
        model=call.model,
        latency_ms=call.latency_ms,
        attempts=call.attempts,
        finish_reason=call.finish_reason,
        usage=call.usage,
        prompt_token_ids=call.prompt_token_ids if with_tokens else None,
        completion_token_ids=call.completion_token_ids if with_tokens else None,
        completion_logprobs=call.completion_logprobs if with_tokens else None,
        error=call.error,
    )


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

    # ------------------------------------------------------------------------- run registry

    def register_run(self, run_id: str, kind: str, ops_total: int) -> RunHandle:
        self._admit([run_id])
        return self._add_run(run_id, kind, ops_total)

    def _admit(self, run_ids: list[str]) -> None:
        """Refuse (409/429) unless every one of ``run_ids`` can be registered now. Registering
        them must follow with no ``await`` in between, so that admission is all-or-nothing."""
        for run_id in run_ids:
            existing = self.registry.runs.find(run_id)
            if existing is not None and not existing.finished:
                raise Conflict(f"run {run_id!r} is already running", code="run_exists")
        if self.registry.active_runs() + len(run_ids) > self.registry.max_active_runs:
            needed = f"{len(run_ids)} run slots" if len(run_ids) > 1 else "a run slot"
            raise CapacityExceeded(
                f"{self.registry.max_active_runs} runs at most may be active and {needed} are not "
                "free; retry later",
                headers={"Retry-After": "1"},
            )

    def _add_run(self, run_id: str, kind: str, ops_total: int) -> RunHandle:
        self.registry.runs.pop(run_id)
        run = RunHandle(id=run_id, rl_run_id="", kind=kind, ops_total=ops_total)  # type: ignore[arg-type]
        self._evict_finished_runs()
        self.registry.runs.put_evicting(run_id, run)
        return run

    def _evict_finished_runs(self) -> None:
        runs = self.registry.runs
        while len(runs) >= runs.capacity:
            oldest = next((r for r in runs if r.finished), None)
            if oldest is None:
                return
            runs.pop(oldest.id)

    @staticmethod
    def _finish_run(run: RunHandle, status: str, result: Any = None, error: str | None = None) -> None:
        run.status = status  # type: ignore[assignment]
        run.finished_at = time.time()
        # Only background runs keep their result for /run/status: a blocking call has already
        # returned it, and 2,000 kept results of long rollouts would hold about a GiB.
        run.result = result if run.task is not None else None
        run.error = error

    def abort(self, run_id: str) -> RunHandle:
        run = self.registry.runs.get(run_id)
        run.abort.set()
        for member_id in run.member_ids:
            member = self.registry.runs.find(member_id)
            if member is not None:
                member.abort.set()
        return run

    # ---------------------------------------------------------------------------- public API

    async def rollout(self, req: RolloutRequest) -> RolloutResponse:
        run_id = req.run_id or new_instance_id()
        run = self.register_run(run_id, "rollout", len(req.op_list()))
        return await self._run_registered(run, req)

    def start_rollout(self, req: RolloutRequest) -> RunHandle:
        run = self.register_run(req.run_id or new_instance_id(), "rollout", len(req.op_list()))
        run.task = asyncio.create_task(self._run_registered(run, req))
        run.task.add_done_callback(_consume_exception)
        return run

    async def group(self, req: RolloutGroupRequest) -> RolloutGroupResponse:
        run = self._register_group(req)
        return await self._run_group(run, req)

    def start_group(self, req: RolloutGroupRequest) -> RunHandle:
        run = self._register_group(req)
        run.task = asyncio.create_task(self._run_group(run, req))
        run.task.add_done_callback(_consume_exception)
        return run

    # ------------------------------------------------------------------------------ single

    async def _run_registered(
        self,
        run: RunHandle,
        req: RolloutRequest,
        *,
        adopt_env: EnvHandle | None = None,
        group_id: str | None = None,
        group_index: int | None = None,
    ) -> RolloutResponse:
        try:
            response = await self._execute(run, req, adopt_env, group_id, group_index)
        except BaseException as exc:
            message = exc.message if isinstance(exc, ServiceError) else f"{type(exc).__name__}: {exc}"
            self._finish_run(run, "failed", error=message)
            raise
        self._finish_run(run, response.status, result=response, error=response.error)
        return response

    async def _resolve_env(self, spec: RolloutEnvSpec, rl_run_id: str) -> tuple[EnvHandle, bool]:
        """The env to play and whether this rollout owns it (and must terminate it)."""
        if spec.env_id is not None:
            return _unshared(self.envs.get(spec.env_id), "env"), False
        if spec.snapshot_id is not None:
            return await self.envs.restore(spec.snapshot_id), True
        assert spec.env_name is not None
        return await self.envs.create(spec.env_name, spec.config, spec.seed, rl_run_id), True

    async def _resolve_policy(
        self, spec: RolloutPolicySpec, env: EnvHandle, rl_run_id: str
    ) -> tuple[PolicyHandle, bool]:
        if spec.policy_id is not None:
            return _unshared(self.policies.get(spec.policy_id), "policy"), False
        assert spec.policy_name is not None
        handle = await self.policies.create(spec.policy_name, spec.config, rl_run_id, bound_env_id=env.id)
        return handle, True

    async def _guarded(self, awaitable: Awaitable[T], run: RunHandle, deadline: float) -> T:
        """Await, but give up at the deadline or on abort (cancelling the awaited work)."""
        task = asyncio.ensure_future(awaitable)
        aborted = asyncio.ensure_future(run.abort.wait())
        try:
            done, _ = await asyncio.wait(
                {task, aborted},
                timeout=max(0.0, deadline - time.monotonic()),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            aborted.cancel()
        if task in done:
            return task.result()
        task.cancel()
        await asyncio.wait({task}, timeout=5.0)  # let it unwind; its outcome is discarded
        raise _Stop("aborted" if run.abort.is_set() else "time_limit")

    async def _execute(
        self,
        run: RunHandle,
        req: RolloutRequest,
        adopt_env: EnvHandle | None,
        group_id: str | None,
        group_index: int | None,
    ) -> RolloutResponse:
        started_wall, started = time.time(), time.monotonic()
        deadline = started + req.safety.max_time_s
        ops = req.op_list()
        llm_timeout = req.safety.llm_timeout_s or self.settings.inference_timeout_s
        record = req.record
        with_tokens = records_tokens(req)

        env, owns_env = (
            (adopt_env, True) if adopt_env is not None else await self._resolve_env(req.env, req.rl_run_id)
        )
        env.pins += 1  # the idle reaper must not take it while the rollout waits on the LLM
        policy: PolicyHandle | None = None
        owns_policy = False
        decisions: list[DecisionTrace] = []
        episodes: list[_Episode] = []
        stop_reason = "completed"
        error: str | None = None
        ops_executed = 0
        pending: DecisionTrace | None = None
        try:
            policy, owns_policy = await self._resolve_policy(req.policy, env, req.rl_run_id)
            policy.pins += 1
            current = env.last or await self.envs.run(env.env.observe)
            if current.done:
                if req.on_done != "reset":
                    raise Conflict(
                        f"env {env.id} has finished its episode; reset it first", code="episode_over"
                    )
                current = await self.envs.reset_handle(env)
                policy.policy.reset()
            episode = _Episode(index=0, seed=getattr(env.env, "seed", None))
            episodes.append(episode)
            for op in ops:
                if run.abort.is_set():
                    raise _Stop("aborted")
                if time.monotonic() >= deadline:
                    raise _Stop("time_limit")
                if req.safety.max_ops is not None and ops_executed >= req.safety.max_ops:
                    raise _Stop("max_ops")
                if op == "agent":
                    t0 = time.monotonic()
                    timeout = min(llm_timeout, max(0.001, deadline - t0))
                    decision = await self._guarded(
                        self.policies.step(
                            policy, current.observation, record_logprobs=with_tokens, timeout_s=timeout
                        ),
                        run,
                        deadline,
                    )
                    run.llm_s += time.monotonic() - t0
                    if decision.llm_call is not None:  # ids and logprobs stay in their own fields
                        decision.llm_call.response = compact_response(decision.llm_call.response)
                    pending = DecisionTrace(
                        turn=len(decisions), observation=current.observation, decision=decision
                    )
                    decisions.append(pending)
                    if decision.error:
                        episode.steps.append(self._step_record(pending, record, with_tokens))
                        raise _Stop(f"policy_error:{decision.error}")
                else:
                    assert pending is not None  # the request validator guarantees an agent op came first
                    t0 = time.monotonic()
                    try:
                        result = await self.envs.step_handle(env, tool_calls=pending.decision.tool_calls)
                    except PluginError as exc:
                        pending.decision.error, pending.decision.error_detail = "invalid_action", str(exc)
                        episode.steps.append(self._step_record(pending, record, with_tokens))
                        raise _Stop("policy_error:invalid_action") from None
                    pending.env_ms = (time.monotonic() - t0) * 1000
                    run.env_s += pending.env_ms / 1000
                    pending.result = result
                    policy.policy.observe_outcome(result)
                    episode.steps.append(self._step_record(pending, record, with_tokens))
                    episode.total_reward += result.reward
                    episode.achievements.extend(result.info.get("achievements_unlocked", []))
                    pending, current = None, result
                    if result.done:
                        episode.done, episode.truncated = True, result.truncated
                        episode.stop_reason = "truncated" if result.truncated else "done"
                        episode.final = self._final(result, record)
                        if req.on_done == "terminate":
                            ops_executed += 1
                            raise _Stop("episode_done")
                        current = await self.envs.reset_handle(env)
                        policy.policy.reset()
                        episode = _Episode(index=len(episodes), seed=getattr(env.env, "seed", None))
                        episodes.append(episode)
                ops_executed += 1
                run.ops_executed = ops_executed
        except _Stop as stop:
            stop_reason = stop.reason
        except NotFound:
            # A caller terminated the env or policy mid-rollout: keep what ran, say how it ended.
            ended = _terminated(env, policy)
            if ended is None:
                raise
            stop_reason = ended
            if pending is not None and pending.result is None:  # decided, never executed
                episode.steps.append(self._step_record(pending, record, with_tokens))
        except ServiceError:
            raise
        except PluginError:
            raise
        except Exception as exc:  # an unexpected fault: keep what was played, report it
            log.exception("rollout %s failed", run.id)
            stop_reason, error = "error", f"{type(exc).__name__}: {exc}"
        finally:
            run.ops_executed = ops_executed
            env.pins -= 1
            if policy is not None:
                policy.pins -= 1
            if policy is not None and owns_policy:
                await self.policies.discard(policy)
            if owns_env:
                await self.envs.discard(env)

        last_episode = episodes[-1] if episodes else None
        if last_episode is not None and last_episode.stop_reason == "running":
            last_episode.stop_reason = stop_reason
            last_episode.final = self._final(env.last, record) if env.last else None
            if not last_episode.steps and len(episodes) > 1:
                episodes.pop()  # an episode reset into and never played
        trajectories = [self._trajectory(ep, env, policy) for ep in episodes] if record.trajectories else []
        status = (
            "aborted"
            if stop_reason in ("aborted", *TERMINATED)
            else ("failed" if stop_reason == "error" else "completed")
        )
        metrics = self._metrics(episodes, decisions, run, time.monotonic() - started, with_tokens)
        response = RolloutResponse(
            run_id=run.id,
            status=status,
            trajectories=trajectories,
            metrics=metrics,
            warnings=[untrainable_warning(metrics)] if metrics.llm_calls_without_tokens else [],
            aborted=stop_reason in ("aborted", "time_limit", *TERMINATED),
            ops_executed=ops_executed,
            stop_reason=stop_reason,
            error=error,
            env_id=None if owns_env else env.id,
            policy_id=None if (owns_policy or policy is None) else policy.id,
            group_id=group_id,
            group_index=group_index,
        )
        trace = RolloutTrace(
            request=req,
            response=response,
            env_name=env.env_name,
            policy_name=policy.policy_name if policy else (req.policy.policy_name or ""),
            policy_config=_public_config(policy.policy.get_state()) if policy else {},
            seed=getattr(env.env, "seed", None),
            started_at=started_wall,
            finished_at=time.time(),
            decisions=decisions,
        )
        if record.return_trace:
            response.trace = trace.to_dict()
        if self.tracer is not None:
            self.tracer.submit(trace)
        return response

    # ------------------------------------------------------------------------------ records

    @staticmethod
    def _step_record(d: DecisionTrace, record: Any, with_tokens: bool) -> RolloutStep:
        result = d.result
        observation = None
        if record.observations:
            observation = d.observation if record.images else _strip_images(d.observation)
        return RolloutStep(
            turn=d.turn,
            observation=observation,
            tool_calls=d.decision.tool_calls,
            actions=list(result.info.get("actions", [])) if result else [],
            reward=result.reward if result else 0.0,
            done=result.done if result else False,
            truncated=result.truncated if result else False,
            info=result.info if result else {},
            step_idx=result.step_idx if result else 0,
            decision_error=d.decision.error,
            decision_error_detail=d.decision.error_detail,
            llm=llm_record(d.decision.llm_call, with_tokens),
            timing={
                "llm_ms": d.decision.llm_call.latency_ms if d.decision.llm_call else 0.0,
                "env_ms": round(d.env_ms, 3),
            },
        )

    @staticmethod
    def _final(result: StepResult, record: Any) -> dict[str, Any]:
        observation = result.observation if record.images else _strip_images(result.observation)
        return {"observation": observation, "step_idx": result.step_idx, "done": result.done}

    @staticmethod
    def _trajectory(ep: _Episode, env: EnvHandle, policy: PolicyHandle | None) -> Trajectory:
        return Trajectory(
            env_id=env.id,
            policy_id=policy.id if policy else "",
            episode=ep.index,
            seed=ep.seed,
            steps=ep.steps,
            final=ep.final,
            length=len(ep.steps),
            total_reward=round(ep.total_reward, 6),
            achievements=ep.achievements,
            done=ep.done,
            truncated=ep.truncated,
            stop_reason=ep.stop_reason,
        )

    @staticmethod
    def _metrics(
        episodes: list[_Episode],
        decisions: list[DecisionTrace],
        run: RunHandle,
        wall_s: float,
        with_tokens: bool,
    ) -> RolloutMetrics:
        returns = [round(ep.total_reward, 6) for ep in episodes]
        achievements = sorted({a for ep in episodes for a in ep.achievements})
        calls = [d.decision.llm_call for d in decisions if d.decision.llm_call is not None]
        usage = [c.usage or {} for c in calls]
        return RolloutMetrics(
            episode_returns=returns,
            mean_return=(sum(returns) / len(returns)) if returns else 0.0,
            num_steps=sum(d.result.info.get("actions_executed", 1) for d in decisions if d.result),
            num_decisions=len(decisions),
            num_episodes=len(episodes),
            achievements=achievements,
            achievements_count=len(achievements),
            llm_calls=len(calls),
            llm_time_s=round(run.llm_s, 6),
            env_time_s=round(run.env_s, 6),
            wall_time_s=round(wall_s, 6),
            prompt_tokens=sum(int(u.get("prompt_tokens") or 0) for u in usage),
            completion_tokens=sum(int(u.get("completion_tokens") or 0) for u in usage),
            llm_calls_without_tokens=sum(1 for c in calls if _untrainable(c)) if with_tokens else 0,
        )

    # ------------------------------------------------------------------------------- groups

    def _register_group(self, req: RolloutGroupRequest) -> RunHandle:
        """The group's run and its members' runs, admitted together or not at all (a group that
        took the slots its members need later would leave them half-registered for good)."""
        if req.group_size > self.settings.max_group_size:
            raise Unprocessable(  # a retry cannot succeed: not a 429
                f"group_size {req.group_size} exceeds max_group_size {self.settings.max_group_size}",
                code="group_too_large",
            )
        group_id = req.group_id or new_instance_id()
        member_ids = [f"{group_id}.{i}" for i in range(req.group_size)]
        self._admit([group_id, *member_ids])
        member_ops = len(_member_request(req, "x", None).op_list())
        run = self._add_run(group_id, "group", member_ops * req.group_size)
        run.member_ids = member_ids
        run.member_runs = [self._add_run(member_id, "rollout", member_ops) for member_id in member_ids]
        return run

    async def _run_group(self, run: RunHandle, req: RolloutGroupRequest) -> RolloutGroupResponse:
        started = time.monotonic()
        member_ids, members_runs = run.member_ids, run.member_runs
        try:
            start_envs = await self._group_start_envs(req)
        except BaseException as exc:
            message = exc.message if isinstance(exc, ServiceError) else f"{type(exc).__name__}: {exc}"
            for member in members_runs:
                self._finish_run(member, "failed", error=f"the group could not start: {message}")
            self._finish_run(run, "failed", error=message)
            raise

        async def play(i: int) -> RolloutResponse:
            member_req = _member_request(req, member_ids[i], i)
            return await self._run_registered(
                members_runs[i], member_req, adopt_env=start_envs[i], group_id=run.id, group_index=i
            )

        results = await asyncio.gather(*(play(i) for i in range(req.group_size)), return_exceptions=True)
        members: list[GroupMember] = []
        for i, result in enumerate(results):
            if isinstance(result, BaseException):
                message = (
                    result.message
                    if isinstance(result, ServiceError)
                    else f"{type(result).__name__}: {result}"
                )
                members.append(
                    GroupMember(group_index=i, run_id=member_ids[i], status="failed", error=message)
                )
            else:
                members.append(
                    GroupMember(group_index=i, run_id=member_ids[i], status=result.status, result=result)
                )
        returns = [m.result.metrics.mean_return if m.result else None for m in members]
        valid = [r for r in returns if r is not None and math.isfinite(r)]
        response = RolloutGroupResponse(
            group_id=run.id,
            members=members,
            metrics=GroupMetrics(
                returns=returns,
                mean_return=statistics.fmean(valid) if valid else None,
                std_return=statistics.pstdev(valid) if valid else None,
                completed=sum(1 for m in members if m.status == "completed"),
                failed=sum(1 for m in members if m.status == "failed"),
                wall_time_s=round(time.monotonic() - started, 6),
                llm_calls_without_tokens=sum(
                    m.result.metrics.llm_calls_without_tokens for m in members if m.result
                ),
            ),
            warnings=list(dict.fromkeys(w for m in members if m.result for w in m.result.warnings)),
        )
        self._finish_run(run, "aborted" if run.abort.is_set() else "completed", result=response)
        return response

    async def _group_start_envs(self, req: RolloutGroupRequest) -> list[EnvHandle]:
        """G identical starting envs: G resets of one seed, or G restores of one snapshot."""
        spec = req.env
        if spec.snapshot_id is not None:
            return await self.envs.restore_many(spec.snapshot_id, req.group_size)
        assert spec.env_name is not None
        return await self.envs.create_many(
            spec.env_name, spec.config, spec.seed, req.rl_run_id, req.group_size
        )


def _member_request(req: RolloutGroupRequest, run_id: str, index: int | None) -> RolloutRequest:
    config = dict(req.policy.config)
    if req.vary_policy_seed and index is not None and isinstance(config.get("seed"), int):
        config["seed"] = config["seed"] + index
    return RolloutRequest(
        run_id=run_id,
        env=RolloutEnvSpec(env_id="adopted"),
        policy=RolloutPolicySpec(policy_name=req.policy.policy_name, config=config),
        ops=req.ops,
        max_turns=req.max_turns,
        on_done=req.on_done,
        record=req.record,
        safety=req.safety,
        rl_run_id=req.rl_run_id,
        mode=req.mode,
    )


def records_tokens(req: RolloutRequest) -> bool:
    """Whether a rollout requests and keeps token ids and logprobs: as asked, else in mode "rl"."""
    return req.record.logprobs if req.record.logprobs is not None else req.mode == "rl"


def _untrainable(call: LLMCall) -> bool:
    """An answered call that came back without the token ids or logprobs a trainer needs."""
    return call.response is not None and (
        call.prompt_token_ids is None or call.completion_token_ids is None or call.completion_logprobs is None
    )


def untrainable_warning(metrics: RolloutMetrics) -> str:
    return (
        f"no_token_ids: the inference server returned no token ids or logprobs for "
        f"{metrics.llm_calls_without_tokens} of {metrics.llm_calls} LLM calls, so these steps cannot be "
        "trained on (vLLM >= 0.10.2 returns them with return_token_ids; OpenAI and Groq do not)"
    )


def _unshared(handle: H, what: str) -> H:
    """Refuse an env or policy another running rollout is playing: interleaved steps (or a shared
    policy history) would put one rollout's data into the other's trajectory."""
    if handle.pins:
        raise Conflict(f"{what} {handle.id} is in use by another running rollout", code=f"{what}_in_use")
    return handle


def _terminated(env: EnvHandle, policy: PolicyHandle | None) -> str | None:
    if env.closed:
        return "env_terminated"
    if policy is not None and policy.closed:
        return "policy_terminated"
    return None


def _public_config(state: dict[str, Any]) -> dict[str, Any]:
    config = state.get("config") if isinstance(state, dict) else None
    return {k: v for k, v in (config or {}).items() if "key" not in k.lower()}


def _consume_exception(task: asyncio.Task[Any]) -> None:
    """Background runs report through /run/status; keep asyncio from logging them as lost."""
    if not task.cancelled():
        task.exception()
