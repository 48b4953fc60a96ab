"""Operators' changes through the admin API: who made each, noted, and answered once on disk.

A purge, a deleted session or a cleared retained message is noted in the
audit log (``[auth] audit_log``) with the user that asked, so that "who
emptied this queue" has an answer; queue and topic actions also say so in
the broker's log.  The answer waits until the change is on disk
(``Broker.when_durable``): an operator told "done" can count on it across a
crash.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger
from twisted.web import server

from core.broker import Broker
from gateway.admin.http import Answer, grant_of

log = Logger(namespace="gateway.admin")

# Writes one audit record: (event, fields) (gateway/auth/audit.py).
Audit = Callable[..., None]


def user_of(request: server.Request) -> str | None:
    """The name of the user the request was authenticated as; None without users or anonymous."""
    grant = grant_of(request)
    return grant.principal.name if grant is not None else None


class Changes:
    """Notes a broker's operators' changes and answers them once durable."""

    def __init__(self, broker: Broker, audit: Audit | None = None) -> None:
        self.broker = broker
        self.audit = audit

    def audited(self, request: server.Request, action: str, **fields: Any) -> None:
        """One ``admin_action`` record in the audit log, when there is one."""
        if self.audit is not None:
            self.audit("admin_action", user=user_of(request), action=action, **fields)

    def noted(self, request: server.Request, action: str, destination: str, **fields: Any) -> None:
        """An action on a destination: in the broker's log and in the audit log."""
        log.info("admin {action} on {destination} by {user}: {fields}", action=action, destination=destination,
                 user=user_of(request) or "anonymous", fields=fields)
        self.audited(request, action, destination=destination, **fields)

    def durably(self, answer: Answer) -> defer.Deferred[Answer]:
        """``answer``, once every change made so far is on disk."""
        done: defer.Deferred[Answer] = defer.Deferred()
        self.broker.when_durable(lambda: done.callback(answer))
        return done
