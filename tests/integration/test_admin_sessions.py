"""MQTT sessions over the admin API (gateway/admin/sessions.py), over real HTTP: seen, and ended.

paho clients make the sessions, persistent and clean, and come back to show
whether one was ended, on the same broker and on one restarted on the same
data directory.
"""
from __future__ import annotations

import json

import pytest

from tests.integration.admin_support import answers_json_error, Actions, as_user, get, refused_without_admin, secured_config
from tests.support import BrokerHandle, connect, disconnect, make_config, mqtt_close, mqtt_connect, sync, wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    handle = BrokerHandle(make_config(tmp_path_factory.mktemp("sessions")))
    yield Actions(handle)
    handle.stop()


def test_mqtt_sessions_persistent_and_clean(api):
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    handle = api.handle
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 300
    keeper, keeper_got = mqtt_connect(handle, "api-keeper", version=5, clean=False, properties=props)
    keeper.subscribe("api/alerts/#", 1)
    keeper_got.wait_for(1, what="subacks")
    passer, _ = mqtt_connect(handle, "api-passer", version=4)

    sessions = {s["client_id"]: s for s in get(api, "/api/v1/mqtt-sessions?filter=api-")[1]["mqtt_sessions"]}
    assert sessions["api-keeper"]["persistent"] is True and sessions["api-keeper"]["connected"] is True
    assert sessions["api-keeper"]["subscriptions"] == ["topic://api.alerts.>"]
    assert sessions["api-passer"]["persistent"] is False and sessions["api-passer"]["connected"] is True
    # A clean session gets its queue with its first subscription; until then it shows an empty one.
    assert sessions["api-passer"]["subscriptions"] == [] and sessions["api-passer"]["messages"] == 0
    assert set(sessions["api-passer"]) == set(sessions["api-keeper"]) - {"expiry_interval", "disconnected_at"}
    passer.subscribe("$share/api-group/api/shared/#", 1)  # a shared group's consumer comes first
    passer.subscribe("api/passer/#", 1)
    wait_until(lambda: get(api, "/api/v1/mqtt-sessions/api-passer")[1]["subscriptions"] == ["topic://api.passer.>"],
               what="api-passer's subscription")
    assert get(api, "/api/v1/mqtt-sessions/api-passer")[1]["consumers"] == 1

    mqtt_close(keeper)
    wait_until(lambda: not get(api, "/api/v1/mqtt-sessions/api-keeper")[1]["connected"], what="api-keeper offline")
    sender, sender_got = connect(handle)
    sender.send("/topic/api.alerts.fire", "while away", headers={"persistent": "true"})
    sync(sender, sender_got)
    away = get(api, "/api/v1/mqtt-sessions/api-keeper")[1]
    assert away["ready"] == 1 and away["expiry_interval"] == 300 and away["disconnected_at"].endswith("Z")
    mqtt_close(passer)
    # A clean session ends with its connection.
    wait_until(lambda: get(api, "/api/v1/mqtt-sessions/api-passer")[0] == 404, what="api-passer's session gone")
    disconnect(sender)


def test_delete_mqtt_session(api):
    client, got = mqtt_connect(api.handle, "sess-1", clean=False)
    client.subscribe("sess/t", qos=1)
    got.wait_for(1, what="subacks")
    status, _, body = api.call("DELETE", "/api/v1/mqtt-sessions/sess-1")
    assert status == 409 and json.loads(body)["code"] == "session_connected"
    mqtt_close(client)
    # Refused (409) while the broker has not seen the disconnect yet; then deleted (204).
    wait_until(lambda: api.call("DELETE", "/api/v1/mqtt-sessions/sess-1")[0] != 409, what="the session deleted once offline")
    assert api.call("DELETE", "/api/v1/mqtt-sessions/sess-1")[0] == 404
    client, got = mqtt_connect(api.handle, "sess-1", clean=False)
    assert got.connacks[0][0].session_present is False
    mqtt_close(client)


@pytest.mark.parametrize("method, path, status, code, text", [
    ("GET", "/api/v1/mqtt-sessions/nobody", 404, "unknown_session", "nobody"),
    ("GET", "/api/v1/mqtt-sessions?sort=colour", 400, "bad_request", "parameter sort"),
    ("DELETE", "/api/v1/mqtt-sessions/nobody", 404, "unknown_session", "nobody"),
    ("PUT", "/api/v1/mqtt-sessions/nobody", 405, "method_not_allowed", "use DELETE, GET"),
])
def test_bad_input_gets_a_json_error(api, method, path, status, code, text):
    answers_json_error(api, method, path, status, code, text)


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    handle = BrokerHandle(secured_config(tmp_path_factory.mktemp("sessions-secured")))
    yield Actions(handle)
    handle.stop()


def test_sessions_need_admin_on_broker_sessions(secured):
    refused_without_admin(secured, [
        ("GET", "/api/v1/mqtt-sessions", None),
        ("GET", "/api/v1/mqtt-sessions/c", None),
        ("DELETE", "/api/v1/mqtt-sessions/c", None),
    ])
    assert as_user(secured, "alice", "GET", "/api/v1/mqtt-sessions")[0] == 200
    assert as_user(secured, "alice", "DELETE", "/api/v1/mqtt-sessions/c")[0] == 404


def test_an_ended_session_stays_ended_across_a_restart(tmp_path):
    handle = BrokerHandle(make_config(tmp_path))
    api = Actions(handle)
    for client_id in ("r-ended", "r-kept"):
        mqtt, got = mqtt_connect(handle, client_id, clean=False)
        mqtt.subscribe("r/t", qos=1)
        got.wait_for(1, what="subacks")
        mqtt_close(mqtt)
    wait_until(lambda: api.call("DELETE", "/api/v1/mqtt-sessions/r-ended")[0] != 409, what="the session deleted once offline")
    handle.stop()

    handle = BrokerHandle(make_config(tmp_path))
    try:
        assert handle.inspect(lambda: handle.broker.states("mqtt:r-ended")) == []
        for client_id, present in (("r-ended", False), ("r-kept", True)):
            mqtt, got = mqtt_connect(handle, client_id, clean=False)
            assert got.connacks[0][0].session_present is present, client_id
            mqtt_close(mqtt)
    finally:
        handle.stop()
