"""The viewer in a real browser (Debian's headless Chromium through selenium), served by the task
app over the DB it traced: open the run list, filter it, open a rollout, step through frames with
the keyboard and the slider, open the group view; what each page shows is checked against the
trace DB. A screenshot of every page lands in ``test-artifacts/viewer/`` (gitignored)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from grpo_service.tracing.reader import TraceReader
from tests.browser import headless_chromium
from tests.conftest import REPO
from tests.viewer_data import GROUP_SIZE

ARTIFACTS = REPO / "test-artifacts" / "viewer"


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    with headless_chromium("--window-size=1400,1100") as driver:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        yield driver


@pytest.fixture(scope="module")
def served(real_trace_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The task app itself, serving /viewer over the trace DB it was configured with."""
    from grpo_service import Settings, create_app
    from tools.server_thread import ServerThread

    root = tmp_path_factory.mktemp("viewer-app")
    settings = Settings(
        _env_file=None, state_dir=root / "state", snapshot_secret="s" * 40, trace_db=real_trace_db
    )
    server = ServerThread(create_app(settings), name="viewer-app").start()
    yield server.base_url
    server.stop()


def wait(driver: webdriver.Chrome, condition: Any, timeout: float = 20) -> Any:
    return WebDriverWait(driver, timeout).until(condition)


def text_of(driver: webdriver.Chrome, css: str) -> str:
    return driver.find_element(By.CSS_SELECTOR, css).text


def shot(driver: webdriver.Chrome, name: str) -> None:
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, max(900, min(int(height) + 40, 3000)))
    assert driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))
    driver.set_window_size(1400, 1100)


def frame_loaded(position: int) -> Any:
    def check(driver: webdriver.Chrome) -> bool:
        imgs = driver.find_elements(By.CSS_SELECTOR, f'#frame-img[data-position="{position}"]')
        return (
            bool(imgs)
            and driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth", imgs[0])
            == 144
        )

    return check


def test_run_list_filter_rollout_steps_and_group(
    browser: webdriver.Chrome, served: str, real_trace_db: Path
) -> None:
    with TraceReader(real_trace_db, migrate=False) as reader:
        sessions = reader.sessions()
        heuristic = next(s for s in sessions if s["run_id"] == "viewer-heuristic")
        turns = reader.turns(heuristic["session_id"])

    # The run list: every rollout of the DB, newest first.
    browser.get(f"{served}/viewer")
    wait(browser, ec.presence_of_element_located((By.ID, "runs")))
    rows = browser.find_elements(By.CSS_SELECTOR, "#runs tr.row")
    newest_first = sorted(sessions, key=lambda s: s["started_at"], reverse=True)
    assert [r.get_attribute("data-session") for r in rows] == [s["session_id"] for s in newest_first]
    assert text_of(browser, "#total") == str(len(sessions))
    shot(browser, "1-run-list")

    # Filter by policy, then sort by return (a click on the header).
    Select(browser.find_element(By.ID, "filter-policy")).select_by_value("crafter-random")
    wait(browser, lambda d: text_of(d, "#total") == str(GROUP_SIZE))
    browser.find_element(By.CSS_SELECTOR, 'th[data-sort="total_reward"]').click()
    wait(browser, lambda d: "sort=total_reward" in d.current_url)
    wait(browser, ec.presence_of_element_located((By.ID, "runs")))
    shown = [float(td.text) for td in browser.find_elements(By.CSS_SELECTOR, '#runs td[data-col="return"]')]
    expected = sorted(
        (s["total_reward"] for s in sessions if s["policy_name"] == "crafter-random"), reverse=True
    )
    assert shown == expected
    shot(browser, "2-run-list-filtered")

    # Open a rollout: the replay matches the trace, frame 0 and turn 0's observation show.
    browser.get(f"{served}/viewer#/")
    wait(
        browser,
        ec.presence_of_element_located((By.CSS_SELECTOR, f'tr[data-session="{heuristic["session_id"]}"]')),
    )
    browser.find_element(By.CSS_SELECTOR, f'tr[data-session="{heuristic["session_id"]}"] a').click()
    wait(browser, lambda d: "Replay matches the trace" in text_of(d, "#banner"))
    wait(browser, frame_loaded(0))
    assert text_of(browser, "#obs-text") == turns[0]["observation"]["text"]

    # Step with the keyboard: each turn's observation, actions, reward and vitals are the DB's.
    body = browser.find_element(By.TAG_NAME, "body")
    for position in (1, 2, 3):
        body.send_keys(Keys.ARROW_RIGHT)
        wait(browser, frame_loaded(position))
        turn = turns[position]
        wait(browser, lambda d, t=turn: text_of(d, "#obs-text") == t["observation"]["text"])
        assert text_of(browser, "#step-actions") == ", ".join(turn["env"]["actions"])
        assert text_of(browser, "#step-reward") == f"{turn['env']['reward']:.2f}"
        health = browser.find_element(By.CSS_SELECTOR, '[data-vital="health"]').text
        assert health == str(turn["observation"]["status"]["health"])
    body.send_keys(Keys.ARROW_LEFT)
    wait(browser, frame_loaded(2))

    # Jump with the slider to the first turn that unlocked an achievement: it shows as new.
    unlock = next(t for t in turns if t["env"]["achievements_unlocked"])
    position = unlock["turn"] + 1
    browser.execute_script(
        "const s = document.getElementById('slider'); s.value = arguments[0];"
        "s.dispatchEvent(new Event('input'));",
        position,
    )
    wait(browser, frame_loaded(position))
    fresh = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#achievements .chip.new")]
    assert fresh == unlock["env"]["achievements_unlocked"]
    assert f"turn {position} /" in text_of(browser, "#pos")
    shot(browser, "3-rollout")

    # Play runs on by itself; pause stops it (the button, then the space bar).
    slider = browser.find_element(By.ID, "slider")
    browser.find_element(By.ID, "btn-play").click()
    wait(browser, frame_loaded(position + 2))
    browser.find_element(By.ID, "btn-play").click()
    browser.execute_script("document.activeElement.blur()")
    paused_at = int(slider.get_attribute("value"))
    body.send_keys(Keys.SPACE)
    wait(browser, lambda d: int(slider.get_attribute("value")) >= paused_at + 2)
    body.send_keys(Keys.SPACE)
    stopped_at = int(slider.get_attribute("value"))
    time.sleep(0.6)  # at 4 frames/s a running player would have moved on
    assert int(slider.get_attribute("value")) == stopped_at

    # A rollout cut short by the policy shows its error.
    error_run = next(s for s in sessions if s["run_id"] == "viewer-policy-error")
    last = error_run["num_turns"] - 1
    browser.get(f"{served}/viewer#/rollout/{error_run['session_id']}?t={last}")
    wait(browser, lambda d: "no_tool_call" in text_of(d, "#turn-error"))
    assert text_of(browser, "#stop-reason") == "policy_error:no_tool_call"
    shot(browser, "4-rollout-policy-error")

    # The group: every member, with its advantage and the fork.
    browser.get(f"{served}/viewer#/group/viewer-group")
    wait(browser, ec.presence_of_element_located((By.ID, "members")))
    cards = browser.find_elements(By.CSS_SELECTOR, "#members .member")
    assert len(cards) == GROUP_SIZE
    assert text_of(browser, "#fork")
    images_loaded = (
        "return [...document.querySelectorAll('#members img')].every(i => i.complete && i.naturalWidth)"
    )
    wait(browser, lambda d: d.execute_script(images_loaded))
    shot(browser, "5-group")

    # An unknown rollout: a clear message, not a broken page.
    browser.get(f"{served}/viewer#/rollout/no-such-rollout")
    wait(browser, lambda d: "no rollout" in text_of(d, "#error"))
    shot(browser, "6-unknown-rollout")


