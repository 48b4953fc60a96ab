"""Browser apps over WebSocket: @stomp/stompjs and mqtt.js in a real headless Chromium."""
from __future__ import annotations

import pytest

from tests.support import connect, disconnect, mqtt_close, mqtt_connect, sync


def wait_got(page, count, timeout=10.0):
    page.wait_for_function(f"window.got.length >= {count}", timeout=timeout * 1000)
    return page.evaluate("window.got")


@pytest.mark.parametrize("subprotocol, version", [("v12.stomp", "1.2"), ("v11.stomp", "1.1"), ("v10.stomp", "1.0")])
def test_stompjs_round_trip_in_the_browser(broker, page, subprotocol, version):
    url = f"ws://127.0.0.1:{broker.ws_port}/"
    negotiated = page.evaluate("([u, d, p]) => startStomp(u, d, p)", [url, "/topic/chat", subprotocol])
    assert negotiated == version
    page.evaluate("() => window.stomp.publish({destination: '/topic/chat', body: 'from the page', headers: {'x-app': 'web'}})")
    (message,) = wait_got(page, 1)
    assert message["body"] == "from the page"
    assert message["headers"]["x-app"] == "web"
    assert message["destination"] == "/topic/chat"


def test_mqttjs_round_trip_in_the_browser(broker, page):
    url = f"ws://127.0.0.1:{broker.ws_port}/"
    assert page.evaluate("([u, f]) => startMqtt(u, f)", [url, "chat/#"]) == "ok"
    page.evaluate("() => window.mqttClient.publish('chat/room1', 'hello mqtt.js', {qos: 1, properties: {userProperties: {k: 'v'}}})")
    (message,) = wait_got(page, 1)
    assert message["destination"] == "chat/room1"
    assert message["body"] == "hello mqtt.js"
    assert message["qos"] == 1
    assert message["user"] == {"k": "v"}


def test_browser_stomp_browser_mqtt_python_stomp_and_paho_all_exchange(broker, chromium, harness_url):
    """Four clients on one topic: each message reaches the other three, whichever protocol sent it."""
    url = f"ws://127.0.0.1:{broker.ws_port}/"
    context = chromium.new_context()
    stomp_page, mqtt_page = context.new_page(), context.new_page()
    for p in (stomp_page, mqtt_page):
        p.goto(harness_url)
        p.wait_for_function("window.StompJs !== undefined && window.mqtt !== undefined")
    stomp_page.evaluate("([u, d, p]) => startStomp(u, d, p)", [url, "/topic/plant.line1", "v12.stomp"])
    mqtt_page.evaluate("([u, f]) => startMqtt(u, f)", [url, "plant/line1"])
    py_stomp, py_got = connect(broker, "1.2")
    py_stomp.subscribe("/topic/plant.line1", id="py")
    sync(py_stomp, py_got)
    device, device_got = mqtt_connect(broker, "device-1", version=5)
    device.subscribe("plant/line1", qos=1)
    device_got.wait_for(1, what="subacks")  # and startMqtt resolved on its SUBACK

    stomp_page.evaluate("() => window.stomp.publish({destination: '/topic/plant.line1', body: 'A:browser-stomp'})")
    # The barrier for the page's SUBSCRIBE (sent without a receipt): its own message came back.
    wait_got(stomp_page, 1)
    mqtt_page.evaluate("() => window.mqttClient.publish('plant/line1', 'B:browser-mqtt', {qos: 1})")
    py_stomp.send("/topic/plant.line1", "C:python-stomp")
    device.publish("plant/line1", b"D:paho", qos=1).wait_for_publish(5)

    everything = {"A:browser-stomp", "B:browser-mqtt", "C:python-stomp", "D:paho"}
    assert {m["body"] for m in wait_got(stomp_page, 4)} == everything
    assert {m["body"] for m in wait_got(mqtt_page, 4)} == everything
    assert set(py_got.wait_for(4) and py_got.bodies()) == everything
    assert {m.payload.decode() for m in device_got.wait_for(4)} == everything
    assert all(m["destination"] == "plant/line1" for m in mqtt_page.evaluate("window.got"))
    disconnect(py_stomp)
    mqtt_close(device)
    context.close()


