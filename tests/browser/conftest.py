"""A real headless Chromium (Debian's) for the browser tests, started once per session.

Under CI (CI=true) a missing Chromium or playwright is a failure, never a skip:
.ci/run installs them.  On a developer's machine without them the tests skip.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support import call, reactor

HERE = Path(__file__).resolve().parent
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run",
]


def _missing(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"browser tests cannot run under CI: {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        _missing("Debian's chromium is not installed (apt-get install chromium)")
    if not (HERE / "node_modules" / "@stomp" / "stompjs").is_dir():
        _missing("the browser libraries are not installed (npm ci --prefix tests/browser)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install '.[test]')")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def harness_url() -> Iterator[str]:
    """The harness page and the npm bundles, served over real HTTP from the test reactor."""
    from twisted.web.server import Site
    from twisted.web.static import File

    site = Site(File(str(HERE)))
    site.noisy = False
    port = call(reactor().listenTCP, 0, site, interface="127.0.0.1")
    yield f"http://127.0.0.1:{port.getHost().port}/harness.html"
    call(port.stopListening)


@pytest.fixture
def page(chromium: Any, harness_url: str) -> Iterator[Any]:
    context = chromium.new_context()
    page = context.new_page()
    page.goto(harness_url)
    page.wait_for_function("window.StompJs !== undefined && window.mqtt !== undefined")
    yield page
    context.close()
