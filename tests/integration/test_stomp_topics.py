"""Topics over STOMP with stomp.py: fan-out, wildcards, durable and retroactive subscriptions,
temporary queues with request/reply, and scheduled delivery."""
from __future__ import annotations

import time

import pytest

from tests.support import RawStomp, bodies, leave, sync

# -- helpers -----------------------------------------------------------------


def publish(conn, got, destination, items, **headers):
    for item in items:
        conn.send(destination, item, headers=dict(headers))
    sync(conn, got)


def durable(conn, got, destination, name, header="activemq.subscriptionName", sub_id="d", ack="auto"):
    conn.subscribe(destination, id=sub_id, ack=ack, headers={header: name})
    sync(conn, got)


# -- fan-out and wildcards ---------------------------------------------------


def test_topic_fans_out_to_every_subscriber(broker, client):
    subscribers = []
    for i in range(3):
        conn, got = client()
        conn.subscribe("/topic/news", id=f"s{i}")
        sync(conn, got)
        subscribers.append((conn, got))
    producer, gotp = client()
    publish(producer, gotp, "/topic/news", [f"n{i}" for i in range(10)], kind="headline")
    for _, got in subscribers:
        received = got.wait_for(10)
        assert bodies(received) == [f"n{i}" for i in range(10)]
        assert all(m.headers["destination"] == "/topic/news" and m.headers["kind"] == "headline" for m in received)
    for _, got in subscribers:
        assert len(got.settle(0.1)) == 10
    # A topic keeps nothing for subscribers that are not there.
    late, got_late = client()
    late.subscribe("/topic/news", id="late")
    assert got_late.settle(0.2) == []


def test_unsubscribed_topic_subscriber_gets_nothing_more(broker, client):
    conn, got = client()
    conn.subscribe("/topic/stop", id="s")
    other, got_other = client()
    other.subscribe("/topic/stop", id="o")
    sync(conn, got)
    sync(other, got_other)
    publish(other, got_other, "/topic/stop", ["before"])
    assert bodies(got.wait_for(1)) == ["before"]
    conn.unsubscribe("s")
    sync(conn, got)
    publish(other, got_other, "/topic/stop", ["after"])
    assert bodies(got_other.wait_for(2)) == ["before", "after"]
    assert bodies(got.settle(0.2)) == ["before"]


def test_wildcards_one_level_and_rest(broker, client):
    star, got_star = client()
    star.subscribe("/topic/a.*.c", id="star")
    rest, got_rest = client()
    rest.subscribe("/topic/a.>", id="rest")
    sync(star, got_star)
    sync(rest, got_rest)
    producer, gotp = client()
    topics = ["a.b.c", "a.x.c", "a.b.c.d", "a.c", "a", "a.b", "b.a.c", "ab.c", "a.b.d"]
    for t in topics:
        producer.send(f"/topic/{t}", t)
    sync(producer, gotp)
    expected_star = ["a.b.c", "a.x.c"]
    expected_rest = ["a.b.c", "a.x.c", "a.b.c.d", "a.c", "a", "a.b", "a.b.d"]  # '>' also matches the parent level
    got_star.wait_for(len(expected_star))
    got_rest.wait_for(len(expected_rest))
    assert bodies(got_star.settle(0.2)) == expected_star
    assert bodies(got_rest.settle(0.1)) == expected_rest
    assert [m.headers["destination"] for m in got_star.messages] == ["/topic/a.b.c", "/topic/a.x.c"]


def test_overlapping_wildcards_deliver_once_per_subscription(broker, client):
    conn, got = client()
    conn.subscribe("/topic/x.>", id="w1")
    conn.subscribe("/topic/x.*", id="w2")
    conn.subscribe("/topic/x.y", id="exact")
    sync(conn, got)
    publish(conn, got, "/topic/x.y", ["one"])
    got.wait_for(3)
    assert sorted(m.headers["subscription"] for m in got.settle(0.2)) == ["exact", "w1", "w2"]


@pytest.mark.parametrize("destination", ["/topic/a.*", "/topic/a.>"])
def test_sending_to_a_wildcard_is_an_error(broker, destination):
    raw = RawStomp(broker)
    raw.connect()
    raw.frame("SEND", {"destination": destination}, b"x")
    error = raw.expect_error_and_close()
    assert "wildcard" in (error.headers["message"] + error.body.decode()).lower()


# -- durable subscriptions ---------------------------------------------------


