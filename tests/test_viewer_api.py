"""The viewer's data routes over real trace DBs: what they show equals what the DB holds, replays
of real rollouts match their traces (and a tampered trace is caught at the right turn), and every
bad input (unknown ids, bad filters, corrupt or foreign files, no tracing, no key) is a clear 4xx."""

from __future__ import annotations

import io
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from typer.testing import CliRunner

from envs.base import ENVIRONMENTS, Environment, Frame, StepResult
from envs.crafter.env import FRAME_SIZE
from grpo_service.api.routes.viewer import create_viewer_app
from grpo_service.cli import app as cli_app
from grpo_service.core.registry import new_instance_id
from grpo_service.reporting.viewer import queries as runs
from grpo_service.tracing.reader import TraceReader
from tests.conftest import REPO, free_port
from tests.viewer_data import GROUP_SIZE, synthetic_db
from tools.server_thread import ServerThread

KEY = "sk-viewer-3f9a1c7e5d"


@pytest.fixture(scope="module")
def viewer(real_trace_db: Path) -> Iterator[httpx.Client]:
    server = ServerThread(create_viewer_app(real_trace_db), name="viewer").start()
    with httpx.Client(base_url=server.base_url + "/viewer/api", timeout=60) as client:
        yield client
    server.stop()


def _sessions(db: Path) -> list[dict[str, Any]]:
    with TraceReader(db, migrate=False) as reader:
        return reader.sessions()


def test_run_list_filters_sorts_and_pages_like_the_db(viewer: httpx.Client, real_trace_db: Path) -> None:
    sessions = _sessions(real_trace_db)
    page = viewer.get("/rollouts").json()
    assert page["total"] == len(sessions)
    newest_first = sorted(sessions, key=lambda s: s["started_at"], reverse=True)
    assert [r["session_id"] for r in page["rows"]] == [s["session_id"] for s in newest_first]

    by_reward = viewer.get("/rollouts", params={"sort": "total_reward", "order": "desc"}).json()["rows"]
    assert [r["total_reward"] for r in by_reward] == sorted(
        (s["total_reward"] for s in sessions), reverse=True
    )

    react = viewer.get("/rollouts", params={"policy": "crafter-react"}).json()
    assert react["total"] == sum(s["policy_name"] == "crafter-react" for s in sessions) == 3
    errors = viewer.get("/rollouts", params={"stop_reason": "policy_error:*"}).json()
    assert [r["run_id"] for r in errors["rows"]] == ["viewer-policy-error"]

    achievement = next(a for s in sessions for a in s["achievements"])
    having = viewer.get("/rollouts", params={"achievement": achievement}).json()
    assert having["total"] == sum(achievement in s["achievements"] for s in sessions) >= 1
    rich = viewer.get("/rollouts", params={"min_reward": 1.5}).json()
    assert {r["session_id"] for r in rich["rows"]} == {
        s["session_id"] for s in sessions if s["total_reward"] >= 1.5
    }

    pages = [viewer.get("/rollouts", params={"per_page": 3, "page": p}).json() for p in (1, 2, 3)]
    assert pages[0]["pages"] == 3
    ids = [r["session_id"] for p in pages for r in p["rows"]]
    assert ids == [s["session_id"] for s in newest_first]

    day = time.strftime("%Y-%m-%d", time.gmtime(sessions[0]["started_at"]))
    assert viewer.get("/rollouts", params={"since": day, "until": day}).json()["total"] == len(sessions)
    assert viewer.get("/rollouts", params={"since": "2099-01-01"}).json()["total"] == 0

    facets = viewer.get("/summary").json()
    assert facets["sessions"] == len(sessions)
    assert {f["value"] for f in facets["policy"]} == {s["policy_name"] for s in sessions}


