"""The WebSocket listener from Python: subprotocols, framing edge cases, limits, close codes."""
from __future__ import annotations

import base64
import os
import socket
import time

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect

from protocols.mqtt import codec as mq
from protocols.stomp.codec import StompDecoder, encode_frame
from tests.support import (
    BrokerHandle,
    connect,
    disconnect,
    make_config,
    mqtt_close,
    mqtt_connect,
)


def url(broker):
    return f"ws://127.0.0.1:{broker.ws_port}/"


def stomp_frames(ws, count, timeout=5.0):
    decoder = StompDecoder(version="1.2")
    frames = []
    deadline = time.monotonic() + timeout
    while len(frames) < count:
        data = ws.recv(timeout=max(0.01, deadline - time.monotonic()))
        frames.extend(decoder.feed(data.encode() if isinstance(data, str) else data))
    return frames


def stomp_connect(ws):
    ws.send(encode_frame("CONNECT", [("accept-version", "1.2"), ("host", "x")]).decode())
    (connected,) = stomp_frames(ws, 1)
    assert connected.command == "CONNECTED"


@pytest.mark.parametrize("offered", [["foo"], [], ["stomp", "mqttv5"]])
def test_unspoken_subprotocol_is_refused_with_http_400(broker, offered):
    with pytest.raises(InvalidStatus) as info:
        ws_connect(url(broker), subprotocols=offered or None)
    assert info.value.response.status_code == 400
    # Either way the reason names what works: the subprotocols and the paths that need none.
    assert "offer one of v12.stomp" in info.value.response.reason_phrase
    assert "/ws or /stomp for STOMP, /mqtt for MQTT" in info.value.response.reason_phrase


@pytest.mark.parametrize("subprotocol", ["v10.stomp", "v11.stomp", "v12.stomp", "mqtt", "mqttv3.1"])
def test_each_subprotocol_is_accepted(broker, subprotocol):
    with ws_connect(url(broker), subprotocols=[subprotocol, "other"]) as ws:
        assert ws.subprotocol == subprotocol


def test_stomp_frames_many_per_message_and_split_across_messages(broker):
    with ws_connect(url(broker), subprotocols=["v12.stomp"]) as ws:
        stomp_connect(ws)
        sub = encode_frame("SUBSCRIBE", [("destination", "/queue/ws"), ("id", "1")])
        sends = b"".join(encode_frame("SEND", [("destination", "/queue/ws")], f"m{i}".encode()) for i in range(3))
        ws.send(sub + sends)  # one binary message, four frames
        split = encode_frame("SEND", [("destination", "/queue/ws"), ("content-length", "2")], b"m3")
        ws.send(split[:7])
        ws.send(split[7:20].decode())  # text this time
        ws.send(split[20:])
        frames = stomp_frames(ws, 4)
        assert [f.body for f in frames] == [b"m0", b"m1", b"m2", b"m3"]


def test_stomp_text_frames_out_and_binary_when_the_body_is_not_utf8(broker):
    with ws_connect(url(broker), subprotocols=["v12.stomp"]) as ws:
        stomp_connect(ws)
        ws.send(encode_frame("SUBSCRIBE", [("destination", "/queue/b"), ("id", "1")]))
        producer, _ = connect(broker)
        producer.send("/queue/b", "text body")
        producer.send("/queue/b", b"\xff\x00\xfe", headers={"content-type": "application/octet-stream"})
        first, second = ws.recv(5), ws.recv(5)
        assert isinstance(first, str) and first.endswith("text body\x00")
        assert isinstance(second, bytes) and second.endswith(b"\xff\x00\xfe\x00")
        disconnect(producer)


def test_garbage_stomp_gets_error_and_protocol_error_close(broker):
    with ws_connect(url(broker), subprotocols=["v12.stomp"]) as ws:
        stomp_connect(ws)
        ws.send("NOT A COMMAND\nno colon here\n\n\x00")
        (error,) = stomp_frames(ws, 1)
        assert error.command == "ERROR"
        with pytest.raises(ConnectionClosed):
            ws.recv(5)
        assert ws.close_code == 1002
    # Nobody else noticed.
    with ws_connect(url(broker), subprotocols=["v12.stomp"]) as ws:
        stomp_connect(ws)


