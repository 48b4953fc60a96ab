"""A wildcard in a name to send to, or in a queue made by name, is refused on every entry point.

``/queue/a.*`` used to get a RECEIPT and a queue literally named ``a.*`` that no
other name reaches.  The rule is the core's (``Broker.check_destination``), so
each entry point is checked here with a real client: STOMP (raw bytes and
stomp.py, plain and composite destinations, SUBSCRIBE, over TCP and
WebSocket), MQTT (a topic mapped to queues by ``[mqtt] queue_topics``) and
the admin API (publish, send, create, move).  Each test checks the exact
refusal, that no queue came into being, and that the broker goes on serving.
"""
from __future__ import annotations

import json
import urllib.parse

import pytest
import stomp
from websockets.sync.client import connect as ws_connect

from core.access import Rule
from protocols.mqtt import codec as mq
from protocols.stomp.codec import StompDecoder, encode_frame
from tests.integration.test_admin_auth import PASSWORDS, auth_config
from tests.integration.test_admin_streams import Api
from tests.support import (
    BrokerHandle,
    Collector,
    RawMqtt,
    RawStomp,
    connect,
    disconnect,
    make_config,
    sync,
)

pytestmark = pytest.mark.timeout(60)

JSON = "application/json"
NDJSON = "application/x-ndjson"


def queue_refusal(name: str, level: str, subscribe_to: str | None = None) -> str:
    """The words every entry point shows for a wildcard queue name (core/destination.py ``wildcard_send``)."""
    subscribe_to = f"the topic {name!r}" if subscribe_to is None else subscribe_to
    return (
        f"queue name {name!r} has the wildcard {level!r}, but a queue is one queue named in full: "
        f"use a plain queue name, or a topic (send to full topic names, subscribe to {subscribe_to} to receive them all)"
    )


def topic_refusal(name: str, level: str) -> str:
    return (
        f"topic name {name!r} has the wildcard {level!r}: wildcards are for subscribing; "
        f"send to a full topic name, which subscribers of {name!r} receive"
    )


def queues(handle: BrokerHandle) -> set[str]:
    return handle.inspect(lambda: set(handle.broker.queues))


def assert_serving(handle: BrokerHandle, queue: str = "/queue/wild.after") -> None:
    """A new client sends and receives: the refusal cost only the refused connection."""
    conn, got = connect(handle)
    conn.subscribe(queue, id="after")
    conn.send(queue, "still here")
    assert got.wait_for(1)[0].body == "still here"
    disconnect(conn)


@pytest.fixture(scope="module")
def handle(tmp_path_factory):
    config = make_config(tmp_path_factory.mktemp("wildcards"), max_redeliveries=0, redelivery_delay_ms=0)
    config.mqtt_settings.queue_topics = ["jobs/#"]
    handle = BrokerHandle(config)
    yield handle
    handle.stop()


# -- STOMP ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("destination", "canonical", "level"), [
    ("/queue/a.*", "queue://a.*", "*"),
    ("/queue/b.>", "queue://b.>", ">"),
    ("/queue/orders.*.eu", "queue://orders.*.eu", "*"),
])
def test_stomp_send_to_a_wildcard_queue_is_an_error_with_the_receipt_id(handle, destination, canonical, level):
    before = queues(handle)
    raw = RawStomp(handle)
    raw.connect()
    raw.frame("SEND", {"destination": destination, "receipt": "r-1", "persistent": "true"}, b"x")
    error = raw.expect_error_and_close()
    expected = queue_refusal(canonical[len("queue://"):], level)
    assert error.headers["message"] == expected
    assert error.headers["receipt-id"] == "r-1"
    assert error.body.decode() == f"SEND refused: {expected}"
    assert raw.frames == []  # the ERROR came first and was the last: no RECEIPT before or after it
    assert queues(handle) == before and canonical not in queues(handle)
    assert_serving(handle)


@pytest.mark.parametrize(("destination", "refused", "level"), [
    ("/queue/wild.ok1,/queue/a.*", "a.*", "*"),
    ("/queue/wild.ok2,b.>", "b.>", ">"),  # the second part is a queue too: it has the type of the first
])
def test_stomp_composite_with_a_wildcard_part_sends_to_no_part(handle, destination, refused, level):
    raw = RawStomp(handle)
    raw.connect()
    raw.frame("SEND", {"destination": destination, "receipt": "r-2"}, b"x")
    error = raw.expect_error_and_close()
    assert error.headers["message"] == queue_refusal(refused, level)
    first = destination.split(",")[0].replace("/queue/", "queue://")
    assert first not in queues(handle) and f"queue://{refused}" not in queues(handle)  # all or none
    assert_serving(handle)


