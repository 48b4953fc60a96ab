"""Liveness and readiness for load balancers and orchestrators, without credentials.

``/api/v1/health`` answers 200 while the process serves HTTP at all (a
standby too): restart it if this fails.  ``/api/v1/ready`` answers 200 only
on the master with a store that takes writes, 503 otherwise (a standby
waiting for the store lock, a full store): send clients elsewhere meanwhile.
Both are public even with users configured, since a probe has no password,
and they say nothing a stranger could use: a role and a short reason.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.web import server

from core.broker import Broker
from gateway.admin.http import Answer, HttpError, Router, json_body

# None when ready, else why not (a short phrase, nothing secret).
Readiness = Callable[[], "str | None"]

STANDBY = "standby: waiting for the store lock held by another broker"


def broker_readiness(broker: Broker) -> Readiness:
    def why_not() -> str | None:
        usage = broker.store_usage
        if usage.alarm is not None:
            return usage.alarm  # the disk's free space or a failed write, with the free bytes
        if usage.full:
            return "the store is full (store_limit): persistent messages are held or refused"
        return None

    return why_not


class HealthAPI:
    def __init__(self, role: str, readiness: Readiness, alarm: Readiness | None = None) -> None:
        self.role = role
        self.readiness = readiness
        # The store's alarm, said by health too: the process is alive, but an operator should look.
        self.alarm = alarm

    def install(self, router: Router) -> None:
        router.add("/api/v1/health", public=True, get=self.health)
        router.add("/api/v1/ready", public=True, get=self.ready)

    def health(self, request: server.Request) -> Any:
        why = self.alarm() if self.alarm is not None else None
        if why is None:
            return json_body(200, {"status": "ok", "role": self.role})
        return json_body(200, {"status": "ok", "role": self.role, "store": why})

    def ready(self, request: server.Request) -> Any:
        why = self.readiness()
        if why is None:
            return json_body(200, {"status": "ready", "role": self.role})
        return json_body(503, {"status": "not_ready", "role": self.role, "reason": why})


def standby_router() -> Router:
    """What a standby's admin listener serves until it takes over: health and readiness, and 503 for the rest."""
    router = Router(None)
    HealthAPI("standby", lambda: STANDBY).install(router)

    def unavailable(request: server.Request) -> Answer:
        raise HttpError(503, f"this broker is a {STANDBY}; retry once it has taken over", "standby")

    router.fallback = unavailable
    return router
