"""`GroupStream`: GRPO groups kept flowing to an asynchronous trainer, with bounded staleness.

The stream starts groups from its template through the coordinator (each a background group,
as ``/rollout/group/start`` plays it) while fewer than ``in_flight`` are started and not yet
taken; finished groups wait, in completion order, for the trainer to take them. A trainer that
stops taking stops the sampling (back-pressure), and memory is bounded by ``in_flight`` groups.

Versions. Every LLM call of a stream's group is tagged, when it returns, with the version the
stream holds then (`RunHandle.weights_version`). The trainer sends the new version once the
sampler has loaded the new weights and before it resumes generating (vLLM's ``/pause?mode=wait``
lets the calls in flight finish under the old weights first), so a call is tagged with the weights
that sampled it and a group that spans a push carries both versions, span by span. Only a call
that crossed the note is ambiguous (a reply vLLM finished just before the pause, read after the
note, is the old weights'; one queued through the pause, the new's): it carries the version at its
sending too (``weights_version_sent``), and the trainer's fidelity check, recomputing the span
under both, tells which sampled it.

Staleness. A group is stale when its oldest span is more than ``max_staleness`` versions behind
the stream's version, checked on every version update (running and finished groups) and when a
group finishes. ``drop`` discards it; ``restart`` plays its group again from its start state, ahead
of any new group, and starts no new group while a restarted one runs: the trainer then runs out
of fresh groups and stops pushing, so the restarted group finishes within the bound (a slow group
is not starved by fresh ones, the failure mode of discard-and-requeue). After ``max_restarts`` a
group is delivered as it is, flagged ``over_staleness``. Each outcome is counted.

Every wait has a deadline (``take``'s ``wait_s``); a stream whose client makes no call for
``idle_timeout_s`` closes itself and aborts its groups.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from grpo_service.core.registry import RunHandle, new_instance_id
from grpo_service.errors import CapacityExceeded, Conflict, NotFound, ServiceError
from grpo_service.models import (
    RolloutGroupResponse,
    StreamBatch,
    StreamCounters,
    StreamGroup,
    StreamInfo,
    StreamOpenRequest,
    StreamTakeRequest,
)
from grpo_service.rollout.coordinator import RolloutCoordinator
from grpo_service.rollout.run_book import error_message

log = logging.getLogger(__name__)

MAX_STREAMS = 64
RETRY_FULL_S = 1.0  # the run slots were full: try to start again after this


@dataclass(eq=False)
class _Play:
    """One run of one group of the stream (a restart is a new play of the same index)."""

    index: int
    seed: int | None
    attempt: int
    run: RunHandle | None = None
    oldest: int | None = None
    newest: int | None = None
    discarded: bool = False  # aborted as stale: its result is not delivered

    def tagger(self, stream: GroupStream) -> Any:
        def tag() -> int:
            version = stream.version
            self.oldest = version if self.oldest is None else min(self.oldest, version)
            self.newest = version if self.newest is None else max(self.newest, version)
            return version

        return tag


class GroupStream:
    def __init__(self, stream_id: str, req: StreamOpenRequest, coordinator: RolloutCoordinator) -> None:
        self.id, self.req, self.coordinator = stream_id, req, coordinator
        self.version = req.weights_version
        self.status: str = "running"
        self.error: str | None = None
        self.running: dict[int, _Play] = {}  # by id(play)
        self.ready: deque[tuple[_Play, RolloutGroupResponse]] = deque()
        self.replay: deque[_Play] = deque()  # stale groups to play again, first
        self.next_index = 0
        self.counts: Counter[str] = Counter()
        self.staleness: Counter[int] = Counter()
        self.failed_in_a_row = 0
        self.waiting = 0
        self.last_call = time.monotonic()
        self.opened_at = time.monotonic()
        self.busy_s = 0.0  # time with at least one group playing: the sampler's share of the wall
        self._busy_since: float | None = None
        self._changed = asyncio.Event()
        self._retry: asyncio.TimerHandle | None = None
        self._watchdog: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------------- the trainer's calls

    def open(self) -> None:
        """Start the first groups; a template the service refuses raises here (the open's 4xx)."""
        self._fill(raise_refusal=True)
        self._watchdog = asyncio.create_task(self._watch_idle())

    async def take(self, req: StreamTakeRequest) -> StreamBatch:
        self.last_call = time.monotonic()
        self.waiting += 1
        try:
            deadline = time.monotonic() + req.wait_s
            while not self.ready and not self.done:
                self._changed.clear()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), remaining)
        finally:
            self.waiting -= 1
            self.last_call = time.monotonic()
        groups = [self._deliver(*self.ready.popleft()) for _ in range(min(req.max_groups, len(self.ready)))]
        if self.req.max_groups is not None and self.counts["delivered"] >= self.req.max_groups:
            self._end("finished")
        self._fill()
        return StreamBatch(groups=groups, info=self.info(), done=self.done and not self.ready)

    def set_version(self, version: int) -> StreamInfo:
        self.last_call = time.monotonic()
        if version < self.version:
            raise Conflict(
                f"weights_version {version} is older than the stream's {self.version}",
                code="version_backwards",
            )
        self.version = version
        for play in list(self.running.values()):
            if self._stale(play) and not self._keeps(play):
                self._discard_running(play)
        kept: deque[tuple[_Play, RolloutGroupResponse]] = deque()
        for play, response in self.ready:
            if self._stale(play) and not self._keeps(play):
                self._on_stale(play)
            else:
                kept.append((play, response))
        self.ready = kept
        self._fill()
        return self.info()

    def close(self, status: str = "closed") -> StreamInfo:
        self._end(status)
        for play in list(self.running.values()):
            play.discarded = True
            if play.run is not None:
                self.coordinator.abort(play.run.id)
        self.running.clear()
        self._running_changed()
        self.ready.clear()
        self.replay.clear()
        if self._watchdog is not None and self._watchdog is not asyncio.current_task():
            self._watchdog.cancel()
        return self.info()

    def touch(self) -> None:
        self.last_call = time.monotonic()

    @property
    def done(self) -> bool:
        return self.status != "running"

    def info(self) -> StreamInfo:
        c = self.counts
        return StreamInfo(
            stream_id=self.id,
            status=self.status,  # type: ignore[arg-type]
            weights_version=self.version,
            in_flight=self.req.in_flight,
            max_staleness=self.req.max_staleness,
            stale_policy=self.req.stale_policy,
            counters=StreamCounters(
                started=c["started"],
                running=len(self.running),
                ready=len(self.ready),
                delivered=c["delivered"],
                dropped_stale=c["dropped_stale"],
                restarted_stale=c["restarted_stale"],
                delivered_over_staleness=c["delivered_over_staleness"],
                failed=c["failed"],
            ),
            staleness=dict(sorted(self.staleness.items())),
            busy_s=round(self._busy(), 6),
            open_s=round(time.monotonic() - self.opened_at, 6),
            error=self.error,
        )

    # ---------------------------------------------------------------------------- the machinery

    def _busy(self) -> float:
        since = self._busy_since
        return self.busy_s + (time.monotonic() - since if since is not None else 0.0)

    def _running_changed(self) -> None:
        if self.running and self._busy_since is None:
            self._busy_since = time.monotonic()
        elif not self.running and self._busy_since is not None:
            self.busy_s += time.monotonic() - self._busy_since
            self._busy_since = None

    def _outstanding(self) -> int:
        return len(self.running) + len(self.ready) + len(self.replay)

    def _fill(self, raise_refusal: bool = False) -> None:
        """Start groups while the in-flight bound, the group budget and the hold allow."""
        while not self.done and len(self.running) + len(self.ready) < self.req.in_flight:
            if self.replay:
                play = self.replay[0]
            elif any(p.attempt > 0 for p in self.running.values()):
                return  # a restarted group runs: let it finish before fresh ones
            elif (
                self.req.max_groups is not None
                and self.counts["delivered"] + self._outstanding() >= self.req.max_groups
            ):
                return
            else:
                play = self._new_play()
            if not self._start(play, raise_refusal):
                return
            if self.replay and self.replay[0] is play:
                self.replay.popleft()
            raise_refusal = False

    def _new_play(self) -> _Play:
        index = self.next_index
        env = self.req.group.env
        seeds = self.req.seeds
        if env.snapshot_id is not None:
            seed = None
        elif seeds is not None:
            seed = seeds[index % len(seeds)]
        else:
            seed = (env.seed or 0) + index
        return _Play(index=index, seed=seed, attempt=0)

    def _start(self, play: _Play, raise_refusal: bool) -> bool:
        template = self.req.group
        update: dict[str, Any] = {"group_id": new_instance_id()}
        if play.seed is not None:
            update["env"] = template.env.model_copy(update={"seed": play.seed})
        try:
            run = self.coordinator.start_group(template.model_copy(update=update))
        except CapacityExceeded:
            if raise_refusal and not self.running:
                raise
            self._retry_later()
            return False
        except ServiceError as exc:
            if raise_refusal:
                raise
            self._failed(play, exc)
            return False
        if play.attempt == 0 and play.index == self.next_index:
            self.next_index += 1
        play.run = run
        tag = play.tagger(self)
        for handle in (run, *run.member_runs):
            handle.weights_version = tag
        self.counts["started"] += 1
        self.running[id(play)] = play
        self._running_changed()
        assert run.task is not None
        run.task.add_done_callback(lambda task: self._finished(play, task))
        return True

    def _retry_later(self) -> None:
        if self._retry is None:
            loop = asyncio.get_running_loop()
            self._retry = loop.call_later(RETRY_FULL_S, self._retried)

    def _retried(self) -> None:
        self._retry = None
        self._fill()

    def _finished(self, play: _Play, task: asyncio.Task[Any]) -> None:
        self.running.pop(id(play), None)
        self._running_changed()
        if play.discarded or self.done:
            self._fill()
            return
        error = None if task.cancelled() else task.exception()
        if task.cancelled() or error is not None:
            self._failed(play, error)
            return
        body = play.run.result if play.run is not None else None  # a background run keeps JSON
        if body is None:
            self._failed(play, RuntimeError("the group's result was not kept (over the run book's bound)"))
            return
        self.failed_in_a_row = 0
        if self._stale(play) and not self._keeps(play):
            self._on_stale(play)
        else:
            self.ready.append((play, RolloutGroupResponse.model_validate_json(body)))
            self._changed.set()
        self._fill()

    def _failed(self, play: _Play, error: BaseException | None) -> None:
        self.counts["failed"] += 1
        self.failed_in_a_row += 1
        message = error_message(error) if error is not None else "cancelled"
        log.warning("stream %s: group %d failed: %s", self.id, play.index, message)
        if self.failed_in_a_row >= max(3, self.req.in_flight):
            self.error = f"{self.failed_in_a_row} group runs in a row failed; the last: {message}"
            self.close("failed")
            return
        self._fill()

    def _stale(self, play: _Play) -> bool:
        return play.oldest is not None and self.version - play.oldest > self.req.max_staleness

    def _keeps(self, play: _Play) -> bool:
        """A stale group that is kept anyway: restarted ``max_restarts`` times already."""
        return self.req.stale_policy == "restart" and play.attempt >= self.req.max_restarts

    def _discard_running(self, play: _Play) -> None:
        play.discarded = True
        self.running.pop(id(play), None)
        self._running_changed()
        if play.run is not None:
            self.coordinator.abort(play.run.id)
        self._on_stale(play)

    def _on_stale(self, play: _Play) -> None:
        if self.req.stale_policy == "drop":
            self.counts["dropped_stale"] += 1
            return
        self.counts["restarted_stale"] += 1
        self.replay.append(_Play(index=play.index, seed=play.seed, attempt=play.attempt + 1))

    def _deliver(self, play: _Play, response: RolloutGroupResponse) -> StreamGroup:
        staleness = self.version - play.oldest if play.oldest is not None else 0
        over = staleness > self.req.max_staleness
        self.counts["delivered"] += 1
        self.counts["delivered_over_staleness"] += int(over)
        self.staleness[staleness] += 1
        return StreamGroup(
            index=play.index,
            seed=play.seed,
            attempt=play.attempt,
            oldest_version=play.oldest,
            newest_version=play.newest,
            staleness=staleness,
            over_staleness=over,
            group=response,
        )

    def _end(self, status: str) -> None:
        if self.status == "running":
            self.status = status
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._changed.set()

    async def _watch_idle(self) -> None:
        idle = self.req.idle_timeout_s
        while not self.done:
            await asyncio.sleep(max(0.05, self.last_call + idle - time.monotonic()))
            if self.waiting == 0 and time.monotonic() - self.last_call >= idle:
                log.info("stream %s: no call for %.0f s; closing it", self.id, idle)
                self.close()


