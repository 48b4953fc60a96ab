"""The audit log's lines and the failed-login backoff (gateway/auth/audit.py)."""
from __future__ import annotations

import json

from core.access import Permission, Principal
from gateway.auth.audit import AuditedAccess, AuditLog, LoginBackoff, host_of


def test_backoff_bans_past_the_limit_within_the_window_and_doubles():
    backoff = LoginBackoff(limit=3, window=60, ban_seconds=10)
    assert not backoff.failed("10.0.0.1", 0) and not backoff.failed("10.0.0.1", 1)
    assert not backoff.failed("10.0.0.1", 100)  # the first two fell out of the window
    assert not backoff.failed("10.0.0.1", 101)
    assert backoff.failed("10.0.0.1", 102)
    assert backoff.banned("10.0.0.1", 103) == 9 and backoff.banned("10.0.0.2", 103) == 0
    assert backoff.banned("10.0.0.1", 112) == 0
    for t in (113, 114, 115):
        banned = backoff.failed("10.0.0.1", t)
    assert banned and backoff.banned("10.0.0.1", 115) == 20  # a second ban within the hour is twice as long
    assert not LoginBackoff(limit=0, window=60, ban_seconds=10).failed("h", 0)


def test_host_of_the_remote_forms():
    assert host_of("127.0.0.1:5000") == "127.0.0.1"
    assert host_of("ws:10.1.2.3:61614") == "10.1.2.3"
    assert host_of("::1:5000") == "::1"


def test_denials_are_written_as_json_lines(tmp_path):
    class DenyAll:
        def allowed(self, principal, permission, destination, client_id=None):
            return destination == "queue://ok"

    audit = AuditLog(str(tmp_path / "audit.jsonl"))
    access = AuditedAccess(DenyAll(), audit)
    assert access.allowed(Principal("dev1"), Permission.READ, "queue://ok")
    assert not access.allowed(Principal("dev1"), Permission.WRITE, "topic://x", "c1")
    audit.write("login_failed", user=None, address="1.2.3.4:5")
    audit.close()
    first, second = (json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines())
    assert {k: first[k] for k in ("event", "user", "client_id", "permission", "destination")} == {
        "event": "denied", "user": "dev1", "client_id": "c1", "permission": "write", "destination": "topic://x",
    }
    assert second["event"] == "login_failed" and "user" not in second and second["ts"] > 0
    AuditLog("").write("nothing")  # no path: no log, no error


def test_refused_subscriptions_are_audited_and_filtered_deliveries_are_not(tmp_path):
    from core.access import Reading, Rule, Rules

    audit = AuditLog(str(tmp_path / "audit.jsonl"))
    access = AuditedAccess(Rules([
        Rule.parse("*", "allow", ["read"], ["topic://>"]), Rule.parse("*", "deny", ["read"], ["topic://test.nosubscribe"]),
    ]), audit)
    assert access.reading(Principal(None), "topic://>", "c1") is Reading.FILTERED
    assert access.reading(Principal(None), "topic://test.nosubscribe", "c1") is Reading.REFUSED
    reader = access.reader(Principal(None), "c1")
    assert reader is not None and not reader.permits("topic://test.nosubscribe")  # a skipped delivery: counted, not a line
    audit.close()
    (line,) = (json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines())
    assert {k: line[k] for k in ("event", "client_id", "permission", "destination")} == {
        "event": "denied", "client_id": "c1", "permission": "read", "destination": "topic://test.nosubscribe",
    }
