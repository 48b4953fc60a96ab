"""The admin listener with [auth]: HTTP Basic, 401 and 403, and what each route needs (gateway/admin/auth.py)."""
from __future__ import annotations

import base64
import json

import pytest

from core.access import Rule
from core.stream import StreamSpec
from gateway.auth.users import Cost, PasswordHash, write_lines
from tests.integration.test_admin_streams import Api
from tests.support import BrokerHandle, make_config

JSONL = "application/x-ndjson"
CHEAP = Cost(ln=10)  # the format and the checks; the production cost is tested in tests/unit/test_users.py
PASSWORDS = {"alice": "a-secret", "bob": "b-secret", "carol": "c-secret"}


def auth_config(tmp_path, allow_anonymous=None):
    users = tmp_path / "users"
    write_lines(str(users), [f"{name}:{PasswordHash.make(pw.encode(), CHEAP)}" for name, pw in PASSWORDS.items()])
    config = make_config(tmp_path)
    config.streams = [StreamSpec("sensors", ["topic://sensors.>"]), StreamSpec("orders", ["queue://orders"])]
    config.auth.users_file = str(users)
    config.auth.allow_anonymous = allow_anonymous
    config.auth.groups = {"admins": ["alice"]}
    config.auth.rules = [
        Rule.parse("group:admins", "allow", ["read", "write", "admin"], ["topic://>", "queue://>", "stream://>"]),
        Rule.parse("user:carol", "allow", ["read"], ["stream://sensors"]),
        Rule.parse("anonymous", "allow", ["read"], ["stream://orders"]),
    ]
    return config


@pytest.fixture
def broker(tmp_path):
    handle = BrokerHandle(auth_config(tmp_path))
    yield handle
    handle.stop()


def call(handle, method, path, user=None, password=None, body=None, content_type=None, authorization=None):
    if user is not None:
        password = PASSWORDS.get(user, "x") if password is None else password
        authorization = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    headers = {"Authorization": authorization} if authorization is not None else {}
    return Api(handle).call(method, path, body, content_type, headers)


def publish(handle, user, destination, body="x"):
    line = json.dumps({"destination": destination, "body": body}).encode()
    return call(handle, "POST", "/api/v1/messages", user, body=line, content_type=JSONL)


def test_missing_and_bad_credentials_get_401_and_the_same_body(broker):
    status, headers, body = call(broker, "GET", "/api/v1/streams/sensors")
    assert status == 401 and headers["WWW-Authenticate"].startswith('Basic realm="gateway"')
    assert json.loads(body)["code"] == "unauthorized"
    wrong = call(broker, "GET", "/api/v1/streams/sensors", "alice", "wrong")
    unknown = call(broker, "GET", "/api/v1/streams/sensors", "mallory", "a-secret")
    assert wrong[0] == unknown[0] == 401
    assert wrong[2] == unknown[2] and json.loads(wrong[2])["error"] == "bad user name or password"
    assert call(broker, "GET", "/api/v1", authorization="Bearer abc")[2] == wrong[2]
    assert call(broker, "GET", "/api/v1", authorization="Basic !!!")[0] == 401
    assert call(broker, "GET", "/")[0] == 401  # every route, the index too


def test_authenticated_without_permission_gets_403(broker):
    status, _, body = call(broker, "GET", "/api/v1/streams/sensors", "bob")
    assert status == 403 and json.loads(body) == {"error": "user 'bob' may not read stream://sensors", "code": "forbidden"}
    # The same for a stream that does not exist: a refusal tells nothing of what exists.
    assert call(broker, "GET", "/api/v1/streams/nope", "bob")[0] == 403
    assert call(broker, "GET", "/api/v1", "bob")[0] == 200  # the index needs a login, no permission
    assert json.loads(call(broker, "GET", "/api/v1/streams", "bob")[2]) == {"streams": []}


def test_admin_user_reads_writes_and_sees_everything(broker):
    status, _, body = publish(broker, "alice", "/topic/sensors.a", "hello")
    assert status == 200 and json.loads(body)["accepted"] == 1
    status, _, body = call(broker, "GET", "/api/v1/streams", "alice")
    assert status == 200 and [s["name"] for s in json.loads(body)["streams"]] == ["sensors", "orders"]
    assert call(broker, "GET", "/api/v1/streams/nope", "alice")[0] == 404


def test_stream_reads_need_read_on_the_stream(broker):
    assert publish(broker, "alice", "topic://sensors.b", "reading")[0] == 200
    status, _, body = call(broker, "GET", "/api/v1/streams/sensors/partitions/0/records?from=0&format=jsonl", "carol")
    assert status == 200 and json.loads(body.splitlines()[0])["body"] == "reading"
    assert call(broker, "GET", "/api/v1/streams/sensors/offsets?timestamp=0", "carol")[0] == 200
    reader = json.dumps({"offsets": {"0": 0}}).encode()
    assert call(broker, "PUT", "/api/v1/streams/sensors/readers/q1", "carol", body=reader, content_type="application/json")[0] == 204
    assert call(broker, "GET", "/api/v1/streams/orders", "carol")[0] == 403
    assert [s["name"] for s in json.loads(call(broker, "GET", "/api/v1/streams", "carol")[2])["streams"]] == ["sensors"]


def test_publishing_needs_write_on_every_row(broker):
    status, _, body = publish(broker, "carol", "/topic/sensors.c")
    assert status == 403 and json.loads(body)["error"] == "row 0: user 'carol' may not write topic://sensors.c"
    rows = b"\n".join(json.dumps({"destination": d, "body": "x"}).encode() for d in ("/queue/orders", "/topic/sensors.d"))
    assert call(broker, "POST", "/api/v1/messages", "alice", body=rows, content_type=JSONL)[0] == 200
    assert broker.queue_depth("queue://orders") == 1


def test_anonymous_requests_when_allowed_follow_the_rules(tmp_path):
    handle = BrokerHandle(auth_config(tmp_path, allow_anonymous=True))
    try:
        assert call(handle, "GET", "/api/v1/streams/orders")[0] == 200  # the rule for anonymous
        status, headers, _ = call(handle, "GET", "/api/v1/streams/sensors")
        assert status == 401 and "WWW-Authenticate" in headers  # not allowed: asked to log in
        assert call(handle, "GET", "/api/v1/streams/sensors", "carol")[0] == 200
        assert call(handle, "GET", "/api/v1/streams/sensors", "carol", "wrong")[0] == 401  # not anonymous instead
    finally:
        handle.stop()


def test_the_spark_client_reads_and_publishes_with_user_and_password(broker):
    """What the Spark source and sink send (options user and password): the same HTTP Basic, the same rules."""
    from spark.client import BrokerClient
    from spark.errors import BrokerError
    from spark.options import parse_write_options

    url = f"http://127.0.0.1:{broker.admin_port}"
    with BrokerClient(url) as anonymous:
        with pytest.raises(BrokerError, match="401.*set the options user and password"):
            anonymous.stream("sensors")
    opts = parse_write_options({"url": url, "user": "carol", "password": PASSWORDS["carol"]})
    with BrokerClient(url, authorization=opts.authorization) as carol:
        assert carol.stream("sensors")["name"] == "sensors"
        with pytest.raises(BrokerError, match="403.*lacks the permission"):
            carol.stream("orders")
    opts = parse_write_options({"url": url, "user": "alice", "password": PASSWORDS["alice"]})
    with BrokerClient(url, authorization=opts.authorization) as alice:
        assert {s["name"] for s in alice.streams()} == {"sensors", "orders"}
