"""Retained messages over the admin API (gateway/admin/retained.py), over real HTTP: listed, and cleared.

paho clients retain and subscribe; a topic is named in the path in MQTT form,
its slashes encoded or not (``{topic:path}``), or canonical.  Whether a clear
holds is checked on what a new subscriber gets, on the same broker and on
one restarted on the same data directory.
"""
from __future__ import annotations


import pytest

from tests.integration.admin_support import answers_json_error, Actions, as_user, quote, refused_without_admin, secured_config
from tests.support import BrokerHandle, make_config, mqtt_close, mqtt_connect

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    handle = BrokerHandle(make_config(tmp_path_factory.mktemp("retained")))
    yield Actions(handle)
    handle.stop()


def retain(handle, *topics, client_id="ret-pub"):
    publisher, _ = mqtt_connect(handle, client_id)
    for topic in topics:
        publisher.publish(topic, topic.encode(), qos=1, retain=True).wait_for_publish()
    mqtt_close(publisher)


def test_list_and_clear_retained_messages(api):
    retain(api.handle, "ret/a", "ret/b", "ret/deep/c")
    listing = api.do("GET", "/api/v1/retained?filter=" + quote("ret/#"))
    assert listing["total"] == 3 and listing["filter"] == "topic://ret.>"
    assert listing["topics"][0] == {"destination": "topic://ret.a", "topic": "ret/a", "bytes": listing["topics"][0]["bytes"]}
    assert [t["topic"] for t in api.do("GET", "/api/v1/retained?filter=ret/%2B&page_size=1&page=2")["topics"]] == ["ret/b"]
    assert api.do("DELETE", "/api/v1/retained/" + quote("ret/a"), expect=204) is None
    assert api.do("DELETE", "/api/v1/retained/topic://ret.b", expect=204) is None
    assert api.call("DELETE", "/api/v1/retained/ret/a")[0] == 404
    subscriber, got = mqtt_connect(api.handle, "ret-sub")
    subscriber.subscribe("ret/#", qos=1)
    assert [m.payload for m in got.wait_for(1)] == [b"ret/deep/c"]
    assert len(got.settle(0.2)) == 1
    mqtt_close(subscriber)


@pytest.mark.parametrize("path", [
    "/api/v1/retained/way/down/deep",  # the rest of the path, slashes as they are
    "/api/v1/retained/way%2Fdown%2Fdeep",  # or encoded
    "/api/v1/retained/way/down%2Fdeep",  # or both
    "/api/v1/retained/topic%3A%2F%2Fway.down.deep",  # canonical, encoded
])
def test_a_topic_of_many_levels_however_it_is_written(api, path):
    retain(api.handle, "way/down/deep", client_id="ret-deep")
    assert api.do("DELETE", path, expect=204) is None
    assert api.do("GET", "/api/v1/retained?filter=way/%23")["total"] == 0


@pytest.mark.parametrize("method, path, status, code, text", [
    ("GET", "/api/v1/retained?filter=a/%23/b", 400, "bad_request", "parameter filter"),
    ("GET", "/api/v1/retained?page=0", 400, "bad_request", "parameter page"),
    ("DELETE", "/api/v1/retained/a/%2B", 400, "bad_request", "filter"),
    ("DELETE", "/api/v1/retained/a/%23", 400, "bad_request", "filter"),
    ("DELETE", "/api/v1/retained/topic://a.*", 400, "bad_request", "wildcard"),
    ("DELETE", "/api/v1/retained/never/retained", 404, "unknown_retained", "no retained message on topic://never.retained"),
    ("GET", "/api/v1/retained/a/b", 405, "method_not_allowed", "use DELETE"),
])
def test_bad_input_gets_a_json_error(api, method, path, status, code, text):
    answers_json_error(api, method, path, status, code, text)


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    handle = BrokerHandle(secured_config(tmp_path_factory.mktemp("retained-secured")))
    yield Actions(handle)
    handle.stop()


def test_retained_messages_need_admin_on_their_topic(secured):
    refused_without_admin(secured, [
        ("DELETE", "/api/v1/retained/a%2Fb", None),
        ("DELETE", "/api/v1/retained/a/b", None),
    ])
    assert as_user(secured, None, "GET", "/api/v1/retained")[0] == 401
    assert as_user(secured, "bob", "GET", "/api/v1/retained")[1]["topics"] == []  # read and write are not admin
    assert as_user(secured, "alice", "GET", "/api/v1/retained")[1]["topics"] == []
    assert as_user(secured, "alice", "DELETE", "/api/v1/retained/a/b")[0] == 404


def test_a_cleared_message_stays_cleared_across_a_restart(tmp_path):
    handle = BrokerHandle(make_config(tmp_path))
    retain(handle, "r/retained", "r/cleared")
    Actions(handle).do("DELETE", "/api/v1/retained/r%2Fcleared", expect=204)
    handle.stop()

    handle = BrokerHandle(make_config(tmp_path))
    try:
        subscriber, got = mqtt_connect(handle, "r-sub")
        subscriber.subscribe("r/#", qos=1)
        assert [m.payload for m in got.wait_for(1)] == [b"r/retained"] and len(got.settle(0.2)) == 1
        mqtt_close(subscriber)
    finally:
        handle.stop()