def test_mqtt_packets_split_and_coalesced_across_messages(broker):
    device, got = mqtt_connect(broker, "tcp-device")
    device.subscribe("ws/#", qos=1)
    got.wait_for(1, what="subacks")
    with ws_connect(url(broker), subprotocols=["mqtt"]) as ws:
        connect_packet = mq.encode(mq.Connect("MQTT", 4, True, 30, "ws-client"), 4)
        ws.send(connect_packet[:5])
        ws.send(connect_packet[5:])
        decoder = mq.MqttDecoder(level=4, server=False)
        (connack,) = decoder.feed(ws.recv(5))
        assert connack.reason_code == 0
        publishes = b"".join(mq.encode(mq.Publish(f"ws/{i}", f"p{i}".encode(), qos=1, packet_id=i + 1), 4) for i in range(3))
        ws.send(publishes[:10])
        ws.send(publishes[10:])
        acks = []
        while len(acks) < 3:
            acks.extend(decoder.feed(ws.recv(5)))
        assert sorted(a.packet_id for a in acks) == [1, 2, 3]
    assert sorted(m.payload for m in got.wait_for(3)) == [b"p0", b"p1", b"p2"]
    mqtt_close(device)


def test_mqtt_garbage_inside_a_valid_message_closes_only_that_client(broker):
    with ws_connect(url(broker), subprotocols=["mqtt"]) as ws:
        ws.send(mq.encode(mq.Connect("MQTT", 5, True, 30, "ws-v5"), 5))
        decoder = mq.MqttDecoder(level=5, server=False)
        decoder.feed(ws.recv(5))
        ws.send(b"\x30\xff\xff\xff\xff\x01")  # malformed remaining length
        (disconnect_packet,) = decoder.feed(ws.recv(5))
        assert disconnect_packet.reason_code == mq.ReasonCode.MALFORMED_PACKET
        with pytest.raises(ConnectionClosed):
            ws.recv(5)
        assert ws.close_code == 1002
    other, _ = mqtt_connect(broker, "still-fine")
    mqtt_close(other)


@pytest.fixture
def small(tmp_path):
    config = make_config(tmp_path)
    config.ws_settings.max_message_size = 1024
    config.ws_settings.ping_interval = 0.5
    config.ws_settings.ping_timeout = 0.5
    config.ws_settings.allowed_origins = ["http://app.example"]
    handle = BrokerHandle(config)
    yield handle
    handle.stop()


def test_oversize_message_closes_with_1009(small):
    with ws_connect(url(small), subprotocols=["v12.stomp"], origin="http://app.example") as ws:
        stomp_connect(ws)
        ws.send(b"x" * 5000)
        with pytest.raises(ConnectionClosed):
            ws.recv(5)
        assert ws.close_code == 1009


def test_allowed_origins(small):
    with pytest.raises(InvalidStatus) as info:
        ws_connect(url(small), subprotocols=["v12.stomp"], origin="http://evil.example")
    assert info.value.response.status_code == 400
    assert "not allowed" in info.value.response.reason_phrase
    with pytest.raises(InvalidStatus) as info:
        ws_connect(url(small), subprotocols=["v12.stomp"], origin="null")  # a file:// page
    assert info.value.response.status_code == 400
    with ws_connect(url(small), subprotocols=["v12.stomp"], origin="http://app.example") as ws:
        stomp_connect(ws)


def test_a_page_opened_from_a_file_connects_where_any_origin_is_allowed(broker):
    """A browser sends "Origin: null" for a file:// page: allowed by "*" (the default), as
    a first page tried from disk needs (test_allowed_origins: refused where origins are listed)."""
    with ws_connect(url(broker), subprotocols=["v12.stomp"], origin="null") as ws:
        stomp_connect(ws)


def _raw_handshake(port, origin="http://app.example"):
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((
        f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: v12.stomp\r\n"
        f"Origin: {origin}\r\n\r\n"
    ).encode())
    response = b""
    while b"\r\n\r\n" not in response:
        response += sock.recv(4096)
    assert b" 101 " in response.split(b"\r\n", 1)[0], response
    return sock, response.split(b"\r\n\r\n", 1)[1]


def _read_frames(sock, buffer, until):
    """Unmasked server frames as (opcode, payload) until the deadline; None marks a closed socket."""
    frames = []
    sock.settimeout(0.1)
    while time.monotonic() < until:
        try:
            chunk = sock.recv(4096)
        except socket.timeout:
            if frames:
                return frames, buffer
            continue
        except ConnectionResetError:  # autobahn aborts a connection whose pong is late
            return frames + [None], buffer
        if not chunk:
            return frames + [None], buffer
        more, buffer = _parse(buffer + chunk)
        frames += more
    return frames, buffer


