"""The web console (gateway/admin/console/) in a real headless Chromium, against a real broker.

State comes from real clients (stomp.py, paho); each page is checked against it: the numbers in
the cells, the messages a browse shows, and, after an action clicked in the page, what the broker
then holds and what a consumer receives.  One broker and one page serve the module; each test uses
queues of its own.  The layout test keeps a screenshot, and fails on facts a broken stylesheet or
script would change (bounding boxes, overflow, a blank picture).
"""
from __future__ import annotations

import base64
import contextlib
import itertools
import json
import re
import urllib.request

import pytest
import stomp

from tests.integration.admin_support import dead_letter, send_all
from tests.integration.test_admin_auth import PASSWORDS, auth_config
from tests.support import (
    BrokerHandle,
    Collector,
    connect,
    disconnect,
    make_config,
    mqtt_close,
    mqtt_connect,
    sync,
    wait_until,
)

pytestmark = pytest.mark.timeout(60)

VIEWPORT = {"width": 1280, "height": 800}
DLQ = "queue://DLQ"


@pytest.fixture(scope="module")
def handle(tmp_path_factory):
    # Samples every 0.2 s rather than 5 s: the chart's history fills within the test.
    config = make_config(tmp_path_factory.mktemp("console"), max_redeliveries=1, redelivery_delay_ms=0,
                         traffic_history_interval=0.2)
    handle = BrokerHandle(config)
    yield handle
    handle.stop()


class Console:
    """The page, and what the tests do with it."""

    def __init__(self, page, handle):
        self.page = page
        self.handle = handle
        self.base = f"http://127.0.0.1:{handle.admin_port}"
        self.errors: list[str] = []  # uncaught exceptions in the page: always a bug
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))

    def open(self, route):
        """Go to a route and wait until the page shows the broker's answer for it."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        self.page.goto(f"{self.base}/console/#/{route}")
        try:
            self.page.wait_for_function("(hash) => document.querySelector('main').dataset.shown === hash", arg=f"#/{route}")
        except PlaywrightTimeout:
            state = self.page.evaluate("""() => ({hash: location.hash, shown: document.querySelector('main').dataset.shown,
                status: document.getElementById('status').textContent,
                notes: [...document.querySelectorAll('#messages .note')].map(n => n.textContent)})""")
            raise AssertionError(f"{route}: {state}") from None

    def row(self, key):
        return self.page.locator(f'main table.grid tbody tr[data-key="{key}"]')

    def cells(self, key, columns):
        row = self.row(key)
        return {c: row.locator(f'td[data-col="{c}"]').inner_text() for c in columns}

    def field(self, name):
        return self.page.locator(f'[data-field="{name}"]').first

    def note(self, kind, pattern):
        """Wait for a message of that kind ("ok", "error") matching the pattern; its text."""
        locator = self.page.locator(f"#messages .note.{kind}", has_text=re.compile(pattern))
        locator.first.wait_for(timeout=10_000)
        return locator.first.locator(".note-text").inner_text()

    def confirm(self, answer=None):
        dialog = self.page.locator("dialog.ask[open]")
        dialog.wait_for()
        if answer is not None:
            dialog.locator("input").fill(answer)
        dialog.locator("button[value=ok]").click()

    def api(self, method, path, doc=None):
        data = json.dumps(doc).encode() if doc is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"} if data else {})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())


@pytest.fixture(scope="module")
def console(chromium, handle):
    context = chromium.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(10_000)
    yield Console(page, handle)
    context.close()


@pytest.fixture(autouse=True)
def no_script_errors(request):
    yield
    if "console" in request.fixturenames:
        console = request.getfixturevalue("console")
        errors, console.errors[:] = list(console.errors), []
        assert not errors, f"uncaught errors in the page: {errors}"


def wait_text(locator, expected, timeout=10.0):
    """The element's text once it equals ``expected`` (the page refreshes every 2 s)."""
    wait_until(lambda: locator.inner_text() == expected, timeout, lambda: f"{expected!r}, shown {locator.inner_text()!r}",
               interval=0.05)
    return expected


# -- overview -------------------------------------------------------------------------------


