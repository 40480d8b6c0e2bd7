"""`answer_json` writes the bytes pydantic's ``model_dump_json`` writes (orjson, or pydantic itself
when the answer holds what only pydantic writes its way). Real answers: tests/test_token_streams.py
and tests/test_rollout_tokens_default.py compare the routes' bytes with pydantic's."""

from __future__ import annotations

import datetime
from typing import Annotated, Any

import pytest
from pydantic import (
    BaseModel,
    Field,
    PlainSerializer,
    RootModel,
    SerializeAsAny,
    computed_field,
    field_serializer,
)

from grpo_service.models import (
    ForkNode,
    GroupMember,
    GroupMetrics,
    GroupTree,
    LLMCallRecord,
    LLMTokens,
    RolloutGroupResponse,
    RolloutMetrics,
    RolloutResponse,
    RolloutStep,
    StreamSpan,
    TokenStream,
    Trajectory,
)
from grpo_service.models.encoding import _plan, answer_json


def _llm(**fields: Any) -> LLMCallRecord:
    base = {"prompt_token_ids": [1, 151643], "completion_token_ids": [7], "completion_logprobs": [-0.5]}
    return LLMCallRecord.model_construct(**{"latency_ms": 1.5, "attempts": 1, **base, **fields})


def _answer(step: RolloutStep | None = None, **result: Any) -> RolloutGroupResponse:
    step = step or RolloutStep(turn=0, tool_calls=[], llm=_llm())
    stream = TokenStream(
        token_ids=[1, 2, 3],
        sampled=[0, 1, 1],
        logprobs=[0.0, -1.0, -0.25],
        spans=[StreamSpan(start=1, end=3, turn=0)],
        start_reason="start",
        end_reason="completed",
    )
    trajectory = Trajectory(
        env_id="e",
        policy_id="p",
        episode=0,
        steps=[step],
        length=1,
        total_reward=0.5,
        done=True,
        truncated=False,
        stop_reason="episode_done",
        streams=[stream],
    )
    response = RolloutResponse(
        run_id="g.0",
        status="completed",
        trajectories=[trajectory],
        metrics=RolloutMetrics(
            episode_returns=[0.5],
            mean_return=0.5,
            num_steps=1,
            num_decisions=1,
            num_episodes=1,
            achievements=["collect_wood"],
            achievements_count=1,
            llm_calls=1,
            llm_time_s=0.25,
            env_time_s=0.125,
            wall_time_s=1,
        ),
        aborted=False,
        ops_executed=2,
        stop_reason="completed",
        **result,
    )
    return RolloutGroupResponse(
        group_id="g",
        members=[GroupMember(group_index=0, run_id="g.0", status="completed", result=response)],
        metrics=GroupMetrics(
            returns=[1.0, None], mean_return=1.0, std_return=None, completed=1, failed=0, wall_time_s=2
        ),
        tree=GroupTree(
            roots=[0],
            forks=[ForkNode(parent_index=0, turn=1, children=[1])],
            turns_played=2,
            turns_shared=1,
            continuations_not_started=0,
            fork_s=0.5,
        ),
    )


CASES = {
    "plain": _answer(),
    # Built without validation: ints where pydantic writes floats.
    "ints in float fields": _answer(
        RolloutStep.model_construct(
            turn=1,
            tool_calls=[],
            reward=1,
            timing={"llm_ms": 2},
            llm=_llm(latency_ms=3, completion_logprobs=[0]),
        )
    ),
    "nulls and text": _answer(
        RolloutStep(turn=2, tool_calls=[{"id": None}], info={"text": "é\u2028\x00😀", "x": float("nan")})
    ),
    # What orjson writes differently, or not at all: pydantic writes the answer.
    "a datetime": _answer(RolloutStep(turn=0, tool_calls=[], info={"at": datetime.datetime(2026, 1, 1)})),
    "a set": _answer(RolloutStep(turn=0, tool_calls=[], info={"s": {3}})),
    "a non-string key": _answer(RolloutStep(turn=0, tool_calls=[], info={"d": {1: 2}})),
    "bytes": _answer(RolloutStep(turn=0, tool_calls=[], info={"b": b"ab"})),
    "a model in a dict": _answer(
        RolloutStep(turn=0, tool_calls=[], info={"m": StreamSpan(start=0, end=1, turn=0)})
    ),
    "a trace": _answer(trace={"turns": [{"reward": 1}], "big": 2**70}),
}