def test_eval_report_opens_and_links_into_the_viewer(
    browser: webdriver.Chrome, tmp_path: Path, start_server: Any
) -> None:
    """``eval --report`` against a tracing task app; each run id in the report opens its rollout."""
    import httpx
    from typer.testing import CliRunner

    from grpo_service.cli import app as cli_app

    server = start_server(trace_db=tmp_path / "task_app_traces_eval.db")
    report, result_json = tmp_path / "report.html", tmp_path / "eval.json"
    args = ["eval", "--base-url", server.base_url, "--policy", "crafter-random", "--episodes", "3"]
    args += ["--max-turns", "15", "--json", str(result_json), "--report", str(report)]
    done = CliRunner().invoke(cli_app, args, terminal_width=200)
    assert done.exit_code == 0, done.output
    run_id = json.loads(result_json.read_text())["episodes"][0]["run_id"]
    for _ in range(100):  # the trace writer commits within a quarter second
        rows = httpx.get(f"{server.base_url}/viewer/api/rollouts", params={"run_id": run_id}).json()["rows"]
        if rows:
            break
        time.sleep(0.05)

    browser.get(report.as_uri())
    wait(browser, ec.presence_of_element_located((By.ID, "chart-achievements")))
    for chart in ("chart-achievements", "chart-returns"):
        image = browser.find_element(By.ID, chart)
        assert browser.execute_script("return arguments[0].naturalWidth", image) > 600
    shot(browser, "7-eval-report")
    browser.find_element(By.LINK_TEXT, run_id).click()
    wait(browser, lambda d: "Replay matches the trace" in text_of(d, "#banner"))
    assert rows and f"#/rollout/{rows[0]['session_id']}" in browser.current_url
    wait(browser, frame_loaded(0))
    shot(browser, "8-report-link-to-rollout")


def test_the_page_says_where_a_replay_diverges(
    browser: webdriver.Chrome, real_trace_db: Path, tmp_path: Path
) -> None:
    import sqlite3

    from grpo_service.api.routes.viewer import create_viewer_app
    from tools.server_thread import ServerThread

    db = tmp_path / "tampered.db"
    shutil.copy(real_trace_db, db)
    with sqlite3.connect(db) as conn:
        sid = conn.execute("SELECT session_id FROM sessions WHERE run_id = 'viewer-heuristic'").fetchone()[0]
        conn.execute(
            "UPDATE turns SET observation = json_set(observation, '$.inventory.wood', 99) "
            "WHERE session_id = ? AND turn = 5",
            (sid,),
        )
    server = ServerThread(create_viewer_app(db), name="viewer-diverging").start()
    try:
        browser.get(f"{server.base_url}/viewer#/rollout/{sid}?t=5")
        wait(browser, lambda d: "diverges" in text_of(d, "#banner"))
        banner = text_of(browser, "#banner")
        assert "at turn 5 (observation)" in banner and "inventory" in banner
        shot(browser, "9-rollout-diverging")
    finally:
        server.stop()
