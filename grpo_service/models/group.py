"""``/rollout/group``: a GRPO group, with an optional fork plan (a tree of continuations)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

from grpo_service.models.common import MAX_TURNS, Request, RunId, request_config
from grpo_service.models.rollout import RolloutEnvSpec, RolloutPlan, RolloutPolicySpec, RolloutResponse


class ForkPlan(Request):
    """Where a group's root rollouts fork, and into how many continuations each.

    A fork at turn ``t`` copies the root's env and policy exactly as they are before its decision
    ``t`` (the branch machinery, not a replay) into ``continuations`` new members, which play on
    from there. Give exactly one of ``at_turns``, ``every`` or ``rule``."""

    model_config = request_config(
        {"every": 2, "continuations": 2},
        {"at_turns": [2, 4], "continuations": 3},
        {"rule": "max_entropy", "count": 2, "continuations": 2},
    )

    at_turns: list[Annotated[int, Field(strict=True, ge=1, le=MAX_TURNS)]] | None = Field(
        default=None, max_length=64, description="Fork at these turns (decision indices, 1 or more)."
    )
    every: int | None = Field(
        default=None, strict=True, ge=1, le=MAX_TURNS, description="Fork at turns k, 2k, 3k, ..."
    )
    rule: Literal["max_entropy"] | None = Field(
        default=None,
        description="Choose the turns after each root has played: `max_entropy` forks at the `count` "
        "turns (after the first) whose sampled tokens were least likely (highest mean -logprob, the "
        "policy's entropy estimated from its own samples; needs recorded logprobs).",
    )
    count: int = Field(default=1, strict=True, ge=1, le=64, description="With `rule`: fork turns per root.")
    continuations: int = Field(
        default=2, strict=True, ge=1, le=64, description="K: new members started at each fork."
    )

    @model_validator(mode="after")
    def _one_way(self) -> ForkPlan:
        given = [n for n in ("at_turns", "every", "rule") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError("fork: give exactly one of 'at_turns', 'every' or 'rule'")
        if self.at_turns is not None:
            if not self.at_turns:
                raise ValueError("fork.at_turns: give at least one turn")
            self.at_turns = sorted(set(self.at_turns))
        return self

    def fixed_turns(self, max_turns: int) -> list[int] | None:
        """The fork turns known before playing (those a root of ``max_turns`` can reach), or None
        when a rule chooses them after each root has played."""
        if self.at_turns is not None:
            return [t for t in self.at_turns if t < max_turns]
        if self.every is not None:
            return list(range(self.every, max_turns, self.every))
        return None

    def forks_per_root(self, max_turns: int) -> int:
        fixed = self.fixed_turns(max_turns)
        return len(fixed) if fixed is not None else min(self.count, max(0, max_turns - 1))


class RolloutGroupRequest(RolloutPlan):
    """G rollouts from the same start, each with its own policy instance and sampling."""

    model_config = request_config(
        {
            "group_size": 4,
            "env": {"env_name": "crafter", "seed": 123},
            "policy": {"policy_name": "crafter-random", "config": {"seed": 0}},
            "max_turns": 20,
        },
        {
            "group_size": 8,
            "env": {"env_name": "crafter", "seed": 123},
            "policy": {"policy_name": "crafter-react", "config": {"temperature": 1.0}},
            "max_turns": 20,
            "record": {"logprobs": True},
            "safety": {"max_time_s": 600},
        },
        {
            "group_size": 4,
            "env": {"env_name": "crafter", "seed": 123},
            "policy": {"policy_name": "crafter-random", "config": {"seed": 0}},
            "max_turns": 20,
            "fork": {"every": 5, "continuations": 2},
        },
    )

    group_id: RunId | None = Field(
        default=None, description="Generated when omitted; members are `{id}.{i}`."
    )
    group_size: int = Field(ge=1, le=1024, description="G: rollouts in the group.")
    env: RolloutEnvSpec = Field(description="The common start: `env_name` + `seed`, or `snapshot_id`.")
    policy: RolloutPolicySpec = Field(description="`policy_name` + `config`: each member gets its own.")
    on_done: Literal["reset", "terminate"] = Field(
        default="terminate", description="At the end of an episode: start the next one, or stop."
    )
    vary_policy_seed: bool = Field(
        default=True, description="Give member i the policy config seed + i (when the policy has a seed)."
    )
    fork: ForkPlan | None = Field(
        default=None,
        description="Fork each of the G roots mid-episode into continuations (a tree of rollouts; needs "
        "`max_turns` and `on_done: terminate`). Members G and up are the continuations.",
    )

    @model_validator(mode="after")
    def _sources(self) -> RolloutGroupRequest:
        if self.env.env_id is not None:
            raise ValueError(
                "env: a group starts from 'env_name' (+ seed) or 'snapshot_id', not a live env_id"
            )
        if self.policy.policy_id is not None:
            raise ValueError("policy: a group needs 'policy_name' (each member gets its own instance)")
        if self.fork is not None:
            if self.max_turns is None or self.ops is not None:
                raise ValueError("fork: a forking group takes 'max_turns', not 'ops'")
            if self.on_done != "terminate":
                raise ValueError("fork: a forking group plays one episode per member (on_done 'terminate')")
            if self.fork.rule is not None and self.record.logprobs is False:
                raise ValueError("fork.rule: max_entropy reads the sampled logprobs; keep record.logprobs on")
        return self

    def turns_at_most(self) -> int:
        """Decisions the whole group may make: every member's, a continuation's from its fork turn on."""
        per = self.turns_per_rollout()
        if self.fork is None or self.max_turns is None:
            return self.group_size * per
        fixed = self.fork.fixed_turns(self.max_turns)
        starts = fixed if fixed is not None else [1] * self.fork.forks_per_root(self.max_turns)
        continued = sum(min(per, self.max_turns - turn) for turn in starts) * self.fork.continuations
        return self.group_size * (per + continued)

    def tree_size(self) -> int:
        """Members at most: the G roots and every continuation their forks may start."""
        if self.fork is None or self.max_turns is None:
            return self.group_size
        per_root = self.fork.forks_per_root(self.max_turns) * self.fork.continuations
        return self.group_size * (1 + per_root)


class GroupMember(BaseModel):
    group_index: int = Field(description="Index in the group.")
    run_id: str = Field(description="The member's run id (`{group_id}.{index}`).")
    status: Literal["completed", "failed", "aborted"] = Field(description="How the member ended.")
    result: RolloutResponse | None = Field(
        default=None, description="Its rollout (null if it failed outright)."
    )
    error: str | None = Field(default=None, description="Why it failed outright.")


class ForkNode(BaseModel):
    """One fork of a tree: a state of a root before its decision `turn`, and the members that
    continued from it (the parent's own continuation is one more sample of that state)."""

    parent_index: int = Field(description="The member whose state was copied.")
    turn: int = Field(description="The decision index at which it was copied.")
    children: list[int] = Field(description="The continuations' member indices.")
    surprisal: float | None = Field(
        default=None,
        description="The parent's mean -logprob over the tokens it sampled at this turn (what the "
        "`max_entropy` rule ranks by; null without recorded logprobs).",
    )


class GroupTree(BaseModel):
    """The tree a forking group played: G roots from one start, forks and their continuations."""

    roots: list[int] = Field(description="The root members' indices (0..G-1).")
    forks: list[ForkNode] = Field(description="Every fork made, by parent and turn.")
    turns_played: int = Field(description="Decisions played over all members (shared prefixes once).")
    turns_shared: int = Field(
        description="Decisions the continuations did not replay because they started from a copy."
    )
    continuations_not_started: int = Field(
        description="Admitted continuations that never ran (their root ended before the fork turn)."
    )
    fork_s: float = Field(
        description="Seconds during which the group was reading or copying env and policy states for "
        "forks (forks that overlapped counted once)."
    )


class GroupMetrics(BaseModel):
    returns: list[float | None] = Field(
        description="Each member's mean return, in index order (a continuation's: from its fork turn on)."
    )
    mean_return: float | None = Field(description="Mean over members (with `fork`: over the roots).")
    std_return: float | None = Field(
        description="Population standard deviation over members (with `fork`: over the roots)."
    )
    completed: int = Field(description="Members with status `completed`.")
    failed: int = Field(description="Members with status `failed`.")
    wall_time_s: float = Field(description="Seconds for the whole group.")
    llm_calls_without_tokens: int = Field(
        default=0, description="Summed over members: LLM calls recorded without token ids or logprobs."
    )


class RolloutGroupResponse(BaseModel):
    group_id: str = Field(description="The group's id.")
    members: list[GroupMember] = Field(
        description="Always G members in index order; with `fork`, then the continuations that ran."
    )
    metrics: GroupMetrics = Field(description="Returns across the group.")
    warnings: list[str] = Field(default_factory=list, description="The members' warnings, each once.")
    tree: GroupTree | None = Field(default=None, description="With `fork`: the tree's shape.")


class RunStarted(BaseModel):
    run_id: str = Field(description="The run's (or group's) id.")
    status: Literal["running"] = Field(description="Always `running`.")
    status_url: str = Field(description="Poll it for progress and, once finished, the result.")