def test_overview_shows_the_connections_and_messages_clients_made(console):
    made = [connect(console.handle) for _ in range(3)]
    device, _ = mqtt_connect(console.handle, "console-device", version=5)
    conn, got = made[0]
    for i in range(4):
        conn.send("/queue/ov.a", f"m{i}")
    sync(conn, got)
    console.open("")
    expected = console.api("GET", "/api/v1/overview")
    assert expected["connections"]["total"] == 4  # nothing else is connected: the module's tests clean up
    wait_text(console.field("connections"), "4")
    assert console.page.locator('[data-protocol="stomp"]').inner_text() == "STOMP 3"
    assert console.page.locator('[data-protocol="mqtt"]').inner_text() == "MQTT 1"
    wait_text(console.field("received"), str(expected["messages"]["received"]))
    wait_text(console.field("queues"), str(expected["queues"]["count"]))
    # The rates come from two polls: a number once the second has come.
    console.page.wait_for_function("""() => /^[0-9.,]+$/.test(document.querySelector('[data-field="in-rate"]').textContent)""")
    # The deepest-queues panel links to the queue's page.
    assert console.page.locator('a[href="#/queues/ov.a"]').inner_text() == "ov.a"
    for c, _ in made:
        disconnect(c)
    mqtt_close(device)
    # Closed connections leave the count at the next refresh.
    wait_text(console.field("connections"), "0")


CHART = """() => {
    const box = document.querySelector('figure.chart-box');
    const rect = (el) => { const r = el.getBoundingClientRect(); return {x: r.x, y: r.y, w: r.width, h: r.height}; };
    const ys = (cls) => (box.querySelector(`polyline.${cls}`).getAttribute('points') || '').split(' ').filter(Boolean)
        .map((p) => Number(p.split(',')[1]));
    return {
        points: Number(box.dataset.points),
        in_ys: ys('in'), out_ys: ys('out'),
        y_title: box.querySelector('[data-axis="y"]').textContent,
        x_title: box.querySelector('[data-axis="x"]').textContent,
        y_ticks: [...box.querySelectorAll('.ticks.y span')].map((s) => s.textContent),
        x_ticks: [...box.querySelectorAll('.ticks.x span')].map((s) => s.textContent),
        collecting: !box.querySelector('.chart-empty').hidden,
        collecting_text: box.querySelector('.chart-empty').textContent,
        plot: rect(box.querySelector('svg.chart')), y_box: rect(box.querySelector('[data-axis="y"]')),
        x_box: rect(box.querySelector('[data-axis="x"]')),
    };
}"""


def test_a_page_opened_after_traffic_charts_the_minutes_before_it(chromium, console):
    """The chart starts from the broker's samples (/api/v1/overview/history), not empty, with labelled axes."""
    conn, got = connect(console.handle)
    for i in range(40):
        conn.send("/queue/chart.q", f"m{i}")
    sync(conn, got)
    disconnect(conn)
    # The barrier: the broker has sampled the burst (a sample with a rate above 0).
    history = wait_until(lambda: (h := console.api("GET", "/api/v1/overview/history"))
                         and any((s["in_per_second"] or 0) > 0 for s in h["samples"]) and h, 10, "a sample of the burst")
    assert history["interval_seconds"] == 0.2 and history["window_seconds"] == 300

    context = chromium.new_context(viewport=VIEWPORT)  # a fresh load, as a person opening the console now
    try:
        page = context.new_page()
        page.goto(f"{console.base}/console/#/")
        page.wait_for_function("() => document.querySelector('main').dataset.shown === '#/'")
        chart = page.evaluate(CHART)  # after the first refresh: only the broker's samples can be drawn yet
    finally:
        context.close()
    assert chart["points"] >= 2 and not chart["collecting"]
    assert min(chart["in_ys"]) < 100, chart["in_ys"]  # the burst is above the x axis
    assert chart["y_title"] == "messages / s" and chart["x_title"] == "time, the last 5 minutes"
    assert chart["x_ticks"] == ["−5 min", "−4 min", "−3 min", "−2 min", "−1 min", "now"]
    top = chart["y_ticks"][0]
    assert chart["y_ticks"][2] == "0" and float(top.replace(",", "")) >= max(
        s["in_per_second"] or 0 for s in history["samples"]) * 0.999
    # The y title is left of the plot, the x title below it (the stylesheet's grid held).
    assert chart["y_box"]["x"] + chart["y_box"]["w"] <= chart["plot"]["x"]
    assert chart["x_box"]["y"] >= chart["plot"]["y"] + chart["plot"]["h"]
    assert chart["plot"]["h"] > 100 and chart["plot"]["w"] > 300


