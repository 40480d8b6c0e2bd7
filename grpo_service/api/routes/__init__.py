"""HTTP routers. Thin: parse, authorize, call a service object, shape the response."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from grpo_service.api.auth import require_api_key
from grpo_service.api.limits import StrictJSONRoute


def service_router(tag: str, prefix: str = "") -> APIRouter:
    """A router of the public API: every route needs the API key and takes strict JSON bodies."""
    return APIRouter(
        prefix=prefix, tags=[tag], dependencies=[Depends(require_api_key)], route_class=StrictJSONRoute
    )