@pytest.mark.parametrize("header", ["activemq.subscriptionName", "durable-subscription-name"])
def test_durable_subscriber_gets_what_was_published_while_away(broker, client, header):
    conn, got = client(client_id="reader")
    durable(conn, got, "/topic/orders", "orders-sub", header)
    producer, gotp = client()
    publish(producer, gotp, "/topic/orders", ["live"])
    assert bodies(got.wait_for(1)) == ["live"]
    leave(conn)

    publish(producer, gotp, "/topic/orders", ["away-1", "away-2", "away-3"])
    assert broker.inspect(lambda: len(broker.broker.durables["reader:orders-sub"].queue)) == 3

    back, got_back = client(client_id="reader")
    durable(back, got_back, "/topic/orders", "orders-sub", header)
    received = got_back.wait_for(3)
    assert bodies(got_back.settle(0.2)) == ["away-1", "away-2", "away-3"]
    assert all(m.headers["destination"] == "/topic/orders" for m in received)


def test_durable_unacked_messages_come_back_redelivered(broker, client):
    conn, got = client(client_id="slow")
    durable(conn, got, "/topic/jobs", "jobs", ack="client-individual")
    producer, gotp = client()
    publish(producer, gotp, "/topic/jobs", ["j1", "j2"])
    first, second = got.wait_for(2)
    conn.ack(first.headers["ack"])
    sync(conn, got)
    leave(conn)
    publish(producer, gotp, "/topic/jobs", ["j3"])

    back, got_back = client(client_id="slow")
    durable(back, got_back, "/topic/jobs", "jobs", ack="client-individual")
    received = got_back.wait_for(2)
    assert bodies(got_back.settle(0.2)) == ["j2", "j3"]
    assert [m.headers.get("redelivered") for m in received] == ["true", None]


def test_unsubscribe_with_name_removes_the_durable_subscription(broker, client):
    conn, got = client(client_id="quitter")
    durable(conn, got, "/topic/feed", "feed")
    conn.unsubscribe("d", headers={"activemq.subscriptionName": "feed"})
    sync(conn, got)
    assert broker.inspect(lambda: list(broker.broker.durables)) == []
    leave(conn)

    producer, gotp = client()
    publish(producer, gotp, "/topic/feed", ["while-gone"])
    back, got_back = client(client_id="quitter")
    durable(back, got_back, "/topic/feed", "feed")
    assert got_back.settle(0.3) == [], "a removed durable subscription kept offline messages"
    publish(producer, gotp, "/topic/feed", ["fresh"])
    assert bodies(got_back.wait_for(1)) == ["fresh"]


def test_unsubscribe_without_name_keeps_the_durable_subscription(broker, client):
    conn, got = client(client_id="pauser")
    durable(conn, got, "/topic/keep", "keep")
    conn.unsubscribe("d")
    sync(conn, got)
    producer, gotp = client()
    publish(producer, gotp, "/topic/keep", ["kept"])
    assert got.settle(0.2) == []
    durable(conn, got, "/topic/keep", "keep", sub_id="d2")
    assert bodies(got.wait_for(1)) == ["kept"]


def test_unsubscribe_inactive_durable_by_name(broker, client):
    conn, got = client(client_id="cleaner")
    durable(conn, got, "/topic/old", "old")
    leave(conn)
    again, got2 = client(client_id="cleaner")
    # No subscription with that id on this connection: the name alone says what to remove.
    again.unsubscribe("old", headers={"activemq.subscriptionName": "old"})
    sync(again, got2)
    assert got2.errors == []
    assert broker.inspect(lambda: list(broker.broker.durables)) == []


def test_second_active_consumer_of_a_durable_subscription_is_an_error(broker, client):
    conn, got = client(client_id="twice")
    durable(conn, got, "/topic/one", "only")
    conn.subscribe("/topic/one", id="again", headers={"activemq.subscriptionName": "only"})
    (error,) = got.wait_for(1, what="errors")
    assert "active" in (error.headers["message"] + error.body).lower()
    assert got.disconnected.wait(5)
    # The first consumer's subscription outlives the refused one and keeps collecting.
    producer, gotp = client()
    publish(producer, gotp, "/topic/one", ["kept"])
    assert broker.inspect(lambda: len(broker.broker.durables["twice:only"].queue)) == 1


@pytest.mark.parametrize("change", ["selector", "destination"])
def test_changing_an_active_durable_subscription_is_an_error(broker, client, change):
    conn, got = client(client_id="changer")
    durable(conn, got, "/topic/one", "only", ack="client-individual")
    producer, gotp = client()
    publish(producer, gotp, "/topic/one", ["held"])
    got.wait_for(1)
    headers = {"activemq.subscriptionName": "only"}
    destination = "/topic/one"
    if change == "selector":
        headers["selector"] = "kind = 'x'"
    else:
        destination = "/topic/two"
    conn.subscribe(destination, id="again", headers=headers)
    (error,) = got.wait_for(1, what="errors", timeout=1.0)
    assert "active" in error.headers["message"].lower()
    assert got.disconnected.wait(5)
    # The original subscription survives, holding its unacknowledged message for the client's return.
    state = broker.inspect(lambda: {k: (v.destination, len(v.queue)) for k, v in broker.broker.durables.items()})
    assert state == {"changer:only": ("topic://one", 1)}


