"""The API page: ``/docs`` (Swagger UI) and ``/redoc`` render from the service's own assets, with no
network beyond 127.0.0.1, in Debian's headless Chromium."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import pytest

from grpo_service.models import RolloutRequest
from tests.browser import headless_chromium
from tools.server_thread import ServerThread


def test_docs_pages_load_only_assets_the_service_serves(client: httpx.Client) -> None:
    for path in ("/docs", "/redoc"):
        page = client.get(path)
        assert page.status_code == 200
        assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert assets and all(a.startswith("/") for a in assets), assets  # nothing from a CDN
        for asset in assets:
            assert client.get(asset).status_code == 200, asset


@pytest.fixture
def browser() -> Iterator[object]:
    # Offline: every host but loopback resolves to nothing, so a CDN asset could not load.
    with headless_chromium("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1") as driver:
        yield driver


def test_docs_render_offline_in_chromium(server: ServerThread, browser: object) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver = browser
    driver.get(server.base_url + "/docs")  # type: ignore[attr-defined]
    wait = WebDriverWait(driver, 30)
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".opblock-summary-path")))
    shown = driver.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")  # type: ignore[attr-defined]
    paths = {e.text.replace("\u200b", "") for e in shown}
    assert {"/env/create", "/rollout", "/rollout/group", "/health"} <= paths
    title = driver.find_element(By.CSS_SELECTOR, ".info .title").text  # type: ignore[attr-defined]
    assert "grpo-service" in title
    assert not driver.find_elements(By.CSS_SELECTOR, ".errors-wrapper")  # type: ignore[attr-defined]

    # "Try it out" starts from the request model's first example, which works as it is.
    (block,) = [
        b
        for b in driver.find_elements(By.CSS_SELECTOR, ".opblock.opblock-post")  # type: ignore[attr-defined]
        if b.find_element(By.CSS_SELECTOR, ".opblock-summary-path").text.replace("\u200b", "") == "/rollout"
    ]
    block.find_element(By.CSS_SELECTOR, ".opblock-summary").click()
    wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, ".try-out__btn"))).click()
    body = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "textarea.body-param__text")))
    assert json.loads(body.get_attribute("value")) == RolloutRequest.model_json_schema()["examples"][0]

    driver.get(server.base_url + "/redoc")  # type: ignore[attr-defined]
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "[role=menuitem], .menu-content")))
