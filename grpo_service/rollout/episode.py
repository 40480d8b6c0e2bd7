"""`EpisodeLoop`: one rollout's ``agent``/``env`` ops on one env and one policy.

An ``agent`` op asks the policy for tool calls (under the rollout's deadline and abort), an
``env`` op executes them; a finished episode is reset (``on_done="reset"``) or ends the rollout.
A decision that cannot be played (an unparsable reply, an action the env refuses) is answered
when the policy says so (`Policy.answer_invalid`): its ``env`` op takes no env step and records
the turn as invalid, with the feedback its model sees next; otherwise it ends the rollout.
Every plug-in call goes through the managers. The loop never raises for what the trainer should
see as data: a policy error, the deadline, an abort, a caller terminating the env or policy, or
an unexpected fault end it with a ``stop_reason`` and keep what was played.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from envs.base import StepOptions, StepResult
from envs.errors import PluginError
from grpo_service.core.env_manager import EnvManager
from grpo_service.core.policy_manager import PolicyManager
from grpo_service.core.registry import EnvHandle, PolicyHandle, RunHandle
from grpo_service.errors import Conflict, NotFound, ServiceError
from grpo_service.models import RolloutRequest
from grpo_service.rollout.records import EpisodeInPlay, final_record, records_tokens, step_record
from grpo_service.tracing.traces import DecisionTrace

log = logging.getLogger(__name__)
T = TypeVar("T")


class Stop(Exception):
    """Ends the loop with ``reason`` as the rollout's stop reason."""

    def __init__(self, reason: str):
        self.reason = reason


