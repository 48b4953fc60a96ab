"""Queues over the admin API (gateway/admin/queues.py), over real HTTP: the views and the actions.

State comes from real clients (stomp.py, paho); every action is checked on
what the broker then does: counts, what a consumer receives next, and what a
broker restarted on the same data directory has.  One broker serves the
actions where tests can share it (each uses its own queues), another with the
default policy the views (its counts follow max_redeliveries 6); restarts and
users get brokers of their own.
"""
from __future__ import annotations

import base64
import json
import threading
import time

import pytest

from tests.integration.admin_support import (
    DLQ,
    JSON,
    POLICY,
    Actions,
    as_user,
    consume,
    dead_letter,
    get,
    refused_without_admin,
    secured_config,
    send_all,
)
from tests.support import BrokerHandle, connect, disconnect, make_config, sync, wait_until

pytestmark = pytest.mark.timeout(60)


def configure(tmp_path, **policy):
    config = make_config(tmp_path, **{**POLICY, **policy})
    config.admin_settings.max_request_size = 64 * 1024
    return config


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    handle = BrokerHandle(configure(tmp_path_factory.mktemp("actions")))
    yield Actions(handle)
    handle.stop()


@pytest.fixture(scope="module")
def views(tmp_path_factory):
    handle = BrokerHandle(make_config(tmp_path_factory.mktemp("queue-views")))
    yield Actions(handle)
    handle.stop()


# -- views -----------------------------------------------------------------------------


def test_queue_counts_follow_sends_and_partial_acks(views):
    producer, got = connect(views.handle)
    for i in range(10):
        producer.send("/queue/api.work", f"job {i}", headers={"persistent": "true"})
    sync(producer, got)
    consumer, received = connect(views.handle)
    consumer.subscribe("/queue/api.work", id="1", ack="client-individual", headers={"activemq.prefetchSize": "4"})
    first = received.wait_for(4)
    for frame in first[:2]:
        consumer.ack(frame.headers["ack"])
    received.wait_for(6)  # the two acks gave the consumer credit for two more
    sync(consumer, received)

    status, queue = get(views, "/api/v1/queues/api.work")
    assert status == 200
    assert queue["destination"] == "queue://api.work" and queue["name"] == "api.work"
    assert (queue["ready"], queue["unacknowledged"], queue["messages"]) == (4, 4, 8)
    assert (queue["consumers"], queue["enqueued"], queue["dequeued"]) == (1, 10, 2)
    assert queue["expired"] == queue["dead_lettered"] == 0
    assert queue["oldest_message_age_ms"] >= 0 and queue["memory_bytes"] > 0 and queue["store_bytes"] > 0
    [consumer_view] = queue["consumer_list"]
    assert consumer_view["prefetch"] == 4 and consumer_view["unacknowledged"] == 4

    disconnect(consumer)  # its four unacknowledged messages go back
    wait_until(lambda: get(views, "/api/v1/queues/api.work")[1]["consumers"] == 0, what="no consumers on api.work")
    queue = get(views, "/api/v1/queues/api.work")[1]
    assert (queue["ready"], queue["unacknowledged"]) == (8, 0)
    disconnect(producer)


def test_queue_list_pages_filters_and_sorts(views):
    producer, got = connect(views.handle)
    for i in range(25):
        for _ in range(i % 5):
            producer.send(f"/queue/api.page.q{i:02d}", "x")
        if i % 5 == 0:
            producer.send(f"/queue/api.page.q{i:02d}", "x", headers={"expires": "1"})  # expired at once: still a queue
    sync(producer, got)
    status, page = get(views, "/api/v1/queues?filter=API.PAGE.&page_size=10&page=2")
    assert status == 200
    assert (page["total"], page["pages"], page["page"], page["page_size"]) == (25, 3, 2, 10)
    assert [q["name"] for q in page["queues"]] == [f"api.page.q{i:02d}" for i in range(10, 20)]
    last = get(views, "/api/v1/queues?filter=api.page.&page_size=10&page=3")[1]
    assert len(last["queues"]) == 5
    assert get(views, "/api/v1/queues?filter=api.page.&page=9")[1]["queues"] == []  # past the end: an empty page
    deepest = get(views, "/api/v1/queues?filter=api.page.&sort=-messages&page_size=5")[1]["queues"]
    assert all(q["messages"] == 4 for q in deepest)
    assert [q["name"] for q in get(views, "/api/v1/queues?filter=api.page.&sort=-name&page_size=2")[1]["queues"]] == [
        "api.page.q24", "api.page.q23",
    ]
    disconnect(producer)


