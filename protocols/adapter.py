"""Twisted glue shared by every protocol over a byte stream: bytes to a session, its bytes to the socket.

A session is any object with ``data_received``, ``connection_lost``,
``shutdown``, ``pause_producing`` and ``resume_producing`` that writes through
the ``write``/``close`` transport interface this protocol offers it.
"""
from __future__ import annotations

from typing import Any, Callable

from twisted.internet import interfaces, protocol
from zope.interface import implementer


@implementer(interfaces.IPushProducer)
class SessionProtocol(protocol.Protocol):
    def __init__(self, factory: "SessionFactory") -> None:
        self.factory = factory
        self.session: Any = None

    def connectionMade(self) -> None:
        peer = self.transport.getPeer()
        remote = f"{getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}"
        self.session = self.factory.make_session(self, remote)
        self.factory.sessions.add(self.session)
        # The socket's buffer filling up pauses this client's deliveries, so a
        # slow reader holds back only itself.
        self.transport.registerProducer(self, True)

    def dataReceived(self, data: bytes) -> None:
        self.session.data_received(data)

    def connectionLost(self, reason: Any = None) -> None:
        self.factory.sessions.discard(self.session)
        self.session.connection_lost()

    # The transport interface sessions write through.
    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def pause_reading(self) -> None:
        """Stop reading this client (producer flow control); its socket buffer fills, then TCP pushes back."""
        self.transport.pauseProducing()

    def resume_reading(self) -> None:
        self.transport.resumeProducing()

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


class SessionFactory(protocol.Factory):
    noisy = False  # one log line per listener is enough; connections log themselves

    def __init__(self, make_session: Callable[[Any, str], Any]) -> None:
        self.make_session = make_session
        self.sessions: set[Any] = set()

    def buildProtocol(self, addr: Any) -> SessionProtocol:
        return SessionProtocol(self)
