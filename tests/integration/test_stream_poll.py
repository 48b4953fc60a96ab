"""``GET /api/v1/streams/{name}/latest``: the long poll of a stream's ends, over real HTTP (gateway/admin/stream_poll.py).

A real broker on loopback; records are published over HTTP and STOMP.  Waits
are checked with barriers (the broker holds the request, seen from the
reactor thread) rather than clock windows, and every test that waits checks
afterwards that nothing of the wait is left: no feed on the stream, no timer
in the reactor.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import pytest

from core.stream import StreamSpec
from gateway.admin import stream_poll
from tests.integration.test_admin_auth import auth_config
from tests.integration.test_admin_auth import call as call_as
from tests.integration.test_admin_streams import Api
from tests.support import BrokerHandle, connect, disconnect, make_config, reactor, sync

JSONL = "application/x-ndjson"


@pytest.fixture
def api(tmp_path):
    config = make_config(tmp_path)
    config.streams = [StreamSpec("sensors", ["topic://sensors.>"], partitions=2), StreamSpec("orders", ["queue://orders"])]
    handle = BrokerHandle(config)
    yield Api(handle)
    handle.stop()


def poll_api(handle: BrokerHandle) -> stream_poll.StreamPollAPI:
    """The broker's StreamPollAPI, found through the route it serves."""
    router = handle.gateway.admin.resource
    for pattern, methods in router.routes():
        if pattern.endswith("/latest"):
            return methods["GET"].__self__
    raise AssertionError("no /latest route")


def publish(api: Api, *destinations: str) -> None:
    body = "".join(json.dumps({"destination": d, "body": "x"}) + "\n" for d in destinations).encode()
    status, _, data = api.call("POST", "/api/v1/messages", body, JSONL)
    assert status == 200, data


def latest(api: Api, query: str = "", timeout: float = 10) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{api.base}/api/v1/streams/sensors/latest{query}", timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def ends(body: Any) -> list[int]:
    return [p["latest"] for p in body["partitions"]]


def leftovers(handle: BrokerHandle) -> dict[str, Any]:
    """What a wait could leave behind: waiters, watches, feeds on the stream, reactor timers of the module."""
    poll = poll_api(handle)

    def look() -> dict[str, Any]:
        timers = [c for c in reactor().getDelayedCalls()
                  if isinstance(getattr(c.func, "__self__", None), (stream_poll._Waiter, stream_poll._Watch))]
        feeds = [f for s in handle.broker.streams.streams.values() for f in s.feeds if isinstance(f, stream_poll._Watch)]
        return {"waiting": poll.waiting(), "watches": dict(poll.watches), "feeds": feeds, "timers": timers}

    return handle.inspect(look)


NOTHING = {"waiting": 0, "watches": {}, "feeds": [], "timers": []}


def waiting(handle: BrokerHandle, n: int) -> None:
    """The barrier: returns once the broker holds ``n`` requests."""
    deadline = time.monotonic() + 10
    while leftovers(handle)["waiting"] != n:
        assert time.monotonic() < deadline, f"the broker never held {n} waiting request(s)"
        time.sleep(0.01)


def test_answers_at_once_without_wait_or_when_an_end_differs(api):
    status, body = latest(api)
    assert status == 200 and body == {"partitions": [{"partition": 0, "earliest": 0, "latest": 0},
                                                     {"partition": 1, "earliest": 0, "latest": 0}]}
    publish(api, "topic://sensors.a", "topic://sensors.a", "topic://sensors.b")
    now = ends(latest(api)[1])
    assert sum(now) == 3
    # Behind (the client knows older ends), or another partition count: no wait, although 30 s are allowed.
    started = time.monotonic()
    assert ends(latest(api, "?after=0,0&wait_ms=30000")[1]) == now
    assert ends(latest(api, f"?after={now[0]}&wait_ms=30000")[1]) == now
    assert ends(latest(api, f"?after={now[0] + 5},{now[1]}&wait_ms=30000")[1]) == now  # ahead: a broker that lost data
    assert ends(latest(api, f"?after={now[0]},{now[1]}")[1]) == now  # no wait_ms: no wait
    assert time.monotonic() - started < 10  # the urllib timeout would have said so anyway
    assert leftovers(api.handle) == NOTHING


