"""STOMP SEND: where a frame goes, whether this client may send there, and the message it becomes.

A destination header is resolved to canonical names once per connection and
value (``Connected.sends``), so a repeated SEND pays a dict lookup; the
rules' checks, the control headers (persistence, priority, expiry, delay,
groups, reply-to) and producer flow control (the shared ``ProducerHold``,
protocols/lifecycle.py) follow, and the message goes to the core connection.
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, NoReturn

from twisted.logger import Logger

from core.access import Permission
from core.errors import BrokerError, UnknownDestination
from core.message import Message
from core.stream_config import UnknownStream
from protocols.lifecycle import hold_if_stored, store_refusal
from protocols.stomp import names
from protocols.stomp.codec import Frame
from protocols.stomp.state import Connected, StompError, int_header

if TYPE_CHECKING:
    from protocols.stomp.session import StompSession

log = Logger(namespace="gateway.stomp")

# Headers a SEND carries for the broker, not for consumers.
_SEND_CONTROL = frozenset({
    "destination", "content-length", "receipt", "transaction", "message-id", "subscription", "ack",
    "redelivered", "redelivery-count", "timestamp", "persistent", "priority", "expires", "correlation-id",
    "reply-to", "content-type", "JMSXGroupID", "JMSXGroupSeq", "AMQ_SCHEDULED_DELAY", "expiration",
})

# Stored messages keep these as signed 64-bit integers.
_INT64_MAX = 2**63 - 1
# Ten years: a longer delay is a mistake, and due times must fit their record keys.
MAX_DELAY_MS = 10 * 365 * 24 * 3600 * 1000

TRUE = ("true", "1", "yes")


def destination(session: StompSession, live: Connected, frame: Frame) -> str:
    """The canonical name of a frame's ``destination`` header (SEND and SUBSCRIBE), remembered per connection."""
    name = frame.headers.get("destination")
    if not name:
        raise StompError("Missing destination header", f"{frame.command} requires a destination header")
    known = live.names.get(name)
    if known is not None:
        return known
    canonical = names.to_canonical(name, live.conn.temp_queue, partial(existing_queue, session))
    # Temporary queues are created on first use and /amq/queue/ names must
    # exist: those are resolved every time.
    if not name.startswith(("/temp-queue/", "/amq/queue/")):
        if len(live.names) >= 1000:
            live.names.clear()
        live.names[name] = canonical
    return canonical


def existing_queue(session: StompSession, name: str) -> str:
    """RabbitMQ's ``/amq/queue/NAME``: the stream or queue of that name; it is never created."""
    broker = session.broker
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


def _send_destinations(session: StompSession, live: Connected, frame: Frame) -> tuple[str, ...]:
    """Where a SEND goes: one destination, or each of a composite (``/queue/a,/topic/b``).

    Remembered per header value (``live.sends``), so a repeated SEND pays
    one dict lookup in ``on_send``; temporary queues and ``/amq/queue/``
    names are resolved every time, as in ``destination``.
    """
    name = frame.headers.get("destination")
    if name is not None and "," in name:
        every = tuple(names.to_canonical_all(name, live.conn.temp_queue, partial(existing_queue, session)))
    else:
        every = (destination(session, live, frame),)
    for each in every:
        # All or none: a composite is refused before any part is sent.  Before the
        # access check too, so /queue/a.* is told about its wildcard, not about rights.
        session.broker.check_destination(each)
    assert name is not None  # destination() refused a SEND without one
    if "/temp-queue/" not in name and "/amq/queue/" not in name:
        if len(live.sends) >= 1000:
            live.sends.clear()
        live.sends[name] = every
    return every


def _allow(session: StompSession, live: Connected, permission: Permission, destination: str, frame: Frame) -> None:
    """Refuse with an ERROR naming the destination (the receipt-id is added by _handle) unless allowed."""
    if not session.access.allowed(session.principal, permission, destination, live.conn.client_id):
        denied(session, permission, destination, frame)


