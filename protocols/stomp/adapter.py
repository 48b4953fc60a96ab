"""Twisted glue for STOMP over TCP: bytes to the session, the session's bytes to the socket."""
from __future__ import annotations

from typing import Any

from twisted.internet import interfaces, protocol
from zope.interface import implementer

from core.broker import Broker
from protocols.stomp.session import StompSession, StompSettings


@implementer(interfaces.IPushProducer)
class StompProtocol(protocol.Protocol):
    session: StompSession

    def __init__(self, factory: "StompFactory") -> None:
        self.factory = factory

    def connectionMade(self) -> None:
        peer = self.transport.getPeer()
        remote = f"{getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}"
        self.session = StompSession(self.factory.broker, self, self.factory.settings, remote)
        self.factory.sessions.add(self.session)
        # The socket's buffer filling up pauses this client's deliveries, so a
        # slow reader holds back only itself.
        self.transport.registerProducer(self, True)

    def dataReceived(self, data: bytes) -> None:
        self.session.data_received(data)

    def connectionLost(self, reason: Any = None) -> None:
        self.factory.sessions.discard(self.session)
        self.session.connection_lost()

    # Transport interface for the session.
    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def close(self) -> None:
        # Unregister first: Twisted holds a close back while a paused producer is attached.
        if self.transport.producer is not None:
            self.transport.unregisterProducer()
        self.transport.loseConnection()

    # IPushProducer: called by the transport about its write buffer.
    def pauseProducing(self) -> None:
        self.session.pause_producing()

    def resumeProducing(self) -> None:
        self.session.resume_producing()

    def stopProducing(self) -> None:
        pass


class StompFactory(protocol.Factory):
    noisy = False  # one log line per listener is enough; connections log themselves
    def __init__(self, broker: Broker, settings: StompSettings) -> None:
        self.broker = broker
        self.settings = settings
        self.sessions: set[StompSession] = set()

    def buildProtocol(self, addr: Any) -> StompProtocol:
        return StompProtocol(self)
