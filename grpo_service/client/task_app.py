"""The typed client a trainer uses to talk to the task app: `TaskAppClient` (sync) and
`AsyncTaskAppClient` (async), over the service's own request and response models.

    from grpo_service.client.task_app import TaskAppClient
    from grpo_service.models import RolloutGroupRequest

    with TaskAppClient("http://localhost:8000", api_key="...") as app:
        group = app.rollout_group(
            group_size=8, env={"env_name": "crafter", "seed": 3},
            policy={"policy_name": "crafter-react"}, max_turns=10,
        )
        returns = group.metrics.returns  # a RolloutGroupResponse

Every method takes its request as a model, or as the model's fields (keyword arguments),
validated here before anything is sent; it returns the route's response model. A call that
does not succeed raises `ServiceCallError` (``cause``: ``http_<status>``, ``timeout``,
``connect_error``, ...). 429 and 503 (the service refused before doing anything) and refused
connections are retried with backoff; a timed-out request is never sent again (a rollout may
still be running on the server). The async client has the same methods, each awaitable.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Self, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from grpo_service import models
from grpo_service.client.modal_sessions import ModalSession

M = TypeVar("M", bound=BaseModel)
Q = TypeVar("Q", bound=BaseModel)

# The service refused the request before doing anything: safe to send again.
RETRY_STATUSES = frozenset({429, 503})
CONNECT_TIMEOUT_S = 10.0
DEFAULT_TIMEOUT_S = 60.0
BLOCKING_ROUTES = frozenset({"/rollout", "/rollout/group"})


class ServiceCallError(Exception):
    """A call that did not produce a 2xx response; ``cause`` is a short, countable label."""

    def __init__(self, cause: str, detail: str, status: int | None = None) -> None:
        super().__init__(f"{cause}: {detail}")
        self.cause = cause
        self.detail = detail
        self.status = status


def headers(api_key: str | None, session: ModalSession | None = None) -> dict[str, str]:
    """The service's key, and on Modal a sticky session's token (`grpo_service.client.modal_sessions`)."""
    return {**({"X-API-Key": api_key} if api_key else {}), **(session.headers if session else {})}


def timeout(read_s: float) -> httpx.Timeout:
    return httpx.Timeout(read_s, connect=min(CONNECT_TIMEOUT_S, read_s))


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(body, dict):
        return str(body.get("detail") or body)[:500]
    return str(body)[:500]


def _outcome(error: httpx.HTTPError | None, response: httpx.Response | None) -> Any:
    """The parsed body of a final attempt, or the `ServiceCallError` it amounts to."""
    if isinstance(error, httpx.TimeoutException):
        raise ServiceCallError("timeout", f"{type(error).__name__}: {error}") from None
    if isinstance(error, httpx.ConnectError):
        raise ServiceCallError("connect_error", str(error)) from None
    if error is not None:
        raise ServiceCallError("http_error", f"{type(error).__name__}: {error}") from None
    assert response is not None
    if response.status_code >= 400:
        raise ServiceCallError(f"http_{response.status_code}", _detail(response), response.status_code)
    try:
        return response.json()
    except ValueError as exc:
        raise ServiceCallError("invalid_response", f"not JSON: {exc}", response.status_code) from None


def _retry_in(
    attempt: int, attempts: int, error: httpx.HTTPError | None, response: httpx.Response | None
) -> float | None:
    """Seconds to wait before the next try, or None when this attempt's outcome is final."""
    if attempt + 1 >= attempts:
        return None
    if response is not None:
        if response.status_code not in RETRY_STATUSES:
            return None
        try:
            return min(30.0, float(response.headers.get("retry-after", "")))
        except ValueError:
            pass
    elif not isinstance(error, httpx.ConnectError):  # it may have reached the server
        return None
    return min(8.0, 0.5 * 2**attempt)


