"""``/api/v1/overview``: the broker at a glance, for a console's front page.

Totals only, as counters a client turns into rates by comparing two answers
(messages/s in and out): O(queues + connections), no per-message work.
``/api/v1/overview/history`` answers the same two counters as the broker
sampled them over the last five minutes (core/history.py), so a page opened
now charts the minutes before it instead of starting empty.
Both need ``admin`` on ``broker://overview`` once users are configured.
"""
from __future__ import annotations

from typing import Any

from twisted.web import server

from core.access import Permission
from core.broker import Broker
from gateway.admin.http import Router, json_body, require
from gateway.admin.metrics import protocol_family
from gateway.admin.names import QUEUE_PREFIX

RESOURCE = "broker://overview"


class OverviewAPI:
    def __init__(self, broker: Broker, version: str) -> None:
        self.broker = broker
        self.version = version

    def install(self, router: Router) -> None:
        router.add("/api/v1/overview", get=self.overview)
        router.add("/api/v1/overview/history", get=self.history)

    def overview(self, request: server.Request) -> Any:
        require(request, Permission.ADMIN, RESOURCE)
        broker = self.broker
        by_protocol: dict[str, int] = {}
        for conn in broker.connections.values():
            family = protocol_family(conn.protocol)
            by_protocol[family] = by_protocol.get(family, 0) + 1
        received, sent = broker.traffic_totals()
        queues = [q for name, q in broker.queues.items() if name.startswith(QUEUE_PREFIX)]
        ready = sum(len(q) for q in queues)
        unacked = sum(q.inflight for q in queues)
        usage = broker.store_usage
        return json_body(200, {
            "broker": broker.name,
            "version": self.version,
            "now_ms": broker.now_ms(),
            "uptime_seconds": round(max(0.0, broker.clock.seconds() - broker.started_at), 3),
            "connections": {"total": len(broker.connections), "by_protocol": by_protocol},
            # Since start; two answers give rates.
            "messages": {"received": received, "sent": sent, "routed": broker.messages_received,
                         "duplicates_dropped": broker.duplicates.dropped},
            "queues": {"count": len(queues), "messages": ready + unacked, "ready": ready, "unacknowledged": unacked,
                       "consumers": sum(len(q.consumers) for q in queues)},
            "topics": {"subscriptions": broker.subscription_count(), "durable_subscriptions": len(broker.durables),
                       "retained_messages": len(broker.retained)},
            "streams": len(broker.streams.streams),
            "dead_letter_queue": broker.policy.dead_letter_queue,
            "memory": {"pending_bytes": broker.memory.bytes, "limit_bytes": broker.memory.limit},
            "store": {"usage_bytes": usage.bytes, "limit_bytes": usage.limit, "full": usage.full},
        })

    def history(self, request: server.Request) -> Any:
        """The sampled totals of the last five minutes, oldest first, each with the rates since the one before.

        ``interval_seconds`` 0: sampling is off (``[policy] traffic_history_interval``),
        and ``samples`` is empty.  ``now_ms`` is the broker's clock, which the
        samples' ``time_ms`` are on, so a client places them without trusting its own.
        """
        require(request, Permission.ADMIN, RESOURCE)
        broker = self.broker
        history = broker.history
        return json_body(200, {
            "now_ms": broker.now_ms(),
            "interval_seconds": history.interval,
            "window_seconds": history.window,
            "samples": history.describe(),
        })