def test_binary_bodies_survive_both_ways(broker, page):
    url = f"ws://127.0.0.1:{broker.ws_port}/"
    page.evaluate("([u, d, p]) => startStomp(u, d, p)", [url, "/queue/bin", "v12.stomp"])
    page.evaluate("([u, f]) => startMqtt(u, f)", [url, "bin/#"])
    payload = bytes(range(256))
    py, _ = connect(broker, "1.2")
    py.send("/queue/bin", payload, headers={"content-type": "application/octet-stream"})
    device, _ = mqtt_connect(broker, "bin-device", version=4)
    device.publish("bin/raw", payload, qos=1).wait_for_publish(5)
    got = wait_got(page, 2)
    by_via = {m["via"]: m for m in got}
    assert by_via["stomp"]["binary"] == list(payload)
    assert by_via["mqtt"]["binary"] == list(payload)
    # And from the browser back to Python: a binary STOMP body built in the page.
    sink, sink_got = connect(broker, "1.2", auto_decode=False)  # bodies as bytes
    sink.subscribe("/queue/from-page", id="s")
    page.evaluate("""() => window.stomp.publish({destination: '/queue/from-page',
        binaryBody: new Uint8Array([...Array(256).keys()]), headers: {'content-type': 'application/octet-stream'}})""")
    (message,) = sink_got.wait_for(1)
    assert message.body == payload
    disconnect(py)
    disconnect(sink)
    mqtt_close(device)


def test_stompjs_without_subprotocol_on_the_stomp_path(broker, page):
    """A plain ``new WebSocket(url)`` (no subprotocol) on /ws: the path picks STOMP."""
    url = f"ws://127.0.0.1:{broker.ws_port}/ws"
    assert page.evaluate("([u, d]) => startStomp(u, d, null)", [url, "/topic/nosub"]) == "1.2"
    assert page.evaluate("() => window.stomp.webSocket.protocol") == ""
    page.evaluate("() => window.stomp.publish({destination: '/topic/nosub', body: 'path picked stomp'})")
    (message,) = wait_got(page, 1)
    assert message["body"] == "path picked stomp"


@pytest.mark.parametrize("no_subprotocol", [False, True], ids=["offers-mqtt", "offers-none"])
def test_mqttjs_on_the_mqtt_path(broker, page, no_subprotocol):
    """``ws://host:port/mqtt`` as users write it for RabbitMQ; mqtt.js offers "mqtt" unless made not to."""
    url = f"ws://127.0.0.1:{broker.ws_port}/mqtt"
    assert page.evaluate("([u, f, n]) => startMqtt(u, f, n)", [url, "paths/#", no_subprotocol]) == "ok"
    if no_subprotocol:
        assert page.evaluate("() => window.mqttSocket.protocol") == ""
    py, _ = connect(broker, "1.2")
    py.send("/topic/paths.mqtt", "from python stomp")
    page.evaluate("() => window.mqttClient.publish('paths/mqtt', 'from mqtt.js', {qos: 1})")
    got = wait_got(page, 2)
    assert sorted(m["body"] for m in got) == ["from mqtt.js", "from python stomp"]
    disconnect(py)


def test_a_browser_offering_nothing_on_an_unknown_path_is_refused(broker, page):
    url = f"ws://127.0.0.1:{broker.ws_port}/nope"
    code = page.evaluate("""(u) => new Promise((resolve) => {
        const ws = new WebSocket(u);
        ws.onopen = () => resolve("open");
        ws.onclose = (event) => resolve(event.code);
    })""", url)
    assert code == 1006  # browsers hide the HTTP answer; the broker's log and non-browser clients show it