class _Try:
    """One try of a request: ``with`` it (``async with`` on the async client) around the send.
    Entering waits the back-off before this try; leaving records a transport error."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.response: httpx.Response | None = None
        self.error: httpx.HTTPError | None = None

    def __enter__(self) -> Self:
        time.sleep(self.delay_s)
        return self

    async def __aenter__(self) -> Self:
        await asyncio.sleep(self.delay_s)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if isinstance(exc, httpx.HTTPError):
            self.error = exc
            return True
        return False

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> bool:
        return self.__exit__(kind, exc, tb)

    def outcome(self) -> Any:
        """The parsed body of a final try, or the `ServiceCallError` it amounts to."""
        return _outcome(self.error, self.response)


@dataclass(frozen=True)
class ServiceRequest:
    """One call to the service, apart from the transport that sends it (the sync and async
    clients share it, as httpx's clients share their request building): what to send, and its
    tries (`tries`; the last try's `outcome` is the answer)."""

    method: str
    url: str
    json: Any = None
    attempts: int = 3  # at least 1
    read_timeout_s: float | None = None

    def send_options(self) -> dict[str, Any]:
        """The keyword arguments of ``httpx.Client.request`` (and ``AsyncClient.request``)."""
        options: dict[str, Any] = {"method": self.method, "url": self.url}
        if self.json is not None:
            options["json"] = self.json
        if self.read_timeout_s is not None:
            options["timeout"] = timeout(self.read_timeout_s)
        return options

    def tries(self) -> Iterator[_Try]:
        """Each try in turn, the next one only while the last may be sent again (`_retry_in`)."""
        delay: float | None = 0.0
        for attempt in range(self.attempts):
            if delay is None:
                return
            last = _Try(delay)
            yield last
            delay = _retry_in(attempt, self.attempts, last.error, last.response)


def call(client: httpx.Client, request: ServiceRequest) -> Any:
    """Send ``request`` with its retries: the parsed JSON body, or `ServiceCallError`."""
    for attempt in request.tries():
        with attempt:
            attempt.response = client.request(**request.send_options())
    return attempt.outcome()


async def acall(client: httpx.AsyncClient, request: ServiceRequest) -> Any:
    """`call` for an async client."""
    for attempt in request.tries():
        async with attempt:
            attempt.response = await client.request(**request.send_options())
    return attempt.outcome()


def _parsed(model: type[M], data: Any) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ServiceCallError("invalid_response", f"not a {model.__name__}: {exc}") from None


def _body(model: type[Q], request: Q | dict[str, Any] | None, fields: dict[str, Any]) -> dict[str, Any]:
    """The JSON body of a request given as a model, a dict or keyword fields (validated here:
    ``invalid_request`` before anything is sent)."""
    if not isinstance(request, BaseModel):
        try:
            request = model.model_validate({**(request or {}), **fields})
        except ValidationError as exc:
            raise ServiceCallError("invalid_request", f"not a valid {model.__name__}: {exc}") from None
    elif fields:
        raise TypeError("give the request as a model or as keyword fields, not both")
    return request.model_dump(mode="json", exclude_unset=True)


class _Post(Generic[Q, M]):
    """A POST route as a client method: ``client.name(request)`` or ``client.name(**fields)``
    returns the response model (the async client: an awaitable of it)."""

    def __init__(self, path: str, request: type[Q], response: type[M]) -> None:
        self.path, self.request, self.response = path, request, response

    def __get__(self, client: _Routes | None, owner: type) -> Callable[..., M]:
        if client is None:
            return self  # type: ignore[return-value]
        route = self

        def send(request: Q | dict[str, Any] | None = None, /, **fields: Any) -> M:
            return client._post(route.path, route.request, request, fields, route.response)

        send.__doc__ = f"POST {self.path}: a {self.request.__name__} -> a {self.response.__name__}."
        return send


class _Routes:
    """Every route of the service, once. ``_send`` is the sync or async transport.

    ``http``: an httpx client of your own (its base URL and headers are used as they are), e.g.
    ``fastapi.testclient.TestClient(app)`` in tests; otherwise one is opened for ``base_url``.
    ``session``: a Modal sticky session; every request carries its token."""

    http_class: ClassVar[type[httpx.Client] | type[httpx.AsyncClient]]

    def __init__(
        self,
        base_url: str = "http://localhost:8000",
        api_key: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        attempts: int = 3,
        max_connections: int = 100,
        http: httpx.Client | httpx.AsyncClient | None = None,
        session: ModalSession | None = None,
    ) -> None:
        # Idle connections expire before uvicorn's 5 s idle timeout closes them under a request.
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections, keepalive_expiry=4.0
        )
        self.http = http or self.http_class(
            base_url=base_url, headers=headers(api_key, session), timeout=timeout(timeout_s), limits=limits
        )
        self.attempts, self._owns_http = attempts, http is None

    def _send(self, request: ServiceRequest, model: type[M]) -> Any:
        raise NotImplementedError

    def _get(self, path: str, model: type[M]) -> Any:
        return self._send(ServiceRequest("GET", path, attempts=self.attempts), model)

    def _post(self, path: str, kind: type[Q], request: Any, fields: dict[str, Any], model: type[M]) -> Any:
        body = _body(kind, request, fields)
        read_timeout_s = None
        if path in BLOCKING_ROUTES:  # answered when the run ends: wait up to its own time limit
            safety = models.RolloutSafetyConfig.model_validate(body.get("safety") or {})
            read_timeout_s = safety.max_time_s + 30.0
        return self._send(ServiceRequest("POST", path, body, self.attempts, read_timeout_s), model)

    def info(self) -> models.ServiceInfo:
        return self._get("/info", models.ServiceInfo)

    def health(self) -> models.Health:
        return self._get("/health", models.Health)

    create_env = _Post("/env/create", models.EnvCreateRequest, models.EnvCreateResponse)
    reset_env = _Post("/env/reset", models.EnvResetRequest, models.EnvResetResponse)
    step_env = _Post("/env/step", models.EnvStepRequest, models.EnvStepResponse)
    snapshot_env = _Post("/env/snapshot", models.EnvSnapshotRequest, models.SnapshotResponse)
    restore_env = _Post("/env/restore", models.EnvRestoreRequest, models.EnvRestoreResponse)
    terminate_env = _Post("/env/terminate", models.EnvTerminateRequest, models.TerminateResponse)

    create_policy = _Post("/policy/create", models.PolicyCreateRequest, models.PolicyCreateResponse)
    step_policy = _Post("/policy/step", models.PolicyStepRequest, models.PolicyStepResponse)
    snapshot_policy = _Post("/policy/snapshot", models.PolicySnapshotRequest, models.SnapshotResponse)
    restore_policy = _Post("/policy/restore", models.PolicyRestoreRequest, models.PolicyRestoreResponse)
    terminate_policy = _Post("/policy/terminate", models.PolicyTerminateRequest, models.TerminateResponse)

    rollout = _Post("/rollout", models.RolloutRequest, models.RolloutResponse)
    start_rollout = _Post("/rollout/start", models.RolloutRequest, models.RunStarted)
    rollout_group = _Post("/rollout/group", models.RolloutGroupRequest, models.RolloutGroupResponse)
    start_group = _Post("/rollout/group/start", models.RolloutGroupRequest, models.RunStarted)
    branch = _Post("/branch", models.BranchRequest, models.BranchResponse)
    abort = _Post("/run/abort", models.RunAbortRequest, models.RunAbortResponse)

    def run_status(self, run_id: str) -> models.RunStatusResponse:
        return self._get(f"/run/status/{run_id}", models.RunStatusResponse)

    # A stream of groups (`grpo_service.client.group_stream.GroupStreamClient` iterates one).
    open_stream = _Post("/rollout/stream", models.StreamOpenRequest, models.StreamInfo)

    def take_groups(
        self, stream_id: str, request: models.StreamTakeRequest | None = None, /, **fields: Any
    ) -> models.StreamBatch:
        body = _body(models.StreamTakeRequest, request, fields)
        wait_s = models.StreamTakeRequest.model_validate(body).wait_s
        path = f"/rollout/stream/{stream_id}/take"
        return self._send(
            ServiceRequest("POST", path, body, self.attempts, wait_s + 30.0), models.StreamBatch
        )

    def set_stream_version(self, stream_id: str, weights_version: int) -> models.StreamInfo:
        body = _body(models.StreamVersionRequest, None, {"weights_version": weights_version})
        request = ServiceRequest("POST", f"/rollout/stream/{stream_id}/version", body, self.attempts)
        return self._send(request, models.StreamInfo)

    def stream_info(self, stream_id: str) -> models.StreamInfo:
        return self._get(f"/rollout/stream/{stream_id}/status", models.StreamInfo)

    def close_stream(self, stream_id: str) -> models.StreamInfo:
        return self._send(
            ServiceRequest("DELETE", f"/rollout/stream/{stream_id}", None, self.attempts), models.StreamInfo
        )


class TaskAppClient(_Routes):
    """The sync client."""

    http_class = httpx.Client
    http: httpx.Client

    def _send(self, request: ServiceRequest, model: type[M]) -> M:
        return _parsed(model, call(self.http, request))

    def close(self) -> None:
        if self._owns_http:
            self.http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncTaskAppClient(_Routes):
    """The async client: the same methods as `TaskAppClient`, each returning an awaitable."""

    http_class = httpx.AsyncClient
    http: httpx.AsyncClient

    async def _send(self, request: ServiceRequest, model: type[M]) -> M:
        return _parsed(model, await acall(self.http, request))

    async def aclose(self) -> None:
        if self._owns_http:
            await self.http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def policy_uses_inference(info: models.ServiceInfo | None, policy: str) -> bool | None:
    """From ``GET /info``: whether ``policy`` calls an LLM (``None``: unknown)."""
    for plugin in info.policies if info is not None else []:
        if plugin.name == policy:
            return plugin.uses_inference
    return None


def build_policy_config(
    uses_inference: bool | None,
    *,
    model: str | None,
    inference_url: str | None,
    inference_api_key: str | None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The policy config for a rollout: LLM settings only for policies that call an LLM."""
    config = dict(extra or {})
    if uses_inference is False:
        return config
    for key, value in (("model", model), ("inference_url", inference_url), ("api_key", inference_api_key)):
        if value is not None:
            config[key] = value
    return config


# How a returned rollout ended: only these are a completed run. Anything else (a policy error such
# as ``policy_error:inference_connection_error``, ``time_limit``, ``aborted``, ``error``) is a
# failure, even though the service answered 200 with the partial trajectory.
NORMAL_ENDINGS = frozenset({"completed", "episode_done"})


def rollout_failure(response: models.RolloutResponse) -> tuple[str | None, str | None]:
    """``(cause, detail)`` of a returned rollout that did not complete, ``(None, None)`` if it did.

    The detail is the service's ``error`` or, for a policy error, the failing decision's
    ``decision_error_detail`` (e.g. "Cannot connect to host 127.0.0.1:9998")."""
    if response.stop_reason in NORMAL_ENDINGS and response.status == "completed":
        return None, None
    detail = response.error
    for trajectory in reversed(response.trajectories):
        if not detail and trajectory.steps:
            detail = trajectory.steps[-1].decision_error_detail
    return str(response.stop_reason or response.status), detail
