"""``python -m tools.bench.viewer``: how fast the trace viewer answers on a big trace DB.

Writes ``--rollouts`` synthetic rollouts (default 10,000; mixed models, rewards, achievements,
stop reasons, groups of 8) with the real trace writer, serves the viewer over it on 127.0.0.1,
and times each request the pages make (median and max of ``--repeats`` over HTTP, JSON
included). Then records real Crafter rollouts and times their replay (the checking pass) and a
frame. Prints a table; ``--json`` keeps the figures.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from grpo_service.api.routes.viewer import create_viewer_app
from tools.server_thread import ServerThread
from tools.synthetic_traces import write_synthetic_db

QUERIES: list[tuple[str, str, dict[str, Any]]] = [
    ("facets (first, uncached)", "/summary", {}),
    ("facets (cached)", "/summary", {}),
    ("list: newest 50", "/rollouts", {}),
    ("list: sorted by return", "/rollouts", {"sort": "total_reward"}),
    ("list: page 150 of 200", "/rollouts", {"page": 150}),
    (
        "list: model + achievement + return",
        "/rollouts",
        {"model": "Qwen/Qwen3-4B", "achievement": "eat_cow", "min_reward": 1},
    ),
    ("list: stop reason family", "/rollouts", {"stop_reason": "policy_error:*", "sort": "num_turns"}),
    ("list: id search", "/rollouts", {"q": "group-99"}),
    ("list: date range", "/rollouts", {"since": "2000-01-01", "until": "2100-01-01"}),
]


def _time(client: httpx.Client, path: str, params: dict[str, Any], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = client.get(path, params=params)
        out.append((time.perf_counter() - t0) * 1000)
        r.raise_for_status()
    return out


def run(rollouts: int, repeats: int, workdir: Path) -> dict[str, Any]:
    db = workdir / "task_app_traces_bench.db"
    t0 = time.perf_counter()
    asyncio.run(write_synthetic_db(db, rollouts))
    figures: dict[str, Any] = {
        "rollouts": rollouts,
        "db_mb": round(db.stat().st_size / 2**20, 1),
        "write_s": round(time.perf_counter() - t0, 1),
    }
    server = ServerThread(create_viewer_app(db), name="bench-viewer").start()
    try:
        with httpx.Client(base_url=server.base_url + "/viewer/api", timeout=60) as client:
            times: dict[str, list[float]] = {}
            for name, path, params in QUERIES:
                times[name] = _time(client, path, params, 1 if "uncached" in name else repeats)
            figures["sessions_in_db"] = client.get("/summary").json()["sessions"]
            sid = client.get("/rollouts", params={"sort": "num_turns"}).json()["rows"][0]["session_id"]
            group = client.get(f"/rollouts/{sid}").json()["session"]["group_id"]
            times["rollout: session + timeline"] = _time(client, f"/rollouts/{sid}", {}, repeats)
            times["rollout: 50 turns in full"] = _time(
                client, f"/rollouts/{sid}/turns", {"count": 50}, repeats
            )
            times["group of 8"] = _time(client, f"/groups/{group}", {}, repeats)
    finally:
        server.stop()
    figures["requests_ms"] = {
        k: {"median": round(statistics.median(v), 1), "max": round(max(v), 1)} for k, v in times.items()
    }
    figures["replay"] = _replay_figures(workdir, repeats)
    return figures


def _replay_figures(workdir: Path, repeats: int) -> dict[str, Any]:
    """Replay a real 300-turn Crafter rollout: the checking pass, then frames forward and back."""
    from tools.task_app import recording_task_app

    db = workdir / "task_app_traces_real.db"
    with recording_task_app(db, workdir / "state", name="bench-recorder", timeout_s=600) as app:
        heuristic = {"policy_name": "crafter-heuristic"}
        app.rollout(
            run_id="bench-heuristic", env={"env_name": "crafter", "seed": 7}, policy=heuristic, max_turns=300
        )
    server = ServerThread(create_viewer_app(db), name="bench-replay").start()
    try:
        with httpx.Client(base_url=server.base_url + "/viewer/api", timeout=600) as client:
            sid = client.get("/rollouts").json()["rows"][0]["session_id"]
            t0 = time.perf_counter()
            status = client.get(f"/rollouts/{sid}/replay").json()
            verify_ms = (time.perf_counter() - t0) * 1000
            forward = _time_frames(client, sid, range(1, min(status["reachable"], 1 + 10 * repeats)))
            back = _time_frames(client, sid, range(status["reachable"] - 1, 0, -37))
    finally:
        server.stop()
    return {
        "turns": status["checked"],
        "diverged": status["divergence"] is not None,
        "check_pass_ms": round(verify_ms, 1),
        "frame_next_ms_median": round(statistics.median(forward), 1),
        "frame_jump_back_ms_median": round(statistics.median(back), 1),
    }


def _time_frames(client: httpx.Client, sid: str, positions: range) -> list[float]:
    out = []
    for p in positions:
        t0 = time.perf_counter()
        client.get(f"/rollouts/{sid}/frames/{p}.png").raise_for_status()
        out.append((time.perf_counter() - t0) * 1000)
    return out or [0.0]


def main(
    rollouts: Annotated[int, typer.Option(min=1, help="Synthetic rollouts in the DB.")] = 10_000,
    repeats: Annotated[int, typer.Option(min=1, help="Timings per request.")] = 5,
    json_path: Annotated[Path | None, typer.Option("--json", dir_okay=False)] = None,
) -> None:
    with tempfile.TemporaryDirectory(prefix="grpo-bench-viewer-") as tmp:
        figures = run(rollouts, repeats, Path(tmp))
    print(
        f"viewer over {figures['sessions_in_db']:,} rollouts "
        f"({figures['db_mb']} MB, written in {figures['write_s']} s)"
    )
    for name, t in figures["requests_ms"].items():
        print(f"  {name:<38} {t['median']:>8.1f} ms median  {t['max']:>8.1f} ms max")
    replay = figures["replay"]
    print(
        f"  replay of a {replay['turns']}-turn Crafter rollout: check pass {replay['check_pass_ms']:.0f} ms, "
        f"next frame {replay['frame_next_ms_median']:.1f} ms, "
        f"jump back {replay['frame_jump_back_ms_median']:.1f} ms"
        f"{' (DIVERGED)' if replay['diverged'] else ''}"
    )
    if json_path is not None:
        json_path.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    typer.run(main)
