"""``/viewer``: the trace viewer's page, its static files and the JSON it reads.

The task app serves the viewer over its own trace DB (``TRACE_DB`` / ``serve --trace``);
``grpo-service view DB`` serves the same router alone over any DB (`create_viewer_app`).
When the service has an API key, the viewer needs it too: API calls may send it as every
other route takes it (``X-API-Key`` / ``Bearer``), and a browser logs in once on the page,
which sets an HttpOnly cookie holding an HMAC of the key (never the key itself).

These routes are the page's own API and are left out of the OpenAPI schema.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response

from grpo_service.api.auth import presented_key
from grpo_service.errors import NotFound, ServiceError, Unauthorized, install_error_handlers
from grpo_service.reporting.viewer import queries as runs
from grpo_service.reporting.viewer.replay import Replay, ReplayCache

STATIC_DIR = Path(runs.__file__).resolve().parent / "static"  # the page lives beside its queries
STATIC_TYPES = {".html": "text/html", ".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml"}
COOKIE = "grpo_viewer"
PREFIX = "/viewer"


@dataclass
class ViewerSource:
    """The DB a viewer shows, the key that guards it and its replays."""

    db: Path | None
    api_key: str | None = None
    replays: ReplayCache = field(default_factory=ReplayCache)

    def session_token(self) -> str | None:
        if self.api_key is None:
            return None
        return hmac.new(self.api_key.encode(), b"grpo-service viewer session", hashlib.sha256).hexdigest()

    def allows(self, request: Request) -> bool:
        if self.api_key is None:
            return True
        presented = presented_key(request)
        if presented is not None:
            return hmac.compare_digest(presented.encode(), self.api_key.encode())
        cookie, token = request.cookies.get(COOKIE), self.session_token()
        return (
            cookie is not None and token is not None and hmac.compare_digest(cookie.encode(), token.encode())
        )


def viewer_source(request: Request) -> ViewerSource:
    """The app's `ViewerSource`; the task app's is built from its settings on first use."""
    state = request.app.state
    source = getattr(state, "viewer", None)
    if source is None:
        settings = state.settings
        key = settings.environment_api_key
        source = ViewerSource(db=settings.trace_db, api_key=key.get_secret_value() if key else None)
        state.viewer = source
    return source


def require_viewer_access(request: Request) -> ViewerSource:
    source = viewer_source(request)
    if not source.allows(request):
        raise Unauthorized(
            "the viewer needs the service's API key: log in at /viewer", code="missing_api_key"
        )
    return source


Source = Annotated[ViewerSource, Depends(require_viewer_access)]
router = APIRouter(prefix=PREFIX, include_in_schema=False, tags=["viewer"])


def _db(source: ViewerSource) -> Path:
    if source.db is None:
        raise NotFound(
            "this server does not trace rollouts, so there is nothing to view: start it with "
            "`grpo-service serve --trace traces/v3` (or TRACE_DB=FILE), or open a trace DB with "
            "`grpo-service view FILE`",
            code="tracing_off",
        )
    return source.db


# ------------------------------------------------------------------------------------ page


def _login_page(message: str | None, status: int) -> HTMLResponse:
    note = f'<p class="err">{html.escape(message)}</p>' if message else ""
    body = f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>grpo-service viewer</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{{font:15px system-ui,sans-serif;background:#f4f5f7;color:#1d2330;display:grid;place-items:center;
height:100vh;margin:0}}form{{background:#fff;padding:28px 32px;border-radius:10px;box-shadow:0 2px 12px #0002;
min-width:320px}}h1{{font-size:18px;margin:0 0 12px}}input{{width:100%;box-sizing:border-box;padding:8px;
margin:8px 0 14px;font:inherit}}button{{padding:8px 16px;font:inherit}}.err{{color:#b3261e}}</style></head>
<body><form method="post" action="{PREFIX}/login"><h1>grpo-service viewer</h1>
<p>This service has an API key (<code>ENVIRONMENT_API_KEY</code>). Enter it to view its traces.</p>{note}
<label>API key<input type="password" name="key" autocomplete="current-password" autofocus></label>
<button type="submit">Open the viewer</button></form></body></html>"""
    return HTMLResponse(body, status_code=status)


@router.get("", response_class=HTMLResponse)
@router.get("/", response_class=HTMLResponse)
def page(request: Request) -> Response:
    """The viewer (one page; the part after ``#`` says which view)."""
    if not viewer_source(request).allows(request):
        return _login_page(None, 401)
    return HTMLResponse((STATIC_DIR / "index.html").read_text(encoding="utf-8"), headers=_no_store())


@router.post("/login")
async def login(request: Request) -> Response:
    source = viewer_source(request)
    form = urllib.parse.parse_qs((await request.body()).decode("utf-8", "replace"))
    key = (form.get("key") or [""])[0]
    if source.api_key is None:
        return RedirectResponse(PREFIX, status_code=303)
    if not hmac.compare_digest(key.encode(), source.api_key.encode()):
        return _login_page("That is not the service's API key.", 401)
    response = RedirectResponse(PREFIX, status_code=303)
    response.set_cookie(
        COOKIE, source.session_token() or "", httponly=True, samesite="strict", path=PREFIX, max_age=7 * 86400
    )
    return response


@router.get("/static/{name}")
def static(name: str, _: Source) -> Response:
    path = STATIC_DIR / name
    kind = STATIC_TYPES.get(path.suffix)
    if kind is None or path.parent != STATIC_DIR or not path.is_file():
        raise NotFound(f"no viewer file {name!r}", code="unknown_file")
    return Response(path.read_bytes(), media_type=kind, headers=_no_store())


