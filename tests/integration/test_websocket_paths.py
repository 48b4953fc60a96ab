"""WebSocket clients that offer no subprotocol: the path picks STOMP or MQTT.

Real clients: stomp.py's ``WSConnection`` (websocket-client underneath, no
``Sec-WebSocket-Protocol``), paho-mqtt over WebSocket (``mqtt`` by default, none
when its headers say so), and the ``websockets`` library for what the others
cannot be made to send.
"""
from __future__ import annotations

import threading

import pytest
import stomp
import websocket
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from gateway.config import ConfigError, load
from protocols.mqtt import codec as mq
from protocols.stomp.codec import encode_frame
from tests.integration.test_websocket import stomp_connect, stomp_frames
from tests.support import BrokerHandle, Collector, MqttCollector, connect, disconnect, make_config, mqtt_close, mqtt_connect


def ws_url(handle, path):
    return f"ws://127.0.0.1:{handle.ws_port}{path}"


def ws_stomp(handle, path):
    """stomp.py's own WebSocket connection: it offers no subprotocol."""
    conn = stomp.WSConnection([(handle.host, handle.ws_port)], ws_path=path, reconnect_attempts_max=1)
    got = Collector()
    conn.set_listener("collector", got)
    conn.connect(wait=True)
    return conn, got


