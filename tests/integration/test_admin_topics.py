"""Topics over the admin API (gateway/admin/topics.py), over real HTTP: what subscriptions make of them,
and a message an operator sends to one.

Subscriptions are made by real clients (stomp.py plain and durable, paho); one
broker serves the module, each test with topics of its own.
"""
from __future__ import annotations

import json
import urllib.parse

import pytest

from tests.integration.admin_support import Actions, as_user, get, login, refused_without_admin, secured_config
from tests.support import BrokerHandle, connect, disconnect, make_config, mqtt_close, mqtt_connect, sync

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    handle = BrokerHandle(make_config(tmp_path_factory.mktemp("topics")))
    yield Actions(handle)
    handle.stop()


def test_a_topic_shows_every_subscription_a_publish_reaches(api):
    handle = api.handle
    listener, heard = connect(handle, client_id="api-durable")
    listener.subscribe("/topic/api.news", id="1", headers={"activemq.subscriptionName": "news"})
    plain, plain_heard = connect(handle)
    plain.subscribe("/topic/api.>", id="1")
    device, device_got = mqtt_connect(handle, "api-news-reader", version=4)
    device.subscribe("api/news", 1)
    device_got.wait_for(1, what="subacks")
    sync(plain, plain_heard)
    sync(listener, heard)
    producer, got = connect(handle)
    for i in range(3):
        producer.send("/topic/api.news", f"n{i}")
    heard.wait_for(3)
    plain_heard.wait_for(3)
    device_got.wait_for(3)

    status, topic = get(api, "/api/v1/topics/api.news")
    assert status == 200 and topic["destination"] == "topic://api.news" and topic["retained"] is False
    kinds = sorted(s["kind"] for s in topic["subscription_list"])
    assert kinds == ["durable", "mqtt", "subscription"]
    assert topic["subscriptions"] == 3 and topic["durable"] == 1 and topic["consumers"] == 3
    assert topic["enqueued"] == 9  # three messages to each of three subscriptions
    assert get(api, "/api/v1/topics/topic%3A%2F%2Fapi.news")[1]["subscriptions"] == 3  # a canonical name too
    wildcard = get(api, "/api/v1/topics/" + urllib.parse.quote("api.>", safe=""))[1]
    assert [s["kind"] for s in wildcard["subscription_list"]] == ["subscription"]
    listed = get(api, "/api/v1/topics?filter=api.")[1]["topics"]
    assert {t["name"] for t in listed} == {"api.news", "api.>"}
    assert [t["name"] for t in get(api, "/api/v1/topics?filter=api.&sort=-subscriptions&page_size=1")[1]["topics"]] == [
        "api.news",
    ]
    for conn in (listener, plain, producer):
        disconnect(conn)
    mqtt_close(device)


def test_a_topic_with_only_a_retained_message_is_found(api):
    publisher, _ = mqtt_connect(api.handle, "topics-retainer")
    publisher.publish("kept/here", b"last", qos=1, retain=True).wait_for_publish()
    status, topic = get(api, "/api/v1/topics/kept.here")
    assert status == 200 and topic["retained"] is True and topic["subscriptions"] == 0
    mqtt_close(publisher)


def test_send_to_a_topic(api):
    mqtt, got = mqtt_connect(api.handle, "send-sub")
    mqtt.subscribe("send/t", qos=1)
    got.wait_for(1, what="subacks")
    answer = api.do("POST", "/api/v1/topics/send.t/messages", {"body_base64": "AP8=", "persistent": False})
    assert answer["destination"] == "topic://send.t" and answer["persistent"] is False
    assert got.wait_for(1)[0].payload == b"\x00\xff"
    mqtt_close(mqtt)


@pytest.mark.parametrize("method, path, body, status, code, text", [
    ("GET", "/api/v1/topics/no.subscriber.here", None, 404, "unknown_topic", "no subscription or retained message"),
    ("GET", "/api/v1/topics?sort=colour", None, 400, "bad_request", "parameter sort"),
    ("POST", "/api/v1/topics/send.bad/messages", b'{"body": 5}', 400, "bad_request", "field 'body'"),
    ("POST", "/api/v1/topics/send.*/messages", b'{"body": "x"}', 400, "bad_request", "wildcards are for subscribing"),
    ("POST", "/api/v1/topics/queue%3A%2F%2Fq/messages", b'{"body": "x"}', 400, "bad_request", "not a topic name"),
    ("DELETE", "/api/v1/topics/x", None, 405, "method_not_allowed", "use GET"),
])
def test_bad_input_gets_a_json_error(api, method, path, body, status, code, text):
    got_status, headers, data = api.call(method, path, body, "application/json" if body is not None else None)
    assert headers["Content-Type"] == "application/json", data
    error = json.loads(data)
    assert (got_status, error["code"]) == (status, code), error
    assert text in error["error"], error


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    handle = BrokerHandle(secured_config(tmp_path_factory.mktemp("topics-secured")))
    yield Actions(handle)
    handle.stop()


def test_topics_need_admin(secured):
    refused_without_admin(secured, [
        ("GET", "/api/v1/topics/sec.t", None),
        ("POST", "/api/v1/topics/sec.t/messages", {"body": "x"}),
    ])
    conn, got = login(secured.handle, "alice")
    conn.subscribe("/topic/sec.t", id="1")
    sync(conn, got)
    assert as_user(secured, "alice", "POST", "/api/v1/topics/sec.t/messages", {"body": "x"})[0] == 200
    assert got.wait_for(1)[0].body == "x"
    assert [t["name"] for t in as_user(secured, "alice", "GET", "/api/v1/topics")[1]["topics"]] == ["sec.t"]
    assert as_user(secured, "bob", "GET", "/api/v1/topics")[1]["topics"] == []  # read and write are not admin
    disconnect(conn)
