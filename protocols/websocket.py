"""WebSocket transport: the STOMP and MQTT sessions of TCP, behind autobahn.

The subprotocol picks the session class (``v10.stomp``/``v11.stomp``/
``v12.stomp`` -> STOMP, ``mqtt``/``mqttv3.1`` -> MQTT), on any path.  A client
that offers no subprotocol at all (stomp.py's ``WSConnection``, many non-browser
clients) gets the protocol of its path, as on RabbitMQ: ``/ws`` and ``/stomp``
STOMP, ``/mqtt`` MQTT (``stomp_paths``/``mqtt_paths``); the path must match
exactly (a trailing slash counts, the query string does not), and the answer
then carries no ``Sec-WebSocket-Protocol`` (RFC 6455 4.2.2).  After that a WebSocket
message is just bytes for the session's decoder, so packets spanning messages
or several per message need nothing special.  Frame data goes to the session
as it arrives, not once a message is whole: the session's decoder is then
the only place an unfinished frame waits, and the broker-wide budget for
unfinished frames (protocols/partial.py) sees it, as on TCP.  autobahn's own wrapping factory
is not used because it forces binary frames, while STOMP clients expect text
frames: outgoing STOMP goes as text when it is UTF-8, as binary otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol

from autobahn.websocket.types import ConnectionDeny
from twisted.internet import interfaces
from twisted.logger import Logger
from zope.interface import implementer

from protocols.adapter import ConnectionGuard, Guarded
from protocols.lifecycle import CloseReason
from protocols.session import Session
from protocols.twisted_types import connected

log = Logger(namespace="gateway.websocket")

STOMP_SUBPROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp")
MQTT_SUBPROTOCOLS = ("mqtt", "mqttv3.1")
_SUBPROTOCOL_LIST = ", ".join(STOMP_SUBPROTOCOLS + MQTT_SUBPROTOCOLS)

# RFC 6455 close codes for the ways a session ends.
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_PROTOCOL_ERROR = 1002
_CLOSE_CODES = {CloseReason.ERROR: CLOSE_PROTOCOL_ERROR, CloseReason.SHUTDOWN: CLOSE_GOING_AWAY}  # else CLOSE_NORMAL

# Seconds a client has to answer the broker's Close frame before its TCP
# connection is aborted (autobahn's default).  Timed on the reactor: autobahn's
# own timer rounds its deadline down to a whole second, so it fired after
# anything from 0 to 1 s and could abort the connection before the Close
# frame, and the ERROR before it, had left the broker.
CLOSE_TIMEOUT = 1.0


@dataclass
class WebSocketSettings:
    # Largest WebSocket message (and frame) accepted; larger ones close with 1009.
    max_message_size: int = 4 * 1024 * 1024
    # Seconds between server pings (0: none) and how long a pong may take.
    ping_interval: float = 30.0
    ping_timeout: float = 10.0
    # Origins allowed to connect ("*" any, a page opened from a file included, whose
    # browser sends "null"); browsers send Origin, other clients may not.
    allowed_origins: list[str] = field(default_factory=lambda: ["*"])
    # Paths where a client offering no subprotocol speaks STOMP or MQTT (exact
    # match, query string ignored).  An offered subprotocol wins on any path.
    stomp_paths: list[str] = field(default_factory=lambda: ["/ws", "/stomp"])
    mqtt_paths: list[str] = field(default_factory=lambda: ["/mqtt"])


# autobahn's own base classes disagree on the types of ``peer`` and
# ``_transport_details``; nothing here uses either.
@implementer(interfaces.IPushProducer)
class GatewayWebSocketProtocol(Guarded, WebSocketServerProtocol):  # type: ignore[misc]
    """One WebSocket connection carrying one STOMP or MQTT session."""

    session: Session | None = None  # type: ignore[assignment]  # None until the handshake is done
    kind = ""
    _ping_call: Any = None
    _close_call: Any = None
    _heard = 0.0

    def onConnect(self, request: Any) -> str | None:
        offered: list[str] = [p for p in request.protocols if p]
        for protocol in offered:
            if protocol in STOMP_SUBPROTOCOLS:
                self.kind = "stomp"
                return protocol
            if protocol in MQTT_SUBPROTOCOLS:
                self.kind = "mqtt"
                return protocol
        factory: GatewayWebSocketFactory = self.factory
        if offered:
            # A browser fails a connection whose answer names none of its offers,
            # so accepting by path here would only move the error.
            raise ConnectionDeny(
                ConnectionDeny.BAD_REQUEST,
                f"no supported WebSocket subprotocol (offered: {', '.join(offered)[:200]}); "
                f"offer one of {_SUBPROTOCOL_LIST}{factory.path_hint('; or offer none on ')}",
            )
        kind = factory.path_kinds.get(request.path)
        if kind is None:
            raise ConnectionDeny(
                ConnectionDeny.BAD_REQUEST,
                f"no WebSocket subprotocol offered and path {request.path[:200]} has no default protocol; "
                f"{factory.path_hint('connect to ', '; or ')}offer one of {_SUBPROTOCOL_LIST}",
            )
        self.kind = kind
        return None  # no subprotocol: the answer has no Sec-WebSocket-Protocol (RFC 6455 4.2.2)

    def onOpen(self) -> None:
        transport = connected(self.transport)
        peer = transport.getPeer()
        remote = f"ws:{getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}"
        session = self.session = self.factory.make_session(self.kind, self, remote)
        self.factory.sessions.add(session)
        self._open(self.factory.guard, getattr(peer, "host", "?"))
        self._register(transport)
        self._heard = self.factory.reactor.seconds()
        if self.factory.settings.ping_interval > 0:
            self._ping_call = self.factory.reactor.callLater(self.factory.settings.ping_interval, self._keep_alive)

    def _keep_alive(self) -> None:
        """Ping every interval; a peer silent (no pong, no data) for interval + timeout is gone.

        Done here with the reactor's timers rather than autobahn's auto-ping,
        whose batched timers can fire a short timeout early and drop a healthy peer.
        """
        settings = self.factory.settings
        now = self.factory.reactor.seconds()
        if now - self._heard > settings.ping_interval + settings.ping_timeout:
            log.info("[{remote}] no pong for {s:.1f}s: closing", remote=getattr(self.session, "label", "?"), s=now - self._heard)
            self._ping_call = None
            self.dropConnection(abort=True)
            return
        self.sendPing()
        self._ping_call = self.factory.reactor.callLater(settings.ping_interval, self._keep_alive)

    def onPong(self, payload: bytes) -> None:
        self._heard = self.factory.reactor.seconds()

    # A message's frames go to the session as their bytes arrive (autobahn has
    # checked size and UTF-8 before each piece); nothing is gathered here.
    def onMessageFrameData(self, payload: bytes) -> None:
        if not self.failedByMe and self.session is not None:
            self._heard = self.factory.reactor.seconds()
            self._feed(payload)

    def onMessageFrameEnd(self) -> None:
        pass

    def onMessageEnd(self) -> None:
        pass

    def sendCloseFrame(self, code: int | None = None, reasonUtf8: bytes | None = None, isReply: bool = False) -> None:
        """Every Close the broker starts (shutdown, an operator, a protocol error, a size limit)
        gives the client CLOSE_TIMEOUT to answer before the connection is aborted."""
        super().sendCloseFrame(code=code, reasonUtf8=reasonUtf8, isReply=isReply)
        if not isReply and self.state == self.STATE_CLOSING and self._close_call is None:
            self._close_call = self.factory.reactor.callLater(CLOSE_TIMEOUT, self._close_timed_out)

    def _close_timed_out(self) -> None:
        self._close_call = None
        if self.state != self.STATE_CLOSED:
            self.wasClean = False
            self.wasNotCleanReason = f"the peer did not answer the Close frame within {CLOSE_TIMEOUT:g}s"
            self.dropConnection(abort=True)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        for call in (self._ping_call, self._close_call):
            if call is not None and call.active():
                call.cancel()
        self._ping_call = self._close_call = None
        if self.session is not None:
            self.factory.sessions.discard(self.session)
            self._closed()
            self.session.connection_lost()

    # Transport interface for the sessions.
    def write(self, data: bytes) -> None:
        if self.state != self.STATE_OPEN:
            return  # autobahn failed or closed the connection this turn: nothing more goes out
        if self.kind == "stomp" and (data.isascii() or _is_utf8(data)):
            self.sendMessage(data, isBinary=False)
        else:
            self.sendMessage(data, isBinary=True)

    def _pause_transport(self) -> None:
        connected(self.transport).pauseProducing()

    def _resume_transport(self) -> None:
        connected(self.transport).resumeProducing()

    def close(self) -> None:
        reason = CloseReason.NORMAL if self.session is None else self.session.close_reason
        code = _CLOSE_CODES.get(reason, CLOSE_NORMAL)
        self._unregister(connected(self.transport))
        # sendClose admits only 1000 and 3000-4999 (application codes); a server
        # may also say 1001 going away and 1002 protocol error (RFC 6455 7.4.1).
        self.sendCloseFrame(code=code, reasonUtf8=reason.value.encode(), isReply=False)

    # IPushProducer, as on TCP: a full socket pauses this client's deliveries.
    def pauseProducing(self) -> None:
        if self.session is not None:
            self.session.pause_producing()

    def resumeProducing(self) -> None:
        if self.session is not None:
            self.session.resume_producing()

    def stopProducing(self) -> None:
        pass


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class GatewayWebSocketFactory(WebSocketServerFactory):
    protocol = GatewayWebSocketProtocol
    noisy = False

    def __init__(
        self, make_session: Callable[[str, GatewayWebSocketProtocol, str], Session], settings: WebSocketSettings,
        guard: ConnectionGuard | None = None,
    ) -> None:
        super().__init__()
        self.make_session = make_session
        self.settings = settings
        self.sessions: set[Session] = set()
        self.guard = guard
        # Path -> session kind for clients that offer no subprotocol.
        self.path_kinds: dict[str, str] = {path: "mqtt" for path in settings.mqtt_paths}
        self.path_kinds.update((path, "stomp") for path in settings.stomp_paths)
        self.setProtocolOptions(
            maxMessagePayloadSize=settings.max_message_size,
            maxFramePayloadSize=settings.max_message_size,
            allowedOrigins=[_origin_pattern(o) for o in settings.allowed_origins],
            # A page opened from a file sends "Origin: null", which autobahn refuses unless told:
            # "*" means any origin, that one included (a first page tried from disk just works).
            allowNullOrigin="*" in settings.allowed_origins,
            # Say why (1009 too big, 1002 protocol error) with a close frame instead of a bare drop.
            failByDrop=False,
            closeHandshakeTimeout=0,  # timed here instead (CLOSE_TIMEOUT)
        )

    def path_hint(self, before: str, after: str = "") -> str:
        """``/ws or /stomp for STOMP, /mqtt for MQTT`` between ``before`` and
        ``after``, or nothing when no path takes clients without a subprotocol."""
        settings = self.settings
        named = [
            " or ".join(paths) + f" for {name}"
            for name, paths in (("STOMP", settings.stomp_paths), ("MQTT", settings.mqtt_paths)) if paths
        ]
        return f"{before}{', '.join(named)}{after}" if named else ""


def _origin_pattern(origin: str) -> str:
    """autobahn matches ``scheme://host:port`` with the port always present;
    users write origins as browsers send them (no default port)."""
    if "*" in origin or origin.count(":") >= 2:
        return origin
    if origin.startswith("https://"):
        return origin + ":443"
    if origin.startswith("http://"):
        return origin + ":80"
    return origin