def test_stomp_send_to_a_wildcard_topic_says_what_to_send_to(handle):
    raw = RawStomp(handle)
    raw.connect()
    raw.frame("SEND", {"destination": "/topic/prices.*"}, b"x")
    error = raw.expect_error_and_close()
    assert error.headers["message"] == topic_refusal("prices.*", "*")
    assert_serving(handle)


def test_stomp_py_producer_gets_the_error_and_no_queue_is_made(handle):
    conn, got = connect(handle)
    conn.send("/queue/reports.>", "x", headers={"receipt": "r-3"})
    (error,) = got.wait_for(1, what="errors")
    assert error.headers["message"] == queue_refusal("reports.>", ">")
    assert got.receipts == []
    assert got.disconnected.wait(5)
    assert "queue://reports.>" not in queues(handle)
    disconnect(conn)
    assert_serving(handle)


def test_stomp_subscribe_to_a_wildcard_queue_is_refused_and_makes_no_queue(handle):
    raw = RawStomp(handle)
    raw.connect()
    raw.frame("SUBSCRIBE", {"destination": "/queue/work.*", "id": "s", "receipt": "r-4"})
    error = raw.expect_error_and_close()
    assert error.headers["message"] == queue_refusal("work.*", "*")
    assert error.headers["receipt-id"] == "r-4"
    assert "queue://work.*" not in queues(handle)
    assert_serving(handle)


def test_a_virtual_topics_wildcard_consumer_queue_is_still_a_queue(handle):
    """``Consumer.A.VirtualTopic.>`` is the one queue whose name holds a wildcard: its filter."""
    conn, got = connect(handle)
    conn.subscribe("/queue/Consumer.W.VirtualTopic.>", id="w")
    sync(conn, got)
    conn.send("/topic/VirtualTopic.wild", "copied")
    assert got.wait_for(1)[0].body == "copied"
    disconnect(conn)


def test_stomp_over_websocket_gets_the_same_error(handle):
    with ws_connect(f"ws://127.0.0.1:{handle.ws_port}/", subprotocols=["v12.stomp"]) as ws:
        decoder = StompDecoder(version="1.2")
        ws.send(encode_frame("CONNECT", [("accept-version", "1.2"), ("host", "x")]).decode())
        ws.send(encode_frame("SEND", [("destination", "/queue/ws.*"), ("receipt", "r-5")], b"x").decode())
        frames = []
        while len(frames) < 2:
            data = ws.recv(timeout=5)
            frames.extend(decoder.feed(data.encode() if isinstance(data, str) else data))
    assert [f.command for f in frames] == ["CONNECTED", "ERROR"]
    assert frames[1].headers["message"] == queue_refusal("ws.*", "*")
    assert "queue://ws.*" not in queues(handle)
    assert_serving(handle)


def test_the_wildcard_is_named_before_access_is_checked(tmp_path):
    """With users, a producer is told about its wildcard, not that it may not create ``a.*``."""
    config = auth_config(tmp_path)
    config.auth.rules = [*config.auth.rules, Rule.parse("user:bob", "allow", ["write"], ["queue://>"])]
    secured = BrokerHandle(config)
    try:
        conn = stomp.Connection12([(secured.host, secured.port)])
        got = Collector()
        conn.set_listener("c", got)
        conn.connect("bob", PASSWORDS["bob"], wait=True)
        conn.send("/queue/a.*", "x")
        (error,) = got.wait_for(1, what="errors")
        assert error.headers["message"] == queue_refusal("a.*", "*")
        assert "queue://a.*" not in queues(secured)
    finally:
        secured.stop()


# -- MQTT: a topic mapped to a queue ([mqtt] queue_topics) -------------------------------------------