def denied(session: StompSession, permission: Permission, destination: str, frame: Frame) -> NoReturn:
    name = frame.headers.get("destination", destination)
    log.info(
        "[{label}] {user} may not {what} {d}", label=session.label, user=session.principal.name or "anonymous",
        what=permission.value, d=destination,
    )
    why = f"{permission.value} access to {name} is not allowed for this user"
    if destination.startswith("queue://") and session.broker.queue(destination, create=False) is None:
        why += " (the queue does not exist yet, and creating it needs admin on it)"
    raise StompError("Access denied", why)


def on_send(session: StompSession, live: Connected, frame: Frame) -> None:
    h = frame.headers
    destinations = live.sends.get(h.get("destination", ""))
    if destinations is None:
        destinations = _send_destinations(session, live, frame)
    if session.checked:
        for each in destinations:
            _allow(session, live, Permission.WRITE, each, frame)
    broker = session.broker
    persistent_text = h.get("persistent")
    persistent = broker.policy.default_persistent if persistent_text is None else persistent_text.lower() in TRUE
    # Most SENDs carry none of these: a dict lookup each, a parse only when present.
    priority = 4 if "priority" not in h else int_header(h, "priority", 4, 0, 9)
    expiration = 0 if "expires" not in h else int_header(h, "expires", 0, 0, _INT64_MAX)
    if "expiration" in h:
        expiration = relative_expiry(session, h, expiration)
    delay = 0 if "AMQ_SCHEDULED_DELAY" not in h else int_header(h, "AMQ_SCHEDULED_DELAY", 0, 0, MAX_DELAY_MS)
    group_seq = 0 if "JMSXGroupSeq" not in h else int_header(h, "JMSXGroupSeq", 0, -1, _INT64_MAX)
    reply_to = h.get("reply-to")
    if reply_to is not None:
        # The core keeps reply-to in canonical form so every protocol can name it
        # (MQTT's response topic); a value that is no destination passes as it is.
        try:
            reply_to = names.to_canonical(reply_to, live.conn.temp_queue)
        except BrokerError:
            pass
    usage = broker.store_usage
    if persistent and usage.full:
        refused = store_refusal(broker, True)
        if refused is not None:
            raise StompError(*refused)
    stored_before = usage.bytes
    appended_before = broker.streams.appended
    custom = {k: v for k, v in h.items() if k not in _SEND_CONTROL} if not h.keys() <= _SEND_CONTROL else {}
    if custom and "x-message-ttl" in custom:
        relative_expiry(session, h, expiration)  # refused, saying what to use instead
    transaction = h.get("transaction")
    for each in destinations:
        # A composite's parts are copies, each with its own id; sent in one
        # turn, persistent ones reach the disk in one batch, all or none.
        message = Message(
            broker.new_message_id(), each, frame.body, custom if len(destinations) == 1 else dict(custom),
            persistent=persistent, priority=priority, expiration=expiration, timestamp=broker.now_ms(),
            group_id=h.get("JMSXGroupID"), group_seq=group_seq, correlation_id=h.get("correlation-id"),
            reply_to=reply_to, content_type=h.get("content-type"),
        )
        live.conn.send(message, transaction, delay)
    if usage.full and session.hold is None:
        # Producer flow control: read nothing more from this client until there is room.
        hold_if_stored(session, session.transport, broker, persistent, stored_before, appended_before, log, "producer")


def relative_expiry(session: StompSession, h: dict[str, str], expires: int) -> int:
    """RabbitMQ's ``expiration``: a time to live in milliseconds, beside ActiveMQ's absolute ``expires``."""
    if "x-message-ttl" in h:
        raise StompError(
            "Unsupported header x-message-ttl",
            "x-message-ttl is a RabbitMQ queue argument, which queues here do not take; give each SEND "
            "expiration (milliseconds to live, as RabbitMQ's per-message TTL) or expires (epoch milliseconds)",
        )
    if expires:
        raise StompError("Conflicting expiry headers", "give expires (epoch milliseconds) or expiration (milliseconds to live), not both")
    ttl = int_header(h, "expiration", 0, 0, MAX_DELAY_MS)
    return session.broker.now_ms() + ttl
