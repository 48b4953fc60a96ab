"""Twisted glue shared by every protocol over a byte stream: bytes to a session, its bytes to the socket.

A session is any object with ``data_received``, ``connection_lost``,
``shutdown``, ``pause_producing``, ``resume_producing``, ``refuse_connect``,
``fail_unfinished`` and a ``decoder`` with ``buffered``, that writes through
the ``write``/``close`` transport interface this protocol offers it.
``Guarded`` is what the TCP and WebSocket adapters share: admission when a
connection opens, the broker-wide budget for bytes held in unfinished
frames, and reading paused for as long as any reason to pause holds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from twisted.internet import interfaces, protocol
from zope.interface import implementer

from protocols.admission import Admission
from protocols.partial import PartialBudget
from protocols.session import Session
from protocols.twisted_types import connected


@dataclass
class ConnectionGuard:
    """The limits every listener's connections share (one per broker, passed to each factory)."""

    admission: Admission | None = None
    budget: PartialBudget | None = None


class Guarded:
    """Admission, the partial-frame budget and read holds, for a connection adapter."""

    session: Session
    _address: str | None = None
    _holds: set[str]
    _guard: ConnectionGuard | None = None

    def _open(self, guard: ConnectionGuard | None, host: str) -> None:
        """After the session exists: count the connection in, or have the session refuse its CONNECT."""
        self._guard = guard
        self._holds = set()
        if guard is None or guard.admission is None:
            return
        refusal = guard.admission.admit(host)
        if refusal is None:
            self._address = host
        else:
            self.session.refuse_connect(refusal)

    def _feed(self, data: bytes) -> None:
        """Bytes to the session; then what its decoder still holds goes on the budget."""
        session = self.session
        decoder = session.decoder
        before = decoder.buffered
        session.data_received(data)
        guard = self._guard
        if guard is not None and guard.budget is not None:
            held = decoder.buffered
            budget = guard.budget
            if held or self in budget.holders:
                # A frame completed if the decoder kept less than it had plus what came.
                budget.update(self, held, held < before + len(data))

    def _closed(self) -> None:
        guard = self._guard
        if guard is None:
            return
        if self._address is not None and guard.admission is not None:
            guard.admission.release(self._address)
            self._address = None
        if guard.budget is not None:
            guard.budget.forget(self)

    @property
    def label(self) -> str:
        session: Session | None = getattr(self, "session", None)
        return "?" if session is None else session.label

    def pause_reading(self, reason: str = "flow control") -> None:
        """Stop reading the client for ``reason`` (its socket buffer fills, then TCP pushes back)."""
        if not self._holds:
            self._pause_transport()
        self._holds.add(reason)

    def resume_reading(self, reason: str = "flow control") -> None:
        """``reason`` no longer holds; reading resumes once no other reason does."""
        if reason in self._holds:
            self._holds.discard(reason)
            if not self._holds:
                self._resume_transport()

    def drop_unfinished(self, seconds: float) -> None:
        self.session.fail_unfinished(seconds)

    def _pause_transport(self) -> None:
        raise NotImplementedError

    def _resume_transport(self) -> None:
        raise NotImplementedError


@implementer(interfaces.IPushProducer)
class SessionProtocol(Guarded, protocol.Protocol):
    def __init__(self, factory: "SessionFactory") -> None:
        self.factory = factory
        self._holds = set()

    def connectionMade(self) -> None:
        peer = connected(self.transport).getPeer()
        host = getattr(peer, "host", "?")
        remote = f"{host}:{getattr(peer, 'port', '?')}"
        self.session = self.factory.make_session(self, remote)
        self.factory.sessions.add(self.session)
        self._open(self.factory.guard, host)
        # The socket's buffer filling up pauses this client's deliveries, so a
        # slow reader holds back only itself.
        connected(self.transport).registerProducer(self, True)

    def dataReceived(self, data: bytes) -> None:
        self._feed(data)

    def connectionLost(self, reason: Any = None) -> None:
        self.factory.sessions.discard(self.session)
        self._closed()
        self.session.connection_lost()

    # The transport interface sessions write through.
    def write(self, data: bytes) -> None:
        connected(self.transport).write(data)

    def _pause_transport(self) -> None:
        connected(self.transport).pauseProducing()

    def _resume_transport(self) -> None:
        connected(self.transport).resumeProducing()

    def close(self) -> None:
        transport = connected(self.transport)
        # Unregister first: Twisted holds a close back while a paused producer is attached.
        if transport.producer is not None:
            transport.unregisterProducer()
        transport.loseConnection()

    # IPushProducer: called by the transport about its write buffer.
    def pauseProducing(self) -> None:
        self.session.pause_producing()

    def resumeProducing(self) -> None:
        self.session.resume_producing()

    def stopProducing(self) -> None:
        pass


class SessionFactory(protocol.Factory):
    noisy = False  # one log line per listener is enough; connections log themselves

    def __init__(self, make_session: Callable[[SessionProtocol, str], Session], guard: ConnectionGuard | None = None) -> None:
        self.make_session = make_session
        self.sessions: set[Session] = set()
        self.guard = guard

    def buildProtocol(self, addr: Any) -> SessionProtocol:
        return SessionProtocol(self)
