"""The console's Bridges page in a real headless Chromium, against a bridge whose link really comes and goes.

Gateway A bridged to gateway B (tests/integration/test_admin_bridges.py's pair):
the page must show the link up, then what A forwarded, then, with B stopped,
the link down with its reason and the messages waiting for B.
"""
from __future__ import annotations

import pytest

from tests.browser.test_console import VIEWPORT, Console, wait_text
from tests.integration.test_admin_bridges import LINK, pair, publish  # noqa: F401 (pair: the fixture)
from tests.support import wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def console(chromium, pair):  # noqa: F811 (the imported fixture, by name)
    context = chromium.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(10_000)
    shown = Console(page, pair.local)
    yield shown
    context.close()
    assert not shown.errors, f"uncaught errors in the page: {shown.errors}"


COLUMNS = ("state", "since", "url", "queued", "inflight", "forwarded", "received", "last_error")


def test_the_bridges_page_shows_the_link_its_traffic_and_an_outage(console, pair):  # noqa: F811
    console.open("bridges")
    assert console.page.locator('#nav a[data-route="bridges"]').get_attribute("aria-current") == "page"
    assert console.page.locator("main h2").inner_text() == "Bridges"
    row = console.row("tob")
    wait_text(row.locator('td[data-col="state"]'), "connected")
    cells = console.cells("tob", COLUMNS)
    assert cells["url"] == f"mqtt://127.0.0.1:{pair.remote.mqtt_port}"
    assert cells["queued"] == cells["inflight"] == cells["forwarded"] == cells["received"] == "0"
    assert cells["last_error"] == "–" and cells["since"].endswith(" s ago")
    assert "connected since" in row.locator('td[data-col="since"] span').get_attribute("title")
    assert console.page.locator("main .count").inner_text() == "1 bridge, 1 connected"

    publish(pair.local, "t/x", 3, "console-pub")
    wait_text(row.locator('td[data-col="forwarded"]'), "3")  # the next 2 s refresh

    pair.stop_remote()
    wait_text(row.locator('td[data-col="state"]'), "disconnected")
    publish(pair.local, "t/x", 2, "console-pub")
    wait_text(row.locator('td[data-col="queued"]'), "2")
    error = row.locator('td[data-col="last_error"]')
    wait_until(lambda: error.inner_text() not in ("", "–"), LINK, "the last error shown")
    assert error.inner_text() == pair.status()["last_error"] and error.get_attribute("title") == error.inner_text()
    assert console.page.locator("main .count").inner_text() == "1 bridge, 0 connected"


def test_without_bridges_the_page_says_how_to_configure_one(console, pair):  # noqa: F811
    console.base = f"http://127.0.0.1:{pair.remote.admin_port}"  # B has none
    console.open("bridges")
    assert console.page.locator("main table.grid tbody tr.empty").inner_text() == (
        "No bridges are configured ([[bridges]] in the configuration file).")
