"""What the STOMP session's modules share: its settings, its error, its ``Phase``, and what exists once connected.

Apart from the session (protocols/stomp/session.py) so that the modules of
its handlers (``send``, ``subscriptions``) can use them without importing
the session at run time.  ``protocols.stomp.session`` re-exports the public
names.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from core.connection import Connection
from core.consumer import AckMode, Consumer
from protocols.outbox import Outbox
from protocols.stomp.codec import StompLimits

__all__ = [
    "BROKER_HEADER", "SERVER_NAME", "TTL_HEADER", "VERSIONS", "Connected", "Phase", "StompError", "StompSettings",
    "Subscription", "int_header",
]

VERSIONS = ("1.0", "1.1", "1.2")
SERVER_NAME = "gateway/0.1"
# CONNECT and CONNECTED: a gateway's bridge names its broker, and the gateway answers with its own.
BROKER_HEADER = "gateway-broker"
# SUBSCRIBE from a gateway's network link: how many brokers a message may have crossed to be given it.
TTL_HEADER = "gateway-ttl"


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


class Subscription:
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
        self.subs: dict[str, Subscription] = {}
        self.subs_by_no: dict[int, Subscription] = {}
        self.sub_no = 0
        self.names: dict[str, str] = {}  # STOMP destination -> canonical, for repeated SENDs
        # A SEND's destination header -> where it goes (several for a composite), checked once.
        self.sends: dict[str, tuple[str, ...]] = {}


def int_header(headers: dict[str, str], name: str, default: int, low: int, high: int | None) -> int:
    """An integer header between ``low`` and ``high`` (None: no bound), ``default`` when absent or empty."""
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
