"""The admin HTTP listener (twisted.web): a versioned JSON API on ``[admin]``, default 127.0.0.1:8161."""
from __future__ import annotations

from typing import Any

from core.broker import Broker
from gateway.admin.bridges import BridgesAPI, BridgeStatus
from gateway.admin.connections import ConnectionsAPI
from gateway.admin.console_site import ConsoleSite
from gateway.admin.health import HealthAPI, broker_readiness, standby_router
from gateway.admin.http import AdminSite, Guard, Router, json_body
from gateway.admin.metrics import BrokerCollector, LoginCounts, MetricsAPI
from gateway.admin.overview import OverviewAPI
from gateway.admin.publish import PublishAPI
from gateway.admin.queues import QueuesAPI
from gateway.admin.retained import RetainedAPI
from gateway.admin.sessions import MqttSessionsAPI
from gateway.admin.streams import StreamsAPI
from gateway.admin.subscriptions import DurableSubscriptionsAPI
from gateway.admin.topics import TopicsAPI
from gateway.config import AdminSettings

__all__ = ["admin_site", "standby_site", "wants_html"]

# What the index lists (every route under them is in docs/operations.rst, Every route).
API = [
    "/api/v1/overview", "/api/v1/queues", "/api/v1/topics", "/api/v1/durable-subscriptions",
    "/api/v1/mqtt-sessions", "/api/v1/streams", "/api/v1/connections", "/api/v1/messages",
    "/api/v1/bridges", "/api/v1/health", "/api/v1/ready", "/metrics", "/api/v1/dlq/replay", "/api/v1/retained",
    "/console/",
]


# Where a browser is sent from ``/``.
CONSOLE = "/console/"


def wants_html(accept: str | None) -> bool:
    """Whether an Accept header prefers a page to JSON: a browser's navigation, not an API client or curl.

    Browsers name ``text/html`` explicitly; curl sends ``*/*`` and API clients
    ``application/json`` or nothing, so only an explicit ``text/html`` (or XHTML)
    ranked above any explicit JSON counts.
    """
    if not accept:
        return False
    html = json = 0.0
    for part in accept.split(","):
        media, *params = (piece.strip() for piece in part.split(";"))
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        media = media.lower()
        if media in ("text/html", "application/xhtml+xml"):
            html = max(html, quality)
        elif media == "application/json":
            json = max(json, quality)
    return html > 0 and html > json


def admin_site(
    broker: Broker, max_request_size: int, version: str, guard: Guard | None = None, *,
    settings: AdminSettings | None = None, logins: LoginCounts | None = None, bridges: BridgeStatus | None = None,
) -> AdminSite:
    """``guard`` authenticates every request (gateway/admin/auth.py); None: no authentication, everything allowed.

    ``logins``: the authenticator's counts of refused logins, for /metrics (None: no users configured).
    ``bridges``: the configured bridges' status, for the API and /metrics (None: no bridges).
    """
    settings = settings or AdminSettings(max_request_size=max_request_size)
    router = Router(guard)
    # Operators' changes (purge, move, DLQ replay, ending a session...): each noted in the audit log when there is one.
    audit = getattr(getattr(guard, "audit", None), "write", None)
    # One module per resource, each with every method of its paths.
    StreamsAPI(broker).install(router)
    PublishAPI(broker).install(router)
    QueuesAPI(broker, audit).install(router)
    TopicsAPI(broker, audit).install(router)
    DurableSubscriptionsAPI(broker, audit).install(router)
    MqttSessionsAPI(broker, audit).install(router)
    RetainedAPI(broker, audit).install(router)
    ConnectionsAPI(broker).install(router)
    BridgesAPI(bridges).install(router)
    OverviewAPI(broker, version).install(router)
    HealthAPI("master", broker_readiness(broker), lambda: broker.store_usage.alarm).install(router)
    MetricsAPI(BrokerCollector(
        broker, version, settings.metrics_max_destinations, settings.metrics_destinations, logins, bridges,
    )).install(router)
    ConsoleSite().install(router)  # the web console's files, at /console/

    def index(request: Any) -> Any:
        # Any principal the guard let through: the index names the API, no destination.
        return json_body(200, {
            "broker": broker.name, "version": version,
            "api": API,
            # Producers' resends the broker dropped (_AMQ_DUPL_ID), and ids it remembers now.
            "duplicates": {"dropped": broker.duplicates.dropped, "remembered": len(broker.duplicates)},
        })

    def root(request: Any) -> Any:
        """``/``: a person typing the admin address lands on the console; a client asking for JSON gets the index.

        Only ``/`` does this: ``/api/v1`` is the API's own index (the console reads it).
        Either answer varies with Accept, so a cache in between keeps them apart.
        """
        if wants_html(request.getHeader("Accept")):
            status, headers, body = 302, {"Location": CONSOLE, "Content-Type": "text/html; charset=utf-8"}, (
                f'<!doctype html><title>gateway</title><a href="{CONSOLE}">The console is at {CONSOLE}</a>\n'.encode()
            )
        else:
            status, headers, body = index(request)
        return status, {**headers, "Vary": "Accept"}, body

    router.add("/api/v1", get=index)
    router.add("/", get=root)
    site = AdminSite(router, max_request_size)
    site.noisy = False  # no log line per connection: Spark connects for every fetch
    return site


def standby_site(max_request_size: int) -> AdminSite:
    """The admin listener of a standby waiting for the store lock: health and readiness (503) only.

    When the broker takes over, the master's routes replace these on the same
    listener (``AdminSite.resource``), so probes never see the port go away.
    """
    site = AdminSite(standby_router(), max_request_size)
    site.noisy = False
    return site
