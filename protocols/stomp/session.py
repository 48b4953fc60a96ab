"""The STOMP state machine: frames in, calls on the core; deliveries out, frames.

No sockets here: the session writes bytes through a small transport interface
and reads time from the broker's clock, so the WebSocket listener can drive
the same class and tests can drive it with no network at all.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, NoReturn

from twisted.logger import Logger

from core.access import ANONYMOUS, Access, AllowAll, Permission, Principal, Reader, Reading
from core.broker import Broker
from core.connection import Connection
from core.consumer import AckMode, Consumer
from core.duplicates import forwarding_headers
from core.entry import Entry
from core.network import PathFilter
from core.errors import BrokerError, UnknownDestination, UserLimit
from core.message import Message
from core.stream_config import UnknownStream
from protocols.auth import Anonymous, Authenticator, Credentials
from protocols.outbox import Outbox
from protocols.stomp import names
from protocols.stomp.codec import (
    CLIENT_COMMANDS,
    Frame,
    StompDecoder,
    StompLimits,
    StompProtocolError,
    encode_frame,
    escape_header,
)
from protocols.transport import Transport

log = Logger(namespace="gateway.stomp")

VERSIONS = ("1.0", "1.1", "1.2")
SERVER_NAME = "gateway/0.1"
# CONNECT and CONNECTED: a gateway's bridge names its broker, and the gateway answers with its own.
BROKER_HEADER = "gateway-broker"
# SUBSCRIBE from a gateway's network link: how many brokers a message may have crossed to be given it.
TTL_HEADER = "gateway-ttl"

# Headers a SEND carries for the broker, not for consumers.
_SEND_CONTROL = frozenset({
    "destination", "content-length", "receipt", "transaction", "message-id", "subscription", "ack",
    "redelivered", "redelivery-count", "timestamp", "persistent", "priority", "expires", "correlation-id",
    "reply-to", "content-type", "JMSXGroupID", "JMSXGroupSeq", "AMQ_SCHEDULED_DELAY", "expiration",
})

# Stored messages keep these as signed 64-bit integers.
_INT64_MAX = 2**63 - 1
# Ten years: a longer delay is a mistake, and due times must fit their record keys.
_MAX_DELAY_MS = 10 * 365 * 24 * 3600 * 1000

_ACK_MODES = {"auto": AckMode.AUTO, "client": AckMode.CLIENT, "client-individual": AckMode.CLIENT_INDIVIDUAL}
_TRUE = ("true", "1", "yes")


@dataclass
class StompSettings:
    limits: StompLimits = field(default_factory=StompLimits)
    # heart-beat: how often we can send at best, how often we want to hear from clients (ms).
    heartbeat_send_ms: int = 1000
    heartbeat_receive_ms: int = 10000
    # A client silent for this many times its negotiated interval is disconnected.
    heartbeat_grace: float = 2.0
    max_subscriptions: int = 1000
    max_transactions: int = 100
    # With users configured: the largest frame (body, and its header block) a client may
    # send before it has logged in.
    preauth_max_frame_size: int = 65536
    # Seconds a new connection may take to send CONNECT (0: no limit).
    connect_timeout: float = 30.0



class StompError(Exception):
    """A frame the session refuses; becomes an ERROR frame and a close."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail or message


class Phase(enum.Enum):
    """Where a session is (wsproto's ``ConnectionState``): each frame is handled by what its phase allows."""

    AWAITING_CONNECT = "awaiting CONNECT"
    AUTHENTICATING = "authenticating"  # CONNECT read, its credentials being checked: reading paused
    CONNECTED = "connected"
    DISCONNECTING = "disconnecting"  # DISCONNECT with a receipt seen: nothing after it is handled
    CLOSED = "closed"


class _Sub:
    """A client subscription: its STOMP id, its core consumer and, for 1.0/1.1 acks, message ids."""

    __slots__ = ("id", "no", "consumer", "header", "ack_mode", "message_tags", "durable_name", "destination")

    def __init__(
        self, sub_id: str, no: int, ack_mode: AckMode, header: bytes, durable_name: str | None, destination: str,
    ) -> None:
        self.id = sub_id
        self.no = no
        self.destination = destination  # canonical: what a reload of the rules checks again
        self.ack_mode = ack_mode
        self.header = header  # b"subscription:<escaped id>\n", encoded once
        self.consumer: Consumer | None = None
        self.message_tags: dict[str, int] = {}
        self.durable_name = durable_name


class Connected:
    """What exists only once CONNECT is accepted: the core connection, the outbox, the subscriptions.

    The session holds it as ``live`` from CONNECTED on, and the handlers of
    every frame after CONNECT take it as an argument, so none of them can run
    (or be written) against a connection that is not there.
    """

    __slots__ = ("conn", "outbox", "subs", "subs_by_no", "sub_no", "names", "sends")

    def __init__(self, conn: Connection, outbox: Outbox) -> None:
        self.conn = conn
        self.outbox = outbox
        self.subs: dict[str, _Sub] = {}
        self.subs_by_no: dict[int, _Sub] = {}
        self.sub_no = 0
        self.names: dict[str, str] = {}  # STOMP destination -> canonical, for repeated SENDs
        # A SEND's destination header -> where it goes (several for a composite), checked once.
        self.sends: dict[str, tuple[str, ...]] = {}


