"""A GRPO group's answer from its members: whole (`group_response`), or joined from shares whose
members are already JSON (`EncodedMember`, `joined_group_json`).

A group spread over Ray hosts comes back in shares. Each host writes its members as JSON
(`answer_json`) and sends those bytes with the little the group's metrics read of each member;
the front joins the shares into the group's answer without parsing, copying objects between
processes or encoding the members again: the bytes are `answer_json` of `group_response` over the
same members, which are pydantic's bytes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grpo_service.models import GroupMember, GroupMetrics, RolloutGroupResponse
from grpo_service.models.encoding import answer_json


@dataclass(frozen=True, slots=True)
class MemberSummary:
    """What a group's metrics and warnings read of one member."""

    status: str
    mean_return: float | None
    llm_calls_without_tokens: int
    warnings: tuple[str, ...]

    @classmethod
    def of(cls, member: GroupMember) -> MemberSummary:
        result = member.result
        if result is None:
            return cls(member.status, None, 0, ())
        metrics = result.metrics
        return cls(
            member.status, metrics.mean_return, metrics.llm_calls_without_tokens, tuple(result.warnings)
        )


@dataclass(frozen=True, slots=True)
class EncodedMember:
    """A member as its JSON bytes, with its index and summary: a host's share of a spread group."""

    group_index: int
    summary: MemberSummary
    json: bytes

    @classmethod
    def of(cls, member: GroupMember) -> EncodedMember:
        return cls(member.group_index, MemberSummary.of(member), answer_json(member))


def _fields(members: Sequence[MemberSummary], wall_s: float, group_size: int) -> dict[str, Any]:
    """The group's `metrics` and `warnings`: the GRPO returns (of the ``group_size`` first
    members; fork continuations follow them) and their statistics."""
    returns = [m.mean_return for m in members]
    valid = [r for r in returns[:group_size] if r is not None and math.isfinite(r)]
    metrics = GroupMetrics(
        returns=returns,
        mean_return=statistics.fmean(valid) if valid else None,
        std_return=statistics.pstdev(valid) if valid else None,
        completed=sum(1 for m in members if m.status == "completed"),
        failed=sum(1 for m in members if m.status == "failed"),
        wall_time_s=round(wall_s, 6),
        llm_calls_without_tokens=sum(m.llm_calls_without_tokens for m in members),
    )
    return {"metrics": metrics, "warnings": list(dict.fromkeys(w for m in members for w in m.warnings))}


def group_response(
    group_id: str, members: list[GroupMember], wall_s: float, group_size: int, tree: Any = None
) -> RolloutGroupResponse:
    """A group's answer from its members (in index order)."""
    summaries = [MemberSummary.of(m) for m in members]
    return RolloutGroupResponse(
        group_id=group_id, members=members, tree=tree, **_fields(summaries, wall_s, group_size)
    )


def joined_group_json(group_id: str, members: list[EncodedMember], wall_s: float, group_size: int) -> bytes:
    """``answer_json(group_response(...))`` of the members ``members`` encode (in index order),
    from their bytes."""
    fields = _fields([m.summary for m in members], wall_s, group_size)
    shell = answer_json(RolloutGroupResponse(group_id=group_id, members=[], **fields))
    empty = b'"members":[]'
    at = shell.index(empty)  # the group id before it is an id: no quote in it, so this is the field
    return b"".join(
        (shell[:at], b'"members":[', b",".join(m.json for m in members), b"]", shell[at + len(empty) :])
    )