def test_without_history_the_chart_says_it_is_collecting(chromium, tmp_path):
    handle = BrokerHandle(make_config(tmp_path, traffic_history_interval=0))
    context = chromium.new_context(viewport=VIEWPORT)
    try:
        page = context.new_page()
        page.goto(f"http://127.0.0.1:{handle.admin_port}/console/#/")
        page.wait_for_function("() => document.querySelector('main').dataset.shown === '#/'")
        chart = page.evaluate(CHART)
        assert chart["points"] == 0 and chart["collecting"]
        assert chart["collecting_text"] == "Collecting: a point every few seconds"
        assert page.locator(".chart-empty").is_visible()
        # The refreshes' own points replace it (the second refresh has a rate).
        page.wait_for_function("() => document.querySelector('figure.chart-box').dataset.points !== '0'")
        assert not page.locator(".chart-empty").is_visible()
    finally:
        context.close()
        handle.stop()


# -- queues -----------------------------------------------------------------------------------


def test_queues_page_shows_each_queue_with_its_depth_and_the_filter_narrows_it(console):
    handle = console.handle
    send_all(handle, "/queue/ql.alpha", ["a1", "a2", "a3"])
    send_all(handle, "/queue/ql.beta", [f"b{i}" for i in range(5)])
    holder, held = connect(handle)
    holder.subscribe("/queue/ql.beta", id="h", ack="client-individual", headers={"activemq.prefetchSize": "2"})
    held.wait_for(2)
    sync(holder, held)
    console.open("queues")
    columns = ["messages", "ready", "unacknowledged", "consumers", "enqueued", "dequeued"]
    assert console.cells("ql.alpha", columns) == dict(zip(columns, ["3", "3", "0", "0", "3", "0"]))
    assert console.cells("ql.beta", columns) == dict(zip(columns, ["5", "3", "2", "1", "5", "0"]))
    # The numbers are right-aligned, the name links to the queue's page.
    assert console.row("ql.beta").locator('td[data-col="messages"]').evaluate("td => getComputedStyle(td).textAlign") == "right"
    assert console.row("ql.beta").locator("td a").get_attribute("href") == "#/queues/ql.beta"

    console.page.fill("input.filter", "ql.al")
    console.page.wait_for_function("() => document.querySelectorAll('main tbody tr[data-key]').length === 1")
    assert console.page.locator("main tbody tr[data-key]").get_attribute("data-key") == "ql.alpha"
    assert "filter=ql.al" in console.page.url
    assert "1 queue" in console.page.locator(".count").inner_text()

    # Sorting by a column asks the broker for that order (messages, most first).
    console.page.fill("input.filter", "ql.")
    console.page.wait_for_function("() => document.querySelectorAll('main tbody tr[data-key]').length === 2")
    console.page.locator("th.sortable button", has_text="Messages").click()
    console.page.wait_for_function("() => location.hash.includes('sort=-messages')")
    console.page.wait_for_function("() => document.querySelector('main tbody tr[data-key]').dataset.key === 'ql.beta'")
    console.page.locator("th.sortable button", has_text="Messages").click()
    console.page.wait_for_function("() => document.querySelector('main tbody tr[data-key]').dataset.key === 'ql.alpha'")
    # A consumer acking makes the live figures move without a reload.
    for m in held.messages[:2]:
        holder.ack(m.headers["ack"])
    sync(holder, held)
    wait_text(console.row("ql.beta").locator('td[data-col="dequeued"]'), "2")
    disconnect(holder)