def test_mqtt_topic_mapped_to_a_queue_cannot_carry_a_stomp_wildcard(handle):
    """``jobs/#`` maps to queues: ``jobs/*`` would be ``queue://jobs.*``; 5.0 is told 0x90, and nothing is made."""
    raw = RawMqtt(handle, level=5)
    try:
        assert raw.connect("wild-v5").reason_code == 0
        raw.packet(mq.Publish("jobs/*", b"x", qos=1, packet_id=7))
        ack = raw.read()
        assert isinstance(ack, mq.Puback) and ack.packet_id == 7 and ack.reason_code == 0x90, ack
        assert ack.properties["reason_string"] == "topic level '*' is reserved (it is a wildcard for STOMP clients)"
        # The same connection goes on: a plain job topic reaches its queue.
        raw.packet(mq.Publish("jobs/eu", b"job", qos=1, packet_id=8))
        ack = raw.read()
        assert isinstance(ack, mq.Puback) and ack.packet_id == 8 and ack.reason_code == 0, ack
    finally:
        raw.close()
    assert handle.queue_bodies("queue://jobs.eu") == [b"job"]
    assert "queue://jobs.*" not in queues(handle)

    v311 = RawMqtt(handle, level=4)
    try:
        assert v311.connect("wild-v311").reason_code == 0
        v311.packet(mq.Publish("jobs/>", b"x", qos=1, packet_id=9))
        assert v311.closed_by_peer()  # 3.1.1 has no way to say why: the connection is closed
    finally:
        v311.close()
    assert "queue://jobs.>" not in queues(handle)
    assert_serving(handle)


# -- the admin API -------------------------------------------------------------------------------


def quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def answer(api: Api, method: str, path: str, body: bytes | None = None, content_type: str | None = None):
    status, headers, data = api.call(method, path, body, content_type)
    assert headers.get("Content-Type") == "application/json", (status, data)
    return status, json.loads(data)


@pytest.mark.parametrize(("destination", "name", "level"), [
    ("/queue/a.*", "a.*", "*"), ("queue://b.>", "b.>", ">"),
])
def test_api_publish_refuses_a_wildcard_queue_and_sends_no_row(handle, destination, name, level):
    api = Api(handle)
    rows = [{"destination": "/queue/wild.api.ok", "body": "1"}, {"destination": destination, "body": "2"}]
    body = "\n".join(json.dumps(r) for r in rows).encode()
    status, doc = answer(api, "POST", "/api/v1/messages", body, NDJSON)
    assert (status, doc) == (400, {"error": f"row 1: {queue_refusal(name, level)}", "code": "bad_request"})
    assert "queue://wild.api.ok" not in queues(handle) and f"queue://{name}" not in queues(handle)
    assert_serving(handle)


def test_api_send_to_a_wildcard_queue_or_topic_is_a_400(handle):
    api = Api(handle)
    doc = json.dumps({"body": "x"}).encode()
    status, got = answer(api, "POST", f"/api/v1/queues/{quote('a.*')}/messages", doc, JSON)
    assert (status, got) == (400, {"error": queue_refusal("a.*", "*"), "code": "bad_request"})
    status, got = answer(api, "POST", f"/api/v1/topics/{quote('t.>')}/messages", doc, JSON)
    assert (status, got) == (400, {"error": topic_refusal("t.>", ">"), "code": "bad_request"})
    assert "queue://a.*" not in queues(handle)
    assert_serving(handle)


def test_api_create_refuses_a_wildcard_queue_but_makes_a_wildcard_consumer_queue(handle):
    api = Api(handle)
    status, got = answer(api, "PUT", f"/api/v1/queues/{quote('made.>')}")
    assert (status, got) == (400, {"error": queue_refusal("made.>", ">"), "code": "bad_request"})
    assert answer(api, "GET", f"/api/v1/queues/{quote('made.>')}")[0] == 404
    status, got = answer(api, "PUT", f"/api/v1/queues/{quote('Consumer.Ops.VirtualTopic.>')}")
    assert (status, got) == (201, {"destination": "queue://Consumer.Ops.VirtualTopic.>", "created": True})
    assert_serving(handle)


def test_api_move_to_a_wildcard_queue_is_a_400_and_nothing_moves(handle):
    conn, got = connect(handle)
    for body in ("m1", "m2"):
        conn.send("/queue/wild.move", body)
    sync(conn, got)
    disconnect(conn)
    api = Api(handle)
    status, doc = answer(api, "POST", "/api/v1/queues/wild.move/move", json.dumps({"to": "wild.*"}).encode(), JSON)
    assert (status, doc) == (400, {"error": f"field 'to': {queue_refusal('wild.*', '*')}", "code": "bad_request", "field": "to"})
    assert handle.queue_bodies("queue://wild.move") == [b"m1", b"m2"]
    assert "queue://wild.*" not in queues(handle)
    status, doc = answer(api, "POST", "/api/v1/queues/wild.move/move", json.dumps({"to": "wild.moved"}).encode(), JSON)
    assert (status, doc["moved"]) == (200, 2)
    assert handle.queue_bodies("queue://wild.moved") == [b"m1", b"m2"]
