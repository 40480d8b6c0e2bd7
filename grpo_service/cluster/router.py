"""`ClusterRouter`: the front's ASGI middleware, sending each request to the Ray host(s) it concerns.

- A request naming instance-tagged ids (envs, policies, runs, training jobs) goes whole to the
  host of their tag (one actor call); ids of two hosts in one request answer 421.
- Work that names no live id is *placed*: on the least loaded host (a client-chosen ``run_id``
  always on the host its hash picks, which sees duplicates), and on the next one when a host
  answers 429 (full): capacity limits are split over the hosts and hold for the cluster.
- ``POST /rollout/group`` (and ``/start``) and ``POST /rollouts`` are spread: each host plays a
  share of the members or ids, and the front joins the answers (one call per host, not per
  rollout); ``/run/status`` joins a background group's shares.
- ``/run/status`` and ``/run/abort`` ask every host (a client's run id names no host, a spread
  group has a part on each); the listings and ``/health`` add up every host's.
- Training jobs and AgentGym's integer-id sessions live on one host (`Cluster.home`).
- The docs, ``/info`` and the trace viewer (the trace DB is on the front's node) answer here;
  OpenEnv's WebSockets end here too, their sessions on hosts (`grpo_service.protocols.openenv.links`).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from grpo_service.api.asgi import Answer, RequestArgs, call_asgi
from grpo_service.api.listing import Page, paginate
from grpo_service.cluster.cluster import Cluster, HostRef, share
from grpo_service.cluster.step_batcher import StepBatcher, batched, session_op
from grpo_service.core.registry import TAGGED_ID_PATTERN, new_id
from grpo_service.errors import HostLost, HostUnavailable, ServiceError, WrongInstance, error_body, send_error
from grpo_service.models import (
    BatchRolloutResult,
    BatchRolloutsRequest,
    BatchRolloutsResponse,
    EnvList,
    GroupMember,
    PolicyList,
    RolloutGroupRequest,
    RolloutGroupResponse,
    RunList,
    RunStarted,
)
from grpo_service.models.encoding import answer_json
from grpo_service.rollout.batch import batch_response, check_batch_turns
from grpo_service.rollout.group_answer import EncodedMember, group_response, joined_group_json

_ID_IN_BODY = re.compile(f'"{TAGGED_ID_PATTERN}"'.encode())  # a whole JSON string
_ID_IN_PATH = re.compile(f"/{TAGGED_ID_PATTERN}(?=/|$)")  # a whole path segment
_HOP_HEADERS = frozenset({b"host", b"content-length", b"connection", b"keep-alive", b"transfer-encoding"})

# Answered by the front's own app: the docs, /info and the viewer (the trace DB is on this node).
# OpenEnv's routes go to the hosts like the rest: /mcp by its session id, and the front's
# WebSockets reach their sessions through /openenv/<env>/link (`grpo_service.protocols.openenv.links`).
LOCAL_PREFIXES = ("/docs", "/redoc", "/openapi.json", "/info", "/viewer")
HOME_PREFIXES = ("/agentgym/", "/train", "/training/", "/inference", "/models")
HOME_PATHS = frozenset({"/"})  # the training API's root
LISTINGS: dict[str, tuple[str, type[BaseModel], str, str]] = {
    # path: (kind, list model, its items field, the field that orders them oldest first)
    "/env/list": ("env", EnvList, "envs", "created_at"),
    "/policy/list": ("policy", PolicyList, "policies", "created_at"),
    "/run/list": ("run", RunList, "runs", "started_at"),
}
SPREAD_PATHS = frozenset({"/rollout/group", "/rollout/group/start", "/rollouts"})
ROLLOUT_PATHS = frozenset(
    {"/rollout", "/rollout/start", "/rollout/group", "/rollout/group/start", "/rollouts"}
)


class ClusterRouter:
    def __init__(self, app: ASGIApp, cluster: Cluster, fastapi_app: Any = None) -> None:
        self.app = app
        self.cluster = cluster
        self.steps = StepBatcher(cluster)
        if fastapi_app is not None:  # the OpenEnv sockets' links send their operations here
            fastapi_app.state.internal_request = self.internal_request

    async def internal_request(
        self, method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> Answer:
        """A request of the service's own (an OpenEnv socket's link operation) routed as
        `__call__` routes a client's, without the app's middleware, which its socket passed
        when it opened: thousands of sockets send one per frame."""
        scope = {"type": "http", "method": method, "path": path, "query_string": query, "headers": headers}
        try:
            return await self._dispatch(scope, body)
        except ServiceError as exc:
            answer = _json_answer(exc.status_code, error_body(exc.code, exc.message))
            extra = [(k.lower().encode(), v.encode()) for k, v in (exc.headers or {}).items()]
            return answer[0], [*answer[1], *extra], answer[2]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path.startswith(LOCAL_PREFIXES):
            await self.app(scope, receive, send)
            return
        body, disconnected = await _read_body(receive)
        if disconnected:
            return
        try:
            answer = await self._dispatch(scope, body)
        except ServiceError as exc:
            await send_error(send, exc.status_code, exc.code, exc.message, exc.headers)
            return
        status, headers, content = answer
        headers = [(k, v) for k, v in headers if k != b"content-length"]
        headers.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    # ---------------------------------------------------------------------------- dispatch

    async def _dispatch(self, scope: Scope, body: bytes) -> Answer:
        path, method = scope["path"], scope["method"]
        await self.cluster.maybe_refresh()
        request = _Request(scope, body)
        if method == "GET" and (path == "/health" or path in LISTINGS):
            return await self._gathered(request)
        if path.startswith(HOME_PREFIXES) or path in HOME_PATHS:
            return await self._forward(self.cluster.home(), request)
        if path.startswith("/run/status/") or path == "/run/abort":
            return await self._ask_every_host(request)
        if method == "POST" and path in SPREAD_PATHS and len(self.cluster.live()) > 1:
            spread = self._batch if path == "/rollouts" else self._group
            answer = await spread(request)
            if answer is not None:
                return answer
        tags = set(_ID_IN_PATH.findall(path)) | {t.decode() for t in _ID_IN_BODY.findall(body)}
        if len(tags) > 1:
            hosts = ", ".join(sorted(tags))
            raise WrongInstance(
                f"the request names ids of several hosts ({hosts}); live objects used together "
                "must live on one host: create them together, or restore snapshots on one host",
                code="wrong_instance",
            )
        if tags:
            owner = await self.cluster.owner(tags.pop())
            if batched(method, path, body):
                return await self.steps.request(owner, request.args())
            return await self._forward(owner, request, weight=_weight(path))
        return await self._placed(request)

    async def _forward(self, host: HostRef, request: _Request, weight: int = 0) -> Answer:
        host.inflight += weight
        try:
            if session_op(request.path):
                return await self.steps.single(host, request.args())
            return await self.cluster.call(host, "request", *request.args())
        finally:
            host.inflight -= weight

    async def _placed(self, request: _Request) -> Answer:
        """On the first host with room: a 429 (that host is full) tries the next."""
        key = request.run_id()
        hosts = self.cluster.by_key(key) if key is not None else self.cluster.by_load()
        answer: Answer | None = None
        retry = request.path not in ROLLOUT_PATHS  # a rollout cut by a lost host is not replayed
        for host in hosts:
            try:
                answer = await self._forward(host, request, weight=_weight(request.path))
            except (HostUnavailable, HostLost):
                if not retry or host is hosts[-1]:
                    raise
                continue
            if answer[0] != 429:
                return answer
        assert answer is not None
        return answer

    async def _ask_every_host(self, request: _Request) -> Answer:
        """The run's answer from the hosts that know it (joined for a group spread over hosts).
        A group's members that no live host holds were lost with their host: they are reported
        `failed`, unless a host did not answer (it may hold them: 503, retry)."""
        live = self.cluster.live()
        results = await asyncio.gather(*(self._forward(h, request) for h in live), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, ServiceError):
                raise result
        answers = [r for r in results if not isinstance(r, BaseException)]
        found = [a for a in answers if a[0] != 404]
        if not found:
            return answers[0] if answers else _json_answer(404, error_body("run_not_found", "unknown run"))
        ok = [json.loads(a[2]) for a in found if a[0] == 200]
        if not ok or request.method != "GET" or ok[0]["kind"] != "group":
            return found[0]
        missing = _missing_members(ok)
        if len(ok) < 2 and not missing:  # one host holds the whole group: its answer as it is
            return found[0]
        silent = [h.tag for h, r in zip(live, results, strict=True) if isinstance(r, HostUnavailable)]
        lost = sorted(self.cluster.lost)
        if silent and missing:
            raise HostUnavailable(
                f"members of group {ok[0]['run_id']} may be on hosts that do not answer now "
                f"({', '.join(silent)}); retry later"
            )
        detail = f"host_lost: the member's Ray host is lost (lost hosts: {', '.join(lost) or 'none'})"
        return _json_answer(200, _joined_status(ok, detail))

    async def _each_host(self, call: Callable[[HostRef], Awaitable[Any]]) -> list[Any]:
        """``call`` on every live host at once; hosts that fail are left out (and marked)."""
        results = await asyncio.gather(*(call(h) for h in self.cluster.live()), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, ServiceError):
                raise result
        return [r for r in results if not isinstance(r, BaseException)]

    # ---------------------------------------------------------------- listings and /health

    async def _gathered(self, request: _Request) -> Answer:
        """The front's own answer checks the query (a 422 as embedded); the hosts' fill it."""
        local = await call_asgi(self.app, *request.args(), {"app": request.scope["app"]})
        if local[0] != 200:
            return local
        if request.path == "/health":
            health = await self._health(json.loads(local[2]))
            return _json_answer(200 if health["workers"] else 503, health)
        kind, model, field, order = LISTINGS[request.path]
        page = _page(request.query)
        parts = await self._each_host(lambda h: self.cluster.call(h, "summaries", kind, page.rl_run_id))
        items = sorted((item for part in parts for item in part), key=lambda item: item[order])
        listed = paginate(items, page, lambda item: item["rl_run_id"], lambda item: item)
        return _json_answer(
            200, model.model_validate({field: listed.pop("items"), **listed}).model_dump(mode="json")
        )

    async def _health(self, health: dict[str, Any]) -> dict[str, Any]:
        counts = await self._each_host(lambda h: self.cluster.call(h, "counts", timeout=10.0))
        for key in ("envs", "policies", "runs_active", "active_jobs", "loaded_models"):
            health[key] = sum(c[key] for c in counts)
        health["workers"] = len(counts)  # the hosts that answered
        if not counts:
            health["status"] = "unavailable"  # every call would be a 503
        health["lost_hosts"] = sorted(self.cluster.lost)
        sink = self.cluster.trace_sink
        if sink is not None:
            stats = await asyncio.wait_for(sink.stats.remote(), 10.0)
            health["tracing"] = {
                k: v for k, v in stats.items() if isinstance(v, int) and not isinstance(v, bool)
            }
        return health

    # ------------------------------------------------------------------------------ spread

    async def _group(self, request: _Request) -> Answer | None:
        """A group's members split over the hosts, one `Host.group_part` call each; started in
        the background for ``/rollout/group/start`` (``/run/status`` joins the shares)."""
        background = request.path == "/rollout/group/start"
        try:
            req = RolloutGroupRequest.model_validate_json(request.body)
        except ValidationError:
            return None  # one host answers the 422, as embedded
        hosts = self.cluster.answering()[: req.group_size]
        if len(hosts) < 2 or req.group_size > self.cluster.settings.max_group_size or req.fork is not None:
            return None  # one host answers (a fork plan's continuations fork from its members' envs)
        group_id = req.group_id or f"{hosts[0].tag}-{new_id()}"
        req = req.model_copy(update={"group_id": group_id})
        parts = _split(list(range(req.group_size)), len(hosts))
        started = time.monotonic()
        body = req.model_dump_json().encode()

        async def part(host: HostRef, members: list[int]) -> Any:
            host.inflight += len(members)
            try:
                return await self.cluster.call(host, "group_part", body, members, background)
            except ServiceError as exc:  # the host is lost: its members failed, the group goes on
                if background:  # nothing will report them: the start fails as a whole
                    return (exc.status_code, exc.code, exc.message)
                failed = [
                    GroupMember(group_index=i, run_id=f"{group_id}.{i}", status="failed", error=exc.message)
                    for i in members
                ]
                return [EncodedMember.of(member) for member in failed]
            finally:
                host.inflight -= len(members)

        tasks = [asyncio.ensure_future(part(h, m)) for h, m in zip(hosts, parts, strict=True)]
        for done in asyncio.as_completed(tasks):
            if isinstance(await done, tuple):  # a part refused: the others stop, nothing is left running
                await self._each_host(lambda h: self._forward(h, _abort(group_id)))
                break
        results = await asyncio.gather(*tasks)
        refused = [r for r in results if isinstance(r, tuple)]
        if refused:  # every part checks the same request: the first refusal is the group's
            status, code, detail = refused[0]
            return _json_answer(status, error_body(code, detail), retry=status == 429)
        if background:
            begun = RunStarted(run_id=group_id, status="running", status_url=f"/run/status/{group_id}")
            return _json_answer(202, begun.model_dump(mode="json"))
        members = sorted((m for r in results for m in r), key=lambda m: m.group_index)
        content = joined_group_json(group_id, members, time.monotonic() - started, req.group_size)
        return 200, [(b"content-type", b"application/json")], content

    async def _batch(self, request: _Request) -> Answer | None:
        """``/rollouts``: the ids split over the hosts, one ``/rollouts`` of a share each."""
        try:
            req = BatchRolloutsRequest.model_validate_json(request.body)
        except ValidationError:
            return None
        check_batch_turns(req, self.cluster.settings)  # the front joins the shares' results
        # No more hosts than the caller's concurrency: together the shares keep its bound.
        hosts = self.cluster.answering()[: min(len(req.ids), req.concurrency)]
        if len(hosts) < 2:
            return None
        chunks = _split(req.ids, len(hosts))
        started = time.monotonic()

        async def part(host: HostRef, ids: list[int]) -> Answer | list[BatchRolloutResult]:
            concurrency = share(req.concurrency, hosts.index(host), len(hosts))
            sub = req.model_copy(update={"ids": ids, "concurrency": concurrency})
            try:
                return await self._forward(host, request.with_body(sub.model_dump_json().encode()), len(ids))
            except ServiceError as exc:
                return [BatchRolloutResult(id=i, error=exc.message) for i in ids]

        answers = await asyncio.gather(*(part(h, c) for h, c in zip(hosts, chunks, strict=True)))
        results: list[BatchRolloutResult] = []
        for answer in answers:
            if isinstance(answer, list):
                results += answer
            elif answer[0] != 200:
                return answer  # every part checks the same request: the first refusal is the batch's
            else:
                results += BatchRolloutsResponse.model_validate_json(answer[2]).results
        response = batch_response(req, results, time.monotonic() - started)
        return 200, [(b"content-type", b"application/json")], answer_json(response)


class _Request:
    def __init__(self, scope: Scope, body: bytes) -> None:
        self.scope, self.body = scope, body
        self.path, self.method = scope["path"], scope["method"]
        self.query: bytes = scope.get("query_string", b"")

    def args(self) -> RequestArgs:
        headers = [(k, v) for k, v in self.scope["headers"] if k not in _HOP_HEADERS]
        return self.method, self.path, self.query, headers, self.body

    def with_body(self, body: bytes) -> _Request:
        return _Request(self.scope, body)

    def run_id(self) -> str | None:
        """The client-chosen ``run_id`` of a rollout request, if any."""
        if self.path not in ROLLOUT_PATHS or b'"run_id"' not in self.body:
            return None
        try:
            value = json.loads(self.body).get("run_id")
        except (ValueError, AttributeError, RecursionError):
            return None
        return value if isinstance(value, str) else None


def _abort(run_id: str) -> _Request:
    scope = {"path": "/run/abort", "method": "POST", "headers": [(b"content-type", b"application/json")]}
    return _Request(scope, json.dumps({"run_id": run_id}).encode())


def _weight(path: str) -> int:
    return 1 if path in ROLLOUT_PATHS else 0


def _split(items: list[Any], parts: int) -> list[list[Any]]:
    """``items`` in ``parts`` contiguous chunks of sizes as equal as possible (larger first)."""
    size, extra = divmod(len(items), parts)
    chunks, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        chunks.append(items[start:end])
        start = end
    return chunks


def _page(query: bytes) -> Page:
    """The listing's page (the front's own route has validated the query)."""
    values = {k: v[-1] for k, v in parse_qs(query.decode("latin-1")).items()}
    return Page(
        limit=int(values.get("limit", 100)),
        offset=int(values.get("offset", 0)),
        rl_run_id=values.get("rl_run_id"),
    )


def _missing_members(parts: list[dict[str, Any]]) -> list[int]:
    """The indices of a group's members that none of its answering ``parts`` holds."""
    total = max(p.get("members_total") or 0 for p in parts)
    present = {m["group_index"] for p in parts for m in (p.get("members") or [])}
    return sorted(set(range(total)) - present)