def test_layout_of_the_queues_page(console, tmp_path):
    """Facts a broken stylesheet or script would change, and a screenshot kept for people."""
    page = console.page
    send_all(console.handle, "/queue/layout.q", ["x"])
    console.open("queues")
    page.wait_for_selector('main tbody tr[data-key="layout.q"]')
    header = page.locator("header.top").bounding_box()
    assert header["y"] == 0 and 36 <= header["height"] <= 60 and header["width"] == VIEWPORT["width"]
    links = [page.locator(f'#nav a[data-route="{r}"]').bounding_box() for r in ("overview", "queues", "connections", "topics")]
    assert all(abs(b["y"] - links[0]["y"]) < 2 for b in links), "the nav items are not on one line"
    assert all(a["x"] + a["width"] <= b["x"] for a, b in itertools.pairwise(links)), "the nav items are not side by side"
    assert all(b["y"] + b["height"] <= header["y"] + header["height"] for b in links)
    assert page.locator('#nav a[data-route="queues"]').evaluate("a => a.classList.contains('active')")
    table = page.locator("main table.grid").bounding_box()
    assert table["y"] > header["height"] and table["width"] > 900 and table["height"] > 40
    heading = page.locator("main table.grid thead th").first.bounding_box()
    cell = page.locator('main tbody tr[data-key="layout.q"] td').first.bounding_box()
    assert heading["y"] + heading["height"] <= cell["y"] + 1 and 14 <= cell["height"] <= 40  # dense rows
    widths = page.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert widths[0] <= VIEWPORT["width"] and widths[0] == widths[1], f"horizontal overflow: {widths}"
    filter_box = page.locator("input.filter").bounding_box()
    assert filter_box["x"] + filter_box["width"] <= VIEWPORT["width"]

    shot = tmp_path / "queues.png"
    png = page.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000
    stats = picture_stats(console, png)
    assert stats["colors"] > 50, stats  # text, lines and the dark header: many colours, not a blank page
    assert stats["dark_top"] > 0.9, stats  # the header bar is drawn (its stylesheet loaded)
    assert stats["deviation"] > 20, stats
    print(f"screenshot: {shot}")


def picture_stats(console, png: bytes) -> dict:
    """Decode the PNG in a blank page of the same browser (PIL is not a dependency): colours, spread, the header."""
    page = console.page.context.new_page()
    try:
        return page.evaluate("""async (data) => {
            const img = new Image();
            img.src = 'data:image/png;base64,' + data;
            await img.decode();
            const canvas = document.createElement('canvas');
            canvas.width = img.width; canvas.height = img.height;
            const g = canvas.getContext('2d');
            g.drawImage(img, 0, 0);
            const px = g.getImageData(0, 0, img.width, img.height).data;
            const colors = new Set();
            let sum = 0, sq = 0, n = 0, dark = 0, top = 0;
            for (let i = 0; i < px.length; i += 4) {
                const lum = 0.299 * px[i] + 0.587 * px[i + 1] + 0.114 * px[i + 2];
                sum += lum; sq += lum * lum; n++;
                colors.add((px[i] << 16) | (px[i + 1] << 8) | px[i + 2]);
                const y = Math.floor(i / 4 / img.width);
                if (y >= 2 && y < 30) { top++; if (lum < 80) dark++; }
            }
            const mean = sum / n;
            return {colors: colors.size, deviation: Math.sqrt(sq / n - mean * mean), dark_top: dark / top,
                    width: img.width, height: img.height};
        }""", base64.b64encode(png).decode())
    finally:
        page.close()


# -- one queue ----------------------------------------------------------------------------------


def test_queue_page_browses_pages_of_messages_and_purge_empties_it(console):
    handle = console.handle
    send_all(handle, "/queue/qp.browse", [f"body-{i:02d}" for i in range(25)], color="red")
    console.open("queues/qp.browse")
    page = console.page
    page.wait_for_selector("main section.queue[data-browsed]")
    wait_text(console.field("messages"), "25")
    bodies = page.locator("table.browse tbody td.body").all_inner_texts()
    assert bodies == [f"body-{i:02d}" for i in range(20)]  # the first page, oldest first
    assert "color: red" in page.locator("table.browse tbody td.headers").first.inner_text()
    # The next page, from the answer's "next"; back again.
    page.get_by_role("button", name="Next ›").click()
    page.wait_for_function("() => document.querySelector('table.browse tbody td.body')?.textContent === 'body-20'")
    assert page.locator("table.browse tbody td.body").all_inner_texts() == [f"body-{i:02d}" for i in range(20, 25)]
    assert page.get_by_role("button", name="Next ›").is_disabled()
    page.get_by_role("button", name="‹ Previous").click()
    page.wait_for_function("() => document.querySelector('table.browse tbody td.body')?.textContent === 'body-00'")
    # A message's details: its whole body and headers.
    page.locator("table.browse tbody tr[data-id] button.link").first.click()
    assert "color: red" in page.locator("table.browse tr.detail:not([hidden])").inner_text()
    assert handle.queue_depth("queue://qp.browse") == 25  # browsing consumed nothing

    page.get_by_role("button", name="Purge…").click()
    console.confirm()
    assert "Purged 25 messages from queue://qp.browse" in console.note("ok", "Purged")
    assert handle.queue_depth("queue://qp.browse") == 0
    wait_text(console.field("ready"), "0")
    page.wait_for_selector("table.browse tr.empty")