def test_expired_and_dead_lettered_counts(views):
    producer, got = connect(views.handle)
    producer.send("/queue/api.expiring", "late", headers={"expires": "1"})
    producer.send("/queue/api.failing", "bad")
    sync(producer, got)
    consumer, received = connect(views.handle)
    consumer.subscribe("/queue/api.expiring", id="1")
    consumer.subscribe("/queue/api.failing", id="2", ack="client-individual")
    for _ in range(7):  # max_redeliveries 6: the seventh failure dead-letters it
        frame = received.wait_for(1)[0]
        received.messages.clear()
        consumer.nack(frame.headers["ack"])
    wait_until(lambda: get(views, "/api/v1/queues/api.failing")[1]["dead_lettered"] == 1, what="one dead-lettered")
    assert get(views, "/api/v1/queues/api.expiring")[1]["expired"] == 1
    dlq = get(views, "/api/v1/queues/DLQ")[1]
    assert dlq["dead_letter_queue"] is True and dlq["ready"] >= 2
    disconnect(consumer)
    disconnect(producer)


def test_views_answer_4xx_json_for_bad_requests(views):
    for path, status, code in [
        ("/api/v1/queues/no.such.queue", 404, "unknown_queue"),
        ("/api/v1/queues?page=0", 400, "bad_request"),
        ("/api/v1/queues?page=abc", 400, "bad_request"),
        ("/api/v1/queues?page_size=1001", 400, "bad_request"),
        ("/api/v1/queues?sort=colour", 400, "bad_request"),
    ]:
        answer_status, body = get(views, path)
        assert (answer_status, body["code"]) == (status, code), path
        assert body["error"]


# -- browse ----------------------------------------------------------------------------


def test_browse_shows_messages_and_does_not_consume(api):
    conn, got = connect(api.handle)
    conn.send("/queue/browse.a", "hello", headers={"persistent": "true", "color": "red", "priority": "7"})
    conn.send("/queue/browse.a", b"\xff\x00\x01", headers={"persistent": "true", "content-type": "application/octet-stream"})
    conn.send("/queue/browse.a", "é" * 200)  # 400 bytes: the preview cuts it between characters
    sync(conn, got)
    page = api.browse("browse.a", "limit=2")
    assert page["destination"] == "queue://browse.a" and page["depth"] == 3 and page["in_flight"] == 0
    first, second = page["messages"]
    assert first["seq"] < second["seq"] and page["next"] > second["seq"]
    assert first["body"] == "hello" and first["encoding"] == "utf-8" and not first["truncated"]
    assert first["headers"]["color"] == "red" and first["priority"] == 7 and first["persistent"] is True
    assert first["id"].startswith("ID:") and first["size"] == 5 and first["redelivered"] is False
    assert first["redeliveries"] == 0 and first["expires"] == 0 and first["timestamp"] > 0 and not first["in_flight"]
    assert second["encoding"] == "base64" and base64.b64decode(second["body"]) == b"\xff\x00\x01"
    assert second["content_type"] == "application/octet-stream"
    (third,) = api.browse("browse.a", f"from={page['next']}&preview=5")["messages"]
    assert third["body"] == "éé" and third["truncated"] and third["size"] == 400 and third["persistent"] is False
    assert api.browse("browse.a", f"from={page['next']}")["next"] is None
    # A consumer holding one unacknowledged: browse shows it in flight; then everything is still there.
    holder, held = connect(api.handle)
    holder.subscribe("/queue/browse.a", id="h", ack="client-individual", headers={"activemq.prefetchSize": "1"})
    held.wait_for(1)
    page = api.browse("browse.a")
    assert [m["in_flight"] for m in page["messages"]] == [True, False, False] and page["in_flight"] == 1
    disconnect(holder)
    received = consume(api.handle, "/queue/browse.a", 3)
    assert received[0].body == "hello" and len(received) == 3