def ws_paho(handle, path, client_id, subprotocol=True):
    """paho over WebSocket; it sends ``Sec-Websocket-Protocol: mqtt`` unless told otherwise."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311, transport="websockets")

    def without_subprotocol(headers):
        return {k: v for k, v in headers.items() if k.lower() != "sec-websocket-protocol"}

    client.ws_set_options(path=path, headers=None if subprotocol else without_subprotocol)
    got = MqttCollector()
    for name in ("on_message", "on_connect", "on_subscribe", "on_disconnect"):
        setattr(client, name, getattr(got, name))
    client.connect(handle.host, handle.ws_port, 30)
    client.loop_start()
    got.wait_for(1, what="connacks")
    return client, got


def refusal(handle, path, subprotocols=None):
    with pytest.raises(InvalidStatus) as info:
        ws_connect(ws_url(handle, path), subprotocols=subprotocols)
    response = info.value.response
    assert response.status_code == 400
    return response.reason_phrase


@pytest.mark.parametrize("path", ["/ws", "/stomp"])
def test_stomppy_wsconnection_without_subprotocol(broker, path):
    conn, got = ws_stomp(broker, path)
    conn.subscribe("/queue/ws-path", id="1", ack="auto")
    conn.send("/queue/ws-path", "over " + path, headers={"x-k": "v"})
    (message,) = got.wait_for(1)
    assert message.body == "over " + path
    assert message.headers["x-k"] == "v"
    assert not got.errors
    disconnect(conn)
    assert got.disconnected.wait(5)


def test_stomp_between_tcp_and_a_websocket_without_subprotocol(broker):
    ws, ws_got = ws_stomp(broker, "/ws")
    tcp, tcp_got = connect(broker)
    ws.subscribe("/topic/both.ways", id="ws", ack="auto")
    tcp.subscribe("/topic/both.ways", id="tcp", ack="auto")
    # A receipt per subscription: both are registered before anything is sent.
    ws.subscribe("/queue/barrier", id="b", headers={"receipt": "ws-ready"})
    ws_got.wait_for(1, what="receipts")
    tcp.subscribe("/queue/barrier", id="b", headers={"receipt": "tcp-ready"})
    tcp_got.wait_for(1, what="receipts")
    tcp.send("/topic/both.ways", "from tcp")
    ws.send("/topic/both.ways", "from ws")
    for got in (ws_got, tcp_got):
        assert sorted(m.body for m in got.wait_for(2)) == ["from tcp", "from ws"]
    disconnect(ws)
    disconnect(tcp)


def test_the_answer_names_no_subprotocol_when_none_was_offered(broker):
    with ws_connect(ws_url(broker, "/ws")) as ws:
        assert ws.subprotocol is None
        assert "Sec-WebSocket-Protocol" not in ws.response.headers  # RFC 6455 4.2.2
        stomp_connect(ws)


def test_query_string_does_not_matter_trailing_slash_does(broker):
    with ws_connect(ws_url(broker, "/ws?token=abc&x=1")) as ws:
        stomp_connect(ws)
    reason = refusal(broker, "/ws/")
    assert "path /ws/ " in reason


def test_a_subprotocol_wins_over_the_path(broker):
    """As before this change: the offered subprotocol decides, on any path."""
    with ws_connect(ws_url(broker, "/ws"), subprotocols=["mqtt"]) as ws:
        assert ws.subprotocol == "mqtt"
        ws.send(mq.encode(mq.Connect("MQTT", 4, True, 30, "mqtt-on-ws-path"), 4))
        (connack,) = mq.MqttDecoder(level=4, server=False).feed(ws.recv(5))
        assert connack.reason_code == 0
    with ws_connect(ws_url(broker, "/anything/at/all"), subprotocols=["v12.stomp"]) as ws:
        stomp_connect(ws)


def test_raw_mqtt_without_subprotocol_on_mqtt_path(broker):
    with ws_connect(ws_url(broker, "/mqtt")) as ws:
        assert ws.subprotocol is None
        ws.send(mq.encode(mq.Connect("MQTT", 5, True, 30, "raw-ws-nosub"), 5))
        decoder = mq.MqttDecoder(level=5, server=False)
        (connack,) = decoder.feed(ws.recv(5))
        assert isinstance(connack, mq.Connack) and connack.reason_code == 0
        ws.send(mq.encode(mq.Disconnect(), 5))


@pytest.mark.parametrize("subprotocol", [True, False], ids=["paho-offers-mqtt", "paho-offers-none"])
def test_paho_over_websocket_on_mqtt_path(broker, subprotocol):
    client, got = ws_paho(broker, "/mqtt", f"paho-ws-{subprotocol}", subprotocol=subprotocol)
    assert got.connacks[0][1] == 0
    client.subscribe("plant/+/temp", qos=1)
    got.wait_for(1, what="subacks")
    device, _ = mqtt_connect(broker, "tcp-device")
    device.publish("plant/l1/temp", b"21.5", qos=1).wait_for_publish(5)
    (message,) = got.wait_for(1)
    assert (message.topic, message.payload) == ("plant/l1/temp", b"21.5")
    # And out again, to a STOMP subscriber of the same topic.
    tcp, tcp_got = connect(broker)
    tcp.subscribe("/topic/plant.l1.temp", id="s", headers={"receipt": "ready"})
    tcp_got.wait_for(1, what="receipts")
    client.publish("plant/l1/temp", b"22.0", qos=1).wait_for_publish(5)
    assert [m.body for m in tcp_got.wait_for(1)] == ["22.0"]
    disconnect(tcp)
    mqtt_close(device)
    mqtt_close(client)


def test_no_subprotocol_on_an_unknown_path_is_refused_with_the_paths(broker):
    reason = refusal(broker, "/nope")
    assert reason == (
        "no WebSocket subprotocol offered and path /nope has no default protocol; "
        "connect to /ws or /stomp for STOMP, /mqtt for MQTT; or offer one of v12.stomp, v11.stomp, v10.stomp, mqtt, mqttv3.1"
    )
    assert "path / " in refusal(broker, "/")


def test_an_unknown_subprotocol_is_refused_even_on_a_known_path(broker):
    reason = refusal(broker, "/mqtt", ["mqttv5"])
    assert reason == (
        "no supported WebSocket subprotocol (offered: mqttv5); offer one of v12.stomp, v11.stomp, v10.stomp, mqtt, "
        "mqttv3.1; or offer none on /ws or /stomp for STOMP, /mqtt for MQTT"
    )


def test_stomppy_on_an_unknown_path_fails_to_connect_and_says_why(broker):
    conn = stomp.WSConnection([(broker.host, broker.ws_port)], ws_path="/nope", reconnect_attempts_max=1)
    with pytest.raises(stomp.exception.ConnectFailedException):
        conn.connect(wait=True)
    # What stomp.py logs as the cause: websocket-client's error carries the reason.
    with pytest.raises(websocket.WebSocketBadStatusException) as info:
        websocket.create_connection(ws_url(broker, "/nope"), timeout=5)
    assert info.value.status_code == 400
    assert "connect to /ws or /stomp for STOMP, /mqtt for MQTT" in str(info.value)


@pytest.fixture
def custom(tmp_path):
    config = make_config(tmp_path)
    config.ws_settings.stomp_paths = ["/broker/stomp"]
    config.ws_settings.mqtt_paths = []
    handle = BrokerHandle(config)
    yield handle
    handle.stop()


def test_configured_paths_replace_the_defaults(custom):
    conn, got = ws_stomp(custom, "/broker/stomp")
    conn.subscribe("/queue/custom", id="1")
    conn.send("/queue/custom", "custom path")
    assert got.wait_for(1)[0].body == "custom path"
    disconnect(conn)
    assert refusal(custom, "/ws").endswith("connect to /broker/stomp for STOMP; or offer one of v12.stomp, v11.stomp, v10.stomp, mqtt, mqttv3.1")
    assert refusal(custom, "/mqtt", ["x"]).endswith("; or offer none on /broker/stomp for STOMP")


def test_no_paths_means_a_subprotocol_is_required(tmp_path):
    config = make_config(tmp_path)
    config.ws_settings.stomp_paths = []
    config.ws_settings.mqtt_paths = []
    handle = BrokerHandle(config)
    try:
        assert refusal(handle, "/ws") == (
            "no WebSocket subprotocol offered and path /ws has no default protocol; "
            "offer one of v12.stomp, v11.stomp, v10.stomp, mqtt, mqttv3.1"
        )
        assert refusal(handle, "/ws", ["foo"]).endswith("offer one of v12.stomp, v11.stomp, v10.stomp, mqtt, mqttv3.1")
        with ws_connect(ws_url(handle, "/ws"), subprotocols=["v12.stomp"]) as ws:
            stomp_connect(ws)
    finally:
        handle.stop()


def test_many_clients_without_subprotocol_at_once(broker):
    """Handshakes in parallel each get their own kind (the kind is per connection)."""
    errors: list[BaseException] = []

    def one(i):
        try:
            if i % 2:
                with ws_connect(ws_url(broker, "/mqtt")) as ws:
                    ws.send(mq.encode(mq.Connect("MQTT", 4, True, 30, f"par-{i}"), 4))
                    (connack,) = mq.MqttDecoder(level=4, server=False).feed(ws.recv(5))
                    assert connack.reason_code == 0
            else:
                with ws_connect(ws_url(broker, "/stomp")) as ws:
                    ws.send(encode_frame("CONNECT", [("accept-version", "1.2"), ("host", "x")]))
                    assert stomp_frames(ws, 1)[0].command == "CONNECTED"
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors, errors


def _load(tmp_path, text):
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return load(str(path))


def test_paths_are_read_from_the_websocket_section(tmp_path):
    config = _load(tmp_path, '[websocket]\nstomp_paths = ["/ws", "/stomp/v1"]\nmqtt_paths = []\n')
    assert config.ws_settings.stomp_paths == ["/ws", "/stomp/v1"]
    assert config.ws_settings.mqtt_paths == []


@pytest.mark.parametrize("line, message", [
    ('stomp_paths = ["ws"]', "[websocket] stomp_paths: 'ws' is not a path like \"/ws\""),
    ('mqtt_paths = ["/mqtt?x=1"]', "[websocket] mqtt_paths: '/mqtt?x=1' is not a path"),
    ('mqtt_paths = ["/a b"]', "[websocket] mqtt_paths: '/a b' is not a path"),
    ('stomp_paths = [1]', "[websocket] stomp_paths: 1 is not a path"),
    ('stomp_paths = "/ws"', "[websocket] stomp_paths must be list"),
    ('mqtt_paths = ["/ws"]', "[websocket] '/ws' is in both stomp_paths and mqtt_paths"),
])
def test_bad_paths_are_config_errors(tmp_path, line, message):
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, f"[websocket]\n{line}\n")
    assert str(info.value).startswith(message), str(info.value)
