"""Operators' changes (gateway/admin/changes.py): who made each, in the audit log, and answered once durable."""
from __future__ import annotations

from twisted.internet.task import Clock
from twisted.web.test.requesthelper import DummyChannel, DummyRequest

from core.access import AllowAll, Principal
from core.broker import Broker
from gateway.admin.changes import Changes, user_of
from gateway.admin.http import BoundedRequest, Grant
from persistence.memory import MemoryStore


def as_user(name: str | None) -> BoundedRequest:
    request = BoundedRequest(DummyChannel())
    request.grant = Grant(Principal(name), AllowAll())
    return request


def test_the_user_is_the_one_the_request_was_authenticated_as():
    assert user_of(as_user("alice")) == "alice"
    assert user_of(as_user(None)) is None  # anonymous
    assert user_of(DummyRequest([])) is None  # not through the router: nobody


def test_changes_are_audited_with_their_user():
    records = []
    changes = Changes(Broker(MemoryStore(), Clock()), lambda event, **fields: records.append((event, fields)))
    changes.noted(as_user("alice"), "purge", "queue://q", purged=3)
    changes.audited(as_user("bob"), "delete_mqtt_session", client_id="c1")
    assert records == [
        ("admin_action", {"user": "alice", "action": "purge", "destination": "queue://q", "purged": 3}),
        ("admin_action", {"user": "bob", "action": "delete_mqtt_session", "client_id": "c1"}),
    ]


def test_without_an_audit_log_changes_are_still_made():
    Changes(Broker(MemoryStore(), Clock())).noted(as_user("alice"), "purge", "queue://q", purged=3)


def test_the_answer_waits_for_the_store():
    broker = Broker(MemoryStore(), Clock())
    waiting = []
    broker.store.when_durable = waiting.append  # a store whose commit has not come yet
    answered = []
    Changes(broker).durably((204, {}, b"")).addCallback(answered.append)
    assert answered == [] and len(waiting) == 1
    waiting[0]()
    assert answered == [(204, {}, b"")]