def test_returning_retroactive_durable_subscriber_gets_no_duplicates(broker, client):
    headers = {"activemq.subscriptionName": "r", "activemq.retroactive": "true"}
    conn, got = client(client_id="retro")
    conn.subscribe("/topic/r", id="d", headers=headers)
    sync(conn, got)
    producer, gotp = client()
    publish(producer, gotp, "/topic/r", ["seen"])
    assert bodies(got.wait_for(1)) == ["seen"]
    leave(conn)
    publish(producer, gotp, "/topic/r", ["offline"])
    back, got_back = client(client_id="retro")
    back.subscribe("/topic/r", id="d", headers=headers)
    got_back.wait_for(1)
    assert bodies(got_back.settle(0.2)) == ["offline"]


def test_redefining_an_inactive_durable_subscription_starts_afresh(broker, client):
    conn, got = client(client_id="redefiner")
    durable(conn, got, "/topic/defs", "defs")
    leave(conn)
    producer, gotp = client()
    publish(producer, gotp, "/topic/defs", ["old-definition"], kind="x")
    back, got_back = client(client_id="redefiner")
    back.subscribe("/topic/defs", id="d", headers={"activemq.subscriptionName": "defs", "selector": "kind = 'y'"})
    sync(back, got_back)
    assert got_back.settle(0.2) == [], "a redefined durable subscription kept messages of the old definition"
    publish(producer, gotp, "/topic/defs", ["y-1", "y-2"], kind="y")
    assert bodies(got_back.wait_for(2)) == ["y-1", "y-2"]


def test_duplicate_client_id_is_refused(broker, client):
    conn, got = client(client_id="unique")
    raw = RawStomp(broker)
    raw.frame("CONNECT", {"accept-version": "1.2", "host": "localhost", "client-id": "unique"})
    error = raw.expect_error_and_close()
    assert "client" in error.headers["message"].lower()
    conn.send("/queue/still", "ok")
    sync(conn, got)
    assert got.errors == []


def test_durable_without_client_id_is_an_error(broker, client):
    conn, got = client()
    conn.subscribe("/topic/anon", id="d", headers={"activemq.subscriptionName": "anon"})
    (error,) = got.wait_for(1, what="errors")
    assert "client" in (error.headers["message"] + error.body).lower()
    assert got.disconnected.wait(5)
    assert broker.inspect(lambda: list(broker.broker.durables)) == []


# -- retroactive consumers ---------------------------------------------------


@pytest.mark.policy(retroactive_count=3)
def test_retroactive_consumer_gets_the_last_n_messages(broker, client):
    producer, gotp = client()
    publish(producer, gotp, "/topic/ticker", [f"t{i}" for i in range(5)])

    retro, got_retro = client()
    retro.subscribe("/topic/ticker", id="r", headers={"activemq.retroactive": "true"})
    plain, got_plain = client()
    plain.subscribe("/topic/ticker", id="p")
    sync(retro, got_retro)
    sync(plain, got_plain)
    assert bodies(got_retro.wait_for(3)) == ["t2", "t3", "t4"]
    assert got_plain.settle(0.2) == [], "a non-retroactive subscriber got messages from before it subscribed"

    publish(producer, gotp, "/topic/ticker", ["live"])
    assert bodies(got_retro.wait_for(4)) == ["t2", "t3", "t4", "live"]
    assert bodies(got_plain.wait_for(1)) == ["live"]
    assert len(got_retro.settle(0.1)) == 4


@pytest.mark.policy(retroactive_count=3)
def test_retroactive_wildcard_replays_matching_topics_in_publish_order(broker, client):
    producer, gotp = client()
    for t in ["x.a", "x.b", "y.a", "x.a", "x.b"]:
        producer.send(f"/topic/{t}", t)
    sync(producer, gotp)
    retro, got = client()
    retro.subscribe("/topic/x.*", id="r", headers={"activemq.retroactive": "true"})
    got.wait_for(4)
    assert bodies(got.settle(0.2)) == ["x.a", "x.b", "x.a", "x.b"]


# -- temporary queues and request/reply --------------------------------------