class StompSession:
    def __init__(
        self, broker: Broker, transport: Transport, settings: StompSettings, remote: str = "",
        authenticator: Authenticator | None = None, access: Access | None = None,
    ) -> None:
        self.broker = broker
        self.authenticator: Authenticator = authenticator or Anonymous()
        self.access: Access = access or AllowAll()
        # With no rules everything is allowed: the checks are skipped, not made.
        self._checked = not isinstance(self.access, AllowAll)
        # Checks deliveries of the subscriptions a deny rule overlaps, and hears of reloads;
        # made with the first topic subscription when there are rules (a producer needs none).
        self._reader: Reader | None = None
        self.principal = ANONYMOUS
        self._waiting: list[bytes] = []  # read while authenticating, handled once connected
        self._auth_paused = False
        self.transport = transport
        self.settings = settings
        self.remote = remote
        limits = settings.limits
        if not isinstance(self.authenticator, Anonymous):
            # Until it has logged in, a client may send only small frames (its CONNECT).
            small = settings.preauth_max_frame_size
            limits = StompLimits(
                min(limits.max_frame_size, small), min(limits.max_headers, 50),
                min(limits.max_header_length, small), limits.max_command_length,
            )
        self.decoder = StompDecoder(limits)
        self.version = "1.0"
        # A bridge from another gateway (its CONNECT names its broker): what it sends is not sent back to it.
        self.bridge = False
        self.peer = ""  # that broker's name
        self.phase = Phase.AWAITING_CONNECT
        # Phase.CLOSED as a plain attribute: read for every frame and write, where a property costs a call.
        self.closed = False
        self.live: Connected | None = None
        self._send_interval = 0.0
        self._receive_interval = 0.0
        self._last_read = 0.0
        self._last_write = 0.0
        self._now = broker.clock.seconds
        self._timer: Any = None
        self.label = remote
        # Why the session ended, for transports that can say (WebSocket close codes).
        self.close_reason = "normal"
        self._held = False  # reading paused by producer flow control
        self._refusal: Any = None  # why this connection may not CONNECT (connection limits)
        self._connect_timer: Any = None
        if settings.connect_timeout > 0:
            self._connect_timer = broker.clock.callLater(settings.connect_timeout, self._connect_timed_out)

    def _authenticating(self) -> bool:
        """CONNECT's credentials are being checked (a method: handlers change the phase under mypy's narrowing)."""
        return self.phase is Phase.AUTHENTICATING

    @property
    def conn(self) -> Connection | None:
        """The core connection, once connected (for operators' views and tests)."""
        return None if self.live is None else self.live.conn

    def _connect_timed_out(self) -> None:
        self._connect_timer = None
        if self.phase is Phase.AWAITING_CONNECT:
            self._fail("Connect timeout", f"no CONNECT within {self.settings.connect_timeout:g} s")

    # -- input ------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.phase is Phase.AUTHENTICATING:
            self._waiting.append(data)  # reading is paused; this was already on its way
            return
        phase = self.phase  # a local: mypy narrows it, not the attribute the handlers change
        if phase is Phase.CLOSED or phase is Phase.DISCONNECTING:  # nothing more is read
            return
        self._last_read = self._now()
        while True:
            try:
                frames = self.decoder.feed(data)
            except StompProtocolError as exc:
                # Frames completed before the bad bytes are the client's real work.
                for frame in exc.frames:
                    if self.closed:
                        return
                    self._handle(frame)
                self._fail(exc.message, exc.detail, exc.headers.get("receipt"))
                return
            for frame in frames:
                phase = self.phase
                if phase is Phase.CLOSED or phase is Phase.DISCONNECTING:
                    return
                self._handle(frame)
            # The decoder pauses after CONNECT so the rest is read with the negotiated
            # version -- and, while the credentials are checked, not read at all.
            if self._authenticating():
                return
            if self.closed or not frames or frames[-1].command not in ("CONNECT", "STOMP") or not self.decoder.buffered:
                return
            data = b""

    def _handle(self, frame: Frame) -> None:
        receipt = frame.headers.get("receipt")
        try:
            command = frame.command
            if command not in CLIENT_COMMANDS or (command == "NACK" and self.version == "1.0"):
                raise StompError(f"Unknown command {command[:40]!r}")
            live = self.live
            if live is None:
                if command not in ("CONNECT", "STOMP"):
                    raise StompError("Not connected", f"{command} before CONNECT; send CONNECT (or STOMP) first")
                self._on_connect(frame)
                return
            if command in ("CONNECT", "STOMP"):
                raise StompError("Already connected", "a second CONNECT on one connection")
            _HANDLERS[command](self, live, frame)
        except StompError as exc:
            self._fail(exc.message, exc.detail, receipt)
            return
        except BrokerError as refused:  # not `exc`: compiled (mypyc), one name has one type per function
            self._fail(str(refused), f"{frame.command} refused: {refused}", receipt)
            return
        except Exception:
            # A bug must cost one client its connection, never the reactor its loop.
            log.failure("[{label}] internal error handling {command}", label=self.label, command=frame.command)
            self._fail("Internal error", f"the broker failed to handle {frame.command}; see its log", receipt)
            return
        if receipt is not None and self.live is not None and frame.command not in ("DISCONNECT", "CONNECT", "STOMP"):
            # Only once what the frame stored is on disk (group commit).
            self.live.outbox.add(encode_frame("RECEIPT", (("receipt-id", receipt),), version=self.version))

    # -- connection ---------------------------------------------------------

    def refuse_connect(self, refusal: Any) -> None:
        """The connection limits refuse this client: its CONNECT gets an ERROR saying why."""
        self._refusal = refusal

    def fail_unfinished(self, seconds: float) -> None:
        """Held an unfinished frame too long (the broker-wide budget for them): an ERROR and a close."""
        if not self.closed:
            self._fail("Frame not completed", f"no frame completed in {seconds:.0f} s while one was unfinished (partial_frame_timeout)")

    def _on_connect(self, frame: Frame) -> None:
        if self._refusal is not None:
            raise StompError("Connection refused", self._refusal.why)
        headers = frame.headers
        accepted = headers.get("accept-version")
        if accepted is None:
            version = "1.0"
        else:
            offered = {v.strip() for v in accepted.split(",")}
            common = [v for v in VERSIONS if v in offered]
            if not common:
                self.write_out(encode_frame(
                    "ERROR",
                    (("version", ",".join(VERSIONS)), ("content-type", "text/plain"),
                     ("message", "Supported protocol versions are " + " ".join(VERSIONS))),
                    b"Supported protocol versions are " + " ".join(VERSIONS).encode(),
                    version="1.2",
                ))
                self._close()
                return
            version = common[-1]
        client_id = headers.get("client-id") or None
        if client_id is not None and self.broker.client_connected(client_id):
            raise StompError("Client id in use", f"client-id {client_id!r} is already connected")
        self.version = version
        self.decoder.version = version
        passcode = headers.get("passcode")
        credentials = Credentials(
            headers.get("login"), None if passcode is None else passcode.encode("utf-8", "surrogateescape"),
            self.transport.certificate_user(), self.remote, f"stomp/{version}", client_id,
        )
        self.phase = Phase.AUTHENTICATING
        self.authenticator.authenticate(credentials, partial(self._authenticated, frame))
        if self.phase is Phase.AUTHENTICATING:
            # The answer comes later (a slow hash, off the reactor thread): read nothing meanwhile.
            self._auth_paused = True
            self.transport.pause_reading("authenticating")

    def _authenticated(self, frame: Frame, principal: Principal | None, why: str) -> None:
        """The authenticator's answer to this connection's CONNECT (now, or in a later turn)."""
        if self.phase is not Phase.AUTHENTICATING:
            return  # closed meanwhile
        resume = self._auth_paused
        self._auth_paused = False
        try:
            if principal is None:
                log.info("[{label}] CONNECT refused: {why}", label=self.label, why=why)
                raise StompError("Access refused", why or "bad user name or password")
            self.principal = principal
            self._connected(frame)
        except StompError as exc:
            self._fail(exc.message, exc.detail, frame.headers.get("receipt"))
        except Exception:
            log.failure("[{label}] internal error handling CONNECT", label=self.label)
            self._fail("Internal error", "the broker failed to handle CONNECT; see its log")
        if resume and not self.closed:
            self.transport.resume_reading("authenticating")
            waiting, self._waiting = self._waiting, []
            if waiting or self.decoder.buffered:
                self.data_received(b"".join(waiting))

    def _connected(self, frame: Frame) -> None:
        headers = frame.headers
        version = self.version
        client_id = headers.get("client-id") or None
        # Asked again after the password check: another connection may have taken the id
        # while the authenticator answered (a slow hash runs off the reactor thread).
        if client_id is not None and self.broker.client_connected(client_id):
            raise StompError("Client id in use", f"client-id {client_id!r} is already connected")
        if self._connect_timer is not None and self._connect_timer.active():
            self._connect_timer.cancel()
        self._connect_timer = None
        self.decoder.limits = self.settings.limits  # logged in: the usual limits from the next frame on
        try:
            conn = self.broker.connect(client_id, protocol=f"stomp/{version}", remote=self.remote, user=self.principal.name)
        except UserLimit as exc:
            raise StompError("Connection refused", str(exc)) from None
        conn.closer = self
        self.live = Connected(conn, Outbox(self.broker.turn_end, conn, self))
        self.phase = Phase.CONNECTED
        self.label = f"{conn.id} {client_id or '-'}"
        out = [("version", version), ("server", SERVER_NAME), ("session", conn.id)]
        if BROKER_HEADER in headers:
            self.bridge = True
            self.peer = headers[BROKER_HEADER]
            out.append((BROKER_HEADER, self.broker.node_name))
        if version != "1.0":
            out.append(("heart-beat", self._negotiate_heartbeat(headers.get("heart-beat", "0,0"))))
        self.write_out(encode_frame("CONNECTED", out, version=version))
        log.info("[{label}] connected from {remote} with STOMP {version}", label=self.label, remote=self.remote, version=version)

    def _negotiate_heartbeat(self, value: str) -> str:
        try:
            cx_text, cy_text = value.split(",")
            cx, cy = int(cx_text), int(cy_text)
            if cx < 0 or cy < 0:
                raise ValueError
        except ValueError:
            raise StompError("Invalid heart-beat header", f"heart-beat must be two non-negative integers, got {value!r}")
        settings = self.settings
        send = max(settings.heartbeat_send_ms, cy) if cy and settings.heartbeat_send_ms else 0
        receive = max(settings.heartbeat_receive_ms, cx) if cx and settings.heartbeat_receive_ms else 0
        self._send_interval = send / 1000.0
        self._receive_interval = receive / 1000.0
        if send or receive:
            now = self.broker.clock.seconds()
            self._last_read = self._last_write = now
            self._arm_heartbeat()
        return f"{send},{receive}"

    def _arm_heartbeat(self) -> None:
        intervals = [i for i in (self._send_interval, self._receive_interval) if i]
        if intervals and not self.closed:
            self._timer = self.broker.clock.callLater(min(intervals) / 2, self._heartbeat)

    def _heartbeat(self) -> None:
        self._timer = None
        if self.closed:
            return
        now = self.broker.clock.seconds()
        if self._receive_interval and now - self._last_read > self._receive_interval * self.settings.heartbeat_grace:
            log.info("[{label}] no heart-beat for {s:.1f}s: closing", label=self.label, s=now - self._last_read)
            self._fail("Heart-beat timeout", f"nothing received for {now - self._last_read:.1f} s")
            return
        if self._send_interval and now - self._last_write >= self._send_interval * 0.8:
            self.write_out(b"\n")
        self._arm_heartbeat()

    def _on_disconnect(self, live: Connected, frame: Frame) -> None:
        receipt = frame.headers.get("receipt")
        if receipt is not None:
            # The receipt once what came before is on disk, and only after the close
            # has given back what the client held (its unacked messages, its client-id):
            # a client that reconnects at once finds them.  The close on the next turn,
            # since closing redelivers and durable callbacks must not dispatch.
            self.phase = Phase.DISCONNECTING
            live.outbox.submit()
            last = encode_frame("RECEIPT", (("receipt-id", receipt),), version=self.version)
            live.conn.when_durable(lambda: self.broker.clock.callLater(0, self._close, last))
        else:
            self._close()

    # -- producing ----------------------------------------------------------

    def _destination(self, live: Connected, frame: Frame) -> str:
        name = frame.headers.get("destination")
        if not name:
            raise StompError("Missing destination header", f"{frame.command} requires a destination header")
        known = live.names.get(name)
        if known is not None:
            return known
        canonical = names.to_canonical(name, live.conn.temp_queue, self._existing_queue)
        # Temporary queues are created on first use and /amq/queue/ names must
        # exist: those are resolved every time.
        if not name.startswith(("/temp-queue/", "/amq/queue/")):
            if len(live.names) >= 1000:
                live.names.clear()
            live.names[name] = canonical
        return canonical

    def _existing_queue(self, name: str) -> str:
        """RabbitMQ's ``/amq/queue/NAME``: the stream or queue of that name; it is never created."""
        broker = self.broker
        try:
            broker.stream(name)
            return "stream://" + name
        except UnknownStream:
            pass
        if broker.queue("queue://" + name, create=False) is not None:
            return "queue://" + name
        raise UnknownDestination(
            f"no queue or stream {name!r}: /amq/queue/{name} names an existing one (as in RabbitMQ); /queue/{name} creates it"
        )

    def _send_destinations(self, live: Connected, frame: Frame) -> tuple[str, ...]:
        """Where a SEND goes: one destination, or each of a composite (``/queue/a,/topic/b``).

        Remembered per header value (``live.sends``), so a repeated SEND pays
        one dict lookup in ``_on_send``; temporary queues and ``/amq/queue/``
        names are resolved every time, as in ``_destination``.
        """
        name = frame.headers.get("destination")
        if name is not None and "," in name:
            every = tuple(names.to_canonical_all(name, live.conn.temp_queue, self._existing_queue))
        else:
            every = (self._destination(live, frame),)
        for destination in every:
            # All or none: a composite is refused before any part is sent.  Before the
            # access check too, so /queue/a.* is told about its wildcard, not about rights.
            self.broker.check_destination(destination)
        assert name is not None  # _destination refused a SEND without one
        if "/temp-queue/" not in name and "/amq/queue/" not in name:
            if len(live.sends) >= 1000:
                live.sends.clear()
            live.sends[name] = every
        return every

    def _allow(self, live: Connected, permission: Permission, destination: str, frame: Frame) -> None:
        """Refuse with an ERROR naming the destination (the receipt-id is added by _handle) unless allowed."""
        if not self.access.allowed(self.principal, permission, destination, live.conn.client_id):
            self._denied(permission, destination, frame)

    def _read_check(self, live: Connected, destination: str, frame: Frame) -> Reader | None:
        """Refuse a SUBSCRIBE as ``_allow`` does, unless granted; for a topic filter a deny rule
        overlaps (``/topic/>`` beside a denied topic), the check its deliveries then carry."""
        reading = self.access.reading(self.principal, destination, live.conn.client_id)
        topic = destination.startswith("topic://")
        reader = self._reader
        if topic and reading is not Reading.REFUSED and reader is None:
            # Every topic subscription hears of a reload through it, whole ones included.
            reader = self._reader = self.access.reader(self.principal, live.conn.client_id)
            if reader is not None:
                reader.listen(self._rules_changed)
        if reading is Reading.FILTERED and topic and reader is not None:
            log.debug(
                "[{label}] {d} granted: a deny rule overlaps it, so each of its messages is checked at delivery",
                label=self.label, d=destination,
            )
            return reader
        if reading is not Reading.WHOLE:
            self._denied(Permission.READ, destination, frame)
        return None

    def _denied(self, permission: Permission, destination: str, frame: Frame) -> NoReturn:
        name = frame.headers.get("destination", destination)
        log.info(
            "[{label}] {user} may not {what} {d}", label=self.label, user=self.principal.name or "anonymous",
            what=permission.value, d=destination,
        )
        why = f"{permission.value} access to {name} is not allowed for this user"
        if destination.startswith("queue://") and self.broker.queue(destination, create=False) is None:
            why += " (the queue does not exist yet, and creating it needs admin on it)"
        raise StompError("Access denied", why)

    def _on_send(self, live: Connected, frame: Frame) -> None:
        h = frame.headers
        destinations = live.sends.get(h.get("destination", ""))
        if destinations is None:
            destinations = self._send_destinations(live, frame)
        if self._checked:
            for destination in destinations:
                self._allow(live, Permission.WRITE, destination, frame)
        broker = self.broker
        persistent_text = h.get("persistent")
        persistent = broker.policy.default_persistent if persistent_text is None else persistent_text.lower() in _TRUE
        # Most SENDs carry none of these: a dict lookup each, a parse only when present.
        priority = 4 if "priority" not in h else _int_header(h, "priority", 4, 0, 9)
        expiration = 0 if "expires" not in h else _int_header(h, "expires", 0, 0, _INT64_MAX)
        if "expiration" in h:
            expiration = self._relative_expiry(h, expiration)
        delay = 0 if "AMQ_SCHEDULED_DELAY" not in h else _int_header(h, "AMQ_SCHEDULED_DELAY", 0, 0, _MAX_DELAY_MS)
        group_seq = 0 if "JMSXGroupSeq" not in h else _int_header(h, "JMSXGroupSeq", 0, -1, _INT64_MAX)
        reply_to = h.get("reply-to")
        if reply_to is not None:
            # The core keeps reply-to in canonical form so every protocol can name it
            # (MQTT's response topic); a value that is no destination passes as it is.
            try:
                reply_to = names.to_canonical(reply_to, live.conn.temp_queue)
            except BrokerError:
                pass
        usage = broker.store_usage
        if persistent and usage.full and broker.policy.store_full_policy == "fail":
            title, why = usage.refusal()
            raise StompError(title, why)
        stored_before = usage.bytes
        appended_before = broker.streams.appended
        custom = {k: v for k, v in h.items() if k not in _SEND_CONTROL} if not h.keys() <= _SEND_CONTROL else {}
        if custom and "x-message-ttl" in custom:
            self._relative_expiry(h, expiration)  # refused, saying what to use instead
        transaction = h.get("transaction")
        for destination in destinations:
            # A composite's parts are copies, each with its own id; sent in one
            # turn, persistent ones reach the disk in one batch, all or none.
            message = Message(
                broker.new_message_id(), destination, frame.body, custom if len(destinations) == 1 else dict(custom),
                persistent=persistent, priority=priority, expiration=expiration, timestamp=broker.now_ms(),
                group_id=h.get("JMSXGroupID"), group_seq=group_seq, correlation_id=h.get("correlation-id"),
                reply_to=reply_to, content_type=h.get("content-type"),
            )
            live.conn.send(message, transaction, delay)
        if usage.full and not self._held and (
            (persistent and usage.bytes > stored_before and broker.policy.store_full_policy == "block")
            or (usage.alarm is not None and broker.streams.appended > appended_before)
        ):
            # Only a send that was stored holds the producer: a persistent message
            # to a topic nobody durably follows costs the store nothing.  Under the
            # disk alarm a stream record is stored too, whatever the message, and
            # cannot be refused once routed: its producer is held by either policy.
            # Producer flow control: read nothing more from this client until there is room.
            self._held = True
            log.info("[{label}] {why}: holding this producer", label=self.label, why=usage.refusal()[1])
            self.transport.pause_reading("store limit")
            usage.when_space(self._release_hold)

    def _relative_expiry(self, h: dict[str, str], expires: int) -> int:
        """RabbitMQ's ``expiration``: a time to live in milliseconds, beside ActiveMQ's absolute ``expires``."""
        if "x-message-ttl" in h:
            raise StompError(
                "Unsupported header x-message-ttl",
                "x-message-ttl is a RabbitMQ queue argument, which queues here do not take; give each SEND "
                "expiration (milliseconds to live, as RabbitMQ's per-message TTL) or expires (epoch milliseconds)",
            )
        if expires:
            raise StompError("Conflicting expiry headers", "give expires (epoch milliseconds) or expiration (milliseconds to live), not both")
        ttl = _int_header(h, "expiration", 0, 0, _MAX_DELAY_MS)
        return self.broker.now_ms() + ttl

    def _release_hold(self) -> None:
        self._held = False
        if not self.closed:
            log.info("[{label}] store has room again: resuming this producer", label=self.label)
            self.transport.resume_reading("store limit")

    # -- consuming ----------------------------------------------------------

    def _on_subscribe(self, live: Connected, frame: Frame) -> None:
        h = frame.headers
        destination = self._destination(live, frame)
        if "x-message-ttl" in h:
            self._relative_expiry(h, 0)  # refused, saying what to use instead
        check = self._read_check(live, destination, frame) if self._checked else None
        sub_id = h.get("id")
        if sub_id is None:
            if self.version != "1.0":
                raise StompError("Missing id header", "SUBSCRIBE requires an id header in STOMP 1.1 and 1.2")
            sub_id = h["destination"]
        if sub_id in live.subs:
            raise StompError("Duplicate subscription id", f"subscription id {sub_id!r} is already in use on this connection")
        if len(live.subs) >= self.settings.max_subscriptions:
            raise StompError("Too many subscriptions", f"at most {self.settings.max_subscriptions} per connection")
        ack_text = h.get("ack", "auto")
        ack_mode = _ACK_MODES.get(ack_text)
        if ack_mode is None:
            raise StompError("Invalid ack mode", f"ack must be auto, client or client-individual, got {ack_text!r}")
        # ActiveMQ's name, or RabbitMQ's (its stream consumers must give one).
        prefetch_name = "activemq.prefetchSize" if "activemq.prefetchSize" in h else "prefetch-count"
        prefetch_n = None if prefetch_name not in h else _int_header(h, prefetch_name, 0, 1, None)
        durable = h.get("activemq.subscriptionName") or h.get("durable-subscription-name") or None
        partition = h.get("x-stream-partition")
        partition_n = None if partition is None else _int_header(h, "x-stream-partition", 0, 0, None)
        live.sub_no += 1
        header = b"subscription:" + escape_header(sub_id, self.version).encode() + b"\n"
        sub = _Sub(sub_id, live.sub_no, ack_mode, header, durable, destination)
        sub.consumer = live.conn.subscribe(
            destination, partial(self._deliver, live.outbox, sub),
            ack_mode=ack_mode, prefetch=prefetch_n, selector=h.get("selector"),
            exclusive=h.get("activemq.exclusive", "").lower() in _TRUE,
            durable_name=durable, retroactive=h.get("activemq.retroactive", "").lower() in _TRUE, no_local=self.bridge,
            network=PathFilter(self.peer, _int_header(h, TTL_HEADER, 255, 1, 255)) if self.bridge else None,
            handle=sub, stream_offset=h.get("x-stream-offset"), stream_partition=partition_n, check=check,
        )
        live.subs[sub_id] = sub
        live.subs_by_no[sub.no] = sub

    def _on_unsubscribe(self, live: Connected, frame: Frame) -> None:
        h = frame.headers
        sub_id = h.get("id")
        if sub_id is None and self.version == "1.0":
            sub_id = h.get("destination")
        durable = h.get("activemq.subscriptionName") or h.get("durable-subscription-name") or None
        if sub_id is None:
            if durable:
                live.conn.remove_durable(durable)
                return
            raise StompError("Missing id header", "UNSUBSCRIBE requires an id header")
        sub = live.subs.pop(sub_id, None)
        if sub is None:
            if durable:
                live.conn.remove_durable(durable)
                return
            raise StompError("Unknown subscription", f"no subscription with id {sub_id!r}")
        del live.subs_by_no[sub.no]
        if sub.consumer is not None:
            live.conn.unsubscribe(sub.consumer, remove_durable=bool(durable))

    def _rules_changed(self) -> None:
        """The rules were reloaded (SIGHUP): the next delivery of every topic subscription is checked by them.

        One they refuse outright now is checked too, so its deliveries stop
        (skipped and counted) while the client stays connected.
        """
        live = self.live
        reader = self._reader
        if live is None or reader is None or self.closed:
            return
        try:
            changed = checked = 0
            for sub in live.subs.values():
                consumer = sub.consumer
                if consumer is None or not sub.destination.startswith("topic://"):
                    continue
                check = None if reader.reading(sub.destination) is Reading.WHOLE else reader
                if (check is None) != (consumer.check is None):
                    changed += 1
                if check is not None:
                    checked += 1
                consumer.check = check
        except Exception:
            # Its subscriptions may no longer match the rules: this client goes, not the reload.
            log.failure("[{label}] internal error applying reloaded rules", label=self.label)
            self.broker.clock.callLater(0, self._fail, "Internal error", "the broker failed to apply reloaded rules; reconnect")
            return
        if changed:
            log.info("[{label}] rules reloaded: {n} of its subscriptions checked at delivery", label=self.label, n=checked)

    def _deliver(self, outbox: Outbox, sub: _Sub, consumer: Consumer, entry: Entry, tag: int) -> None:
        """Write one MESSAGE.  A failure costs this client its connection on the
        next turn, never the other subscribers of the fan-out."""
        try:
            self._deliver_one(outbox, sub, entry, tag)
        except Exception:
            log.failure("[{label}] internal error delivering {id}", label=self.label, id=entry.message.id)
            self.broker.clock.callLater(0, self._fail, "Internal error", "the broker failed to deliver a message; see its log")

    def _deliver_one(self, outbox: Outbox, sub: _Sub, entry: Entry, tag: int) -> None:
        message = entry.message
        parts = [b"MESSAGE\n", sub.header]
        if sub.ack_mode is not AckMode.AUTO:
            if self.version == "1.2":
                parts.append(b"ack:%d:%d\n" % (sub.no, tag))
            else:
                sub.message_tags[message.id] = tag
        if entry.redeliveries:
            parts.append(b"redelivered:true\nredelivery-count:%d\n" % entry.redeliveries)
        if self.bridge:
            # To another gateway's bridge: the id it drops repeats by and the path it stops loops by
            # (ahead of the message's own headers: the first of a repeated header is the one read).
            version = self.version
            parts.append("".join(
                f"{escape_header(k, version)}:{escape_header(v, version)}\n"
                for k, v in forwarding_headers(message, self.broker.node_name)
            ).encode())
        parts.append(self._message_tail(message))
        # After the batch holding its delivered mark (and anything before it) is on disk;
        # an unstored entry (a topic's message) has no mark, and waits only behind what went before.
        outbox.add(b"".join(parts), entry.stored)

    def _message_tail(self, message: Message) -> bytes:
        """Everything after the per-subscriber headers: built once per message and escaping."""
        cache = message.cache
        if cache is None:
            cache = message.cache = {}
        key = ("stomp", self.version == "1.0", self.version == "1.2")
        tail = cache.get(key)
        if tail is None:
            headers = [
                ("destination", names.from_canonical(message.destination)),
                ("timestamp", str(message.timestamp)),
                ("priority", str(message.priority)),
            ]
            if message.persistent:
                headers.append(("persistent", "true"))
            if message.expiration:
                headers.append(("expires", str(message.expiration)))
            if message.content_type is not None:
                headers.append(("content-type", message.content_type))
            if message.correlation_id is not None:
                headers.append(("correlation-id", message.correlation_id))
            if message.reply_to is not None:
                headers.append(("reply-to", names.from_canonical(message.reply_to)))
            if message.group_id is not None:
                headers.append(("JMSXGroupID", message.group_id))
                headers.append(("JMSXGroupSeq", str(message.group_seq)))
            reserved = {name for name, _ in headers}
            reserved.add("message-id")
            reserved.add("")  # an MQTT 5 user property may have an empty name; STOMP headers may not
            headers.extend((k, v) for k, v in message.headers.items() if k not in reserved)
            if self.version == "1.0":
                # 1.0 has no escaping: a header another client sent with a newline
                # (or a colon in its name) cannot be written, so it is left out.
                headers = [(k, v) for k, v in headers if "\n" not in k and "\n" not in v and ":" not in k]
            headers.append(("content-length", str(len(message.body))))
            # Every id has a colon ("ID:..."): escaped on its own, so the other
            # headers usually need no escaping at all.
            first = "message-id:" + (message.id if self.version == "1.0" else escape_header(message.id, self.version)) + "\n"
            tail = cache[key] = _encode_tail(first, headers, message.body, self.version)
        return tail

    def _find(self, live: Connected, frame: Frame) -> tuple[_Sub, int]:
        """The subscription and delivery tag an ACK or NACK names, by version."""
        h = frame.headers
        if self.version == "1.2":
            ack_id = h.get("id")
            if ack_id is None:
                raise StompError("Missing id header", f"{frame.command} requires an id header in STOMP 1.2")
            try:
                no_text, tag_text = ack_id.split(":")
                sub = live.subs_by_no[int(no_text)]
                return sub, int(tag_text)
            except (ValueError, KeyError):
                raise StompError("Unknown ack id", f"{frame.command} for {ack_id!r}, which is not an outstanding message")
        message_id = h.get("message-id")
        if message_id is None:
            raise StompError("Missing message-id header", f"{frame.command} requires a message-id header")
        sub_id = h.get("subscription")
        if sub_id is None and self.version == "1.1":
            raise StompError("Missing subscription header", f"{frame.command} requires a subscription header in STOMP 1.1")
        subs = live.subs
        candidates = [subs[sub_id]] if sub_id in subs else ([] if sub_id else list(subs.values()))
        for sub in candidates:
            tag = sub.message_tags.get(message_id)
            if tag is not None:
                return sub, tag
        raise StompError("Unknown message-id", f"{frame.command} for message {message_id!r}, which is not outstanding")

    def _settle_tags(self, sub: _Sub, tag: int) -> None:
        """Forget 1.0/1.1 message ids the core just settled (cumulative in client mode)."""
        tags = sub.message_tags
        if not tags:
            return
        for message_id, t in list(tags.items()):
            if t == tag or (sub.ack_mode is AckMode.CLIENT and t < tag):
                del tags[message_id]

    def _on_ack(self, live: Connected, frame: Frame) -> None:
        sub, tag = self._find(live, frame)
        if sub.consumer is None or sub.ack_mode is AckMode.AUTO:
            raise StompError("Unknown ack id", "this subscription acknowledges automatically")
        live.conn.ack(sub.consumer, tag, frame.headers.get("transaction"))
        self._settle_tags(sub, tag)

    def _on_nack(self, live: Connected, frame: Frame) -> None:
        sub, tag = self._find(live, frame)
        if sub.consumer is None or sub.ack_mode is AckMode.AUTO:
            raise StompError("Unknown ack id", "this subscription acknowledges automatically")
        self._settle_tags(sub, tag)
        live.conn.nack(sub.consumer, tag, frame.headers.get("transaction"))

    # -- transactions -------------------------------------------------------

    def _tx(self, frame: Frame) -> str:
        tx = frame.headers.get("transaction")
        if not tx:
            raise StompError("Missing transaction header", f"{frame.command} requires a transaction header")
        return tx

    def _on_begin(self, live: Connected, frame: Frame) -> None:
        if live.conn.open_transactions >= self.settings.max_transactions:
            raise StompError("Too many transactions", f"at most {self.settings.max_transactions} open per connection")
        live.conn.begin(self._tx(frame))

    def _on_commit(self, live: Connected, frame: Frame) -> None:
        live.conn.commit(self._tx(frame))

    def _on_abort(self, live: Connected, frame: Frame) -> None:
        live.conn.abort(self._tx(frame))

    # -- output and teardown -----------------------------------------------

    def write_out(self, data: bytes) -> None:
        """Bytes to the client, now (the outbox decides when); nothing once closed."""
        if not self.closed:
            self._last_write = self._now()
            self.transport.write(data)

    def _fail(self, message: str, detail: str = "", receipt: str | None = None) -> None:
        """The client did something wrong: logged as a protocol error, then ``_error_and_close``."""
        if self.close_reason == "normal":
            self.close_reason = "error"
        log.info("[{label}] protocol error: {message}", label=self.label, message=message)
        self._error_and_close(message, detail, receipt)

    def _error_and_close(self, message: str, detail: str = "", receipt: str | None = None) -> None:
        """An ERROR frame (the client's only way to learn why), then the close; the caller logs why."""
        message = message.replace("\r", " ").replace("\n", " ")
        headers = [("message", message), ("content-type", "text/plain")]
        if receipt is not None:
            headers.append(("receipt-id", receipt))
        body = (detail or message).encode("utf-8")
        headers.append(("content-length", str(len(body))))
        if self.live is not None:
            self.live.outbox.submit()  # frames gathered before the error go out before it
        self.write_out(encode_frame("ERROR", headers, body, version=self.version))
        self._close()

    def close_by_admin(self, reason: str) -> None:
        """An operator closed this connection (admin API): an ERROR with the reason, then the close.

        Logged as what it is, an operator's decision, so that a search of the
        log for protocol errors finds clients that misbehaved, not maintenance.
        """
        if not self.closed:
            self.close_reason = "admin"
            log.info("[{label}] closed by an operator: {reason}", label=self.label, reason=reason)
            self._error_and_close(reason, "the connection was closed by an administrator")

    def shutdown(self, reason: str = "Broker shutting down") -> None:
        """The broker is stopping: tell the client why, then close (not a protocol error either)."""
        if not self.closed:
            self.close_reason = "shutdown"
            log.info("[{label}] closing: {reason}", label=self.label, reason=reason)
            self._error_and_close(reason, "the broker is shutting down; reconnect later")

    def _close(self, last: bytes = b"") -> None:
        """``last``: a frame written once the core has closed the connection (DISCONNECT's receipt)."""
        if self.closed:
            return
        if self.live is not None:
            self.live.outbox.submit()  # what this turn gathered goes out before the close
        self._release()
        if last:
            self.transport.write(last)
        self.transport.close()

    def _release(self) -> None:
        self.phase = Phase.CLOSED
        self.closed = True
        if self._reader is not None:
            self._reader.close()  # the rules forget it: nothing left to check
        for timer in (self._timer, self._connect_timer):
            if timer is not None and timer.active():
                timer.cancel()
        self._timer = self._connect_timer = None
        if self.live is not None:
            self.live.conn.close()

    def connection_lost(self) -> None:
        """The socket is gone: what this client held goes back to its queues."""
        if not self.closed:
            log.info("[{label}] connection lost", label=self.label)
        self._release()

    def pause_producing(self) -> None:
        if self.live is not None:
            self.live.conn.pause()

    def resume_producing(self) -> None:
        if self.live is not None and not self.closed:
            self.live.conn.resume()