def _no_store() -> dict[str, str]:
    return {"Cache-Control": "no-cache"}


# ------------------------------------------------------------------------------------ data


@router.get("/api/summary")
def summary(source: Source) -> dict[str, Any]:
    """The DB's name and size, and what each filter can choose from."""
    db = _db(source)
    with runs.open_trace_db(db) as conn:
        return runs.facets(conn, db)


@router.get("/api/rollouts")
def rollouts(source: Source, filters: Annotated[runs.RunFilters, Query()]) -> dict[str, Any]:
    """One page of the filtered, sorted run list."""
    with runs.open_trace_db(_db(source)) as conn:
        return runs.list_runs(conn, filters)


@router.get("/api/rollouts/{session_id}")
def rollout(session_id: str, source: Source) -> dict[str, Any]:
    """A rollout's session record and a light timeline of its turns."""
    with runs.open_trace_db(_db(source), session_id=session_id) as conn:
        session = runs.session(conn, session_id)
        return {"session": session, "timeline": runs.timeline(conn, session_id)}


@router.get("/api/rollouts/{session_id}/turns")
def turns(
    session_id: str,
    source: Source,
    start: Annotated[int, Query(ge=0, le=10**9)] = 0,
    count: Annotated[int, Query(ge=1, le=runs.MAX_TURN_CHUNK)] = 50,
) -> dict[str, Any]:
    """Turns ``start`` .. ``start + count - 1`` in full."""
    with runs.open_trace_db(_db(source), session_id=session_id) as conn:
        runs.session(conn, session_id)
        return {"start": start, "turns": runs.turns(conn, session_id, start, count)}


@router.get("/api/rollouts/{session_id}/turns/{turn}/prompt")
def turn_prompt(
    session_id: str, turn: Annotated[int, PathParam(ge=0, le=10**9)], source: Source
) -> dict[str, Any]:
    """Every message the model was sent at one turn."""
    with runs.open_trace_db(_db(source), session_id=session_id) as conn:
        runs.session(conn, session_id)
        return {"turn": turn, "messages": runs.prompt(conn, session_id, turn)}


def _replay(source: ViewerSource, session_id: str) -> tuple[tuple[str, str], Replay]:
    db = _db(source)
    key = (str(db), session_id)

    def build() -> Replay:
        with runs.open_trace_db(db, session_id=session_id) as conn:
            s = runs.session(conn, session_id)
            steps = runs.replay_steps(conn, session_id)
            prefix = runs.replay_prefix(conn, session_id)
        config = s.get("env_config")
        return Replay(s["env_name"], config if isinstance(config, dict) else {}, s["seed"], steps, prefix)

    return key, source.replays.replay(key, build)


@router.get("/api/rollouts/{session_id}/replay")
def replay(session_id: str, source: Source) -> dict[str, Any]:
    """Replay the rollout through its environment: can it be drawn, and does it match the record?"""
    _, found = _replay(source, session_id)
    return found.status.to_dict()


@router.get("/api/rollouts/{session_id}/frames/{name}")
def frame(session_id: str, name: str, source: Source) -> Response:
    """``{position}.png`` or ``{position}.txt``: the replayed frame at a position."""
    stem, _, kind = name.partition(".")
    if kind not in ("png", "txt") or not stem.isdigit() or len(stem) > 9:
        raise NotFound(f"no frame {name!r}: ask for <position>.png or <position>.txt", code="unknown_frame")
    key, found = _replay(source, session_id)
    if not found.status.available:
        raise FrameUnavailable(f"no frames for this rollout: {found.status.reason}")
    position = int(stem)
    if position >= found.status.reachable:
        raise NotFound(
            f"no frame {position}: the replay reaches positions 0-{found.status.reachable - 1}",
            code="unknown_frame",
        )
    try:
        drawn = source.replays.frame(key, found, position)
    except Exception as exc:  # the env failed to replay or draw: say so, never a 500
        raise FrameUnavailable(f"cannot draw frame {position}: {type(exc).__name__}: {exc}") from None
    if kind == "png":
        if drawn is None or drawn.png is None:
            raise FrameUnavailable(f"{found.env_name} draws no image frames")
        return Response(drawn.png, media_type="image/png", headers={"Cache-Control": "private, max-age=3600"})
    if drawn is None or drawn.text is None:
        raise FrameUnavailable(f"{found.env_name} draws no text frames")
    return PlainTextResponse(drawn.text, headers={"Cache-Control": "private, max-age=3600"})


class FrameUnavailable(ServiceError, status=409, code="no_frame"):
    """The environment draws no frame of the kind asked for."""


@router.get("/api/groups/{group_id}")
def group(group_id: str, source: Source) -> dict[str, Any]:
    """A GRPO group's members side by side, with advantages and the fork turn."""
    with runs.open_trace_db(_db(source)) as conn:
        return runs.group(conn, group_id)


# ------------------------------------------------------------------------------------ standalone


def create_viewer_app(db: Path, api_key: str | None = None) -> FastAPI:
    """The viewer alone over one trace DB (``grpo-service view``)."""
    app = FastAPI(title="grpo-service viewer", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.viewer = ViewerSource(db=db, api_key=api_key)
    install_error_handlers(app)

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse(PREFIX)

    app.include_router(router)
    return app