class GroupStreams:
    """The streams of this process, by id."""

    def __init__(self, coordinator: RolloutCoordinator, max_streams: int = MAX_STREAMS) -> None:
        self.coordinator = coordinator
        self.max_streams = max_streams
        self.streams: dict[str, GroupStream] = {}

    def open(self, req: StreamOpenRequest) -> GroupStream:
        self._forget_ended()
        if len(self.streams) >= self.max_streams:
            raise CapacityExceeded(
                f"{self.max_streams} streams at most may be open; close one (DELETE) or retry later",
                headers={"Retry-After": "1"},
            )
        stream = GroupStream(new_instance_id(), req, self.coordinator)
        stream.open()
        self.streams[stream.id] = stream
        return stream

    def get(self, stream_id: str) -> GroupStream:
        stream = self.streams.get(stream_id)
        if stream is None:
            raise NotFound(
                f"unknown stream {stream_id!r:.80}: closed, or closed after its idle timeout",
                code="stream_not_found",
            )
        stream.touch()
        return stream

    def close(self, stream_id: str) -> StreamInfo:
        stream = self.get(stream_id)
        del self.streams[stream_id]
        return stream.close()

    def close_all(self) -> None:
        for stream in self.streams.values():
            stream.close()
        self.streams.clear()

    def _forget_ended(self) -> None:
        """Streams closed by their idle timeout or failed and never asked again: forgotten."""
        for stream_id, stream in list(self.streams.items()):
            if stream.status in ("closed",) or (stream.done and time.monotonic() - stream.last_call > 600):
                del self.streams[stream_id]