def send_mixed(handle, destination, bodies):
    """Persistent and non-persistent in turn: past the memory limit the first wait in the store,
    the others in the spill store."""
    conn, got = connect(handle)
    for i, body in enumerate(bodies):
        conn.send(destination, body, headers={"persistent": "true" if i % 2 else "false", "n": str(i)})
    sync(conn, got)
    disconnect(conn)


def test_browse_pages_through_messages_paged_out_to_the_store(api):
    bodies = [f"{i:04d}" + "x" * 2000 for i in range(120)]  # 240 KB: past the 64 KiB queue memory limit
    send_mixed(api.handle, "/queue/browse.deep", bodies)
    paged = api.handle.inspect(lambda: (api.handle.broker.queues["queue://browse.deep"].paged,
                                        api.handle.broker.queues["queue://browse.deep"].spilled))
    assert paged[0] > 50 and paged[1] > 25
    shown, start = [], 0
    while start is not None:
        page = api.browse("browse.deep", f"from={start}&limit=50&preview=4")
        shown += [m["body"] for m in page["messages"]]
        start = page["next"]
    assert shown == [b[:4] for b in bodies]
    assert api.handle.queue_depth("queue://browse.deep") == 120
    assert [m.body[:4] for m in consume(api.handle, "/queue/browse.deep", 120)] == [b[:4] for b in bodies]


# -- purge and delete --------------------------------------------------------------------


def test_purge_leaves_messages_in_flight(api):
    send_all(api.handle, "/queue/purge.a", [f"m{i}" for i in range(5)])
    holder, held = connect(api.handle)
    holder.subscribe("/queue/purge.a", id="h", ack="client-individual", headers={"activemq.prefetchSize": "2"})
    held.wait_for(2)
    assert api.do("POST", "/api/v1/queues/purge.a/purge") == {"destination": "queue://purge.a", "purged": 3}
    assert api.handle.queue_depth("queue://purge.a") == 0
    disconnect(holder)  # its two come back, redelivered; nothing else is left
    received = consume(api.handle, "/queue/purge.a", 2)
    assert [m.body for m in received] == ["m0", "m1"] and received[0].headers["redelivered"] == "true"


def test_purge_of_a_queue_paged_to_the_store(api):
    send_mixed(api.handle, "/queue/purge.deep", ["y" * 3000] * 100)
    assert api.do("POST", "/api/v1/queues/purge.deep/purge")["purged"] == 100
    assert api.handle.inspect(lambda: (len(api.handle.broker.queues["queue://purge.deep"]),
                                       api.handle.broker.queues["queue://purge.deep"].paged)) == (0, 0)
    send_all(api.handle, "/queue/purge.deep", ["after"])
    assert [m.body for m in consume(api.handle, "/queue/purge.deep", 1)] == ["after"]


def test_delete_queue_refused_while_it_has_consumers(api):
    send_all(api.handle, "/queue/delete.a", ["1", "2"])
    conn, got = connect(api.handle)
    conn.subscribe("/queue/delete.b", id="c")
    sync(conn, got)
    status, _, body = api.call("DELETE", "/api/v1/queues/delete.b")
    assert status == 409 and json.loads(body)["code"] == "has_consumers"
    disconnect(conn)
    assert api.do("DELETE", "/api/v1/queues/delete.a") == {"destination": "queue://delete.a", "deleted": True, "purged": 2}
    assert api.call("GET", "/api/v1/queues/delete.a/messages")[0] == 404
    assert api.call("DELETE", "/api/v1/queues/delete.a")[0] == 404


# -- send --------------------------------------------------------------------------------


def test_send_to_a_queue(api):
    answer = api.do("POST", "/api/v1/queues/send.a/messages",
                    {"body": "from the console", "headers": {"k": "v", "correlation-id": "c1"}, "persistent": True, "priority": 8})
    assert answer["destination"] == "queue://send.a" and answer["persistent"] and not answer["duplicate"]
    (message,) = consume(api.handle, "/queue/send.a", 1)
    assert message.body == "from the console" and message.headers["message-id"] == answer["id"]
    assert (message.headers["k"], message.headers["correlation-id"], message.headers["priority"]) == ("v", "c1", "8")
    assert message.headers["persistent"] == "true"


# -- get and move ------------------------------------------------------------------------