def _int_header(headers: dict[str, str], name: str, default: int, low: int, high: int | None) -> int:
    text = headers.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise StompError(f"Invalid {name} header", f"{name} must be an integer, got {text[:40]!r}") from None
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise StompError(f"Invalid {name} header", f"{name} must be {bound}, got {value}")
    return value


# What each client command does once connected (CLIENT_COMMANDS is checked
# before the lookup; CONNECT and STOMP are handled before there is a ``live``).
_HANDLERS: dict[str, Callable[[StompSession, Connected, Frame], None]] = {
    "SEND": StompSession._on_send,
    "SUBSCRIBE": StompSession._on_subscribe,
    "UNSUBSCRIBE": StompSession._on_unsubscribe,
    "ACK": StompSession._on_ack,
    "NACK": StompSession._on_nack,
    "BEGIN": StompSession._on_begin,
    "COMMIT": StompSession._on_commit,
    "ABORT": StompSession._on_abort,
    "DISCONNECT": StompSession._on_disconnect,
}
assert set(_HANDLERS) == set(CLIENT_COMMANDS) - {"CONNECT", "STOMP"}


_SPECIAL = ("\\", "\n", ":", "\r")


def _encode_tail(first: str, headers: list[tuple[str, str]], body: bytes, version: str) -> bytes:
    """Header lines, blank line, body and NUL of a MESSAGE, built once per message.

    Escaping runs only when some name or value needs it: usually none does,
    and then the frame is one join.  1.0 headers were filtered by the caller.
    """
    if version != "1.0":
        joined = "".join(name + value for name, value in headers)
        if any(c in joined for c in _SPECIAL):
            headers = [(escape_header(name, version), escape_header(value, version)) for name, value in headers]
    text = first + "".join([f"{name}:{value}\n" for name, value in headers])
    if "\0" in text:
        # No STOMP header may hold a NUL (a reader without content-length would end
        # the frame there); MQTT 5 correlation data and user properties may.
        text = text.replace("\0", "?")
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        # Bytes that are not UTF-8 (MQTT 5 binary correlation data) cannot be a
        # STOMP header value: they arrive as U+FFFD-free '?' rather than break the frame.
        raw = text.encode("utf-8", "replace")
    return b"".join((raw, b"\n", body, b"\0"))
