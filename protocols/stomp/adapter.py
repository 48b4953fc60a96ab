"""STOMP over TCP: the shared stream adapter driving a StompSession."""
from __future__ import annotations

from core.access import Access
from core.broker import Broker
from protocols.adapter import ConnectionGuard, SessionFactory
from protocols.auth import Authenticator
from protocols.stomp.session import StompSession, StompSettings


def stomp_factory(
    broker: Broker, settings: StompSettings, guard: ConnectionGuard | None = None,
    authenticator: Authenticator | None = None, access: Access | None = None,
) -> SessionFactory:
    return SessionFactory(
        lambda transport, remote: StompSession(broker, transport, settings, remote, authenticator, access), guard,
    )
