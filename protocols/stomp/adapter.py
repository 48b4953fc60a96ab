"""STOMP over TCP: the shared stream adapter driving a StompSession."""
from __future__ import annotations

from core.broker import Broker
from protocols.adapter import SessionFactory
from protocols.stomp.session import StompSession, StompSettings


def stomp_factory(broker: Broker, settings: StompSettings) -> SessionFactory:
    return SessionFactory(lambda transport, remote: StompSession(broker, transport, settings, remote))
