"""HTTP to the task app from the CLI: auth headers, a timeout on every call, bounded retries."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

# Statuses where the service refused the request before doing anything (so it is safe to send
# again): at capacity (429), unavailable (503). A timed-out /rollout is never re-sent: it may
# still be running on the server.
RETRY_STATUSES = frozenset({429, 503})
CONNECT_TIMEOUT_S = 10.0


class ServiceCallError(Exception):
    """A call that did not produce a 2xx response; ``cause`` is a short, countable label."""

    def __init__(self, cause: str, detail: str, status: int | None = None) -> None:
        super().__init__(f"{cause}: {detail}")
        self.cause = cause
        self.detail = detail
        self.status = status


def headers(api_key: str | None) -> dict[str, str]:
    return {"X-API-Key": api_key} if api_key else {}


def timeout(read_s: float) -> httpx.Timeout:
    return httpx.Timeout(read_s, connect=min(CONNECT_TIMEOUT_S, read_s))


def _timeout_kwargs(read_timeout_s: float | None) -> dict[str, Any]:
    return {} if read_timeout_s is None else {"timeout": timeout(read_timeout_s)}


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(body, dict):
        return str(body.get("detail") or body)[:500]
    return str(body)[:500]


def _retry_delay(response: httpx.Response | None, attempt: int) -> float:
    if response is not None:
        try:
            return min(30.0, float(response.headers.get("retry-after", "")))
        except ValueError:
            pass
    return min(8.0, 0.5 * 2**attempt)


def _check(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise ServiceCallError(f"http_{response.status_code}", _detail(response), response.status_code)
    try:
        return response.json()
    except ValueError as exc:
        raise ServiceCallError("invalid_response", f"not JSON: {exc}", response.status_code) from None


def _classify(exc: httpx.HTTPError) -> ServiceCallError:
    if isinstance(exc, httpx.TimeoutException):
        return ServiceCallError("timeout", f"{type(exc).__name__}: {exc}")
    if isinstance(exc, httpx.ConnectError):
        return ServiceCallError("connect_error", f"{exc}")
    return ServiceCallError("http_error", f"{type(exc).__name__}: {exc}")


def _retryable(exc: httpx.HTTPError | None, response: httpx.Response | None) -> bool:
    if response is not None:
        return response.status_code in RETRY_STATUSES
    return isinstance(exc, httpx.ConnectError)  # never reached the server


def _retry_in(
    attempt: int, attempts: int, error: httpx.HTTPError | None, response: httpx.Response | None
) -> float | None:
    """Seconds to wait before the next try, or None when this attempt's outcome is final."""
    if attempt + 1 < attempts and _retryable(error, response):
        return _retry_delay(response, attempt)
    return None


def _result(error: httpx.HTTPError | None, response: httpx.Response | None) -> Any:
    """The final outcome of `call`/`acall`: the parsed body, or a `ServiceCallError`."""
    if error is not None:
        raise _classify(error) from None
    assert response is not None
    return _check(response)


def call(
    client: httpx.Client,
    method: str,
    url: str,
    *,
    json: Any = None,
    attempts: int = 3,
    read_timeout_s: float | None = None,
) -> Any:
    """One request with at most ``attempts`` tries; raises `ServiceCallError`."""
    for attempt in range(attempts):
        response: httpx.Response | None = None
        error: httpx.HTTPError | None = None
        try:
            response = client.request(method, url, json=json, **_timeout_kwargs(read_timeout_s))
        except httpx.HTTPError as exc:
            error = exc
        delay = _retry_in(attempt, attempts, error, response)
        if delay is None:
            return _result(error, response)
        time.sleep(delay)
    raise AssertionError("unreachable")


async def acall(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    json: Any = None,
    attempts: int = 3,
    read_timeout_s: float | None = None,
) -> Any:
    """`call` for an async client."""
    for attempt in range(attempts):
        response: httpx.Response | None = None
        error: httpx.HTTPError | None = None
        try:
            response = await client.request(method, url, json=json, **_timeout_kwargs(read_timeout_s))
        except httpx.HTTPError as exc:
            error = exc
        delay = _retry_in(attempt, attempts, error, response)
        if delay is None:
            return _result(error, response)
        await asyncio.sleep(delay)
    raise AssertionError("unreachable")


def policy_uses_inference(info: dict[str, Any] | None, policy: str) -> bool | None:
    """From ``GET /info``: whether ``policy`` calls an LLM (``None``: unknown)."""
    for plugin in (info or {}).get("policies", []):
        if plugin.get("name") == policy:
            return bool(plugin.get("uses_inference"))
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


def rollout_failure(response: dict[str, Any]) -> tuple[str | None, str | None]:
    """``(cause, detail)`` of a returned rollout that did not complete, ``(None, None)`` if it did.

    The detail is the service's ``error`` or, for a policy error, the failing decision's
    ``decision_error_detail`` (e.g. "Cannot connect to host 127.0.0.1:9998")."""
    stop_reason = response.get("stop_reason")
    if stop_reason in NORMAL_ENDINGS and response.get("status") == "completed":
        return None, None
    detail = response.get("error")
    for trajectory in reversed(response.get("trajectories") or []):
        steps = trajectory.get("steps") or []
        if not detail and steps:
            detail = steps[-1].get("decision_error_detail")
    return str(stop_reason or response.get("status")), detail