def test_send_from_the_queue_page_reaches_a_stomp_consumer(console):
    console.api("PUT", "/api/v1/queues/qp.send")
    console.open("queues/qp.send")
    page = console.page
    page.locator("details.send-panel summary").click()
    page.fill("details.send-panel textarea[name=body]", "sent from the console")
    page.fill("details.send-panel textarea[name=headers]", "x-origin: console\ncolor = blue")
    page.select_option("details.send-panel select[name=priority]", "7")
    page.locator("details.send-panel button[type=submit]").click()
    text = console.note("ok", "Sent ID:")
    assert "to queue://qp.send (persistent)" in text
    page.wait_for_function("() => document.querySelector('table.browse tbody td.body')?.textContent === 'sent from the console'")
    assert console.handle.queue_depth("queue://qp.send") == 1
    conn, got = connect(console.handle)
    conn.subscribe("/queue/qp.send", id="s")
    (message,) = got.wait_for(1)
    assert message.body == "sent from the console"
    assert message.headers["x-origin"] == "console" and message.headers["color"] == "blue"
    assert message.headers["priority"] == "7" and message.headers["persistent"] == "true"
    disconnect(conn)


def test_move_to_a_bad_name_shows_the_apis_error_and_a_good_one_moves(console):
    handle = console.handle
    send_all(handle, "/queue/qp.move", ["one", "two", "three"])
    console.open("queues/qp.move")
    page = console.page
    page.wait_for_selector("main section.queue[data-browsed]")
    page.locator("details.move-panel summary").click()
    page.fill("details.move-panel input[name=to]", "topic://elsewhere")  # not a queue
    page.locator("details.move-panel button[type=submit]").click()
    console.confirm()
    text = console.note("error", "field 'to'")
    assert text.startswith("Error: POST /api/v1/queues/qp.move/move: field 'to'"), text
    assert handle.queue_depth("queue://qp.move") == 3
    # The same message the API gives a script.
    request = urllib.request.Request(f"{console.base}/api/v1/queues/qp.move/move", data=b'{"to": "topic://elsewhere"}', method="POST")
    try:
        urllib.request.urlopen(request, timeout=10)
        raise AssertionError("the API moved messages to a topic")
    except urllib.error.HTTPError as exc:
        assert json.loads(exc.read())["error"] in text
    page.locator("#messages .note.error button.close").click()
    assert page.locator("#messages .note.error").count() == 0

    # Move the selected message only: the second.
    page.locator('table.browse tbody tr[data-id] input[type=checkbox]').nth(1).check()
    page.fill("details.move-panel input[name=to]", "qp.moved")
    page.get_by_role("button", name="Move selected (1)").click()
    assert "Moved 1 messages from queue://qp.move to queue://qp.moved" in console.note("ok", "Moved 1")
    assert handle.queue_bodies("queue://qp.moved") == [b"two"]
    assert handle.queue_bodies("queue://qp.move") == [b"one", b"three"]


