"""What the admin API's tests share: JSON calls over real HTTP, users and rules, and the clients that make state.

The tests of each admin resource (test_admin_queues.py, test_admin_topics.py,
test_admin_subscriptions.py, test_admin_sessions.py, test_admin_retained.py)
start brokers of their own from these pieces; the console's and the operator
commands' tests (tests/browser, tests/system/test_ops_cli.py) make dead
letters with them too.
"""
from __future__ import annotations

import base64
import json
import urllib.parse
from typing import Any

import stomp

from core.access import Rule
from gateway.auth.users import Cost, PasswordHash, write_lines
from tests.integration.test_admin_streams import Api
from tests.support import Collector, connect, disconnect, make_config, sync, wait_until

JSON = "application/json"
DLQ = "queue://DLQ"
# A policy whose dead letters come quickly and whose queues page out soon: what the queue actions are tested under.
POLICY = {"max_redeliveries": 1, "queue_memory_limit": 64 * 1024, "redelivery_delay_ms": 0}
PASSWORDS = {"alice": "a-secret", "bob": "b-secret", "dora": "d-secret"}


class Actions(Api):
    def do(self, method: str, path: str, doc: Any = None, raw: bytes | None = None, expect: int = 200) -> Any:
        """A JSON request that must answer ``expect``; its JSON answer (None for a 204)."""
        body = raw if raw is not None else (json.dumps(doc).encode() if doc is not None else None)
        status, headers, data = self.call(method, path, body, JSON if body is not None else None)
        assert status == expect, (status, data)
        if status == 204:
            assert data == b""
            return None
        assert headers.get("Content-Type") == "application/json", (status, data)
        return json.loads(data)

    def browse(self, queue: str, query: str = "") -> Any:
        return self.do("GET", f"/api/v1/queues/{quote(queue)}/messages?{query}")


def get(api: Api, path: str) -> tuple[int, Any]:
    """A GET and its JSON answer, whatever the status (the admin API answers JSON for errors too)."""
    status, headers, body = api.call("GET", path)
    assert headers.get("Content-Type") == "application/json", (status, body)
    return status, json.loads(body)


def quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def secured_config(tmp_path: Any, **policy: Any) -> Any:
    """A broker with users: alice administers queues, topics and sessions; bob reads and writes only;
    dora administers the DLQ and sec.mine.  Every admin action is in the audit log."""
    users = tmp_path / "users"
    write_lines(str(users), [f"{name}:{PasswordHash.make(pw.encode(), Cost(ln=10))}" for name, pw in PASSWORDS.items()])
    config = make_config(tmp_path, **policy)
    config.auth.users_file = str(users)
    config.auth.max_failed_logins = 0  # the 401 checks are many "failed logins" from one address
    config.auth.audit_log = str(tmp_path / "audit.log")
    config.auth.rules = [
        Rule.parse("user:alice", "allow", ["read", "write", "admin"], ["queue://>", "topic://>", "broker://sessions"]),
        Rule.parse("user:bob", "allow", ["read", "write"], ["queue://>", "topic://>"]),
        Rule.parse("user:dora", "allow", ["read", "write", "admin"], ["queue://DLQ", "queue://sec.mine"]),
    ]
    return config


def as_user(api: Api, user: str | None, method: str, path: str, doc: Any = None) -> tuple[int, Any]:
    auth = {} if user is None else {"Authorization": "Basic " + base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()}
    body = json.dumps(doc).encode() if doc is not None else None
    status, _, data = api.call(method, path, body, JSON if body else None, auth)
    return status, json.loads(data) if data else None


def answers_json_error(api: Api, method: str, path: str, status: int, code: str, text: str) -> None:
    """``path`` answers ``status`` with a JSON error of ``code`` whose text names ``text``."""
    got_status, headers, data = api.call(method, path)
    assert headers["Content-Type"] == "application/json", data
    error = json.loads(data)
    assert (got_status, error["code"]) == (status, code), error
    assert text in error["error"], error


def refused_without_admin(api: Api, routes: list[tuple[str, str, Any]]) -> None:
    """Each route asks an anonymous caller to log in (401) and refuses bob, who may read and write (403)."""
    for method, path, doc in routes:
        assert as_user(api, None, method, path, doc)[0] == 401, path
        status, error = as_user(api, "bob", method, path, doc)
        assert status == 403 and error["code"] == "forbidden" and "admin" in error["error"], (path, error)


def login(handle: Any, user: str | None = None) -> tuple[Any, Collector]:
    """A stomp.py connection, as ``user`` when given (a secured broker's)."""
    if user is None:
        return connect(handle)
    conn = stomp.Connection12([(handle.host, handle.port)])
    got = Collector()
    conn.set_listener("collector", got)
    conn.connect(user, PASSWORDS[user], wait=True)
    return conn, got


def send_all(handle: Any, destination: str, bodies: list[str], user: str | None = None, **headers: str) -> None:
    conn, got = login(handle, user)
    for body in bodies:
        conn.send(destination, body, headers={"persistent": "true", **headers})
    sync(conn, got)
    disconnect(conn)


def consume(handle: Any, destination: str, count: int, ack: str = "auto", **headers: str) -> list[Any]:
    """What a new consumer gets: ``count`` messages, and nothing more within a short quiet time."""
    conn, got = connect(handle)
    conn.subscribe(destination, id="c", ack=ack, headers=headers)
    got.wait_for(count)
    messages = got.settle(0.2)
    if ack != "auto":
        for m in messages:
            conn.ack(m.headers["ack"])
        sync(conn, got)
    disconnect(conn)
    return messages


def dead_letter(handle: Any, queue: str, count: int, user: str | None = None, **headers: str) -> None:
    """Send ``count`` messages to /queue/``queue`` and NACK each past max_redeliveries (1): into the DLQ."""
    before = handle.queue_depth(DLQ)
    send_all(handle, f"/queue/{queue}", [f"{queue}-{i}" for i in range(count)], user, **headers)
    conn, got = login(handle, user)
    conn.subscribe(f"/queue/{queue}", id="s", ack="client-individual")
    seen = 0

    def nacked_into_the_dlq() -> bool:
        nonlocal seen
        fresh = got.messages[seen:]
        for message in fresh:  # each delivery NACKed as it comes, redeliveries too
            conn.nack(message.headers["ack"])
        seen += len(fresh)
        return handle.queue_depth(DLQ) >= before + count

    wait_until(nacked_into_the_dlq, 10, f"{count} messages NACKed into the DLQ")
    disconnect(conn)
