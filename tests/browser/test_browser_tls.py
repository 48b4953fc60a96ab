"""@stomp/stompjs and mqtt.js over wss in headless Chromium, against a CA the browser does not know.

The page's context ignores certificate errors (Playwright's ``ignore_https_errors``,
as ``--ignore-certificate-errors`` would for the whole browser), as a browser does
once a user has accepted a test certificate; the broker's TLS is the real one.
The WebSocket TLS port asks for no client certificate (``[websocket]
tls_client_certs = "off"``): asked for one, headless Chromium cancels the
handshake, having no one to pick a certificate (a desktop browser may show a picker).
"""
from __future__ import annotations

from typing import Any, Iterator

import pytest

from tests.support import BrokerHandle, connect, disconnect, make_certificates, make_tls_config


@pytest.fixture
def tls_broker(tmp_path: Any) -> Iterator[BrokerHandle]:
    config = make_tls_config(tmp_path, make_certificates(tmp_path / "tls"))
    config.ws.tls_client_certs = "off"
    handle = BrokerHandle(config)
    yield handle
    handle.stop()


@pytest.fixture
def tls_page(chromium: Any, harness_url: str) -> Iterator[Any]:
    context = chromium.new_context(ignore_https_errors=True)
    page = context.new_page()
    page.goto(harness_url)
    page.wait_for_function("window.StompJs !== undefined && window.mqtt !== undefined")
    yield page
    context.close()


def test_stompjs_and_mqttjs_over_wss(tls_broker, tls_page):
    url = f"wss://127.0.0.1:{tls_broker.ws_tls_port}/"
    assert tls_page.evaluate("([u, d, p]) => startStomp(u, d, p)", [url, "/topic/secure", "v12.stomp"]) == "1.2"
    assert tls_page.evaluate("([u, f]) => startMqtt(u, f)", [url, "secure"]) == "ok"
    tls_page.evaluate("() => window.stomp.publish({destination: '/topic/secure', body: 'from stompjs over wss'})")
    tls_page.evaluate("() => window.mqttClient.publish('secure', 'from mqtt.js over wss', {qos: 1})")
    python, _ = connect(tls_broker)  # and a plain TCP client on the same topic
    python.send("/topic/secure", "from plain STOMP")
    tls_page.wait_for_function("window.got.length >= 6", timeout=10_000)
    got = tls_page.evaluate("window.got")
    assert sorted((m["via"], m["body"]) for m in got) == sorted(
        (via, body) for via in ("stomp", "mqtt") for body in ("from stompjs over wss", "from mqtt.js over wss", "from plain STOMP")
    )
    disconnect(python)
