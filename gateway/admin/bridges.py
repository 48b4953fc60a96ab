"""Bridges for operators: is each link up, since when, why it last failed, and what it holds and has moved.

The figures are the bridges' own (``protocols/bridge/bridge.py`` ``Bridge.status``),
read when asked: a bridge counts per message only what it counts anyway, and an
answer costs one status dict per configured bridge.  The admin layer gets them
through a callable rather than the bridges themselves, so the API, ``/metrics``
and ``$SYS`` (whose publisher lives in core and cannot import the gateway) share
one narrow view, and a site built without bridges (a test, a standby) answers an
empty list.

Both routes need ``admin`` on ``broker://bridges`` once users are configured,
as every broker-wide view does.
"""
from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from twisted.web import server

from core.access import Permission
from core.sysinfo import BridgeStatus
from gateway.admin.descriptions import iso_ms
from gateway.admin.http import HttpError, Router, json_body, require

__all__ = ["RESOURCE", "BridgeStatus", "BridgesAPI", "describe", "public_url"]

RESOURCE = "broker://bridges"


def no_bridges() -> list[dict[str, Any]]:
    return []


def public_url(url: str) -> str:
    """The URL without a password: the bridge takes its password from ``password``/``password_file``,
    but one written into the URL must not reach every reader of the API, the console or a terminal."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return url
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}{port}"))


def describe(status: dict[str, Any]) -> dict[str, Any]:
    """One bridge as the API answers it: its status, with ``since`` also as ISO 8601 for people."""
    return {**status, "url": public_url(status["url"]), "since_iso": iso_ms(status["since"])}


class BridgesAPI:
    def __init__(self, bridges: BridgeStatus | None = None) -> None:
        self.bridges = bridges or no_bridges

    def install(self, router: Router) -> None:
        router.add("/api/v1/bridges", get=self.list)
        router.add("/api/v1/bridges/{name}", get=self.one)

    def list(self, request: server.Request) -> Any:
        require(request, Permission.ADMIN, RESOURCE)
        return json_body(200, {"bridges": [describe(s) for s in sorted(self.bridges(), key=lambda s: s["name"])]})

    def one(self, request: server.Request, name: str) -> Any:
        require(request, Permission.ADMIN, RESOURCE)
        for status in self.bridges():
            if status["name"] == name:
                return json_body(200, describe(status))
        raise HttpError(404, f"no bridge {name!r}", "unknown_bridge")