def test_rollout_detail_and_turns_are_the_db_s(viewer: httpx.Client, real_trace_db: Path) -> None:
    with TraceReader(real_trace_db, migrate=False) as reader:
        (sid,) = reader.session_ids("viewer-llm-1")
        recorded = reader.turns(sid)
        session = reader.session(sid)
    detail = viewer.get(f"/rollouts/{sid}").json()
    assert detail["session"]["total_reward"] == session["total_reward"]
    assert [t["env"]["reward"] for t in detail["timeline"]] == [t["env"]["reward"] for t in recorded]
    assert detail["timeline"][0]["vitals"] == recorded[0]["observation"]["status"]

    turns = viewer.get(f"/rollouts/{sid}/turns", params={"start": 2, "count": 3}).json()["turns"]
    assert [t["turn"] for t in turns] == [2, 3, 4]
    for shown, db_turn in zip(turns, recorded[2:5], strict=True):
        assert shown["observation"] == db_turn["observation"]
        assert shown["prompt_last"] == db_turn["prompt"][-1]  # the user message the model was shown
        assert shown["reply"] == db_turn["completion"]
        assert shown["tool_calls"] == db_turn["tool_calls"]
        assert shown["llm"]["latency_ms"] == db_turn["llm"]["latency_ms"]
        assert shown["env"]["env_ms"] == db_turn["env"]["env_ms"]
    prompt = viewer.get(f"/rollouts/{sid}/turns/3/prompt").json()["messages"]
    assert prompt == recorded[3]["prompt"]


def test_every_real_rollout_replays_exactly_with_frames(viewer: httpx.Client, real_trace_db: Path) -> None:
    for s in _sessions(real_trace_db):
        status = viewer.get(f"/rollouts/{s['session_id']}/replay").json()
        assert status["available"] and status["divergence"] is None, (s["run_id"], status)
        assert status["checked"] == s["num_turns"] and status["frame_png"]
    sid = next(s["session_id"] for s in _sessions(real_trace_db) if s["run_id"] == "viewer-heuristic")
    last = viewer.get(f"/rollouts/{sid}/replay").json()["positions"] - 1
    frames = []
    for position in (last, 0, 17, 18, last):  # a jump back replays from a checkpoint
        r = viewer.get(f"/rollouts/{sid}/frames/{position}.png")
        assert r.status_code == 200 and r.headers["content-type"] == "image/png"
        image = Image.open(io.BytesIO(r.content))
        assert image.size == (FRAME_SIZE, FRAME_SIZE)
        frames.append(r.content)
    assert frames[0] == frames[-1] and frames[1] != frames[2]
    assert viewer.get(f"/rollouts/{sid}/frames/{last + 1}.png").status_code == 404
    assert (
        viewer.get(f"/rollouts/{sid}/frames/0.txt").json()["code"] == "no_frame"
    )  # Crafter has no text frame


def test_a_tampered_or_foreign_trace_is_reported_as_diverging(real_trace_db: Path, tmp_path: Path) -> None:
    db = tmp_path / "tampered.db"
    shutil.copy(real_trace_db, db)
    with TraceReader(db, migrate=False) as reader:
        (sid,) = reader.session_ids("viewer-heuristic")
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE turns SET observation = json_set(observation, '$.status.food', 1) "
            "WHERE session_id = ? AND turn = 7",
            (sid,),
        )
    synthetic = synthetic_db(tmp_path / "synthetic.db", 2)
    server = ServerThread(create_viewer_app(db), name="viewer-tampered").start()
    other = ServerThread(create_viewer_app(synthetic), name="viewer-synthetic").start()
    try:
        status = httpx.get(f"{server.base_url}/viewer/api/rollouts/{sid}/replay", timeout=60).json()
        assert status["divergence"]["turn"] == 7 and status["divergence"]["fields"] == ["status"]
        # Synthetic observations were never played: the very first one differs from a real reset.
        rows = httpx.get(f"{other.base_url}/viewer/api/rollouts", timeout=60).json()["rows"]
        status = httpx.get(
            f"{other.base_url}/viewer/api/rollouts/{rows[0]['session_id']}/replay", timeout=60
        ).json()
        assert status["divergence"]["turn"] == 0 and "snapshot" in status["divergence"]["detail"]
    finally:
        server.stop()
        other.stop()


