"""`FastPaths`: the hottest POST routes (an env's step) answered without FastAPI's per-request
machinery, whose routing, dependency solving and validation cost about as much as the step.

The contract of a fast path: a `FastRoute` takes the request's body and returns the ASGI app that
answers it (a Starlette `Response`, the route's own bytes), or ``None`` when the body is not one it
takes as it is (not strict JSON, not the route's request model). A request it does not take goes
on to the route with its body given again, and the route answers it (FastAPI's 422) from the same
bytes. Only requests the route would take as JSON come this way: a JSON content type (or none
declared, which FastAPI reads as JSON) and the service's API key when one is set; the route
answers everything else (401, 415...). A fast path raises what its route raises (a
`ServiceError`, a `PluginError`): the app's error handlers answer them (`error_response`), so
the two paths answer alike. Add it innermost: CORS, the key gate, the body size limit and the
Ray hosts' router still see every request.

``internal`` routes are the service's own internal routes (a Ray front's socket links, on a
host): taken only from the service itself (`call_asgi`), as their route's `internal_only` would.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from grpo_service.api.asgi import INTERNAL_SCOPE_KEY
from grpo_service.api.auth import check_key
from grpo_service.config import Settings
from grpo_service.errors import Unauthorized, error_response

FastRoute = Callable[[bytes], Awaitable[Response | None]]


class FastPaths:
    """ASGI middleware: ``POST`` requests to the paths of ``routes`` answered by their fast path."""

    def __init__(
        self,
        app: ASGIApp,
        routes: dict[str, FastRoute],
        settings: Settings,
        internal: dict[str, FastRoute] | None = None,
    ) -> None:
        self.app = app
        self.routes = routes
        self.internal = internal or {}
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = None
        if scope["type"] == "http":
            route = self.routes.get(scope["path"])
            if route is None and scope.get(INTERNAL_SCOPE_KEY):
                route = self.internal.get(scope["path"])
        if route is None or scope["method"] != "POST" or not self._acceptable(scope):
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before sending its body
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            answer = await route(body)
        except Exception as exc:
            answer = error_response(exc)
            if answer is None:
                raise  # as from the route: the server's 500
        if answer is None:  # the route answers it
            await self.app(scope, _replay(body, receive), send)
            return
        await answer(scope, receive, send)

    def _acceptable(self, scope: Scope) -> bool:
        """A JSON body (or none declared, which FastAPI reads as JSON) and the key, if one is set."""
        headers = Headers(scope=scope)
        if headers.get("content-type", "application/json") != "application/json":
            return False
        expected = self.settings.environment_api_key
        if expected is not None:
            try:
                check_key(HTTPConnection(scope), expected)
            except Unauthorized:
                return False
        return True


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` with ``body`` (already read) given again first."""
    pending = True

    async def replayed() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
