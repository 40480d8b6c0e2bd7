"""Forking groups: G roots from one start, each copied mid-episode into K continuations.

A root is copied before its decision at a fork turn: the env's and the policy's live state
(``get_state``, the branch machinery's serialization, not a replay) are read at that moment and
restored K times. At fixed turns (``at_turns``, ``every``) the continuations start at once and play
beside their root; with a rule (``max_entropy``) the root's state is read before each of its
decisions, and once it has played, the continuations start from the turns the rule picks.

Member indices are fixed by the plan, so a tree is the same shape however its members interleave:
roots are 0..G-1, and the K continuations of root ``r``'s fork slot ``s`` (its s-th fork turn)
are ``G + (r·F + s)·K + k``. Every index is admitted (a run slot) before anything plays; the
continuations a root never reaches (it ended before the fork turn) are released when it ends.

Bounds: a tree has at most G·(1 + F·K) members (``max_group_size``), as many live envs and
policies at most (checked up front, 429). The rule keeps, per root, only the states a fork can
still need: the ``count`` best-ranked turns so far and the turn being decided (a state is ranked,
and dropped unless it is among the best, as soon as the decision after it has been sampled), so
a root of T turns holds ``count + 1`` states, not T.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass

from envs.base import Environment, environment_class
from grpo_service.config import Settings
from grpo_service.core.registry import EnvHandle, PolicyHandle, RunHandle
from grpo_service.errors import Unprocessable
from grpo_service.models import ForkNode, GroupMember, GroupTree, RolloutGroupRequest, RolloutResponse
from grpo_service.rollout.episode import EpisodeLoop
from grpo_service.rollout.membership import Membership
from grpo_service.rollout.player import RolloutPlayer
from grpo_service.rollout.run_book import error_message


def check_forkable(cls: type[Environment]) -> None:
    if not cls.snapshots_mid_episode:
        raise Unprocessable(
            f"environment {cls.name!r} cannot snapshot mid-episode, so a group cannot fork it; "
            "drop 'fork' to play a plain group",
            code="fork_unsupported",
        )


def admit_tree(req: RolloutGroupRequest, settings: Settings) -> None:
    """Refuse (422) a fork plan that cannot run: an env that cannot be copied mid-episode, or a
    tree larger than ``max_group_size``. The coordinator then holds an env and a policy slot for
    every member the tree may start (or answers 429)."""
    assert req.fork is not None and req.max_turns is not None
    if req.env.env_name is not None:
        check_forkable(environment_class(req.env.env_name))
    size = req.tree_size()
    if size > settings.max_group_size:
        forks = req.fork.forks_per_root(req.max_turns)
        raise Unprocessable(
            f"the fork plan makes a tree of up to {size} members (G {req.group_size} × (1 + {forks} "
            f"forks × {req.fork.continuations} continuations)); max_group_size is {settings.max_group_size}",
            code="group_too_large",
        )


@dataclass
class Capture:
    """A root's env and policy state, read before its decision at ``turn``."""

    root: int
    turn: int
    env: EnvHandle
    policy: PolicyHandle
    env_state: bytes
    policy_state: bytes


def surprisal(result: RolloutResponse | None, turn: int) -> float | None:
    """Mean -logprob of the tokens a rollout sampled at ``turn`` (None without logprobs)."""
    for trajectory in result.trajectories if result else []:
        for step in trajectory.steps:
            if step.turn == turn and step.llm is not None and step.llm.completion_logprobs:
                return mean_surprisal(step.llm.completion_logprobs)
    return None


def mean_surprisal(logprobs: list[float]) -> float:
    return -statistics.fmean(logprobs)


class BusyClock:
    """Seconds during which at least one timed block ran: concurrent forks counted once, so that
    forks per busy second is a throughput."""

    def __init__(self) -> None:
        self.busy_s = 0.0
        self._running = 0
        self._since = 0.0

    def __enter__(self) -> None:
        if self._running == 0:
            self._since = time.monotonic()
        self._running += 1

    def __exit__(self, *exc: object) -> None:
        self._running -= 1
        if self._running == 0:
            self.busy_s += time.monotonic() - self._since