def test_get_takes_messages_off_the_queue_in_order(api):
    """RabbitMQ's "Get messages": what is answered is gone, and a consumer gets the rest."""
    send_all(api.handle, "/queue/taken", ["first", "second", "third"], kind="x")
    got = api.do("POST", "/api/v1/queues/taken/get", {"count": 2})
    assert [m["body"] for m in got["messages"]] == ["first", "second"] and got["depth"] == 1
    assert got["messages"][0]["headers"]["kind"] == "x" and got["messages"][0]["persistent"] is True
    assert [m.body for m in consume(api.handle, "/queue/taken", 1)] == ["third"]
    assert api.do("POST", "/api/v1/queues/taken/get")["messages"] == []  # empty: answered at once
    assert api.do("POST", "/api/v1/queues/taken/get", {"count": 0}, expect=400)["field"] == "count"


def test_move_a_selection_to_another_queue(api):
    conn, got = connect(api.handle)
    for i in range(6):
        conn.send("/queue/move.a", f"m{i}", headers={"persistent": "true", "color": "red" if i % 2 else "blue"})
    sync(conn, got)
    disconnect(conn)
    assert api.do("POST", "/api/v1/queues/move.a/move", {"to": "move.b", "selector": "color = 'red'"}) == {
        "destination": "queue://move.a", "to": "queue://move.b", "moved": 3}
    blue = api.browse("move.a")["messages"]
    assert [m["body"] for m in blue] == ["m0", "m2", "m4"]
    assert api.do("POST", "/api/v1/queues/move.a/move", {"to": "queue://move.b", "ids": [blue[2]["id"]]})["moved"] == 1
    assert api.do("POST", "/api/v1/queues/move.a/move", {"to": "move.c", "limit": 1})["moved"] == 1
    received = consume(api.handle, "/queue/move.b", 4)
    assert [m.body for m in received] == ["m1", "m3", "m5", "m4"]
    assert received[3].headers["message-id"] == blue[2]["id"] and received[3].headers["color"] == "blue"
    assert [m.body for m in consume(api.handle, "/queue/move.c", 1)] == ["m0"]
    assert [m.body for m in consume(api.handle, "/queue/move.a", 1)] == ["m2"]


def test_move_from_a_queue_paged_to_the_store(api):
    bodies = [f"{i:04d}" + "z" * 3000 for i in range(100)]
    send_mixed(api.handle, "/queue/move.deep", bodies)
    assert api.do("POST", "/api/v1/queues/move.deep/move", {"to": "move.deep.odd", "selector": "n LIKE '%1' OR n LIKE '%3'"})["moved"] == 20
    assert api.do("POST", "/api/v1/queues/move.deep/move", {"to": "move.deep.rest"})["moved"] == 80
    assert api.handle.inspect(lambda: [(len(q), q.paged, q.spilled) for n, q in api.handle.broker.queues.items()
                                       if n == "queue://move.deep"]) == [(0, 0, 0)]
    odd = [m.body[:4] for m in consume(api.handle, "/queue/move.deep.odd", 20)]
    assert odd == [b[:4] for b in bodies if b[3] in "13"]
    rest = [m.body[:4] for m in consume(api.handle, "/queue/move.deep.rest", 80)]
    assert rest == [b[:4] for b in bodies if b[3] not in "13"]


# -- DLQ replay --------------------------------------------------------------------------


def test_dlq_replay_sends_dead_letters_home_with_a_clean_slate(api):
    dead_letter(api.handle, "replay.a", 4, kind="order")
    letters = [m for m in api.browse("DLQ", "limit=1000")["messages"] if m["headers"].get("originalDestination") == "queue://replay.a"]
    assert len(letters) == 4 and "max_redeliveries=1" in letters[0]["headers"]["dlqDeliveryFailureCause"]
    one = api.do("POST", "/api/v1/dlq/replay", {"ids": [letters[0]["id"]]})
    assert one == {"destination": DLQ, "replayed": 1, "skipped": [], "skipped_count": 0}
    rest = api.do("POST", "/api/v1/queues/DLQ/replay", {"selector": "kind = 'order'"})
    assert rest["replayed"] == 3
    received = consume(api.handle, "/queue/replay.a", 4, ack="client-individual")
    assert sorted(m.body for m in received) == [f"replay.a-{i}" for i in range(4)]
    for m in received:
        assert "redelivered" not in m.headers and "originalDestination" not in m.headers
        assert "dlqDeliveryFailureCause" not in m.headers and m.headers["kind"] == "order"
    # A message that is no dead letter stays, with the reason.
    stray = api.do("POST", "/api/v1/queues/DLQ/messages", {"body": "stray"})
    answer = api.do("POST", "/api/v1/dlq/replay", {"ids": [stray["id"]]})
    assert answer["replayed"] == 0 and answer["skipped"][0]["id"] == stray["id"]
    assert "originalDestination" in answer["skipped"][0]["reason"]
    api.do("POST", "/api/v1/queues/DLQ/purge")