@pytest.mark.parametrize("responder_version", ["1.0", "1.1", "1.2"])
def test_request_reply_over_a_temporary_queue(broker, client, responder_version):
    requester, got_req = client()
    requester.subscribe("/temp-queue/replies", id="replies")
    responder, got_resp = client(responder_version)
    responder.subscribe("/queue/requests", id="work")
    sync(requester, got_req)
    sync(responder, got_resp)

    requester.send("/queue/requests", "what time is it?", headers={"reply-to": "/temp-queue/replies", "correlation-id": "q1"})
    (request,) = got_resp.wait_for(1)
    reply_to = request.headers["reply-to"]
    assert reply_to.startswith("/remote-temp-queue/"), reply_to
    assert reply_to.endswith(":replies")
    responder.send(reply_to, "noon", headers={"correlation-id": request.headers["correlation-id"]})
    (reply,) = got_req.wait_for(1)
    assert reply.body == "noon"
    assert reply.headers["correlation-id"] == "q1"
    assert reply.headers["subscription"] == "replies"

    # The temporary queue dies with its owner: a late reply is refused.
    leave(requester)
    responder.send(reply_to, "too late")
    (error,) = got_resp.wait_for(1, what="errors")
    assert "temp" in (error.headers["message"] + error.body).lower()
    assert got_resp.disconnected.wait(5)
    assert broker.inspect(lambda: [q for q in broker.broker.queues if q.startswith("temp-queue://")]) == []


def test_temporary_queues_are_private_per_connection(broker, client):
    a, got_a = client()
    b, got_b = client()
    a.subscribe("/temp-queue/inbox", id="ia")
    b.subscribe("/temp-queue/inbox", id="ib")
    sync(a, got_a)
    sync(b, got_b)
    a.send("/temp-queue/inbox", "to-a")
    b.send("/temp-queue/inbox", "to-b")
    assert bodies(got_a.wait_for(1)) == ["to-a"]
    assert bodies(got_b.wait_for(1)) == ["to-b"]
    assert bodies(got_a.settle(0.2)) == ["to-a"]


def test_another_connection_cannot_subscribe_to_a_temporary_queue(broker, client):
    owner, got_owner = client()
    owner.subscribe("/temp-queue/private", id="p")
    owner.send("/queue/leak", "ping", headers={"reply-to": "/temp-queue/private"})
    sync(owner, got_owner)
    snoop, got_snoop = client()
    snoop.subscribe("/queue/leak", id="l")
    (ping,) = got_snoop.wait_for(1)
    snoop.subscribe(ping.headers["reply-to"], id="steal")
    (error,) = got_snoop.wait_for(1, what="errors")
    assert "temporary" in (error.headers["message"] + error.body).lower()
    assert got_snoop.disconnected.wait(5)
    # The owner still receives on it.
    owner.send("/temp-queue/private", "mine")
    assert bodies(got_owner.wait_for(1)) == ["mine"]


# -- scheduled delivery ------------------------------------------------------


def test_scheduled_delivery_waits_for_the_delay(broker, client):
    conn, got = client()
    conn.subscribe("/queue/later", id="s")
    sync(conn, got)
    start = time.monotonic()
    conn.send("/queue/later", "delayed", headers={"AMQ_SCHEDULED_DELAY": "500"})
    conn.send("/queue/later", "marker")  # due at once, queued behind "delayed" were that not held
    assert got.wait_for(1)[0].body == "marker", "a delayed message arrived early"
    assert broker.queue_depth("queue://later") == 0  # held by the scheduler, not waiting in the queue
    message = got.wait_for(2)[1]
    assert message.body == "delayed"
    # Not before its delay: a lower bound no slow machine can break (no upper one to flake).
    assert time.monotonic() - start >= 0.45, "delivered before its delay"
    assert "AMQ_SCHEDULED_DELAY" not in message.headers


def test_scheduled_messages_arrive_in_due_order(broker, client):
    conn, got = client()
    conn.subscribe("/queue/due", id="s")
    sync(conn, got)
    for body, delay in [("c", 450), ("a", 150), ("b", 300), ("now", 0)]:
        conn.send("/queue/due", body, headers={"AMQ_SCHEDULED_DELAY": str(delay)})
    assert bodies(got.wait_for(4, timeout=2)) == ["now", "a", "b", "c"]


def test_scheduled_delivery_to_a_topic(broker, client):
    conn, got = client()
    conn.subscribe("/topic/alarm", id="s")
    sync(conn, got)
    start = time.monotonic()
    conn.send("/topic/alarm", "ring", headers={"AMQ_SCHEDULED_DELAY": "300"})
    conn.send("/topic/alarm", "marker")  # due at once: "ring" must not come before it
    assert bodies(got.wait_for(2)) == ["marker", "ring"]
    assert time.monotonic() - start >= 0.25, "delivered before its delay"