def test_group_view_has_every_member_advantages_and_the_fork(
    viewer: httpx.Client, real_trace_db: Path
) -> None:
    group = viewer.get("/groups/viewer-group").json()
    members = group["members"]
    assert [m["group_index"] for m in members] == list(range(GROUP_SIZE))
    returns = [m["total_reward"] for m in members]
    mean = sum(returns) / len(returns)
    std = (sum((r - mean) ** 2 for r in returns) / len(returns)) ** 0.5
    for m in members:
        assert m["advantage"] == pytest.approx((m["total_reward"] - mean) / (std + 1e-6))
    assert group["start_step"] == 0  # all from a reset of the seed
    # A member's request names an adopted env: the trace records the config the env was built with.
    configs = [s["env_config"] for s in _sessions(real_trace_db) if s["group_id"] == "viewer-group"]
    assert configs == [{"max_steps": 10_000, "image": False}] * GROUP_SIZE
    with sqlite3.connect(real_trace_db) as conn:
        actions = [
            [
                r[0]
                for r in conn.execute(
                    "SELECT actions FROM env_steps WHERE session_id = ? ORDER BY turn", (sid,)
                )
            ]
            for sid in (m["session_id"] for m in members)
        ]
    fork = group["fork_turn"]
    assert all(a[:fork] == actions[0][:fork] for a in actions)
    assert len({tuple(a[fork : fork + 1]) for a in actions}) > 1


BAD_REQUESTS = [
    ("/rollouts/no-such-session", 404, "unknown_rollout"),
    ("/rollouts/no-such-session/replay", 404, "unknown_rollout"),
    ("/rollouts/no-such-session/frames/0.png", 404, "unknown_rollout"),
    ("/rollouts/no-such-session/turns", 404, "unknown_rollout"),
    ("/groups/no-such-group", 404, "unknown_group"),
    ("/rollouts?per_page=0", 422, "invalid_request"),
    ("/rollouts?sort=password", 422, "invalid_request"),
    ("/rollouts?since=yesterday", 422, "invalid_request"),
    ("/rollouts?min_reward=nan", 422, "invalid_request"),
    ("/rollouts?page=-1", 422, "invalid_request"),
    ("/rollouts?bogus=1", 422, "invalid_request"),
]


@pytest.mark.parametrize(("path", "status", "code"), BAD_REQUESTS)
def test_bad_requests_are_clear_4xx(viewer: httpx.Client, path: str, status: int, code: str) -> None:
    r = viewer.get(path)
    assert (r.status_code, r.json()["code"]) == (status, code), r.text


def test_frame_names_out_of_range_and_odd(viewer: httpx.Client, real_trace_db: Path) -> None:
    sid = _sessions(real_trace_db)[0]["session_id"]
    for name in ("x.png", "1.gif", "-1.png", "99999999999.png", "1.png.png"):
        r = viewer.get(f"/rollouts/{sid}/frames/{name}")
        assert r.status_code == 404 and r.json()["code"] == "unknown_frame", name


def test_corrupt_foreign_and_missing_files_are_4xx_and_left_untouched(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 40)
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE people (name TEXT)")
    foreign_bytes = foreign.read_bytes()
    text = tmp_path / "notes.db"
    text.write_text("not a database at all\n" * 100)
    cases = {corrupt: "not_a_trace_db", foreign: "not_a_trace_db", text: "not_a_trace_db"}
    cases[tmp_path / "missing.db"] = "no_trace_db"
    for path, code in cases.items():
        server = ServerThread(create_viewer_app(path), name="viewer-bad").start()
        try:
            for route in ("/summary", "/rollouts", "/rollouts/x", "/rollouts/x/replay", "/groups/g"):
                r = httpx.get(f"{server.base_url}/viewer/api{route}", timeout=30)
                assert 400 <= r.status_code < 500 and r.json()["code"] == code, (path.name, route, r.text)
            page = httpx.get(f"{server.base_url}/viewer", timeout=30)
            assert page.status_code == 200  # the page loads and shows the API's message
        finally:
            server.stop()
    assert foreign.read_bytes() == foreign_bytes  # never migrated or written


