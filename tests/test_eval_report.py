"""The HTML eval report: built from eval's JSON alone (any environment), charts embedded so the
file stands alone, failures by cause, and a viewer link per returned episode."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

from PIL import Image
from typer.testing import CliRunner

from grpo_service.cli import app as cli_app
from grpo_service.reporting.eval_report import render_report, success_rates


def _episode(i: int, ret: float, achievements: list[str], failure: str | None = None, returned: bool = True):
    return {
        "index": i,
        "seed": 100 + i,
        "run_id": f"eval-abc-{i:04d}-s{100 + i}",
        "returned": returned,
        "stop_reason": failure or "completed",
        "failure": failure,
        "turns": 10,
        "achievements": achievements,
        "total_return": ret,
    }


def _images(page: str) -> dict[str, Image.Image]:
    found = re.findall(r'<img id="([^"]+)" alt="[^"]*" src="data:image/png;base64,([^"]+)"', page)
    return {cid: Image.open(io.BytesIO(base64.b64decode(data))) for cid, data in found}


def test_a_crafter_eval_report_has_the_score_charts_failures_and_links() -> None:
    episodes = [
        _episode(0, 3.0, ["collect_wood", "place_table", "wake_up"]),
        _episode(1, 1.0, ["collect_wood"]),
        _episode(2, 0.0, [], failure="policy_error:no_tool_call"),
        _episode(3, 0.0, [], failure="timeout", returned=False),
    ]
    result = {
        "summary": {
            "completed": 2,
            "total": 4,
            "scored": 3,
            "crafter_score": 4.37,
            "mean_return": 4 / 3,
            "success_rates": {"collect_wood": 66.7, "place_table": 33.3, "wake_up": 33.3, "eat_cow": 0.0},
            "failures": {"policy_error:no_tool_call": 1, "timeout": 1},
        },
        "config": {"model": "Qwen/Qwen3-4B", "env_name": "crafter", "base_url": "http://127.0.0.1:8000"},
        "episodes": episodes,
    }
    page = render_report(result, viewer_url="http://127.0.0.1:8000/viewer")
    assert 'id="stat-crafter_score">4.37<' in page
    images = _images(page)
    assert set(images) == {"chart-achievements", "chart-returns", "chart-failures"}
    assert all(im.size[0] > 600 and im.size[1] > 150 for im in images.values())
    assert "<td class=mono>policy_error:no_tool_call</td><td class=num>1</td>" in page
    links = re.findall(r'href="(http://127\.0\.0\.1:8000/viewer#/run/[^"]+)"', page)
    # One per returned episode (the lost one has nothing to show).
    assert links == [f"http://127.0.0.1:8000/viewer#/run/{e['run_id']}" for e in episodes[:3]]
    # Standalone: nothing to fetch (no scripts, styles or images from elsewhere).
    assert not re.search(r'<(script|link)\b|src="(?!data:)', page)


def test_any_environment_without_success_rates_or_score() -> None:
    result = {
        "summary": {"completed": 2, "total": 2, "success_rate": 0.5, "mean_return": 0.5},
        "config": {"policy": "babyai-bot", "env_name": "babyai"},
        "episodes": [_episode(0, 1.0, ["goal"]), _episode(1, 0.0, [])],
    }
    assert success_rates(result) == {"goal": 50.0}
    page = render_report(result)
    assert "Evaluation of babyai-bot on babyai" in page and 'id="stat-success_rate">0.5<' in page
    assert set(_images(page)) == {"chart-achievements", "chart-returns"}
    assert "No failures" in page and "#/run/" not in page  # no viewer given: no links


def test_eval_report_command_and_its_bad_input(tmp_path: Path) -> None:
    result = {"summary": {"completed": 1, "total": 1}, "config": {"base_url": "http://h:1"}, "episodes": []}
    good = tmp_path / "eval.json"
    good.write_text(json.dumps(result))
    out = tmp_path / "out" / "report.html"
    done = CliRunner().invoke(cli_app, ["eval-report", str(good), "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert 'href="http://h:1/viewer"' in out.read_text()
    for name, text in (("broken.json", "{not json"), ("list.json", "[1, 2]")):
        bad = tmp_path / name
        bad.write_text(text)
        done = CliRunner().invoke(cli_app, ["eval-report", str(bad), "--out", str(tmp_path / "x.html")])
        assert done.exit_code == 2 and not (tmp_path / "x.html").exists(), done.output
