"""``/rollout/stream``: GRPO groups kept flowing to an asynchronous trainer, with bounded staleness.

A trainer opens a stream with a group template, how many groups may be in flight and a maximum
staleness; it takes finished groups in completion order, tells the stream each new weights
version, and closes it. Each LLM call of a stream's group is tagged with the weights version the
stream held when the call returned (``steps[].llm.weights_version``), so a group that spans a
weight push carries the version of every span.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from grpo_service.models.common import Request, Seed, request_config
from grpo_service.models.group import RolloutGroupRequest, RolloutGroupResponse

MAX_STREAM_IN_FLIGHT = 256
MAX_TAKE_WAIT_S = 60.0

StalePolicy = Literal["drop", "restart"]
StreamStatus = Literal["running", "finished", "failed", "closed"]


class StreamOpenRequest(Request):
    """Open a stream of GRPO groups (`POST /rollout/stream`)."""

    model_config = request_config(
        {
            "group": {
                "group_size": 4,
                "env": {"env_name": "crafter", "seed": 0},
                "policy": {"policy_name": "crafter-react", "config": {"temperature": 1.0}},
                "max_turns": 10,
                "record": {"logprobs": True},
            },
            "seeds": [0, 1, 2, 3],
            "in_flight": 4,
            "max_staleness": 1,
            "stale_policy": "restart",
        },
        strict=True,  # numbers are numbers: `false` is not version 0
    )

    group: RolloutGroupRequest = Field(
        description="The template of every group (plain, or with a `fork` plan). Leave `group_id` and "
        "`weights_version` out: the stream names its groups and tags their calls."
    )
    seeds: list[Seed] | None = Field(
        default=None,
        min_length=1,
        max_length=100_000,
        description="Start seeds, one per group, cycled. Omitted: group i starts from `group.env.seed + i` "
        "(or from `group.env.snapshot_id` every time).",
    )
    max_groups: int | None = Field(
        default=None, ge=1, le=10_000_000, description="Groups to deliver, then the stream finishes."
    )
    in_flight: int = Field(
        default=4,
        ge=1,
        le=MAX_STREAM_IN_FLIGHT,
        description="Groups started and not yet taken (running or waiting to be taken): the stream starts "
        "a new group only below this (back-pressure: a trainer that stops taking stops the sampling).",
    )
    max_staleness: int = Field(
        default=1,
        ge=0,
        le=1_000_000,
        description="A group whose oldest sampled span is more than this many versions behind the "
        "stream's current version is stale, checked on every version update and when it is taken.",
    )
    stale_policy: StalePolicy = Field(
        default="restart",
        description="`drop`: a stale group is discarded. `restart`: it is played again from its start "
        "state (same seed or snapshot), ahead of any new group, and no new group starts while a restarted "
        "one runs, so that it can finish (no starvation). Both are counted.",
    )
    max_restarts: int = Field(
        default=2,
        ge=0,
        le=100,
        description="With `restart`: after this many restarts of one group, it is delivered as it is, "
        "marked `over_staleness` and counted, rather than restarted again.",
    )
    weights_version: int = Field(default=0, ge=0, description="The version the sampler serves now.")
    idle_timeout_s: float = Field(
        default=300.0,
        gt=0,
        le=86_400,
        description="The stream closes itself (aborting its groups) when its client has made no call on "
        "it for this long.",
    )

    @model_validator(mode="after")
    def _template(self) -> StreamOpenRequest:
        if self.group.group_id is not None:
            raise ValueError("group.group_id: the stream names its groups; leave it out")
        if self.group.weights_version is not None:
            raise ValueError("group.weights_version: give the stream's 'weights_version' instead")
        if self.seeds is not None and self.group.env.snapshot_id is not None:
            raise ValueError("seeds: a group template that starts from a snapshot takes no seeds")
        return self


class StreamTakeRequest(Request):
    """Take finished groups (`POST /rollout/stream/{stream_id}/take`)."""

    model_config = request_config({"max_groups": 4, "wait_s": 5.0}, strict=True)

    max_groups: int = Field(default=1, ge=1, le=MAX_STREAM_IN_FLIGHT, description="At most this many.")
    wait_s: float = Field(
        default=10.0,
        ge=0,
        le=MAX_TAKE_WAIT_S,
        description="Wait up to this long for the first finished group; answer with none after it.",
    )


class StreamVersionRequest(Request):
    """A new weights version (`POST /rollout/stream/{stream_id}/version`): send it once the sampler
    serves the new weights and before it resumes generating."""

    model_config = request_config({"weights_version": 1}, strict=True)

    weights_version: int = Field(ge=0, description="Must not go backwards.")


class StreamCounters(BaseModel):
    started: int = Field(description="Group runs started (restarts included).")
    running: int = Field(description="Groups playing now.")
    ready: int = Field(description="Finished groups waiting to be taken.")
    delivered: int = Field(description="Groups taken by the trainer.")
    dropped_stale: int = Field(description="Groups discarded as too stale (`drop`).")
    restarted_stale: int = Field(description="Groups played again from their start as too stale (`restart`).")
    delivered_over_staleness: int = Field(
        description="Groups delivered although too stale, after `max_restarts` restarts."
    )
    failed: int = Field(description="Group runs that failed outright (could not start, or raised).")


class StreamInfo(BaseModel):
    stream_id: str = Field(description="The stream's id.")
    status: StreamStatus = Field(
        description="`running`; `finished` (max_groups delivered); `failed` (see `error`); `closed`."
    )
    weights_version: int = Field(description="The stream's current version.")
    in_flight: int = Field(description="The in-flight bound.")
    max_staleness: int = Field(description="The staleness bound.")
    stale_policy: StalePolicy = Field(description="What happens to a stale group.")
    counters: StreamCounters = Field(description="What the stream has done.")
    staleness: dict[int, int] = Field(
        description="Delivered groups by staleness (current version at delivery − oldest span version)."
    )
    busy_s: float = Field(
        description="Seconds during which at least one of its groups was playing (the sampler busy)."
    )
    open_s: float = Field(description="Seconds since it opened.")
    error: str | None = Field(default=None, description="Why the stream failed.")


class StreamGroup(BaseModel):
    """One finished group, as taken."""

    index: int = Field(description="The group's index in the stream (its seed is `seeds[index % len]`).")
    seed: int | None = Field(description="Its start seed (null when it started from a snapshot).")
    attempt: int = Field(description="0, or how many times it was restarted as stale.")
    oldest_version: int | None = Field(description="The oldest weights version among its sampled spans.")
    newest_version: int | None = Field(description="The newest.")
    staleness: int = Field(
        description="The stream's version at delivery − `oldest_version` (0 without LLM calls)."
    )
    over_staleness: bool = Field(description="Delivered beyond `max_staleness` (after `max_restarts`).")
    group: RolloutGroupResponse = Field(description="The group as `/rollout/group` answers it.")


class StreamBatch(BaseModel):
    groups: list[StreamGroup] = Field(description="Finished groups in completion order (maybe none).")
    info: StreamInfo = Field(description="The stream after this take.")
    done: bool = Field(description="No group will come any more (finished, failed or closed).")
