"""Durable subscriptions over the admin API (gateway/admin/subscriptions.py), over real HTTP: seen, and ended.

STOMP clients (stomp.py) make and leave the subscriptions; whether one is
ended is checked on what its client gets when it comes back, on the same
broker and on one restarted on the same data directory.
"""
from __future__ import annotations

import json

import pytest

from tests.integration.admin_support import answers_json_error, Actions, as_user, get, refused_without_admin, secured_config, send_all
from tests.support import BrokerHandle, connect, disconnect, make_config, mqtt_close, mqtt_connect, sync, wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    handle = BrokerHandle(make_config(tmp_path_factory.mktemp("subscriptions")))
    yield Actions(handle)
    handle.stop()


def test_a_durable_subscription_is_listed_and_keeps_messages_while_away(api):
    handle = api.handle
    listener, heard = connect(handle, client_id="api-durable")
    listener.subscribe("/topic/api.news", id="1", headers={"activemq.subscriptionName": "news"})
    sync(listener, heard)
    device, device_got = mqtt_connect(handle, "api-durable-device", version=4, clean=False)
    device.subscribe("api/news", 1)
    device_got.wait_for(1, what="subacks")

    durables = get(api, "/api/v1/durable-subscriptions?filter=api-durable")[1]["durable_subscriptions"]
    stomp_view = [d for d in durables if d["kind"] == "durable"]
    assert [(d["key"], d["client_id"], d["name"], d["destination"], d["active"]) for d in stomp_view] == [
        ("api-durable:news", "api-durable", "news", "topic://api.news", True),
    ]
    mqtt_view = [d for d in durables if d["kind"] == "mqtt"]  # an MQTT persistent session's filter, listed alike
    assert [(d["client_id"], d["destination"]) for d in mqtt_view] == [("api-durable-device", "topic://api.news")]
    disconnect(listener)  # away: the durable subscription keeps what is published meanwhile
    wait_until(lambda: not get(api, "/api/v1/durable-subscriptions/api-durable%3Anews")[1]["active"],
               what="the durable subscription inactive")
    send_all(handle, "/topic/api.news", ["while away"])
    away = get(api, "/api/v1/durable-subscriptions/api-durable%3Anews")[1]
    assert away["ready"] == 1 and away["consumers"] == 0 and away["destination"] == "topic://api.news"
    assert api.do("DELETE", "/api/v1/durable-subscriptions/api-durable%3Anews")["dropped"] == 1  # by the listed key
    mqtt_close(device)


def test_delete_durable_subscription(api):
    conn, got = connect(api.handle, client_id="dur-1")
    conn.subscribe("/topic/dur.news", id="d", headers={"activemq.subscriptionName": "s1"})
    sync(conn, got)
    status, _, body = api.call("DELETE", "/api/v1/durable-subscriptions/dur-1/s1")
    assert status == 409 and json.loads(body)["code"] == "subscription_active"
    disconnect(conn)
    send_all(api.handle, "/topic/dur.news", ["while away 1", "while away 2"])
    answer = api.do("DELETE", "/api/v1/durable-subscriptions/dur-1/s1")
    assert answer == {"key": "dur-1:s1", "destination": "topic://dur.news", "dropped": 2}
    assert api.call("DELETE", "/api/v1/durable-subscriptions/dur-1/s1")[0] == 404
    conn, got = connect(api.handle, client_id="dur-1")
    conn.subscribe("/topic/dur.news", id="d", headers={"activemq.subscriptionName": "s1"})
    sync(conn, got)
    assert got.settle(0.2) == []
    disconnect(conn)


@pytest.mark.parametrize("method, path, status, code, text", [
    ("GET", "/api/v1/durable-subscriptions/nobody%3Anothing", 404, "unknown_subscription", "nobody:nothing"),
    ("GET", "/api/v1/durable-subscriptions?sort=colour", 400, "bad_request", "parameter sort"),
    ("DELETE", "/api/v1/durable-subscriptions/nobody/none", 404, "unknown_subscription", "nobody:none"),
    ("DELETE", "/api/v1/durable-subscriptions/nobody%3Anone", 404, "unknown_subscription", "nobody:none"),
    ("POST", "/api/v1/durable-subscriptions/nobody/none", 405, "method_not_allowed", "use DELETE"),
])
def test_bad_input_gets_a_json_error(api, method, path, status, code, text):
    answers_json_error(api, method, path, status, code, text)


def test_an_mqtt_sessions_filter_is_not_ended_here(api):
    device, got = mqtt_connect(api.handle, "dur-mqtt", clean=False)
    device.subscribe("dur/mqtt", 1)
    got.wait_for(1, what="subacks")
    mqtt_close(device)
    [view] = [d for d in get(api, "/api/v1/durable-subscriptions?filter=dur-mqtt")[1]["durable_subscriptions"]]
    assert view["kind"] == "mqtt"
    status, _, body = api.call("DELETE", "/api/v1/durable-subscriptions/" + view["key"].replace("\x1f", "%1F"))
    assert status == 404 and "client-id:subscription-name" in json.loads(body)["error"]


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    handle = BrokerHandle(secured_config(tmp_path_factory.mktemp("subscriptions-secured")))
    yield Actions(handle)
    handle.stop()


def test_durable_subscriptions_need_admin(secured):
    refused_without_admin(secured, [
        ("GET", "/api/v1/durable-subscriptions/c%3As", None),
        ("DELETE", "/api/v1/durable-subscriptions/c/s", None),
        ("DELETE", "/api/v1/durable-subscriptions/c%3As", None),
    ])
    assert as_user(secured, "alice", "DELETE", "/api/v1/durable-subscriptions/c/s")[0] == 404
    assert as_user(secured, "bob", "GET", "/api/v1/durable-subscriptions")[1]["durable_subscriptions"] == []


def test_a_deleted_durable_subscription_stays_gone_across_a_restart(tmp_path):
    handle = BrokerHandle(make_config(tmp_path))
    api = Actions(handle)
    for name in ("gone", "kept"):
        conn, got = connect(handle, client_id="r-client")
        conn.subscribe("/topic/r.news", id="d", headers={"activemq.subscriptionName": name})
        sync(conn, got)
        disconnect(conn)
    send_all(handle, "/topic/r.news", ["held"])
    assert api.do("DELETE", "/api/v1/durable-subscriptions/r-client/gone")["dropped"] == 1
    handle.stop()

    handle = BrokerHandle(make_config(tmp_path))
    try:
        assert handle.inspect(lambda: handle.broker.durable("r-client:gone")) is None
        assert get(Actions(handle), "/api/v1/durable-subscriptions/r-client%3Akept")[1]["ready"] == 1
    finally:
        handle.stop()
