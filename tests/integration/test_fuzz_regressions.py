"""Regression tests for what fuzzing a live broker found (``tests/integration/test_fuzz_live.py``).

Each is a minimal reproduction, shrunk from a fuzz failure, run against the
ordinary per-test ``broker``: a regression test for what is fixed, a strict
xfail for what is not (with its ``KnownBug`` entry in ``tests/fuzz_live.py``,
so that the fuzzing sets it aside meanwhile).
"""
from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from twisted.logger import formatEvent, globalLogPublisher

from protocols.mqtt import codec as mq
from tests.fuzz_live import (
    CLOSE_TIMEOUT,
    nodelay,
    read_until_close,
    ws_frame,
    ws_handshake,
)
from tests.support import BrokerHandle, RawMqtt, RawStomp


@contextlib.contextmanager
def logged_failures() -> Iterator[list[str]]:
    """Every failure event Twisted's log receives meanwhile, known bugs included."""
    events: list[str] = []

    def observer(log_event: dict[str, Any]) -> None:
        failure = log_event.get("log_failure")
        if failure is not None or log_event.get("isError"):
            events.append(formatEvent(log_event) + ("\n" + failure.getTraceback() if failure is not None else ""))

    globalLogPublisher.addObserver(observer)
    try:
        yield events
    finally:
        globalLogPublisher.removeObserver(observer)


class Opened(list):
    """Raw clients a test opened, to close after it whatever happened: ``c = opened(RawStomp(...))``."""

    def __call__(self, client: Any) -> Any:
        self.append(client)
        return client


@pytest.fixture
def opened() -> Iterator[Opened]:
    clients = Opened()
    yield clients
    for client in clients:
        client.close()


def _stomp_subscriber(handle: BrokerHandle, destination: str) -> RawStomp:
    c = nodelay(RawStomp(handle))
    c.connect("1.2")
    c.frame("SUBSCRIBE", {"destination": destination, "id": "1", "receipt": "s"})
    assert c.read().command == "RECEIPT"
    return c


def test_binary_correlation_data_reaches_stomp_subscribers(broker: BrokerHandle, opened: Opened) -> None:
    """Found by fuzzing: correlation data that is not UTF-8 made delivery to STOMP raise
    (UnicodeEncodeError) and the publisher was disconnected."""
    with logged_failures() as failures:
        stomp = opened(_stomp_subscriber(broker, "/topic/bug.corr"))
        publisher = opened(RawMqtt(broker, 5))
        assert publisher.connect("bug-pub").reason_code == 0
        # On the wire: 30 10 00 08 "bug/corr" 04 09 00 01 ff "x"
        publisher.packet(mq.Publish("bug/corr", b"x", 0, False, False, None, {"correlation_data": b"\xff"}))
        message = stomp.read(0.5)
        assert (message.command, message.body) == ("MESSAGE", b"x")
        assert not publisher.closed_by_peer(0.3), publisher.packets
    assert failures == []


def test_binary_correlation_data_in_a_retained_will(broker: BrokerHandle, opened: Opened) -> None:
    """Found by fuzzing, shrunk to: a 5.0 CONNECT with a retained will carrying correlation data
    0x85, then the connection drops without DISCONNECT.  Storing the retained will raised out of
    connectionLost: the will reached nobody and the session was never ended."""
    connect = b"\x10 \x00\x04MQTT\x05$\x00\x00\x00\x00\x05fz-m1\x04\t\x00\x01\x85\x00\x04fz/t\x00\x01\x00"
    assert mq.MqttDecoder().feed(connect)[0].will == mq.Will("fz/t", b"\x00", 0, True, {"correlation_data": b"\x85"})
    with logged_failures() as failures:
        watcher = opened(RawMqtt(broker, 5))
        assert watcher.connect("bug-watch").reason_code == 0
        watcher.packet(mq.Subscribe(1, [mq.SubscriptionRequest("fz/t", 0)]))
        assert isinstance(watcher.read(), mq.Suback)
        sock = socket.create_connection((broker.host, broker.mqtt_port), timeout=5)
        sock.sendall(connect)
        assert sock.recv(100)[:1] == b"\x20"  # CONNACK
        sock.close()  # no DISCONNECT: the will is due
        will = watcher.read(0.5)
        assert isinstance(will, mq.Publish) and will.payload == b"\x00"
    assert failures == []
    # A clean session (no expiry) ends with its connection.
    assert "fz-m1" not in broker.inspect(lambda: set(broker.gateway.mqtt_hub.clients))