class ForkingGroup:
    """Plays one forking group (its registered run and request), each member through the player."""

    def __init__(
        self, player: RolloutPlayer, run: RunHandle, req: RolloutGroupRequest, deadline: float
    ) -> None:
        assert req.fork is not None and req.max_turns is not None
        self.player, self.run, self.req, self.plan = player, run, req, req.fork
        self.deadline = deadline
        self.max_turns = req.max_turns
        self.fixed = self.plan.fixed_turns(self.max_turns)
        self.forks_per_root = self.plan.forks_per_root(self.max_turns)
        self.captures: dict[int, dict[int, Capture]] = {}
        self.ranks: dict[int, dict[int, float]] = {}  # rule: the surprisal of each held, decided turn
        self.forks: list[ForkNode] = []
        self.continuations: list[asyncio.Task[list[GroupMember]]] = []
        self.started: set[int] = set()
        self.clock = BusyClock()
        self.member_runs = list(run.member_runs)  # by index; the group's own list drops unstarted ones

    def children(self, root: int, slot: int) -> list[int]:
        k = self.plan.continuations
        first = self.req.group_size + (root * self.forks_per_root + slot) * k
        return list(range(first, first + k))

    async def play(self, start_envs: list[EnvHandle]) -> tuple[list[GroupMember], GroupTree]:
        roots = await asyncio.gather(*(self._play_root(i, env) for i, env in enumerate(start_envs)))
        # Every continuation has been started by now (a root starts its own before it returns).
        continued = [m for ms in await asyncio.gather(*self.continuations) for m in ms]
        members = sorted([*roots, *continued], key=lambda m: m.group_index)
        for fork in self.forks:
            fork.surprisal = surprisal(roots[fork.parent_index].result, fork.turn)
        played = sum(m.result.metrics.num_decisions for m in members if m.result)
        shared = sum(m.result.fork_turn or 0 for m in continued if m.result)
        tree = GroupTree(
            roots=[m.group_index for m in roots],
            forks=sorted(self.forks, key=lambda f: (f.parent_index, f.turn)),
            turns_played=played,
            turns_shared=shared,
            continuations_not_started=self.req.tree_size() - len(roots) - len(self.started),
            fork_s=round(self.clock.busy_s, 6),
        )
        return members, tree

    async def _play_root(self, index: int, env: EnvHandle) -> GroupMember:
        self.captures[index] = {}

        async def before_decision(loop: EpisodeLoop, turn: int) -> None:
            await self._before_decision(index, loop, turn)

        member = Membership(self.run.id, index, env, deadline=self.deadline, before_decision=before_decision)
        try:
            played = await self.player.play_member(self.member_runs[index], self.req, member)
            if self.fixed is None and played.result is not None and not self.run.abort.is_set():
                self._fork_by_rule(index, played.result)
        finally:
            self.captures.pop(index, None)
            self.ranks.pop(index, None)
            self._release_unstarted(index)
        return played

    async def _before_decision(self, root: int, loop: EpisodeLoop, turn: int) -> None:
        if self.fixed is not None:
            if turn in self.fixed:
                self._start(await self._capture(root, loop, turn), self.fixed.index(turn))
        elif turn >= 1:  # turn 0 is the group's common start: the roots already sample it
            self._keep_best(root, loop)
            self.captures[root][turn] = await self._capture(root, loop, turn)

    def _keep_best(self, root: int, loop: EpisodeLoop) -> None:
        """Drop the states the rule can no longer choose: the last decided turn's, unless its
        surprisal (known now that it was sampled) ranks it among the ``count`` best so far."""
        held = self.captures[root]
        decided = loop.decisions[-1] if loop.decisions else None
        if decided is None or decided.turn not in held:
            return
        call = decided.decision.llm_call
        logprobs = call.completion_logprobs if call is not None and loop.with_tokens else None
        if not logprobs:
            del held[decided.turn]  # the rule cannot rank it (no logprobs): never chosen
            return
        self.ranks.setdefault(root, {})[decided.turn] = mean_surprisal(logprobs)
        ranks = self.ranks[root]
        if len(ranks) > self.forks_per_root:  # the same order as `_fork_by_rule`: (surprisal, turn)
            worst = min(ranks, key=lambda t: (ranks[t], t))
            del ranks[worst], held[worst]

    async def _capture(self, root: int, loop: EpisodeLoop, turn: int) -> Capture:
        assert loop.policy is not None
        with self.clock:
            env_state = await self.player.envs.state_of(loop.env)
            policy_state = await self.player.policies.state_of(loop.policy)
        return Capture(root, turn, loop.env, loop.policy, env_state, policy_state)

    def _fork_by_rule(self, root: int, result: RolloutResponse) -> None:
        """``max_entropy``: fork at the ``count`` turns whose samples were least likely."""
        ranked = [(s, turn) for turn in self.captures[root] if (s := surprisal(result, turn)) is not None]
        chosen = sorted(turn for _, turn in sorted(ranked, reverse=True)[: self.forks_per_root])
        for slot, turn in enumerate(chosen):
            self._start(self.captures[root][turn], slot)

    def _start(self, capture: Capture, slot: int) -> None:
        indices = self.children(capture.root, slot)
        self.started.update(indices)
        self.forks.append(ForkNode(parent_index=capture.root, turn=capture.turn, children=indices))
        for index in indices:
            self.member_runs[index].ops_total = 2 * (self.max_turns - capture.turn)
        self.continuations.append(asyncio.create_task(self._continue(capture, indices)))

    async def _continue(self, capture: Capture, indices: list[int]) -> list[GroupMember]:
        """Copy the captured state once per continuation and play them all."""
        try:
            with self.clock:
                envs, policies = await self._copy(capture, indices)
        except Exception as exc:  # e.g. the env table filled up meanwhile: these members fail
            runs = [self.member_runs[i] for i in indices]
            for run in runs:
                self.player.runs.fail(run, exc, prefix="the fork could not be copied: ")
            return [
                GroupMember(group_index=i, run_id=r.id, status="failed", error=error_message(exc))
                for i, r in zip(indices, runs, strict=True)
            ]
        members = [
            Membership(
                self.run.id,
                index,
                env,
                policy,
                parent_index=capture.root,
                fork_turn=capture.turn,
                deadline=self.deadline,
            )
            for index, env, policy in zip(indices, envs, policies, strict=True)
        ]
        plays = (self.player.play_member(self.member_runs[m.group_index], self.req, m) for m in members)
        return list(await asyncio.gather(*plays))

    async def _copy(self, capture: Capture, indices: list[int]) -> tuple[list[EnvHandle], list[PolicyHandle]]:
        """One env and one policy per continuation, from the captured states (in the slots the tree
        holds): all, or none."""
        claim = self.run.claim
        env_hold, policy_hold = (claim.envs, claim.policies) if claim is not None else (None, None)
        envs = await self.player.envs.copies(capture.env, capture.env_state, len(indices), hold=env_hold)
        policies = self.player.policies
        try:
            offsets = [i - capture.root if self.req.vary_policy_seed else 0 for i in indices]
            payloads = [policies.with_seed(capture.policy_state, o) for o in offsets]
            bound = [e.id for e in envs]
            return envs, await policies.copies(capture.policy, payloads, bound, hold=policy_hold)
        except BaseException:
            for env in envs:
                await self.player.envs.discard(env)
            raise

    def _release_unstarted(self, root: int) -> None:
        """Give back the run slots of the continuations ``root`` will never start."""
        unstarted = {
            self.member_runs[i].id
            for slot in range(self.forks_per_root)
            for i in self.children(root, slot)
            if i not in self.started
        }
        for run_id in unstarted:
            self.player.registry.runs.pop(run_id)
        if self.run.claim is not None:  # nor their env and policy slots
            self.run.claim.envs.drop(len(unstarted))
            self.run.claim.policies.drop(len(unstarted))
        self.run.member_ids = [i for i in self.run.member_ids if i not in unstarted]
        self.run.member_runs = [r for r in self.run.member_runs if r.id not in unstarted]
