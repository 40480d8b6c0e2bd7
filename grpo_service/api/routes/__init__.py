"""HTTP routers. Thin: parse, authorize, call a service object, shape the response."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel

from grpo_service.api.auth import require_api_key
from grpo_service.api.limits import StrictJSONRoute
from grpo_service.models.encoding import answer_json


def service_router(tag: str, prefix: str = "") -> APIRouter:
    """A router of the public API: every route needs the API key and takes strict JSON bodies."""
    return APIRouter(
        prefix=prefix, tags=[tag], dependencies=[Depends(require_api_key)], route_class=StrictJSONRoute
    )


def json_answer(answer: BaseModel) -> Response:
    """``answer`` as its route's ``response_model`` would send it, encoded by orjson (token ids and
    observations are most of a hot route's answer; `answer_json` writes pydantic's bytes)."""
    return Response(answer_json(answer), media_type="application/json")