def _joined_status(parts: list[dict[str, Any]], lost_detail: str) -> dict[str, Any]:
    """``/run/status`` of a group spread over hosts: its parts' members and progress joined, and
    the members no part holds (their host is lost) reported `failed` with ``lost_detail``."""
    first = dict(parts[0])
    members = [m for p in parts for m in (p.get("members") or [])]
    missing = _missing_members(parts)
    member_ops = members[0]["ops_total"] if members else 0  # a spread group's members have equal ops
    members += [
        {
            "group_index": i,
            "run_id": f"{first['run_id']}.{i}",
            "status": "failed",
            "ops_executed": 0,
            "ops_total": member_ops,
        }
        for i in missing
    ]
    members.sort(key=lambda m: m["group_index"])
    running = any(p["status"] == "running" for p in parts)
    results = [p["result"] for p in parts if p.get("result") is not None]
    if first["kind"] == "group" and not running and len(results) == len(parts):  # all shares done
        shares = [RolloutGroupResponse.model_validate(r) for r in results]
        lost = [
            GroupMember(group_index=i, run_id=f"{first['run_id']}.{i}", status="failed", error=lost_detail)
            for i in missing
        ]
        joined = sorted([*(m for share in shares for m in share.members), *lost], key=lambda m: m.group_index)
        wall_s = max(share.metrics.wall_time_s for share in shares)
        first["result"] = group_response(first["run_id"], joined, wall_s, len(joined)).model_dump(mode="json")
    if any(p.get("result_evicted") for p in parts):  # a share's result was dropped: no whole result
        first.update(result=None, result_evicted=True)
    first.update(
        members=members,
        members_total=len(members),
        status="running" if running else first["status"],
        ops_executed=sum(p["ops_executed"] for p in parts),
        ops_total=sum(p["ops_total"] for p in parts) + member_ops * len(missing),
        finished_at=None if running else max((p["finished_at"] or 0) for p in parts),
        timings={k: round(sum(p["timings"][k] for p in parts), 6) for k in first["timings"]},
    )
    return first


def _json_answer(status: int, content: Any, *, retry: bool = False) -> Answer:
    headers = [(b"content-type", b"application/json")]
    if retry:
        headers.append((b"retry-after", b"1"))
    return status, headers, json.dumps(content).encode()


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    """The request body, and whether the client disconnected before sending all of it."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks), True
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), False
