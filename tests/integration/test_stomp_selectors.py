"""JMS selectors on STOMP subscriptions (the ``selector`` header), queues and topics, with stomp.py."""
from __future__ import annotations

import pytest

from tests.support import RawStomp, bodies, sync

# (selector, messages as (body, headers), bodies the selector admits, in order)
CASES = {
    "string-equality": (
        "color = 'red'",
        [("r1", {"color": "red"}), ("b1", {"color": "blue"}), ("n1", {}), ("R1", {"color": "RED"}), ("r2", {"color": "red"})],
        ["r1", "r2"],
    ),
    "string-inequality": (
        "color <> 'red'",
        [("r1", {"color": "red"}), ("b1", {"color": "blue"}), ("n1", {})],
        ["b1"],  # an absent property is NULL: the comparison is UNKNOWN, not TRUE
    ),
    "numeric-greater": (
        "price > 5",
        [("p3", {"price": "3"}), ("p10", {"price": "10"}), ("p5", {"price": "5"}), ("p5.5", {"price": "5.5"}),
         ("pabc", {"price": "abc"}), ("none", {})],
        ["p10", "p5.5"],
    ),
    "numeric-range-and-arithmetic": (
        "qty * 2 >= 10 AND qty < 8",
        [("q4", {"qty": "4"}), ("q5", {"qty": "5"}), ("q7", {"qty": "7"}), ("q8", {"qty": "8"})],
        ["q5", "q7"],
    ),
    "like": (
        "name LIKE 'ab%' OR code LIKE 'x_z'",
        [("abc", {"name": "abc"}), ("ab", {"name": "ab"}), ("cab", {"name": "cab"}), ("xyz", {"code": "xyz"}),
         ("xz", {"code": "xz"}), ("xyyz", {"code": "xyyz"})],
        ["abc", "ab", "xyz"],
    ),
    "like-escape": (
        r"path LIKE 'a\_%' ESCAPE '\'",
        [("a_b", {"path": "a_b"}), ("axb", {"path": "axb"}), ("a_", {"path": "a_"})],
        ["a_b", "a_"],
    ),
    "not-like": (
        "name NOT LIKE '%test%'",
        [("prod", {"name": "prod-1"}), ("test", {"name": "my-test-1"}), ("none", {})],
        ["prod"],
    ),
    "in": (
        "region IN ('eu', 'us')",
        [("eu", {"region": "eu"}), ("asia", {"region": "asia"}), ("us", {"region": "us"}), ("none", {})],
        ["eu", "us"],
    ),
    "not-in": (
        "region NOT IN ('eu', 'us')",
        [("eu", {"region": "eu"}), ("asia", {"region": "asia"}), ("none", {})],
        ["asia"],
    ),
    "between": (
        "qty BETWEEN 2 AND 4",
        [("q1", {"qty": "1"}), ("q2", {"qty": "2"}), ("q3", {"qty": "3"}), ("q4", {"qty": "4"}), ("q5", {"qty": "5"})],
        ["q2", "q3", "q4"],
    ),
    "not-between": (
        "qty NOT BETWEEN 2 AND 4",
        [("q1", {"qty": "1"}), ("q3", {"qty": "3"}), ("q5", {"qty": "5"})],
        ["q1", "q5"],
    ),
    "is-null": (
        "tag IS NULL",
        [("tagged", {"tag": "x"}), ("plain", {}), ("empty", {"tag": ""})],
        ["plain"],
    ),
    "is-not-null": (
        "tag IS NOT NULL",
        [("tagged", {"tag": "x"}), ("plain", {}), ("empty", {"tag": ""})],
        ["tagged", "empty"],
    ),
    "and-or-not": (
        "(color = 'red' OR color = 'green') AND NOT (size = 'L')",
        [("red-S", {"color": "red", "size": "S"}), ("red-L", {"color": "red", "size": "L"}),
         ("green", {"color": "green"}), ("blue-S", {"color": "blue", "size": "S"})],
        ["red-S"],  # green has no size: NOT (UNKNOWN) is UNKNOWN
    ),
    "boolean-keywords-case-insensitive": (
        "kind = 'a' and not (n > 3) or kind = 'z'",
        [("a1", {"kind": "a", "n": "1"}), ("a9", {"kind": "a", "n": "9"}), ("z", {"kind": "z"})],
        ["a1", "z"],
    ),
    "jms-priority": (
        "JMSPriority > 6",
        [("p9", {"priority": "9"}), ("p4", {"priority": "4"}), ("default", {}), ("p7", {"priority": "7"})],
        ["p9", "p7"],
    ),
    "jms-delivery-mode": (
        "JMSDeliveryMode = 'PERSISTENT'",
        [("durable", {"persistent": "true"}), ("transient", {"persistent": "false"}), ("default", {})],
        ["durable"],
    ),
    "jms-correlation-id": (
        "JMSCorrelationID = 'c-2'",
        [("c1", {"correlation-id": "c-1"}), ("c2", {"correlation-id": "c-2"})],
        ["c2"],
    ),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_queue_selector(broker, client, case):
    selector, messages, expected = CASES[case]
    producer, gotp = client()
    for body, headers in messages:
        producer.send("/queue/sel", body, headers=headers)
    sync(producer, gotp)
    conn, got = client()
    conn.subscribe("/queue/sel", id="s1", headers={"selector": selector})
    if expected:
        got.wait_for(len(expected))
    received = got.settle(0.2)
    assert bodies(received) == expected  # (for jms-priority, higher priority first is also the send order)
    assert got.errors == []
    left = [b.decode() for b in broker.queue_bodies("queue://sel")]
    assert sorted(left) == sorted(body for body, _ in messages if body not in expected)


def test_non_matching_messages_stay_for_a_later_consumer(broker, client):
    conn, got = client()
    conn.subscribe("/queue/stay", id="red", headers={"selector": "color = 'red'"})
    sync(conn, got)
    producer, gotp = client()
    for body, color in [("1", "red"), ("2", "blue"), ("3", "red"), ("4", "green"), ("5", "blue")]:
        producer.send("/queue/stay", body, headers={"color": color})
    sync(producer, gotp)
    assert bodies(got.wait_for(2)) == ["1", "3"]
    assert bodies(got.settle(0.2)) == ["1", "3"]
    assert broker.queue_bodies("queue://stay") == [b"2", b"4", b"5"]

    other, got_other = client()
    other.subscribe("/queue/stay", id="all")
    assert bodies(got_other.wait_for(3)) == ["2", "4", "5"]
    producer.send("/queue/stay", "6", headers={"color": "red"})
    producer.send("/queue/stay", "7", headers={"color": "blue"})
    sync(producer, gotp)
    # Both consumers still get what they may take; nothing goes to the red-only one that is not red.
    got.settle(0.2)
    got_other.settle(0.2)
    assert all(m.headers["color"] == "red" for m in got.messages)
    assert sorted(bodies(got.messages[2:]) + bodies(got_other.messages[3:])) == ["6", "7"]
    assert broker.queue_depth("queue://stay") == 0


def test_two_selective_consumers_split_a_queue(broker, client):
    eu, got_eu = client()
    eu.subscribe("/queue/split", id="eu", headers={"selector": "region = 'eu'"})
    us, got_us = client()
    us.subscribe("/queue/split", id="us", headers={"selector": "region = 'us'"})
    sync(eu, got_eu)
    sync(us, got_us)
    for i in range(10):
        us.send("/queue/split", f"{i}", headers={"region": "eu" if i % 2 else "us"})
    sync(us, got_us)
    assert bodies(got_eu.wait_for(5)) == ["1", "3", "5", "7", "9"]
    assert bodies(got_us.wait_for(5)) == ["0", "2", "4", "6", "8"]


def test_topic_subscriptions_with_selectors(broker, client):
    cheap, got_cheap = client()
    cheap.subscribe("/topic/prices", id="cheap", headers={"selector": "price < 10"})
    dear, got_dear = client()
    dear.subscribe("/topic/prices", id="dear", headers={"selector": "price >= 10 AND currency = 'EUR'"})
    everything, got_all = client()
    everything.subscribe("/topic/prices", id="all")
    for conn, got in ((cheap, got_cheap), (dear, got_dear), (everything, got_all)):
        sync(conn, got)
    plan = [("a", "5", "EUR"), ("b", "15", "EUR"), ("c", "15", "USD"), ("d", "9.99", "USD"), ("e", "100", "EUR")]
    for body, price, currency in plan:
        everything.send("/topic/prices", body, headers={"price": price, "currency": currency})
    assert bodies(got_all.wait_for(5)) == ["a", "b", "c", "d", "e"]
    assert bodies(got_cheap.wait_for(2)) == ["a", "d"]
    assert bodies(got_dear.wait_for(2)) == ["b", "e"]
    assert bodies(got_cheap.settle(0.2)) == ["a", "d"]
    assert bodies(got_dear.settle(0.2)) == ["b", "e"]


def test_durable_subscription_with_selector_keeps_only_matching_messages(broker, client):
    conn, got = client(client_id="picky")
    headers = {"activemq.subscriptionName": "alerts", "selector": "severity IN ('high', 'critical')"}
    conn.subscribe("/topic/alerts", id="d", headers=headers)
    sync(conn, got)
    conn.disconnect(receipt="bye")
    producer, gotp = client()
    for body, severity in [("a", "low"), ("b", "high"), ("c", "medium"), ("d", "critical")]:
        producer.send("/topic/alerts", body, headers={"severity": severity})
    sync(producer, gotp)
    assert broker.inspect(lambda: len(broker.broker.durables["picky:alerts"].queue)) == 2
    back, got_back = client(client_id="picky")
    back.subscribe("/topic/alerts", id="d", headers=headers)
    got_back.wait_for(2)
    assert bodies(got_back.settle(0.2)) == ["b", "d"]


@pytest.mark.parametrize("selector", ["color = ", "color == 'red'", "price > > 5", "name LIKE 5", "(a = 1", "a IN ()"])
def test_invalid_selector_is_an_error_and_closes_only_that_connection(broker, client, selector):
    bystander, got_by = client()
    bystander.subscribe("/queue/ok", id="ok")
    sync(bystander, got_by)

    bad, got_bad = client()
    bad.subscribe("/queue/ok", id="bad", headers={"selector": selector})
    (error,) = got_bad.wait_for(1, what="errors")
    assert "selector" in error.headers["message"].lower(), error.headers
    assert got_bad.disconnected.wait(5), "the broker kept the connection open after ERROR"

    bystander.send("/queue/ok", "still here")
    assert bodies(got_by.wait_for(1)) == ["still here"]
    assert got_by.errors == []


def test_invalid_selector_on_topic_raw(broker):
    raw = RawStomp(broker)
    raw.connect()
    raw.frame("SUBSCRIBE", {"destination": "/topic/t", "id": "s", "selector": "x BETWEEN 1", "receipt": "r"})
    error = raw.expect_error_and_close()
    assert "selector" in error.headers["message"].lower()
    assert error.headers.get("receipt-id") == "r"