def test_empty_user_property_name_is_left_out_for_stomp(broker: BrokerHandle, opened: Opened) -> None:
    """Found by fuzzing: a user property without a name became a STOMP header without a name,
    which no STOMP client can parse."""
    stomp = opened(_stomp_subscriber(broker, "/topic/bug.up"))
    publisher = opened(RawMqtt(broker, 5))
    assert publisher.connect("bug-pub").reason_code == 0
    # On the wire: 30 10 00 06 "bug/up" 06 26 00 00 00 01 "v" "x"
    publisher.packet(mq.Publish("bug/up", b"x", 0, False, False, None, {"user_properties": [("", "v")]}))
    message = stomp.read(0.5)
    assert (message.command, message.body) == ("MESSAGE", b"x")
    assert "" not in message.headers


def test_far_expiry_from_stomp_reaches_every_subscriber(broker: BrokerHandle, opened: Opened) -> None:
    """Found by fuzzing: an expiry more than 2**32 s ahead overflowed MQTT 5's
    message_expiry_interval; the exception ended the fan-out, so the STOMP subscriber after the
    MQTT one lost the message (and with a delay it escaped to the reactor)."""
    with logged_failures() as failures:
        mqtt = opened(RawMqtt(broker, 5))
        assert mqtt.connect("bug-sub").reason_code == 0
        mqtt.packet(mq.Subscribe(1, [mq.SubscriptionRequest("bug/exp", 0)]))
        assert isinstance(mqtt.read(), mq.Suback)
        stomp = opened(_stomp_subscriber(broker, "/topic/bug.exp"))
        sender = opened(nodelay(RawStomp(broker)))
        sender.connect("1.2")
        far = str(int(time.time() * 1000) + 2**33 * 1000)
        sender.frame("SEND", {"destination": "/topic/bug.exp", "expires": far, "AMQ_SCHEDULED_DELAY": "10", "receipt": "r"}, b"x")
        assert sender.read().command == "RECEIPT"
        message = stomp.read(0.5)
        assert (message.command, message.body) == ("MESSAGE", b"x")
        publish = mqtt.read(0.5)
        assert isinstance(publish, mq.Publish) and publish.payload == b"x"
        assert 0 < publish.properties["message_expiry_interval"] <= 0xFFFFFFFF
    assert failures == []


def test_websocket_write_after_close_leaves_other_clients_served(broker: BrokerHandle, opened: Opened) -> None:
    """Found by fuzzing: output for a WebSocket that autobahn had just failed raised Disconnected
    at the end of the reactor turn, which abandoned the other clients' output of that turn and
    left them never receiving anything again."""
    bystander = opened(_stomp_subscriber(broker, "/topic/bug.turn"))
    with logged_failures() as failures:
        sock = ws_handshake(broker.ws_port, "v12.stomp")
        stomp = (
            b"CONNECT\naccept-version:1.2\n\n\0"
            b"SUBSCRIBE\nid:1\ndestination:/topic/bug.other\nreceipt:r\n\n\0"  # output held for the turn's end
            b"SEND\ndestination:/topic/bug.turn\n\nhello\0"  # output for the bystander, same turn
        )
        sock.sendall(ws_frame(stomp) + b"\x00\x00")  # then an unmasked frame: autobahn fails the connection
        assert read_until_close(sock, bytearray(), CLOSE_TIMEOUT, None)
        sock.close()
        message = bystander.read(0.5)
        assert (message.command, message.body) == ("MESSAGE", b"hello")
        bystander.frame("SEND", {"destination": "/topic/bug.turn", "receipt": "again"}, b"again")
        assert {bystander.read(0.5).command, bystander.read(0.5).command} == {"MESSAGE", "RECEIPT"}
    assert failures == []


def test_correlation_data_with_nul_reaches_stomp_as_a_parseable_header(broker: BrokerHandle, opened: Opened) -> None:
    """Found by a long fuzz run: correlation data with a NUL byte became a STOMP header with a NUL
    in it, which no STOMP client can parse (and one splitting frames at NUL would cut in two)."""
    stomp = opened(_stomp_subscriber(broker, "/topic/bug.nul"))
    publisher = opened(RawMqtt(broker, 5))
    assert publisher.connect("bug-pub").reason_code == 0
    # On the wire: 30 11 00 07 "bug/nul" 06 09 00 03 61 00 62 "x"
    publisher.packet(mq.Publish("bug/nul", b"x", 0, False, False, None, {"correlation_data": b"a\x00b"}))
    message = stomp.read(0.5)
    assert (message.command, message.body) == ("MESSAGE", b"x")
    assert "\0" not in message.headers.get("correlation-id", "")