def test_task_app_viewer_needs_the_key_and_says_when_tracing_is_off(
    start_server: Any, tmp_path: Path
) -> None:
    untraced = start_server()
    r = httpx.get(f"{untraced.base_url}/viewer/api/summary", timeout=30)
    assert r.status_code == 404 and r.json()["code"] == "tracing_off" and "--trace" in r.json()["detail"]

    keyed = start_server(environment_api_key=KEY, trace_db=tmp_path / "live.db")
    with httpx.Client(base_url=keyed.base_url, timeout=30, follow_redirects=False) as client:
        page = client.get("/viewer")
        assert page.status_code == 401 and 'name="key"' in page.text  # a login form, not a JSON error
        assert client.get("/viewer/api/summary").status_code == 401
        assert client.get("/viewer/static/viewer.js").status_code == 401
        assert client.post("/viewer/login", data={"key": KEY[:-1]}).status_code == 401
        assert client.get("/viewer/api/summary", headers={"X-API-Key": KEY}).status_code == 200
        login = client.post("/viewer/login", data={"key": KEY})
        assert login.status_code == 303
        cookie = login.cookies.get("grpo_viewer")
        assert cookie and KEY not in cookie and "HttpOnly" in login.headers["set-cookie"]
        assert client.get("/viewer/api/summary").status_code == 200  # the cookie is enough
        assert client.get("/viewer").status_code == 200
        client.cookies.clear()
        client.cookies.set("grpo_viewer", "0" * 64)
        assert client.get("/viewer/api/summary").status_code == 401


