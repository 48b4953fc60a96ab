"""The store limit: producers are held back (or refused) and resume when consumers make room."""
from __future__ import annotations

import threading

import pytest

from protocols.mqtt import codec as mq
from tests.support import RawMqtt, bodies, connect, disconnect, mqtt_close, mqtt_connect, wait_stable, wait_until

BODY = "x" * 1000
LIMIT = 40_000  # about 37 messages of 1000 bytes


def send_with_receipts(conn, got, destination, count):
    """Send persistent messages from a thread; returns the thread and the ids sent so far."""
    sent = []

    def run():
        for i in range(count):
            conn.send(destination, f"{i:04d}" + BODY, headers={"persistent": "true"}, receipt=f"r{i}")
            sent.append(i)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, sent


@pytest.mark.policy(store_limit=LIMIT, store_full_policy="block")
def test_stomp_producer_is_held_at_the_limit_and_resumes(broker):
    producer, pgot = connect(broker, "1.2")
    thread, _ = send_with_receipts(producer, pgot, "/queue/full", 120)
    held_at = wait_stable(lambda: len(pgot.receipts))
    assert 30 <= held_at < 120, f"{held_at} receipts: the producer was not held at the limit"
    assert broker.queue_depth("queue://full") <= held_at + 1

    consumer, cgot = connect(broker, "1.2")
    consumer.subscribe("/queue/full", id="c", ack="client-individual", headers={"activemq.prefetchSize": "20"})
    acked = 0

    def acked_all() -> bool:
        nonlocal acked
        for message in cgot.messages[acked:]:  # each acked as it comes: room for the held producer
            consumer.ack(message.headers["ack"])
            acked += 1
        return acked >= 120

    wait_until(acked_all, 20, lambda: f"120 messages consumed and acked, {acked} so far")
    thread.join(10)
    assert len(pgot.wait_for(120, what="receipts", timeout=10)) == 120
    assert [b[:4] for b in bodies(cgot.messages)] == [f"{i:04d}" for i in range(120)]
    disconnect(producer)
    disconnect(consumer)


@pytest.mark.policy(store_limit=LIMIT, store_full_policy="block")
def test_mqtt_publisher_is_held_at_the_limit_and_resumes(broker):
    sub, sub_got = mqtt_connect(broker, "keeper", clean=False)
    sub.subscribe("full/#", qos=1)
    sub_got.wait_for(1, what="subacks")
    mqtt_close(sub)  # its session keeps QoS 1 messages: they fill the store
    publisher, _ = mqtt_connect(broker, "pub")
    infos = [publisher.publish("full/t", f"{i:04d}".encode() + BODY.encode(), qos=1) for i in range(100)]
    acked = wait_stable(lambda: sum(i.is_published() for i in infos))
    assert 30 <= acked < 100, f"{acked} PUBACKs: the publisher was not held"
    sub, sub_got = mqtt_connect(broker, "keeper", clean=False)  # drains the session
    wait_until(lambda: all(i.is_published() for i in infos), 20,
               lambda: f"100 PUBACKs once the session drains, {sum(i.is_published() for i in infos)} so far")
    payloads = [m.payload[:4].decode() for m in sub_got.wait_for(100, timeout=10)]
    assert sorted(set(payloads)) == [f"{i:04d}" for i in range(100)]
    mqtt_close(publisher)
    mqtt_close(sub)


@pytest.mark.policy(store_limit=LIMIT, store_full_policy="fail")
def test_fail_policy_refuses_persistent_sends_with_a_clear_error(broker):
    producer, got = connect(broker, "1.2")
    for i in range(60):
        producer.send("/queue/refuse", BODY, headers={"persistent": "true"})
    (error,) = got.wait_for(1, what="errors")
    assert error.headers["message"] == "Store limit reached"
    assert 30 <= broker.queue_depth("queue://refuse") < 60
    # Non-persistent messages are not stored, so they are not limited by the store.
    other, other_got = connect(broker, "1.2")
    other.subscribe("/queue/light", id="l")
    other.send("/queue/light", "still fine")
    assert other_got.wait_for(1)[0].body == "still fine"
    disconnect(other)


@pytest.mark.policy(store_limit=LIMIT, store_full_policy="fail")
def test_fail_policy_answers_mqtt5_with_quota_exceeded(broker):
    keeper, keeper_got = mqtt_connect(broker, "keeper5", clean=False)
    keeper.subscribe("q/#", qos=1)
    keeper_got.wait_for(1, what="subacks")
    mqtt_close(keeper)
    raw = RawMqtt(broker, level=5)
    assert raw.connect("raw-pub").reason_code == 0
    codes = []
    for i in range(60):
        raw.packet(mq.Publish("q/t", BODY.encode(), qos=1, packet_id=i + 1))
        codes.append(raw.read(2).reason_code)
    assert codes[0] == 0 and codes[-1] == mq.ReasonCode.QUOTA_EXCEEDED, codes
    raw.close()


def _post_json_lines(broker, rows: list[dict]) -> tuple[int, dict]:
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"http://127.0.0.1:{broker.admin_port}/api/v1/messages",
        data=b"".join(json.dumps(r).encode() + b"\n" for r in rows),
        headers={"Content-Type": "application/x-ndjson"}, method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


@pytest.mark.policy(store_limit=LIMIT, store_full_policy="block")
def test_http_publish_waits_for_room_and_is_answered_even_when_refused_then(broker):
    """A POST held by a full store is answered once there is room: 200 when routed,
    the refusal (here: its temporary queue's owner left meanwhile) when not -- never left hanging."""
    producer, _ = connect(broker, "1.2")
    for i in range(60):
        producer.send("/queue/full", BODY, headers={"persistent": "true"})
    wait_stable(lambda: broker.queue_depth("queue://full"))
    owner, owner_got = connect(broker, "1.2")
    owner.subscribe("/temp-queue/replies", id="t")
    owner.send("/temp-queue/replies", "hello", receipt="r")
    owner_got.wait_for(1, what="receipts")
    (hello,) = owner_got.wait_for(1)
    temp = hello.headers["destination"]
    answers: list[tuple[int, dict]] = []
    held = threading.Thread(target=lambda: answers.append(_post_json_lines(broker, [
        {"destination": temp, "body": "late", "persistent": True},
    ])))
    ok = threading.Thread(target=lambda: answers.append(_post_json_lines(broker, [
        {"destination": "/queue/later", "body": "b", "persistent": True},
    ])))
    def waiting_for_space() -> int:
        return broker.inspect(lambda: len(broker.broker.store_usage.waiters))

    before = waiting_for_space()  # the STOMP producer's hold, if it is held
    held.start()
    wait_until(lambda: waiting_for_space() > before, what="the POST waiting for room in the store")
    assert held.is_alive(), "the POST was answered while the store is full"
    disconnect(owner)  # its temporary queue goes with it
    consumer, got = connect(broker, "1.2")
    consumer.subscribe("/queue/full", id="c")
    got.wait_for(60)
    held.join(20)
    ok.start()
    ok.join(20)
    assert not held.is_alive() and not ok.is_alive()
    status, body = answers[0]
    assert status == 400 and "does not exist" in body["error"], answers
    assert answers[1] == (200, {"accepted": 1, "duplicates": 0})
    disconnect(consumer)
    disconnect(producer)
