"""``gateway_http_requests_total{route,method,status}``: the admin listener's answers in ``/metrics``.

Real requests over HTTP, then a scrape parsed by prometheus-client's parser:
routes are counted by their pattern (not the path), answers that come later
(a Deferred, a password check) once, refusals before routing under the route
they were for, and paths no route serves as ``unmatched``.
"""
from __future__ import annotations

import base64
import json
import socket

import pytest

from core.access import Rule
from core.stream import StreamSpec
from gateway.auth.users import Cost, PasswordHash, write_lines
from tests.integration.test_admin_streams import Api
from tests.integration.test_metrics import scrape
from tests.support import BrokerHandle, make_config

SERIES = "gateway_http_requests_total"


def counts(api: Api, headers: dict | None = None) -> dict[tuple[str, str, str], float]:
    return {(dict(k)["route"], dict(k)["method"], dict(k)["status"]): v for k, v in scrape(api, headers).get(SERIES, {}).items()}


def grown(before: dict, after: dict) -> dict:
    """The series that moved between two scrapes, and by how much (the scrape itself left out)."""
    moved = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    moved.pop(("/metrics", "GET", "200"), None)
    return moved


@pytest.fixture
def api(tmp_path):
    config = make_config(tmp_path)
    config.streams = [StreamSpec("sensors", ["topic://sensors.>"])]
    handle = BrokerHandle(config)
    yield Api(handle)
    handle.stop()


def test_answers_by_route_pattern_method_and_status(api):
    before = counts(api)
    assert api.call("GET", "/api/v1/queues")[0] == 200
    assert api.call("GET", "/api/v1/queues")[0] == 200
    assert api.call("GET", "/api/v1/queues/no.such.queue")[0] == 404
    assert api.call("GET", "/api/v1/queues/other.queue")[0] == 404
    line = json.dumps({"destination": "/topic/sensors.a", "body": "x"}).encode()
    assert api.call("POST", "/api/v1/messages", line, "application/x-ndjson")[0] == 200  # a Deferred answer
    assert api.call("GET", "/api/v1/streams/sensors/latest?after=1&wait_ms=20")[0] == 200  # a long poll
    assert api.call("GET", "/api/v1/streams/sensors/latest?wait_ms=-1")[0] == 400
    assert api.call("DELETE", "/api/v1/overview")[0] == 405
    assert api.call("GET", "/no/such/path")[0] == 404
    api.call("GET", "/api/v1/retained/a/b/c")  # a {topic:path} route: labelled as {topic}, as it always was
    raw = socket.create_connection(("127.0.0.1", api.handle.admin_port))
    raw.sendall(b"BREW /api/v1/queues HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert raw.makefile("rb").readline().split()[1] == b"405"
    raw.close()
    moved = grown(before, counts(api))
    retained = [k for k in moved if k[0].startswith("/api/v1/retained/")]
    assert retained and retained[0][0] == "/api/v1/retained/{topic}"
    del moved[retained[0]]
    assert moved == {
        ("/api/v1/queues", "GET", "200"): 2,
        ("/api/v1/queues/{name}", "GET", "404"): 2,  # one series for every queue name
        ("/api/v1/messages", "POST", "200"): 1,
        ("/api/v1/streams/{name}/latest", "GET", "200"): 1,
        ("/api/v1/streams/{name}/latest", "GET", "400"): 1,
        ("/api/v1/overview", "DELETE", "405"): 1,
        ("unmatched", "GET", "404"): 1,
        ("/api/v1/queues", "other", "405"): 1,  # methods clients make up do not make series
    }


PASSWORDS = {"alice": "a-secret", "bob": "b-secret"}


def basic(user: str, password: str | None = None) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password or PASSWORDS[user]}".encode()).decode()}


def test_refusals_are_counted_under_their_route(tmp_path):
    users = tmp_path / "users"
    write_lines(str(users), [f"{name}:{PasswordHash.make(pw.encode(), Cost(ln=10))}" for name, pw in PASSWORDS.items()])
    config = make_config(tmp_path)
    config.streams = [StreamSpec("sensors", ["topic://sensors.>"])]
    config.auth.users_file = str(users)
    config.auth.rules = [Rule.parse("user:alice", "allow", ["read", "write", "admin"], ["stream://>", "broker://>"])]
    handle = BrokerHandle(config)
    try:
        api = Api(handle)
        before = counts(api, basic("alice"))
        assert api.call("GET", "/api/v1/streams/sensors")[0] == 401  # no credentials: refused before routing
        assert api.call("GET", "/api/v1/streams/sensors", headers=basic("alice", "wrong"))[0] == 401  # after the hash
        assert api.call("GET", "/api/v1/streams/sensors", headers=basic("bob"))[0] == 403
        assert api.call("GET", "/api/v1/streams/sensors", headers=basic("alice"))[0] == 200  # answered after the hash
        assert api.call("GET", "/nowhere", headers=basic("alice", "wrong"))[0] == 401
        assert api.call("GET", "/metrics", headers=basic("bob"))[0] == 403
        moved = grown(before, counts(api, basic("alice")))
        assert moved == {
            ("/api/v1/streams/{name}", "GET", "401"): 2,
            ("/api/v1/streams/{name}", "GET", "403"): 1,
            ("/api/v1/streams/{name}", "GET", "200"): 1,
            ("unmatched", "GET", "401"): 1,
            ("/metrics", "GET", "403"): 1,
        }
    finally:
        handle.stop()