def test_dlq_replay_of_a_topic_dead_letter_goes_to_the_topic(api):
    conn, got = connect(api.handle, client_id="dlq-topic")
    conn.subscribe("/topic/dlq.t", id="d", ack="client-individual", headers={"activemq.subscriptionName": "s"})
    sync(conn, got)
    send_all(api.handle, "/topic/dlq.t", ["t1"])
    for n in (1, 2):
        conn.nack(got.wait_for(n)[n - 1].headers["ack"])
    selector = {"selector": "originalDestination = 'topic://dlq.t'"}
    wait_until(lambda: api.handle.queue_depth(DLQ), what="the dead letter in the DLQ")
    assert api.do("POST", "/api/v1/dlq/replay", selector)["replayed"] == 1
    again = got.wait_for(3)[2]
    assert again.body == "t1" and "originalDestination" not in again.headers and "redelivered" not in again.headers
    conn.ack(again.headers["ack"])
    conn.unsubscribe("d", headers={"activemq.subscriptionName": "s"})
    sync(conn, got)
    disconnect(conn)


def test_dlq_replay_of_many_keeps_the_broker_answering(api):
    n = 100_000

    def bury():
        from core.entry import Entry
        from core.message import Message

        broker = api.handle.broker
        dlq = broker.queue(DLQ)
        for i in range(n):
            message = Message(broker.new_message_id(), DLQ, b"%d" % i, {"originalDestination": "queue://replay.many"},
                              persistent=True)
            dlq.enqueue(Entry(message, broker.next_seq()))

    api.handle.inspect(bury)
    latencies = []
    done = threading.Event()

    def ping():
        while not done.is_set():
            started = time.monotonic()
            assert api.call("GET", "/api/v1")[0] == 200
            latencies.append(time.monotonic() - started)

    pinger = threading.Thread(target=ping)
    pinger.start()
    try:
        answer = api.do("POST", "/api/v1/dlq/replay", {"selector": "JMSDestination = 'queue://DLQ'"})
    finally:
        done.set()
        pinger.join()
    assert answer["replayed"] == n
    assert api.handle.queue_depth("queue://replay.many") == n and api.handle.queue_depth(DLQ) == 0
    assert len(latencies) > 3 and max(latencies) < 0.5, latencies
    assert api.do("POST", "/api/v1/queues/replay.many/purge")["purged"] == n


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize("method, path, body, status, code, text", [
    ("GET", "/api/v1/queues/nowhere/messages", None, 404, "unknown_queue", "no queue queue://nowhere"),
    ("POST", "/api/v1/queues/nowhere/purge", None, 404, "unknown_queue", "no queue"),
    ("POST", "/api/v1/queues/nowhere/get", None, 404, "unknown_queue", "no queue"),
    ("PUT", "/api/v1/queues/DLQ", None, 400, "bad_request", "is a dead-letter queue"),
    ("PUT", "/api/v1/queues/bad.a", b'{"durable": true}', 400, "bad_request", "unknown field 'durable'"),
    ("POST", "/api/v1/queues/bad.a/get", b'{"count": "2"}', 400, "bad_request", "field 'count'"),
    ("DELETE", "/api/v1/queues/nowhere", None, 404, "unknown_queue", "no queue"),
    ("POST", "/api/v1/queues/bad.a/move", b"{not json", 400, "bad_request", "not JSON"),
    ("POST", "/api/v1/queues/bad.a/move", b"[1]", 400, "bad_request", "JSON object"),
    ("POST", "/api/v1/queues/bad.a/move", b'{"to": "x", "color": 1}', 400, "bad_request", "unknown field 'color'"),
    ("POST", "/api/v1/queues/bad.a/move", b'{"ids": []}', 400, "bad_request", "field 'to' is required"),
    ("POST", "/api/v1/queues/bad.a/move", b'{"to": 7}', 400, "bad_request", "field 'to' must be"),
    ("POST", "/api/v1/queues/bad.a/move", b'{"to": "bad.a"}', 400, "bad_request", "already"),
    ("POST", "/api/v1/queues/bad.a/move", b'{"to": "x", "limit": true}', 400, "bad_request", "field 'limit'"),
    ("POST", "/api/v1/queues/bad.a/move", b'{"to": "x", "ids": "abc"}', 400, "bad_request", "field 'ids'"),
    ("POST", "/api/v1/queues/bad.a/move", b'{"to": "x", "selector": "a ="}', 400, "bad_request", "field 'selector'"),
    ("POST", "/api/v1/queues/bad.a/move", b'{"to": "topic://x"}', 400, "bad_request", "not a queue name"),
    ("POST", "/api/v1/queues/bad.a/replay", None, 400, "bad_request", "not a dead-letter queue"),
    ("POST", "/api/v1/dlq/replay", b'{"queue": 3}', 400, "bad_request", "field 'queue'"),
    ("POST", "/api/v1/queues/bad.a/messages", b'{"body": 5}', 400, "bad_request", "field 'body'"),
    ("POST", "/api/v1/queues/bad.a/messages", b'{"priority": 10}', 400, "bad_request", "field 'priority'"),
    ("POST", "/api/v1/queues/bad.a/messages", b'{"persistent": "yes"}', 400, "bad_request", "field 'persistent'"),
    ("POST", "/api/v1/queues/bad.a/messages", b'{"headers": {"a": 1}}', 400, "bad_request", "field 'headers'"),
    ("POST", "/api/v1/queues/bad.a/messages", b'{"headers": {"expires": "soon"}}', 400, "bad_request", "expires"),
    ("POST", "/api/v1/queues/bad.a/messages", b'{"body_base64": "%%"}', 400, "bad_request", "body_base64"),
    ("GET", "/api/v1/queues/bad.a/messages?limit=0", None, 400, "bad_request", "limit must be 1-1000"),
    ("GET", "/api/v1/queues/bad.a/messages?from=x", None, 400, "bad_request", "from must be an integer"),
    ("GET", "/api/v1/queues/bad.a/purge", None, 405, "method_not_allowed", "use POST"),
])
def test_bad_input_gets_a_json_error(api, method, path, body, status, code, text):
    send_all(api.handle, "/queue/bad.a", ["keep"])
    got_status, headers, data = api.call(method, path, body, JSON if body is not None else None)
    assert headers["Content-Type"] == "application/json", data
    error = json.loads(data)
    assert (got_status, error["code"]) == (status, code), error
    assert text in error["error"], error
    if "field '" in text and error.get("field") is not None:
        assert error["field"] in text


