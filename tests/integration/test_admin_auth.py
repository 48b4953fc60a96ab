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


def test_bearer_tokens_act_as_their_user_until_revoked(tmp_path, capsys):
    """`gateway token FILE USER` prints a token; the admin listener takes it as that user, with its rules."""
    from gateway.cli import main

    tokens = str(tmp_path / "tokens")
    made = {}
    for user in ("carol", "bob", "alice"):
        assert main(["token", tokens, user]) == 0
        made[user] = capsys.readouterr().out.strip()
    assert all(t.startswith("gwt_") for t in made.values()) and len(set(made.values())) == 3
    config = auth_config(tmp_path)
    config.auth.tokens_file = tokens
    handle = BrokerHandle(config)
    try:
        def bearer(token, path="/api/v1/streams/sensors"):
            return call(handle, "GET", path, authorization=f"Bearer {token}")

        assert bearer(made["carol"])[0] == 200
        status, _, body = bearer(made["bob"])
        assert status == 403 and json.loads(body)["error"] == "user 'bob' may not read stream://sensors"
        forged = made["carol"][:-4] + "AAAA"
        for bad in (forged, "gwt_nope", "not-a-token", ""):
            status, headers, body = bearer(bad)
            assert status == 401 and json.loads(body)["error"] == "bad user name or password", bad
        assert main(["token", tokens, "--list"]) == 0
        listed = capsys.readouterr().out.split()
        assert listed[1::2] == ["carol", "bob", "alice"]
        assert main(["token", tokens, "--revoke", listed[0]]) == 0
        # alice leaves the users file: her token goes with her.
        write_lines(config.auth.users_file, [f"{n}:{PasswordHash.make(p.encode(), CHEAP)}" for n, p in PASSWORDS.items() if n != "alice"])
        assert bearer(made["carol"])[0] == 200  # read when the broker starts and on SIGHUP only
        handle.inspect(handle.gateway.reload)  # what the CLI's SIGHUP handler calls
        assert bearer(made["carol"])[0] == 401
        assert bearer(made["alice"])[0] == 401
        assert bearer(made["bob"])[0] == 403
        # A damaged tokens file is refused on reload; the tokens read before stay.
        with open(tokens, "a") as f:
            f.write("garbage line\n")
        handle.inspect(handle.gateway.reload)
        assert bearer(made["bob"])[0] == 403
    finally:
        handle.stop()
    assert main(["token", tokens, "--revoke", "zzzzzzzz"]) == 1
    assert "no token 'zzzzzzzz'" in capsys.readouterr().err


def test_the_spark_client_with_a_token(broker, tmp_path):
    from spark.errors import OptionError
    from spark.options import parse_write_options

    url = f"http://127.0.0.1:{broker.admin_port}"
    assert parse_write_options({"url": url, "token": "gwt_abcdefgh_x"}).authorization == "Bearer gwt_abcdefgh_x"
    with pytest.raises(OptionError, match="replaces user and password"):
        parse_write_options({"url": url, "token": "gwt_abcdefgh_x", "user": "carol", "password": "p"})
    with pytest.raises(OptionError, match="made by `gateway token"):
        parse_write_options({"url": url, "token": "s3cret"})


def test_a_client_certificate_logs_in_on_admin_https(tmp_path):
    """On the admin TLS port a verified certificate (CN dev1) is its user; Basic credentials still win when given."""
    import ssl
    import urllib.error
    import urllib.request

    from tests.support import make_certificates

    certs = make_certificates(tmp_path / "tls")
    config = auth_config(tmp_path)
    write_lines(config.auth.users_file, [f"{n}:{PasswordHash.make(p.encode(), CHEAP)}" for n, p in {**PASSWORDS, "dev1": "x"}.items()])
    config.auth.rules.append(Rule.parse("user:dev1", "allow", ["read"], ["stream://orders"]))
    config.tls.cert, config.tls.key, config.tls.ca = certs["server"], certs["server-key"], certs["ca"]
    handle = BrokerHandle(config)

    def get(path, client=None, authorization=None):
        ctx = ssl.create_default_context(cafile=certs["ca"])
        if client:
            ctx.load_cert_chain(certs[client], certs[f"{client}-key"])
        request = urllib.request.Request(f"https://127.0.0.1:{handle.admin_tls_port}{path}")
        if authorization:
            request.add_header("Authorization", authorization)
        try:
            with urllib.request.urlopen(request, context=ctx, timeout=10) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    try:
        assert get("/api/v1/streams/orders", "client")[0] == 200
        status, body = get("/api/v1/streams/sensors", "client")
        assert status == 403 and body["error"] == "user 'dev1' may not read stream://sensors"
        assert get("/api/v1/streams/orders")[0] == 401  # no certificate, no credentials
        basic = "Basic " + base64.b64encode(f"carol:{PASSWORDS['carol']}".encode()).decode()
        assert get("/api/v1/streams/sensors", "client", basic)[0] == 200  # carol, not dev1
        assert get("/api/v1/streams/orders", "client", basic)[0] == 403
        # The plain port has no certificate to go by.
        assert call(handle, "GET", "/api/v1/streams/orders")[0] == 401
    finally:
        handle.stop()


def test_requests_without_credentials_do_not_ban_the_address(tmp_path):
    """A browser asks once without credentials before its Basic prompt: that is no password guess."""
    config = auth_config(tmp_path)
    config.auth.max_failed_logins = 2
    handle = BrokerHandle(config)
    try:
        for _ in range(5):
            assert call(handle, "GET", "/api/v1/streams/sensors")[0] == 401
        assert call(handle, "GET", "/api/v1/streams/sensors", "alice")[0] == 200
        assert call(handle, "GET", "/api/v1", "alice", "wrong")[0] == 401
        assert call(handle, "GET", "/api/v1", "alice", "wrong")[0] == 401  # the second guess bans the address
        status, _, body = call(handle, "GET", "/api/v1", "alice")
        assert status == 401 and "too many failed logins" in json.loads(body)["error"]
    finally:
        handle.stop()