def test_dlq_replay_selected_then_all_sends_dead_letters_home(console):
    handle = console.handle
    dead_letter(handle, "qp.dead", 3)
    assert handle.queue_depth(DLQ) == 3 and handle.queue_depth("queue://qp.dead") == 0
    console.open("queues/DLQ")
    page = console.page
    page.wait_for_selector("main section.queue[data-browsed]")
    page.wait_for_selector("main .title-row .badge.dlq:not([hidden])")
    assert page.locator("table.browse tbody tr[data-id]").count() == 3
    page.locator("table.browse tbody tr[data-id] input[type=checkbox]").first.check()
    page.get_by_role("button", name="Replay selected (1)").click()
    assert "Replayed 1 messages from queue://DLQ" in console.note("ok", "Replayed 1")
    assert handle.queue_depth("queue://qp.dead") == 1 and handle.queue_depth(DLQ) == 2
    page.wait_for_function("() => document.querySelectorAll('table.browse tbody tr[data-id]').length === 2")
    page.get_by_role("button", name="Replay all").click()
    console.confirm()
    console.note("ok", "Replayed 2")
    assert handle.queue_depth("queue://qp.dead") == 3 and handle.queue_depth(DLQ) == 0
    assert sorted(handle.queue_bodies("queue://qp.dead")) == [b"qp.dead-0", b"qp.dead-1", b"qp.dead-2"]
    page.wait_for_selector("table.browse tr.empty")
    # The queues list marks the DLQ.
    console.open("queues?filter=DLQ")
    assert console.row("DLQ").locator(".badge.dlq").inner_text() == "DLQ"


# -- connections --------------------------------------------------------------------------------


def test_connections_page_lists_a_client_and_closing_it_tells_the_client_why(console):
    victim, got = connect(console.handle, client_id="console-victim")
    victim.send("/queue/cx.q", "hello")
    sync(victim, got)
    console.open("connections")
    page = console.page
    page.fill("input.filter", "console-victim")
    page.wait_for_function("() => document.querySelectorAll('main tbody tr[data-key]').length === 1")
    row = page.locator("main tbody tr[data-key]")
    conn_id = row.get_attribute("data-key")
    assert row.locator('td[data-col="client_id"]').inner_text() == "console-victim"
    assert row.locator('td[data-col="protocol"]').inner_text() == "STOMP 1.2"
    assert row.locator('td[data-col="messages_in"]').inner_text() == "1"
    row.get_by_role("button", name="Close…").click()
    console.confirm("maintenance window")
    assert f"Closed {conn_id}: maintenance window" in console.note("ok", "Closed")
    assert got.disconnected.wait(5)
    assert [e.headers.get("message") for e in got.errors] == ["maintenance window"]
    page.wait_for_selector("main tbody tr.empty")


def test_connections_page_names_protocols_as_people_know_them(console):
    """``mqtt/4`` is MQTT 3.1.1 to its users: the column shows that; the API keeps its machine value."""
    from websockets.sync.client import connect as ws_connect

    from protocols.stomp.codec import StompDecoder, encode_frame

    handle = console.handle
    stomp_conn, _ = connect(handle, client_id="proto-stomp")
    devices = [mqtt_connect(handle, f"proto-v{v}", version=v)[0] for v in (3, 4, 5)]
    stack = contextlib.ExitStack()
    try:
        ws = stack.enter_context(ws_connect(f"ws://127.0.0.1:{handle.ws_port}/", subprotocols=["v12.stomp"]))
        ws.send(encode_frame("CONNECT", [("accept-version", "1.2"), ("host", "x"), ("client-id", "proto-ws")]).decode())
        data = ws.recv(timeout=5)
        assert StompDecoder(version="1.2").feed(data.encode() if isinstance(data, str) else data)[0].command == "CONNECTED"
        console.open("connections?filter=proto-")
        page = console.page
        page.wait_for_function("() => document.querySelectorAll('main tbody tr[data-key]').length === 5")
        shown = dict(zip(page.locator('main tbody td[data-col="client_id"]').all_inner_texts(),
                         page.locator('main tbody td[data-col="protocol"]').all_inner_texts()))
        assert shown == {
            "proto-stomp": "STOMP 1.2", "proto-v3": "MQTT 3.1", "proto-v4": "MQTT 3.1.1", "proto-v5": "MQTT 5.0",
            "proto-ws": "STOMP 1.2 over WebSocket",
        }
        api = console.api("GET", "/api/v1/connections?filter=proto-")["connections"]
        assert {c["client_id"]: c["protocol"] for c in api} == {
            "proto-stomp": "stomp/1.2", "proto-v3": "mqtt/3", "proto-v4": "mqtt/4", "proto-v5": "mqtt/5", "proto-ws": "stomp/1.2",
        }
        # The filter finds people's names too.
        console.open("connections?filter=MQTT%203.1.1")
        page.wait_for_function("() => document.querySelectorAll('main tbody tr[data-key]').length === 1")
        assert page.locator('main tbody td[data-col="client_id"]').inner_text() == "proto-v4"
    finally:
        stack.close()
        disconnect(stomp_conn)
        for device in devices:
            mqtt_close(device)