def test_body_over_the_limit_gets_413(api):
    status, _, data = api.call("POST", "/api/v1/queues/bad.a/messages", json.dumps({"body": "x" * 70_000}).encode(), JSON)
    assert status == 413 and json.loads(data)["code"] == "request_too_large"


# -- users and rules -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    handle = BrokerHandle(secured_config(tmp_path_factory.mktemp("secured"), **POLICY))
    yield Actions(handle)
    handle.stop()


def test_actions_need_admin(secured):
    assert as_user(secured, "alice", "POST", "/api/v1/queues/sec.a/messages", {"body": "1"})[0] == 200
    refused_without_admin(secured, [
        ("GET", "/api/v1/queues/sec.a", None),
        ("GET", "/api/v1/queues/sec.a/messages", None),
        ("POST", "/api/v1/queues/sec.a/purge", None),
        ("POST", "/api/v1/queues/sec.a/get", None),
        ("PUT", "/api/v1/queues/sec.new", None),
        ("DELETE", "/api/v1/queues/sec.a", None),
        ("POST", "/api/v1/queues/sec.a/messages", {"body": "x"}),
        ("POST", "/api/v1/queues/sec.a/move", {"to": "sec.b"}),
        ("POST", "/api/v1/queues/DLQ/replay", None),
        ("POST", "/api/v1/dlq/replay", None),
    ])
    # admin on the source but not on the target of a move
    assert as_user(secured, "alice", "POST", "/api/v1/queues/sec.mine/messages", {"body": "1"})[0] == 200
    status, error = as_user(secured, "dora", "POST", "/api/v1/queues/sec.mine/move", {"to": "sec.a"})
    assert status == 403 and error["error"] == "field 'to': user 'dora' may not admin queue://sec.a"
    assert as_user(secured, "alice", "GET", "/api/v1/queues/sec.a/messages")[1]["depth"] == 1
    assert as_user(secured, "alice", "POST", "/api/v1/queues/sec.a/purge")[1]["purged"] == 1
    with open(secured.handle.config.auth.audit_log) as log:
        audit = [json.loads(line) for line in log]
    assert {"event": "admin_action", "user": "alice", "action": "purge", "destination": "queue://sec.a", "purged": 1}.items() \
        <= audit[-1].items()