def test_view_command_serves_the_newest_db_and_refuses_a_bad_one(real_trace_db: Path, tmp_path: Path) -> None:
    traces = tmp_path / "traces" / "v3"
    traces.mkdir(parents=True)
    old, new = traces / "task_app_traces_20260101_000000.db", traces / "task_app_traces_20260102_000000.db"
    synthetic_db(old, 1)
    shutil.copy(real_trace_db, new)
    port = free_port()
    env = {"PYTHONPATH": str(REPO), "PATH": str(Path(sys.executable).parent)}
    cmd = [sys.executable, "-m", "grpo_service.cli", "view", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                summary = httpx.get(f"http://127.0.0.1:{port}/viewer/api/summary", timeout=2).json()
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert summary["db"] == new.name and summary["sessions"] == len(_sessions(new))
    finally:
        proc.terminate()
        proc.wait(10)
    bad = tmp_path / "foreign.db"
    with sqlite3.connect(bad) as conn:
        conn.execute("CREATE TABLE t (x)")
    done = CliRunner().invoke(cli_app, ["view", str(bad)], terminal_width=400)
    assert done.exit_code == 2 and "not a grpo-service trace DB" in done.output


def test_a_query_past_its_deadline_is_a_clear_4xx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = synthetic_db(tmp_path / "big.db", 40)
    monkeypatch.setattr(runs, "QUERY_DEADLINE_S", 0.0)  # as if the DB were huge
    server = ServerThread(create_viewer_app(db), name="viewer-slow").start()
    try:
        r = httpx.get(f"{server.base_url}/viewer/api/summary", timeout=30)
        assert r.status_code == 422 and r.json()["code"] == "query_too_slow", r.text
        assert "narrow it with filters" in r.json()["detail"]
    finally:
        server.stop()


async def test_a_ray_front_serves_the_viewer_itself_even_for_a_host_s_group_id() -> None:
    """Through Ray, the front serves /viewer from the trace DB on its node; group ids carry a
    host's tag, and sending them to that host would fail once it is lost."""
    pytest.importorskip("ray")
    from grpo_service.cluster.router import ClusterRouter

    served: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        served.append(scope["path"])

    class NoHosts:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the viewer request reached the cluster ({name})")

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    path = f"/viewer/api/groups/{new_instance_id()}"
    router = ClusterRouter(app, NoHosts())  # type: ignore[arg-type]
    await router({"type": "http", "path": path, "headers": []}, receive, None)  # type: ignore[arg-type]
    assert served == [path]


class TurnCounter(Environment):
    """A text game whose observations are the synthetic traces' own: replays of them match."""

    name = "turn-counter"

    def __init__(self, config: Any, seed: int | None) -> None:
        self.config, self.seed, self.turn = config, seed or 0, 0

    def _result(self, reward: float = 0.0) -> StepResult:
        text = f"Step {self.turn}. You see grass and a tree to the left."
        return StepResult({"text": text, "step_idx": self.turn}, reward, False, False, {}, self.turn)

    def reset(self, seed: int | None = None) -> StepResult:
        self.turn = 0
        return self._result()

    def step(self, actions: Any) -> StepResult:
        self.turn += 1
        return self._result()

    def observe(self) -> StepResult:
        return self._result()

    def actions_from_tool_calls(self, tool_calls: Any) -> list[str | int]:
        return list(tool_calls[0]["args"]["actions"])

    step_idx = property(lambda self: self.turn)
    done = property(lambda self: False)

    def get_state(self) -> bytes:
        return str(self.turn).encode()

    @classmethod
    def from_state(cls, state: bytes) -> TurnCounter:
        env = cls(None, 0)
        env.turn = int(state)
        return env

    def render_frame(self) -> Frame:
        return Frame(text=f"turn {self.turn}\n[{'#' * self.turn}]")


def test_a_text_game_replays_with_text_frames(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ENVIRONMENTS, TurnCounter.name, TurnCounter)
    db = synthetic_db(tmp_path / "text.db", 3, turns=40)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE sessions SET env_name = ?", (TurnCounter.name,))
        conn.execute("UPDATE env_steps SET reward = 0")  # the counter pays nothing
        sid = conn.execute("SELECT session_id FROM sessions ORDER BY num_turns DESC").fetchone()[0]
        turns = conn.execute("SELECT num_turns FROM sessions WHERE session_id = ?", (sid,)).fetchone()[0]
    server = ServerThread(create_viewer_app(db), name="viewer-text").start()
    try:
        api = f"{server.base_url}/viewer/api/rollouts/{sid}"
        status = httpx.get(f"{api}/replay", timeout=30).json()
        assert status["divergence"] is None and status["frame_text"] and not status["frame_png"], status
        for position in (turns - 1, 2, 20):  # jumps back use the text game's own checkpoints
            r = httpx.get(f"{api}/frames/{position}.txt", timeout=30)
            assert r.text == f"turn {position}\n[{'#' * position}]"
        assert httpx.get(f"{api}/frames/2.png", timeout=30).json()["code"] == "no_frame"
    finally:
        server.stop()


def test_a_damaged_json_cell_is_a_clear_4xx(real_trace_db: Path, tmp_path: Path) -> None:
    db = tmp_path / "damaged.db"
    shutil.copy(real_trace_db, db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE messages SET tool_calls = '{\"cut' WHERE tool_calls IS NOT NULL")
        sid = conn.execute("SELECT session_id FROM messages WHERE tool_calls IS NOT NULL").fetchone()[0]
    server = ServerThread(create_viewer_app(db), name="viewer-damaged").start()
    try:
        r = httpx.get(f"{server.base_url}/viewer/api/rollouts/{sid}/turns", params={"count": 200}, timeout=30)
        assert r.status_code == 422 and r.json()["code"] == "corrupt_trace_db", r.text
    finally:
        server.stop()


def test_the_modal_image_ships_the_viewer_page() -> None:
    import main
    from grpo_service.api.routes.viewer import STATIC_DIR

    ignored = ~main.SHIPPED_FILES
    assert all(not ignored(path) for path in STATIC_DIR.iterdir())
    assert not ignored(STATIC_DIR.parent / "runs.py") and ignored(STATIC_DIR.parent / "__pycache__" / "x.pyc")
