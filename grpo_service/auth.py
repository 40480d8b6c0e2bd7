"""API-key dependency: `X-API-Key` or `Authorization: Bearer`, compared in constant time."""

from __future__ import annotations

import hmac
import ipaddress
from typing import Any

from fastapi import FastAPI, Request

from grpo_service.errors import ERROR_MEANINGS, Unauthorized
from grpo_service.models import ErrorBody


def _presented_key(request: Request) -> str | None:
    key = request.headers.get("x-api-key")
    if key:
        return key
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token:
        return token.strip()
    return None


async def require_api_key(request: Request) -> None:
    """Route dependency. A no-op when the service has no key configured."""
    expected = request.app.state.settings.environment_api_key
    if expected is None:
        return
    presented = _presented_key(request)
    # Never echo any part of either key back.
    if presented is None:
        raise Unauthorized("missing API key: send X-API-Key or Authorization: Bearer", code="missing_api_key")
    if not hmac.compare_digest(presented.encode(), expected.get_secret_value().encode()):
        raise Unauthorized("invalid API key", code="invalid_api_key")


SECURITY_SCHEMES = {
    "APIKeyHeader": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
    "BearerAuth": {"type": "http", "scheme": "bearer"},
}
OPEN_PATHS = frozenset({"/health"})  # every other operation depends on `require_api_key`


def document_security(app: FastAPI) -> None:
    """When a key is configured, declare it in the OpenAPI schema on every operation but /health
    (the dependency reads the headers itself, so FastAPI cannot infer it)."""
    build_schema = app.openapi

    def openapi() -> dict[str, Any]:
        cached = app.openapi_schema is not None
        schema = build_schema()
        if cached or app.state.settings.environment_api_key is None:
            return schema
        components = schema.setdefault("components", {})
        components["securitySchemes"] = SECURITY_SCHEMES
        components.setdefault("schemas", {}).setdefault("ErrorBody", ErrorBody.model_json_schema())
        unauthorized = {
            "description": ERROR_MEANINGS[401],
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
        }
        for path, operations in schema.get("paths", {}).items():
            if path not in OPEN_PATHS:
                for operation in operations.values():
                    operation["security"] = [{name: []} for name in SECURITY_SCHEMES]
                    operation.setdefault("responses", {})["401"] = unauthorized
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind_safety(host: str, has_key: bool, allow_insecure: bool) -> None:
    """Refuse to expose an unauthenticated service beyond this machine."""
    if has_key or allow_insecure or is_loopback(host):
        return
    raise SystemExit(
        f"refusing to serve on {host} without ENVIRONMENT_API_KEY; set a key, bind to 127.0.0.1, "
        "or pass --insecure (ALLOW_INSECURE=1) if you really mean it"
    )
