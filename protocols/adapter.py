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

import socket
from dataclasses import dataclass
from typing import Any, Callable

from cryptography.x509.oid import NameOID
from twisted.internet import interfaces, protocol, tcp
from zope.interface import implementer

from protocols.admission import Admission
from protocols.partial import PartialBudget
from protocols.session import Session
from protocols.twisted_types import StreamTransport, connected


def peer_certificate_user(transport: object) -> str | None:
    """The CN of the client certificate a TLS transport's handshake verified; None otherwise.

    A TLS listener asks for a certificate only with a CA to verify it against,
    and a certificate that fails verification fails the handshake; so any
    certificate found here has been verified.  Plain TCP, a client without a
    certificate and a certificate without a CN all give None.  Read once the
    client has sent something: the handshake completes before the first byte.
    """
    handle = getattr(transport, "getHandle", None)
    connection = handle() if callable(handle) else None
    peer = getattr(connection, "get_peer_certificate", None)
    if not callable(peer):
        return None
    certificate = peer(as_cryptography=True)
    if certificate is None:
        return None
    names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else None


@dataclass
class ConnectionGuard:
    """The limits every listener's connections share (one per broker, passed to each factory)."""

    admission: Admission | None = None
    budget: PartialBudget | None = None


class Guarded:
    """Admission, the partial-frame budget and read holds, for a connection adapter."""

    session: Session
    _address: str | None = None
    # Why reading is paused; keys only (an empty set is 216 bytes, a dict 64), made with the first hold.
    _holds: dict[str, None] | None = None
    _guard: ConnectionGuard | None = None
    _producing = False  # registered as the transport's producer

    def _open(self, guard: ConnectionGuard | None, host: str) -> None:
        """After the session exists: count the connection in, or have the session refuse its CONNECT."""
        self._guard = guard
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
        holds = self._holds
        if holds is None:
            holds = self._holds = {}
        if not holds:
            self._pause_transport()
        holds[reason] = None

    def resume_reading(self, reason: str = "flow control") -> None:
        """``reason`` no longer holds; reading resumes once no other reason does."""
        holds = self._holds
        if holds is not None and reason in holds:
            del holds[reason]
            if not holds:
                self._resume_transport()

    def drop_unfinished(self, seconds: float) -> None:
        self.session.fail_unfinished(seconds)

    def _register(self, transport: StreamTransport) -> None:
        """Be the transport's producer: its full write buffer pauses the session's deliveries."""
        transport.registerProducer(self, True)
        self._producing = True

    def _unregister(self, transport: StreamTransport) -> None:
        """Before closing: Twisted holds a close back while a paused producer is attached.

        Tracked here because a TLS transport keeps its producer to itself.
        """
        if self._producing:
            self._producing = False
            transport.unregisterProducer()

    def certificate_user(self) -> str | None:
        """The CN of the client's verified TLS certificate (what protocols.auth.certificate_user asks)."""
        return peer_certificate_user(getattr(self, "transport", None))

    def _pause_transport(self) -> None:
        raise NotImplementedError

    def _resume_transport(self) -> None:
        raise NotImplementedError


# Seconds a closed connection still reads what its client sends before it is reset, once
# its last byte is out; and how long that last output may take to go out at all.
LINGER_SECONDS = 2.0
DRAIN_SECONDS = 30.0


@implementer(interfaces.IPushProducer)
class SessionProtocol(Guarded, protocol.Protocol):
    # Plain TCP: the socket and its Twisted connection, for writes that go straight out (``write``).
    _socket: socket.socket | None = None
    _tcp: Any = None
    # Set once closing: the timer that ends a lingering close (see close).
    _linger: Any = None

    def __init__(self, factory: "SessionFactory") -> None:
        self.factory = factory

    def connectionMade(self) -> None:
        peer = connected(self.transport).getPeer()
        host = getattr(peer, "host", "?")
        remote = f"{host}:{getattr(peer, 'port', '?')}"
        self.session = self.factory.make_session(self, remote)
        self.factory.sessions.add(self.session)
        self._open(self.factory.guard, host)
        # The socket's buffer filling up pauses this client's deliveries, so a
        # slow reader holds back only itself.
        transport = connected(self.transport)
        self._register(transport)
        if isinstance(transport, tcp.Connection) and not transport.TLS:  # TLS and WebSocket write through their layer
            self._tcp = transport
            self._socket = transport.socket

    def dataReceived(self, data: bytes) -> None:
        if self._linger is None:
            self._feed(data)

    def connectionLost(self, reason: Any = None) -> None:
        linger = self._linger
        if linger is not None and linger.active():
            linger.cancel()
        self.factory.sessions.discard(self.session)
        self._closed()
        self.session.connection_lost()

    # The transport interface sessions write through.
    def write(self, data: bytes) -> None:
        """Straight to the socket when Twisted holds nothing for it; what does not fit, through Twisted.

        Twisted buffers every write until its next poll reports the socket
        writable: an extra pass of the reactor loop and two epoll_ctl calls
        per write, which was most of the broker's share of a message's
        latency.  Only when its buffer is empty, so the order stays, and
        never for TLS, whose bytes must go through its layer.
        """
        tcp_ = self._tcp
        if tcp_ is not None and not tcp_._tempDataLen and len(tcp_.dataBuffer) == tcp_.offset and tcp_.connected \
                and not tcp_._writeDisconnected:
            assert self._socket is not None
            try:
                sent = self._socket.send(data)
            except OSError:
                sent = 0  # full (EAGAIN), or an error Twisted's own write will find and report
            if sent == len(data):
                return
            data = data[sent:]
        connected(self.transport).write(data)

    def _pause_transport(self) -> None:
        connected(self.transport).pauseProducing()

    def _resume_transport(self) -> None:
        connected(self.transport).resumeProducing()

    def close(self) -> None:
        """Close after what the session wrote, lingering on plain TCP so that the client reads it.

        A socket closed with unread input is reset, not closed: the client's
        kernel may then drop the last frames before the client reads them (the
        STOMP ERROR, the MQTT 5 DISCONNECT with its reason), typically while it
        is still sending (PUBRELs for the PUBRECs before a DISCONNECT 0x93).
        So, as web servers do, the write side is shut after the last byte, and
        what the client still sends is read and dropped until it closes too:
        ``LINGER_SECONDS`` after the close, or once its last byte is out where
        that takes longer, but no more than ``DRAIN_SECONDS`` in all.
        """
        transport = connected(self.transport)
        self._unregister(transport)
        tcp_ = self._tcp
        if tcp_ is None or self._linger is not None:
            transport.loseConnection()  # TLS: its layer closes itself; a second close: nothing more to do
            return
        self._linger = tcp_.reactor.callLater(LINGER_SECONDS, self._linger_over, tcp_.reactor.seconds())
        tcp_.loseWriteConnection()
        tcp_.resumeProducing()  # read (and drop) even where a hold had paused reading

    def _linger_over(self, closed_at: float) -> None:
        tcp_ = self._tcp
        if not tcp_._writeDisconnected and tcp_.reactor.seconds() - closed_at < DRAIN_SECONDS:
            self._linger = tcp_.reactor.callLater(LINGER_SECONDS, self._linger_over, closed_at)  # still writing
            return
        tcp_.abortConnection()

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