def test_waits_until_a_record_is_written(api):
    publish(api, "topic://sensors.a")
    before = ends(latest(api)[1])
    answers: list[Any] = []
    after = ",".join(map(str, before))
    thread = threading.Thread(target=lambda: answers.append((latest(api, f"?after={after}&wait_ms=30000", timeout=40),
                                                             time.monotonic())))
    thread.start()
    waiting(api.handle, 1)  # the barrier: the broker holds the request
    assert leftovers(api.handle)["feeds"], "the wait should follow the stream"
    assert not answers
    # A record for another stream moves nothing here: still waiting.
    publish(api, "queue://orders")
    conn, got = connect(api.handle)
    conn.send("/topic/sensors.b", "live", headers={"persistent": "true"})
    sync(conn, got)  # on disk now (the receipt)
    written = time.monotonic()
    thread.join(10)
    disconnect(conn)
    assert answers, "no answer although a record was written"
    (status, body), answered = answers[0]
    assert status == 200 and sum(ends(body)) == sum(before) + 1
    assert answered - written < 1.0, f"answered {answered - written:.3f} s after the write"
    assert leftovers(api.handle) == NOTHING


def test_answers_at_the_bound_when_nothing_is_written(api):
    now = ends(latest(api)[1])
    started = time.monotonic()
    status, body = latest(api, f"?after={now[0]},{now[1]}&wait_ms=300")
    assert status == 200 and ends(body) == now
    assert time.monotonic() - started >= 0.29
    assert leftovers(api.handle) == NOTHING


def test_a_client_leaving_mid_wait_leaves_nothing_behind(api):
    now = ends(latest(api)[1])
    raw = socket.create_connection(("127.0.0.1", api.handle.admin_port))
    raw.sendall(f"GET /api/v1/streams/sensors/latest?after={now[0]},{now[1]}&wait_ms=30000 HTTP/1.1\r\n"
                f"Host: x\r\n\r\n".encode())
    other: list[Any] = []
    thread = threading.Thread(target=lambda: other.append(latest(api, f"?after={now[0]},{now[1]}&wait_ms=30000", timeout=40)))
    thread.start()
    waiting(api.handle, 2)
    raw.close()  # an idle query stopped
    waiting(api.handle, 1)
    assert len(leftovers(api.handle)["watches"]) == 1  # the other waiter keeps the stream's watch
    publish(api, "topic://sensors.c")
    thread.join(10)
    assert other and other[0][0] == 200 and sum(ends(other[0][1])) == sum(now) + 1
    assert leftovers(api.handle) == NOTHING


def test_bad_parameters_and_unknown_streams(api):
    for query, what in [
        ("?after=abc&wait_ms=10", "parameter after"), ("?after=1,-2&wait_ms=10", "parameter after"),
        ("?after=1,,2&wait_ms=10", "parameter after"), ("?after=%C2%B2&wait_ms=10", "parameter after"),
        ("?after=0,0&wait_ms=-1", "parameter wait_ms must be 0-30000"),
        ("?after=0,0&wait_ms=30001", "parameter wait_ms must be 0-30000"),
        ("?after=0,0&wait_ms=soon", "parameter wait_ms must be an integer"),
    ]:
        status, body = latest(api, query)
        assert status == 400 and body["code"] == "bad_request" and what in body["error"], (query, body)
    status, _, data = api.call("GET", "/api/v1/streams/nope/latest?after=0&wait_ms=1000")
    assert status == 404 and json.loads(data)["code"] == "unknown_stream"
    assert leftovers(api.handle) == NOTHING


def test_needs_read_on_the_stream(tmp_path):
    handle = BrokerHandle(auth_config(tmp_path))
    try:
        path = "/api/v1/streams/sensors/latest?after=0&wait_ms=20"
        assert call_as(handle, "GET", path)[0] == 401
        status, _, body = call_as(handle, "GET", path, "bob")
        assert status == 403 and json.loads(body) == {"error": "user 'bob' may not read stream://sensors", "code": "forbidden"}
        assert call_as(handle, "GET", "/api/v1/streams/nope/latest", "bob")[0] == 403  # says nothing of what exists
        status, _, body = call_as(handle, "GET", path, "carol")  # read on stream://sensors: waits 20 ms, then answers
        assert status == 200 and ends(json.loads(body)) == [0]
    finally:
        handle.stop()