@pytest.mark.parametrize("name", CASES)
def test_the_bytes_are_pydantics(name: str) -> None:
    answer = CASES[name]
    assert answer_json(answer) == answer.model_dump_json().encode()


class Aliased(BaseModel):
    value: int = Field(default=0, serialization_alias="v")


class Computed(BaseModel):
    value: int = 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def double(self) -> int:
        return 2 * self.value


class Serialized(BaseModel):
    value: int = 0

    @field_serializer("value")
    def _as_text(self, value: int) -> str:
        return str(value)


class WithSerializer(BaseModel):
    value: Annotated[float, PlainSerializer(lambda v: round(v), return_type=int)] = 0.5


class AsAny(BaseModel):
    tokens: SerializeAsAny[LLMTokens] | None = None


class Root(RootModel[list[int]]):
    pass


class BaseTokens(BaseModel):
    tokens: LLMTokens | None = None  # a subclass's value is written with LLMTokens' fields


@pytest.mark.parametrize(
    "model",
    [
        Aliased(value=1),
        Computed(value=1),
        Serialized(value=1),
        WithSerializer(value=2.5),
        AsAny(tokens=_llm()),
        Root([1, 2]),
        BaseTokens(tokens=_llm()),
    ],
)
def test_a_model_pydantic_writes_its_own_way_is_left_to_it(model: BaseModel) -> None:
    assert _plan(type(model)) is None
    assert answer_json(model) == model.model_dump_json().encode()


@pytest.mark.parametrize(
    "cls",
    [
        RolloutGroupResponse,
        GroupMember,
        GroupMetrics,
        GroupTree,
        ForkNode,
        RolloutResponse,
        RolloutMetrics,
        Trajectory,
        RolloutStep,
        LLMCallRecord,
        TokenStream,
        StreamSpan,
    ],
)
def test_the_answers_models_take_the_fast_path(cls: type[BaseModel]) -> None:
    assert _plan(cls) is not None


@pytest.mark.parametrize("name", ["plain", "ints in float fields", "nulls and text", "a datetime", "a trace"])
def test_a_group_joined_from_encoded_shares_is_the_whole_groups_bytes(name: str) -> None:
    """A group spread over Ray hosts: each host writes its members (`EncodedMember`), the front
    joins them (`joined_group_json`); the bytes are the whole group's answer, as pydantic writes
    it, with a failed, an aborted and a warned member."""
    from grpo_service.rollout.group_answer import EncodedMember, group_response, joined_group_json

    done = CASES[name].members[0]
    assert done.result is not None
    warned = done.result.model_copy(update={"warnings": ["w1", "w2"]})
    members = [
        done.model_copy(update={"group_index": 0, "run_id": "g-1.0"}),
        GroupMember(group_index=1, run_id="g-1.1", status="failed", error="host h2 is lost"),
        done.model_copy(update={"group_index": 2, "run_id": "g-1.2", "result": warned}),
        done.model_copy(update={"group_index": 3, "run_id": "g-1.3", "status": "aborted"}),
    ]
    whole = group_response("g-1", members, 1.25, group_size=4)
    shares = [[EncodedMember.of(m) for m in members[:2]], [EncodedMember.of(m) for m in members[2:]]]
    joined = joined_group_json("g-1", [m for share in shares for m in share], 1.25, group_size=4)
    assert joined == whole.model_dump_json().encode() == answer_json(whole)
    assert (
        joined_group_json("g-2", [], 0.0, 0) == group_response("g-2", [], 0.0, 0).model_dump_json().encode()
    )
