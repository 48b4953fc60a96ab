"""The console's Streams pages in a real headless Chromium, against a broker whose stream real clients fed.

A stream of two partitions gets records from STOMP (receipt barriers), two
readers register over HTTP at known offsets, so their lag is known; one of
them stopped refreshing its lease long ago (its expiry set as a stuck query's
would be: a tenth of the lease left), and the page must say so in words.
The broker samples every 0.2 s, so the lag chart has points within the test.
"""
from __future__ import annotations

import pytest

from core.stream import StreamSpec
from tests.browser.test_console import VIEWPORT, Console, wait_text
from tests.integration.test_admin_stream_status import append, destination_in, put_reader
from tests.integration.test_admin_streams import Api
from tests.support import BrokerHandle, call, make_config

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def handle(tmp_path_factory):
    config = make_config(tmp_path_factory.mktemp("console-streams"), traffic_history_interval=0.2)
    config.streams = [StreamSpec("sensors", ["topic://sensors.>"], partitions=2, reader_lease_seconds=600),
                      StreamSpec("orders", ["queue://orders"], max_age_seconds=86400, max_bytes=1 << 30)]
    handle = BrokerHandle(config)
    api = Api(handle)
    append(api, destination_in("sensors", 2, 0), 12)
    append(api, destination_in("sensors", 2, 1), 5)
    put_reader(api, "sensors", "spark-live", {0: 10, 1: 5})  # 2 behind in partition 0, none in 1
    put_reader(api, "sensors", "spark-stuck", {0: 0, 1: 1})  # 12 and 4 behind

    def stuck() -> None:  # its last refresh was 540 s ago: 60 s of the 600 s lease left
        handle.broker.streams.get("sensors").readers["spark-stuck"].expires_ms = handle.broker.now_ms() + 60_000

    call(stuck)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def console(chromium, handle):
    context = chromium.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(10_000)
    shown = Console(page, handle)
    yield shown
    context.close()
    assert not shown.errors, f"uncaught errors in the page: {shown.errors}"


def table_row(console, table, key):
    return console.page.locator(f'main [data-table="{table}"] tbody tr[data-key="{key}"]')


def cells(row, columns):
    return {c: row.locator(f'td[data-col="{c}"]').inner_text() for c in columns}


def test_the_list_shows_each_stream_with_its_readers_worst_lag_and_an_expiring_lease(console):
    console.open("streams")
    page = console.page
    assert page.locator('#nav a[data-route="streams"]').get_attribute("aria-current") == "page"
    assert page.locator("main h2").inner_text() == "Streams"
    assert page.locator("main .count").inner_text() == "2 streams"
    sensors = console.cells("sensors", ["partitions", "records", "readers", "max_lag", "expiring"])
    assert sensors == {"partitions": "2", "records": "17", "readers": "2", "max_lag": "16", "expiring": "⚠ 1 expiring"}
    assert "lease-expiring" in console.row("sensors").get_attribute("class")
    assert console.cells("orders", ["records", "max_lag", "expiring"]) == {"records": "0", "max_lag": "–", "expiring": "–"}
    assert console.row("orders").get_attribute("class") in (None, "")
    assert console.row("sensors").locator("td a").get_attribute("href") == "#/streams/sensors"


def test_a_stream_shows_partitions_readers_lag_and_the_reader_about_to_lose_its_lease(console):
    console.open("streams")
    console.row("sensors").locator("td a").click()  # to the stream's page, as a person would
    page = console.page
    page.wait_for_function("() => document.querySelector('main').dataset.shown === '#/streams/sensors'")
    assert page.locator("main h2").inner_text() == "Stream sensors"
    assert page.locator('#nav a[data-route="streams"]').get_attribute("aria-current") == "page"
    assert console.field("records").inner_text() == "17" and console.field("readers").inner_text() == "2"
    assert console.field("lease").inner_text() == "10 min" and console.field("max-age").inner_text() == "7.0 d"
    assert console.field("max-bytes").inner_text() == "no limit"
    assert console.field("destinations").inner_text() == "topic://sensors.>"
    assert "less than 2.5 min of its lease left" in console.field("lease-rule").inner_text()

    partition = ["earliest", "latest", "records"]
    assert cells(table_row(console, "partitions", "0"), partition) == {"earliest": "0", "latest": "12", "records": "12"}
    assert cells(table_row(console, "partitions", "1"), partition) == {"earliest": "0", "latest": "5", "records": "5"}

    live, stuck = table_row(console, "readers", "spark-live"), table_row(console, "readers", "spark-stuck")
    assert cells(live, ["partitions", "total_lag", "state"]) == {"partitions": "2", "total_lag": "2", "state": "ok"}
    assert cells(stuck, ["total_lag", "state"]) == {"total_lag": "16", "state": "⚠ expiring"}
    assert "lease-expiring" in stuck.get_attribute("class") and "lease-expiring" not in (live.get_attribute("class") or "")
    left = stuck.locator('td[data-col="lease"]').inner_text()  # "59.6 s": what is left of its lease
    assert left.endswith(" s") and 50 <= float(left.split()[0]) <= 60, left
    assert "a quarter of the 10 min lease" in stuck.locator(".badge").get_attribute("title")
    # The expiring row is visibly different, not only in its word: its background is tinted.
    backgrounds = [row.evaluate("tr => getComputedStyle(tr).backgroundColor") for row in (live, stuck)]
    assert backgrounds[0] != backgrounds[1]

    position = ["position", "latest", "lag"]
    assert cells(table_row(console, "positions", "spark-live/0"), position) == {"position": "10", "latest": "12", "lag": "2"}
    assert cells(table_row(console, "positions", "spark-live/1"), position) == {"position": "5", "latest": "5", "lag": "0"}
    assert cells(table_row(console, "positions", "spark-stuck/0"), position) == {"position": "0", "latest": "12", "lag": "12"}
    assert "lease-expiring" in table_row(console, "positions", "spark-stuck/1").get_attribute("class")

    # The lag chart: a line per reader from the broker's samples, the most behind first, named in the legend.
    page.wait_for_function("() => Number(document.querySelector('figure.chart-box').dataset.points) >= 4")
    assert page.locator(".series-legend .legend-item").all_inner_texts() == ["spark-stuck", "spark-live"]
    assert page.locator("figure.chart-box .axis-title.y").inner_text() == "records behind"
    assert page.locator("figure.chart-box .ticks.y span").first.inner_text() == "20"  # 16 behind: the scale's top is 20
    assert page.locator("svg.chart polyline.line").count() == 2
    assert not page.locator(".chart-empty").is_visible()
    widths = page.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert widths[0] == widths[1], f"horizontal overflow: {widths}"


def test_the_page_follows_a_reader_catching_up(console):
    console.open("streams/sensors")
    put_reader(Api(console.handle), "sensors", "spark-live", {0: 12, 1: 5})
    wait_text(table_row(console, "readers", "spark-live").locator('td[data-col="total_lag"]'), "0")  # the next refresh
    wait_text(table_row(console, "positions", "spark-live/0").locator('td[data-col="lag"]'), "0")


def test_an_unknown_stream_says_so(console):
    console.page.goto(f"{console.base}/console/#/streams/nope")
    assert "unknown stream 'nope'" in console.note("error", "unknown stream")