class EpisodeLoop:
    """Plays one rollout. ``play()`` once, then ``close()`` (always: it releases the env and policy)."""

    def __init__(
        self,
        run: RunHandle,
        req: RolloutRequest,
        env: EnvHandle,
        owns_env: bool,
        envs: EnvManager,
        policies: PolicyManager,
        *,
        llm_timeout_s: float,
        deadline: float,
        policy: PolicyHandle | None = None,
        first_turn: int = 0,
        before_decision: Callable[[EpisodeLoop, int], Awaitable[None]] | None = None,
    ) -> None:
        self.run, self.req, self.env, self.owns_env = run, req, env, owns_env
        self.envs, self.policies = envs, policies
        self.llm_timeout_s, self.deadline = llm_timeout_s, deadline
        self.with_tokens = records_tokens(req)
        # An adopted policy (a fork's copy) is this rollout's to release, like an adopted env.
        self.policy: PolicyHandle | None = policy
        self.owns_policy = policy is not None
        # A fork's continuation numbers its turns on from its parent's (the turns before are the parent's).
        self.first_turn = first_turn
        # Called with each decision's turn before the policy is asked: a forking group copies the
        # env and policy there.
        self.before_decision = before_decision
        self.decisions: list[DecisionTrace] = []
        self.episodes: list[EpisodeInPlay] = []
        self.ops_executed = 0
        self.stop_reason = "completed"
        self.error: str | None = None
        self._pending: DecisionTrace | None = None  # decided, not yet executed
        self._current: StepResult | None = None
        # Done when the run is aborted: one waiter for the whole rollout, not one per decision.
        self._abort_waiter: asyncio.Future[Any] | None = None
        env.pins += 1  # the idle reaper must not take it while the rollout waits on the LLM

    async def close(self) -> None:
        self.env.pins -= 1
        if self.policy is not None:
            self.policy.pins -= 1
            if self.owns_policy:
                await self.policies.discard(self.policy)
        if self.owns_env:
            await self.envs.discard(self.env)

    @property
    def episode(self) -> EpisodeInPlay:
        return self.episodes[-1]

    async def play(self) -> None:
        """Run the ops; set ``stop_reason`` (and ``error``). Raises only for the caller's mistakes."""
        try:
            await self._start()
            for op in self.req.op_list():
                self._check_limits()
                if op == "agent":
                    await self._decide()
                else:
                    await self._act()
                self.ops_executed += 1
                self.run.ops_executed = self.ops_executed
        except Stop as stop:
            self.stop_reason = stop.reason
        except NotFound:
            # A caller terminated the env or policy mid-rollout: keep what ran, say how it ended.
            policy_closed = self.policy is not None and self.policy.closed
            ended = "env_terminated" if self.env.closed else "policy_terminated" if policy_closed else None
            if ended is None:
                raise
            self.stop_reason = ended
            if self._pending is not None and self._pending.result is None and self.episodes:
                self._record(self._pending)
        except (ServiceError, PluginError):
            raise
        except Exception as exc:  # an unexpected fault: keep what was played, report it
            log.exception("rollout %s failed", self.run.id)
            self.stop_reason, self.error = "error", f"{type(exc).__name__}: {exc}"
        finally:
            self.run.ops_executed = self.ops_executed
            if self._abort_waiter is not None:
                self._abort_waiter.cancel()
                self._abort_waiter = None

    async def _start(self) -> None:
        if self.policy is None:
            self.policy, self.owns_policy = await self._resolve_policy()
        self.policy.pins += 1
        self._current = await self.envs.current(self.env)
        if self._current.done:
            if self.req.on_done != "reset":
                raise Conflict(
                    f"env {self.env.id} has finished its episode; reset it first", code="episode_over"
                )
            await self._reset()
        self.episodes.append(EpisodeInPlay(index=0, seed=self.envs.seed(self.env)))

    async def _resolve_policy(self) -> tuple[PolicyHandle, bool]:
        """The policy to play and whether this rollout owns it (and must release it)."""
        spec = self.req.policy
        if spec.policy_id is not None:
            return unshared(self.policies.get(spec.policy_id), "policy"), False
        assert spec.policy_name is not None
        claim = self.run.claim  # the slot held for it since the rollout's admission
        created = await self.policies.create(
            spec.policy_name,
            spec.config,
            self.req.rl_run_id,
            bound_env_id=self.env.id,
            hold=claim.policies if claim is not None else None,
        )
        return created, True

    def _check_limits(self) -> None:
        if self.run.abort.is_set():
            raise Stop("aborted")
        if time.monotonic() >= self.deadline:
            raise Stop("time_limit")
        max_ops = self.req.safety.max_ops
        if max_ops is not None and self.ops_executed >= max_ops:
            raise Stop("max_ops")

    @property
    def turn(self) -> int:
        """The turn of the next decision."""
        return self.first_turn + len(self.decisions)

    async def _decide(self) -> None:
        assert self._current is not None
        if self.before_decision is not None:
            await self.before_decision(self, self.turn)
        started = time.monotonic()
        timeout = min(self.llm_timeout_s, max(0.001, self.deadline - started))
        assert self.policy is not None
        options = StepOptions(record_logprobs=self.with_tokens, timeout_s=timeout)
        clock = self.run.weights_version
        sent = clock() if clock is not None else None
        step = self.policies.step(self.policy, self._current.observation, options)
        decision = await self._guarded(step)
        self.run.llm_s += time.monotonic() - started
        call = decision.llm_call
        if call is not None and call.weights_version is None:
            call.weights_version = clock() if clock is not None else self.req.weights_version
            if sent is not None and sent != call.weights_version:
                call.weights_version_sent = sent
        self._pending = DecisionTrace(
            turn=self.turn, observation=self._current.observation, decision=decision
        )
        self.decisions.append(self._pending)
        if decision.error:
            self._invalid(self._pending)

    def _invalid(self, pending: DecisionTrace) -> None:
        """The decision cannot be played: the policy answers it (the ``env`` op then records the
        turn), or the rollout ends here."""
        assert self.policy is not None
        decision = pending.decision
        assert decision.error is not None
        pending.feedback = self.policies.answer_invalid(self.policy, decision.error, decision.error_detail)
        if pending.feedback is None:
            self._record(pending)
            raise Stop(f"policy_error:{decision.error}")

    async def _act(self) -> None:
        pending = self._pending
        assert pending is not None  # the request validator guarantees an agent op came first
        if pending.feedback is not None:  # an answered invalid turn: a round without an env step
            self._record(pending)
            self._pending = None
            return
        started = time.monotonic()
        try:
            result = await self.envs.step_handle(self.env, tool_calls=pending.decision.tool_calls)
        except PluginError as exc:
            pending.decision.error, pending.decision.error_detail = "invalid_action", str(exc)
            self._invalid(pending)
            self._record(pending)
            self._pending = None
            return
        pending.env_ms = (time.monotonic() - started) * 1000
        self.run.env_s += pending.env_ms / 1000
        pending.result = result
        self.policies.observe_outcome(self.policy, result)  # type: ignore[arg-type]
        self._record(pending)
        self.episode.total_reward += result.reward
        self.episode.achievements.extend(result.info.get("achievements_unlocked", []))
        self._pending, self._current = None, result
        if result.done:
            self._end_episode(result)
            await self._reset()
            self.episodes.append(EpisodeInPlay(index=len(self.episodes), seed=self.envs.seed(self.env)))

    def _end_episode(self, result: StepResult) -> None:
        episode = self.episode
        episode.done, episode.truncated = True, result.truncated
        episode.stop_reason = "truncated" if result.truncated else "done"
        episode.final = final_record(result, self.req.record)
        if self.req.on_done == "terminate":
            self.ops_executed += 1
            raise Stop("episode_done")

    async def _reset(self) -> None:
        assert self.policy is not None
        self._current = await self.envs.reset_handle(self.env)
        self.policies.reset(self.policy)

    def _record(self, decision: DecisionTrace) -> None:
        self.episode.steps.append(step_record(decision, self.req.record, self.with_tokens))
        stream = decision.decision.meta.get("stream")
        if isinstance(stream, dict):
            self.episode.streamed = True
            if stream.get("segment_start") not in (None, "start"):
                self.episode.segment_starts[decision.turn] = stream["segment_start"]
            self.episode.template_differs += bool(stream.get("template_differs"))

    async def _guarded(self, awaitable: Awaitable[T]) -> T:
        """Await, but give up at the deadline or on abort (cancelling the awaited work)."""
        task = asyncio.ensure_future(awaitable)
        aborted = self._abort_waiter
        if aborted is None:
            aborted = self._abort_waiter = asyncio.ensure_future(self.run.abort.wait())
        done, _ = await asyncio.wait(
            {task, aborted},
            timeout=max(0.0, self.deadline - time.monotonic()),
            return_when=asyncio.FIRST_COMPLETED,
        )
        if task in done:
            return task.result()
        task.cancel()
        await asyncio.wait({task}, timeout=5.0)  # let it unwind; its outcome is discarded
        raise Stop("aborted" if self.run.abort.is_set() else "time_limit")


H = TypeVar("H", EnvHandle, PolicyHandle)


def unshared(handle: H, what: str) -> H:
    """Refuse an env or policy another running rollout is playing: interleaved steps (or a shared
    policy history) would put one rollout's data into the other's trajectory."""
    if handle.pins:
        raise Conflict(f"{what} {handle.id} is in use by another running rollout", code=f"{what}_in_use")
    return handle