# -- topics, durable subscriptions, MQTT sessions ---------------------------------------------------


def test_topics_durable_subscriptions_and_mqtt_sessions_are_listed(console):
    subscriber = stomp.Connection12([(console.handle.host, console.handle.port)])
    got = Collector()
    subscriber.set_listener("c", got)
    subscriber.connect(wait=True, headers={"client-id": "console-durable"})
    subscriber.subscribe("/topic/tp.news", id="d", headers={"activemq.subscriptionName": "news"})
    sync(subscriber, got)
    device, device_got = mqtt_connect(console.handle, "console-mqtt", version=4, clean=False)
    device.subscribe("tp/sensors/#", qos=1)
    device_got.wait_for(1, what="subacks")

    console.open("topics")
    assert console.cells("tp.news", ["subscriptions", "durable", "consumers"]) == {"subscriptions": "1", "durable": "1", "consumers": "1"}
    assert console.row("tp.sensors.>").count() == 1
    console.open("durable")
    assert console.cells("console-durable:news", ["client_id", "sub_name", "destination", "active"]) == {
        "client_id": "console-durable", "sub_name": "news", "destination": "topic://tp.news", "active": "yes"}
    console.open("mqtt")
    assert console.cells("console-mqtt", ["persistent", "connected", "subscriptions"]) == {
        "persistent": "yes", "connected": "yes", "subscriptions": "topic://tp.sensors.>"}

    # Gone from the broker, the durable subscription can be deleted from its page.
    disconnect(subscriber)
    console.open("durable")
    console.row("console-durable:news").get_by_role("button", name="Delete…").click()
    console.confirm()
    console.note("ok", "Deleted durable subscription console-durable:news")
    console.page.wait_for_selector('main tbody tr[data-key="console-durable:news"]', state="detached")
    mqtt_close(device)


# -- with users -------------------------------------------------------------------------------


def test_with_users_the_console_asks_for_a_login_and_uses_it_for_the_api(chromium, tmp_path):
    # Imported here: without playwright the chromium fixture skips the test instead of the module failing.
    from playwright.sync_api import Error as PlaywrightError

    handle = BrokerHandle(auth_config(tmp_path))
    try:
        url = f"http://127.0.0.1:{handle.admin_port}/console/#/"
        # Without credentials the browser is challenged (Basic) and, having none to give, shows nothing.
        anonymous = chromium.new_context(viewport=VIEWPORT)
        with pytest.raises(PlaywrightError, match="ERR_INVALID_AUTH_CREDENTIALS"):
            anonymous.new_page().goto(url)
        anonymous.close()
        # alice administers queues and topics, not broker://overview: the page loads, the API says why not.
        alice = chromium.new_context(viewport=VIEWPORT, http_credentials={"username": "alice", "password": PASSWORDS["alice"]})
        page = alice.new_page()
        assert page.goto(url).status == 200
        page.locator("#messages .note.error", has_text="may not admin broker://overview").wait_for(timeout=10_000)
        send_all(handle, "/queue/secure.q", ["s1", "s2"], user="alice")
        page.goto(url.replace("#/", "#/queues"))
        page.wait_for_selector('main tbody tr[data-key="secure.q"]')
        assert page.locator('main tbody tr[data-key="secure.q"] td[data-col="messages"]').inner_text() == "2"
        alice.close()
        # Credentials in the address (http://alice:...@host/console/): the page's API calls must not carry them.
        typed = chromium.new_context(viewport=VIEWPORT)
        page = typed.new_page()
        page.goto(url.replace("http://", f"http://alice:{PASSWORDS['alice']}@").replace("#/", "#/queues"))
        page.wait_for_selector('main tbody tr[data-key="secure.q"]')
        typed.close()
    finally:
        handle.stop()
