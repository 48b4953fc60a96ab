"""The admin HTTP listener (twisted.web): a versioned JSON API on ``[admin]``, default 127.0.0.1:8161."""
from __future__ import annotations

from typing import Any

from core.broker import Broker
from gateway.admin.http import AdminSite, Guard, Router, json_body
from gateway.admin.publish import PublishAPI
from gateway.admin.streams import StreamsAPI

__all__ = ["admin_site"]


def admin_site(broker: Broker, max_request_size: int, version: str, guard: Guard | None = None) -> AdminSite:
    """``guard`` authenticates every request (gateway/admin/auth.py); None: no authentication, everything allowed."""
    router = Router(guard)
    StreamsAPI(broker).install(router)
    PublishAPI(broker).install(router)

    def index(request: Any) -> Any:
        # Any principal the guard let through: the index names the API, no destination.
        return json_body(200, {
            "broker": broker.name, "version": version,
            "api": ["/api/v1/streams", "/api/v1/messages"],
            # Producers' resends the broker dropped (_AMQ_DUPL_ID), and ids it remembers now.
            "duplicates": {"dropped": broker.duplicates.dropped, "remembered": len(broker.duplicates)},
        })

    router.add("/api/v1", get=index)
    router.add("/", get=index)
    site = AdminSite(router, max_request_size)
    site.noisy = False  # no log line per connection: Spark connects for every fetch
    return site
