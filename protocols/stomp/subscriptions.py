"""STOMP SUBSCRIBE and UNSUBSCRIBE, the MESSAGEs a subscription is given, and their ACK and NACK.

A subscription is a consumer in the core whose sink is ``deliver`` (bound
with the session, the outbox and the ``Subscription``).  A MESSAGE is the
subscription's own headers (``subscription``, ``ack``, redelivery) joined to
the tail the codec builds once per message and escaping
(``protocols.stomp.encoding.message_tail``).  ACK and NACK name a delivery
by ``ack`` id (1.2) or by message id and subscription (1.0, 1.1).
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from twisted.logger import Logger

from core.access import Permission, Reader, Reading
from core.consumer import AckMode, Consumer
from core.duplicates import forwarding_headers
from core.entry import Entry
from core.network import PathFilter
from protocols.lifecycle import fail_soon
from protocols.outbox import Outbox
from protocols.stomp.codec import Frame, escape_header, message_tail
from protocols.stomp.send import TRUE, denied, destination, relative_expiry
from protocols.stomp.state import TTL_HEADER, Connected, StompError, Subscription, int_header

if TYPE_CHECKING:
    from protocols.stomp.session import StompSession

log = Logger(namespace="gateway.stomp")

_ACK_MODES = {"auto": AckMode.AUTO, "client": AckMode.CLIENT, "client-individual": AckMode.CLIENT_INDIVIDUAL}


def on_subscribe(session: StompSession, live: Connected, frame: Frame) -> None:
    h = frame.headers
    canonical = destination(session, live, frame)
    if "x-message-ttl" in h:
        relative_expiry(session, h, 0)  # refused, saying what to use instead
    check = _read_check(session, live, canonical, frame) if session.checked else None
    version = session.version
    sub_id = h.get("id")
    if sub_id is None:
        if version != "1.0":
            raise StompError("Missing id header", "SUBSCRIBE requires an id header in STOMP 1.1 and 1.2")
        sub_id = h["destination"]
    if sub_id in live.subs:
        raise StompError("Duplicate subscription id", f"subscription id {sub_id!r} is already in use on this connection")
    max_subscriptions = session.settings.max_subscriptions
    if len(live.subs) >= max_subscriptions:
        raise StompError("Too many subscriptions", f"at most {max_subscriptions} per connection")
    ack_text = h.get("ack", "auto")
    ack_mode = _ACK_MODES.get(ack_text)
    if ack_mode is None:
        raise StompError("Invalid ack mode", f"ack must be auto, client or client-individual, got {ack_text!r}")
    # ActiveMQ's name, or RabbitMQ's (its stream consumers must give one).
    prefetch_name = "activemq.prefetchSize" if "activemq.prefetchSize" in h else "prefetch-count"
    prefetch_n = None if prefetch_name not in h else int_header(h, prefetch_name, 0, 1, None)
    durable = h.get("activemq.subscriptionName") or h.get("durable-subscription-name") or None
    partition = h.get("x-stream-partition")
    partition_n = None if partition is None else int_header(h, "x-stream-partition", 0, 0, None)
    live.sub_no += 1
    header = b"subscription:" + escape_header(sub_id, version).encode() + b"\n"
    sub = Subscription(sub_id, live.sub_no, ack_mode, header, durable, canonical)
    bridge = session.bridge
    sub.consumer = live.conn.subscribe(
        canonical, partial(deliver, session, live.outbox, sub),
        ack_mode=ack_mode, prefetch=prefetch_n, selector=h.get("selector"),
        exclusive=h.get("activemq.exclusive", "").lower() in TRUE,
        durable_name=durable, retroactive=h.get("activemq.retroactive", "").lower() in TRUE, no_local=bridge,
        network=PathFilter(session.peer, int_header(h, TTL_HEADER, 255, 1, 255)) if bridge else None,
        handle=sub, stream_offset=h.get("x-stream-offset"), stream_partition=partition_n, check=check,
    )
    live.subs[sub_id] = sub
    live.subs_by_no[sub.no] = sub


def on_unsubscribe(session: StompSession, live: Connected, frame: Frame) -> None:
    h = frame.headers
    sub_id = h.get("id")
    if sub_id is None and session.version == "1.0":
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


def _read_check(session: StompSession, live: Connected, canonical: str, frame: Frame) -> Reader | None:
    """Refuse a SUBSCRIBE as a SEND is refused, unless granted; for a topic filter a deny rule
    overlaps (``/topic/>`` beside a denied topic), the check its deliveries then carry."""
    reading = session.access.reading(session.principal, canonical, live.conn.client_id)
    topic = canonical.startswith("topic://")
    reader = session.reader
    if topic and reading is not Reading.REFUSED and reader is None:
        # Every topic subscription hears of a reload through it, whole ones included.
        reader = session.reader = session.access.reader(session.principal, live.conn.client_id)
        if reader is not None:
            reader.listen(partial(rules_changed, session))
    if reading is Reading.FILTERED and topic and reader is not None:
        log.debug(
            "[{label}] {d} granted: a deny rule overlaps it, so each of its messages is checked at delivery",
            label=session.label, d=canonical,
        )
        return reader
    if reading is not Reading.WHOLE:
        denied(session, Permission.READ, canonical, frame)
    return None


def rules_changed(session: StompSession) -> None:
    """The rules were reloaded (SIGHUP): the next delivery of every topic subscription is checked by them.

    One they refuse outright now is checked too, so its deliveries stop
    (skipped and counted) while the client stays connected.
    """
    live = session.live
    reader = session.reader
    if live is None or reader is None or session.closed:
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
        fail_soon(session, session.broker.clock, log, "applying reloaded rules", "the broker failed to apply reloaded rules; reconnect")
        return
    if changed:
        log.info("[{label}] rules reloaded: {n} of its subscriptions checked at delivery", label=session.label, n=checked)


def deliver(session: StompSession, outbox: Outbox, sub: Subscription, consumer: Consumer, entry: Entry, tag: int) -> None:
    """Write one MESSAGE.  A failure costs this client its connection on the
    next turn, never the other subscribers of the fan-out."""
    try:
        deliver_one(session, outbox, sub, entry, tag)
    except Exception:
        fail_soon(
            session, session.broker.clock, log, f"delivering {entry.message.id}",
            "the broker failed to deliver a message; see its log",
        )


def deliver_one(session: StompSession, outbox: Outbox, sub: Subscription, entry: Entry, tag: int) -> None:
    message = entry.message
    version = session.version
    parts = [b"MESSAGE\n", sub.header]
    if sub.ack_mode is not AckMode.AUTO:
        if version == "1.2":
            parts.append(b"ack:%d:%d\n" % (sub.no, tag))
        else:
            sub.message_tags[message.id] = tag
    if entry.redeliveries:
        parts.append(b"redelivered:true\nredelivery-count:%d\n" % entry.redeliveries)
    if session.bridge:
        # To another gateway's bridge: the id it drops repeats by and the path it stops loops by
        # (ahead of the message's own headers: the first of a repeated header is the one read).
        parts.append("".join(
            f"{escape_header(k, version)}:{escape_header(v, version)}\n"
            for k, v in forwarding_headers(message, session.broker.node_name)
        ).encode())
    parts.append(message_tail(message, version))
    # After the batch holding its delivered mark (and anything before it) is on disk;
    # an unstored entry (a topic's message) has no mark, and waits only behind what went before.
    outbox.add(b"".join(parts), entry.stored)


def _find(session: StompSession, live: Connected, frame: Frame) -> tuple[Subscription, int]:
    """The subscription and delivery tag an ACK or NACK names, by version."""
    h = frame.headers
    version = session.version
    if version == "1.2":
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
    if sub_id is None and version == "1.1":
        raise StompError("Missing subscription header", f"{frame.command} requires a subscription header in STOMP 1.1")
    subs = live.subs
    candidates = [subs[sub_id]] if sub_id in subs else ([] if sub_id else list(subs.values()))
    for sub in candidates:
        tag = sub.message_tags.get(message_id)
        if tag is not None:
            return sub, tag
    raise StompError("Unknown message-id", f"{frame.command} for message {message_id!r}, which is not outstanding")


def _settle_tags(sub: Subscription, tag: int) -> None:
    """Forget 1.0/1.1 message ids the core just settled (cumulative in client mode)."""
    tags = sub.message_tags
    if not tags:
        return
    for message_id, t in list(tags.items()):
        if t == tag or (sub.ack_mode is AckMode.CLIENT and t < tag):
            del tags[message_id]


def on_ack(session: StompSession, live: Connected, frame: Frame) -> None:
    sub, tag = _find(session, live, frame)
    if sub.consumer is None or sub.ack_mode is AckMode.AUTO:
        raise StompError("Unknown ack id", "this subscription acknowledges automatically")
    live.conn.ack(sub.consumer, tag, frame.headers.get("transaction"))
    _settle_tags(sub, tag)


def on_nack(session: StompSession, live: Connected, frame: Frame) -> None:
    sub, tag = _find(session, live, frame)
    if sub.consumer is None or sub.ack_mode is AckMode.AUTO:
        raise StompError("Unknown ack id", "this subscription acknowledges automatically")
    _settle_tags(sub, tag)
    live.conn.nack(sub.consumer, tag, frame.headers.get("transaction"))