def test_replay_skips_targets_the_user_may_not_administer(secured):
    as_user(secured, "alice", "POST", "/api/v1/queues/sec.mine/purge")  # what another test left there
    dead_letter(secured.handle, "sec.mine", 1, "alice")
    dead_letter(secured.handle, "sec.other", 1, "alice")
    status, answer = as_user(secured, "dora", "POST", "/api/v1/dlq/replay")
    assert status == 200 and answer["replayed"] == 1 and answer["skipped_count"] == 1
    assert "queue://sec.other" in answer["skipped"][0]["reason"]
    assert secured.handle.queue_depth("queue://sec.mine") == 1 and secured.handle.queue_depth(DLQ) == 1


# -- restart -------------------------------------------------------------------------------


def test_actions_hold_across_a_restart(tmp_path):
    handle = BrokerHandle(configure(tmp_path))
    api = Actions(handle)
    send_all(handle, "/queue/r.purged", ["p"] * 3)
    send_all(handle, "/queue/r.deleted", ["d"] * 2)
    send_all(handle, "/queue/r.from", ["a", "b", "c"], tag="t")
    dead_letter(handle, "r.home", 3)
    assert api.do("POST", "/api/v1/queues/r.purged/purge")["purged"] == 3
    assert api.do("DELETE", "/api/v1/queues/r.deleted")["purged"] == 2
    assert api.do("POST", "/api/v1/queues/r.from/move", {"to": "r.to", "limit": 2})["moved"] == 2
    assert api.do("POST", "/api/v1/dlq/replay", {"limit": 2})["replayed"] == 2
    assert api.do("PUT", "/api/v1/queues/r.created", expect=201) == {"destination": "queue://r.created", "created": True}
    assert api.do("PUT", "/api/v1/queues/r.created", expect=200)["created"] is False
    handle.stop()

    handle = BrokerHandle(configure(tmp_path))
    try:
        queues = handle.inspect(lambda: {name: len(q) for name, q in handle.broker.queues.items()})
        assert queues.get("queue://r.purged") == 0 and "queue://r.deleted" not in queues
        assert queues.get("queue://r.created") == 0  # made by an operator: there while empty
        assert (queues["queue://r.from"], queues["queue://r.to"], queues[DLQ], queues["queue://r.home"]) == (1, 2, 1, 2)
        assert [m.body for m in consume(handle, "/queue/r.to", 2)] == ["a", "b"]
        home = consume(handle, "/queue/r.home", 2, ack="client-individual")
        assert all("redelivered" not in m.headers and "originalDestination" not in m.headers for m in home)
    finally:
        handle.stop()


def test_changes_from_another_sites_page_are_refused(api):
    """A browser names the page's origin on a cross-site POST: refused, so no web page purges through it."""
    send_all(api.handle, "/queue/csrf", ["keep"])
    base = f"http://127.0.0.1:{api.handle.admin_port}"
    status, _, body = api.call("POST", "/api/v1/queues/csrf/purge", b"", "text/plain", {"Origin": "http://evil.example"})
    assert status == 403 and json.loads(body)["code"] == "cross_origin"
    assert api.handle.queue_depth("queue://csrf") == 1
    assert api.call("GET", "/api/v1/queues/csrf", headers={"Origin": "http://evil.example"})[0] == 200  # reads are not changes
    status, _, body = api.call("POST", "/api/v1/queues/csrf/purge", b"", None, {"Origin": base})  # the console's own
    assert status == 200 and json.loads(body)["purged"] == 1