def _parse(buffer):
    """The whole (small, unmasked) server frames at the start of ``buffer``, and what is left of it."""
    frames = []
    while len(buffer) >= 2 and len(buffer) >= 2 + (buffer[1] & 0x7F):
        length = buffer[1] & 0x7F
        frames.append((buffer[0] & 0x0F, buffer[2:2 + length]))
        buffer = buffer[2 + length:]
    return frames, buffer


def test_server_pings_and_a_peer_that_pongs_stays(small):
    sock, buffer = _raw_handshake(small.ws_port)
    pings = 0
    until = time.monotonic() + 2.5
    while time.monotonic() < until:
        frames, buffer = _read_frames(sock, buffer, until)
        assert None not in frames, "dropped although it answered every ping"
        for opcode, payload in frames:
            if opcode == 0x9:
                pings += 1
                mask = os.urandom(4)
                masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
                sock.sendall(bytes([0x8A, 0x80 | len(payload)]) + mask + masked)
    assert pings >= 2
    sock.close()


def test_a_peer_that_never_pongs_is_dropped(small):
    sock, buffer = _raw_handshake(small.ws_port)
    until = time.monotonic() + 5
    seen = []
    while time.monotonic() < until and None not in seen:
        frames, buffer = _read_frames(sock, buffer, until)
        seen.extend(frames)
    assert None in seen, "a peer that never answers pings must be dropped"
    sock.close()


def _send_masked(sock, opcode, payload):
    mask = os.urandom(4)
    assert len(payload) < 126
    sock.sendall(bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))


def test_a_peer_that_never_answers_the_close_frame_gets_the_whole_second(small):
    # The broker starts the close (here for a protocol error): the ERROR and the Close
    # frame arrive, and only a full CLOSE_TIMEOUT later is the connection dropped.
    # autobahn's own timer rounded to whole seconds and dropped anywhere from 0 to 1 s.
    sock, buffer = _raw_handshake(small.ws_port)
    _send_masked(sock, 0x1, b"NOT-A-COMMAND\n\n\x00")
    sock.settimeout(5)
    seen, close_at = [], None
    while None not in seen:  # each read timed as it returns: the Close frame's arrival, then the drop's
        try:
            chunk = sock.recv(4096)
        except ConnectionResetError:
            chunk = b""
        arrived = time.monotonic()
        if not chunk:
            seen.append(None)
            break
        frames, buffer = _parse(buffer + chunk)
        if close_at is None and any(f[0] == 0x8 for f in frames):
            close_at = arrived
        seen.extend(frames)
    dropped_after = time.monotonic() - close_at
    texts = [payload for opcode, payload in (f for f in seen if f is not None) if opcode == 0x1]
    assert texts and texts[0].startswith(b"ERROR\n"), seen
    assert [p[:2] for o, p in (f for f in seen if f is not None) if o == 0x8] == [(1002).to_bytes(2, "big")]
    # Dropped (a read waits 5 s at most), and not before the whole second: the lower bound is the
    # point, and no slow machine can break it.
    assert seen[-1] is None and dropped_after >= 0.9, dropped_after
    sock.close()


def test_pong_keeps_the_connection(small):
    with ws_connect(url(small), subprotocols=["v12.stomp"], origin="http://app.example") as ws:  # answers pings itself
        stomp_connect(ws)
        time.sleep(1.5)  # the broker's own timer under test: three ping intervals, past the ping timeout
        ws.send(encode_frame("SUBSCRIBE", [("destination", "/queue/alive"), ("id", "1"), ("receipt", "r")]))
        (receipt,) = stomp_frames(ws, 1)
        assert receipt.command == "RECEIPT"


def test_shutdown_closes_with_going_away(tmp_path):
    handle = BrokerHandle(make_config(tmp_path))
    with ws_connect(url(handle), subprotocols=["v12.stomp"]) as ws:
        stomp_connect(ws)
        handle.stop()
        (error,) = stomp_frames(ws, 1)
        assert error.headers["message"] == "Broker shutting down"
        with pytest.raises(ConnectionClosed):
            ws.recv(5)
        assert ws.close_code == 1001
