"""MQTT SUBSCRIBE and UNSUBSCRIBE, and the rules' checks a subscription's deliveries carry.

Every filter of a client feeds the client's one queue (durable when its
session outlives the connection), whose consumer this connection is; a
shared subscription (``$share/group/filter``) is a queue of the group's
instead, with a consumer of this connection's.  Retained messages follow the
SUBACK through that queue like any delivery.  A filter a deny rule overlaps
is granted and each of its deliveries is checked by the session's ``Reader``,
which also hears of reloads of the rules.
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from twisted.logger import Logger

from core.access import Reader, Reading
from core.consumer import AckMode
from core.destination import InvalidDestination
from core.entry import Entry
from core.queue import MessageQueue
from protocols.lifecycle import fail_soon
from protocols.mqtt import codec as mq
from protocols.mqtt.codec import MqttProtocolError, ReasonCode
from protocols.mqtt.connected import Connected
from protocols.mqtt.delivery import deliver
from protocols.mqtt.names import InvalidTopic, filter_to_canonical, split_shared
from protocols.mqtt.state import RetainedVia, SubscriptionOptions

if TYPE_CHECKING:
    from protocols.mqtt.session import MqttSession

log = Logger(namespace="gateway.mqtt")

# MQTT 3.1.1 3.9.3: the SUBACK return code of a refused filter (5.0 says why with a reason code).
SUBACK_FAILURE = 0x80


def session_queue(session: MqttSession, live: Connected) -> MessageQueue:
    """The client's own queue, and this connection's consumer of it; a clean session
    gets both with its first subscription, not at CONNECT."""
    queue = session.hub.clean_queue(live.client)
    if live.consumer is None:
        live.consumer = live.conn.consume(
            queue, partial(deliver, session, live), ack_mode=AckMode.CLIENT_INDIVIDUAL,
            prefetch=min(session.peer_receive_maximum, session.settings.max_inflight), check=_check_for(session, live, None),
        )
    return queue


def reader_of(session: MqttSession, client_id: str) -> Reader | None:
    reader = session.reader
    if reader is None:
        reader = session.reader = session.hub.access.reader(session.principal, client_id)
        if reader is not None:
            reader.listen(partial(rules_changed, session))
    return reader


def _check_for(session: MqttSession, live: Connected, shared_filter: str | None) -> Reader | None:
    """The check a consumer carries: the consumer of a shared filter's group, or (None) of the
    session's own queue, which every other filter feeds; None when no deny overlaps what it gets."""
    filtered = live.filtered
    if filtered is None:
        return None
    if shared_filter is not None:
        return session.reader if shared_filter in filtered else None
    client = live.client
    shared = client.shared if client.subscribed else {}
    return session.reader if any(f not in shared for f in filtered) else None


def _apply_checks(session: MqttSession, live: Connected) -> None:
    if live.consumer is not None:
        live.consumer.check = _check_for(session, live, None)
    client = live.client
    if client.subscribed and client.shared:
        for mqtt_filter, consumer in live.shared_consumers.items():
            consumer.check = _check_for(session, live, mqtt_filter)


def _mark(live: Connected, mqtt_filter: str, filtered: bool) -> None:
    if filtered:
        if live.filtered is None:
            live.filtered = {}
        live.filtered[mqtt_filter] = None
    elif live.filtered is not None:
        live.filtered.pop(mqtt_filter, None)
        if not live.filtered:
            live.filtered = None


def review(session: MqttSession, live: Connected) -> None:
    """Which of the session's filters the current rules only partly let through.

    A filter they refuse outright now (granted before a reload) is checked
    too: each of its deliveries is then skipped, rather than the client cut off.
    """
    reader = session.reader
    client = live.client
    if reader is None or not client.subscribed:
        return
    filtered: dict[str, None] = {}
    for mqtt_filter, sub in client.subs.items():
        if reader.reading(sub.destination) is not Reading.WHOLE:
            filtered[mqtt_filter] = None
    for mqtt_filter, (_, canonical) in client.shared.items():
        if reader.reading(canonical) is not Reading.WHOLE:
            filtered[mqtt_filter] = None
    live.filtered = filtered or None


def rules_changed(session: MqttSession) -> None:
    """The rules were reloaded (SIGHUP): the next delivery of every subscription is checked by them."""
    live = session.live
    if live is None or session.closed:
        return
    before = live.filtered
    try:
        review(session, live)
        _apply_checks(session, live)
    except Exception:
        # Its subscriptions may no longer match the rules: this client goes, not the reload.
        fail_soon(session, session.broker.clock, log, "applying reloaded rules", "")
        return
    if before != live.filtered:
        log.info(
            "[{label}] rules reloaded: {n} of its subscriptions checked at delivery", label=session.label,
            n=len(live.filtered or ()),
        )


def on_subscribe(session: MqttSession, live: Connected, packet: mq.Subscribe) -> None:
    sub_id = packet.properties.get("subscription_identifier") if session.level == 5 else None
    codes = []
    retained: list[Entry] = []
    for request in packet.subscriptions:
        codes.append(_subscribe_one(session, live, request, sub_id, retained))
    session.send_packet(mq.Suback(packet.packet_id, codes))
    # Retained messages follow the SUBACK, through the queue like any delivery (flow control, QoS).
    if retained:
        queue = session_queue(session, live)
        for entry in retained:
            queue.enqueue(entry)


def _subscribe_one(
    session: MqttSession, live: Connected, request: mq.SubscriptionRequest, sub_id: int | None, retained: list[Entry],
) -> int:
    client = live.client
    mqtt_filter = request.topic_filter
    level = session.level
    try:
        group, inner = split_shared(mqtt_filter)
        canonical = filter_to_canonical(inner)
        session.broker.check_name(canonical, allow_wildcards=True)
    except (InvalidTopic, InvalidDestination) as exc:
        log.info("[{label}] SUBSCRIBE {f!r} refused: {why}", label=session.label, f=mqtt_filter, why=str(exc))
        return ReasonCode.TOPIC_FILTER_INVALID if level == 5 else SUBACK_FAILURE
    reading = Reading.WHOLE
    if session.checked:
        reading = session.hub.access.reading(session.principal, canonical, client.client_id)
        # A granted subscription hears of a reload through the session's reader, a whole one too.
        if reading is not Reading.REFUSED and reader_of(session, client.client_id) is None and reading is Reading.FILTERED:
            reading = Reading.REFUSED  # nothing to check its deliveries with (an Access without readers)
        if reading is Reading.REFUSED:
            log.info(
                "[{label}] {user} may not subscribe to {f!r}", label=session.label,
                user=session.principal.name or "anonymous", f=mqtt_filter,
            )
            return ReasonCode.NOT_AUTHORIZED if level == 5 else SUBACK_FAILURE
    if group is not None and request.no_local and level == 5:
        raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR, "no local on a shared subscription")
    existed = mqtt_filter in client.filters
    if not existed and len(client.filters) >= session.settings.max_subscriptions:
        return ReasonCode.QUOTA_EXCEEDED if level == 5 else SUBACK_FAILURE
    no_local = bool(request.no_local) or session.bridge
    options = SubscriptionOptions(
        request.qos, no_local, bool(request.retain_as_published) or session.bridge, request.retain_handling, sub_id or None,
    )
    client.filters[mqtt_filter] = options
    checks = reading is Reading.FILTERED or live.filtered is not None
    if checks:
        if reading is Reading.FILTERED:
            log.debug(
                "[{label}] {f!r} granted: a deny rule overlaps it, so each of its messages is checked at delivery",
                label=session.label, f=mqtt_filter,
            )
        _mark(live, mqtt_filter, reading is Reading.FILTERED)
    if group is not None:
        if not existed:
            client.shared[mqtt_filter] = (group, canonical)
            join_shared(session, live, mqtt_filter, group, canonical)
        if checks:
            _apply_checks(session, live)
        return request.qos
    broker = session.broker
    if client.durable:
        queue_key = session.hub.queue_key(client.client_id)
        sub = broker.durable_subscription(
            f"{queue_key}\x1f{mqtt_filter}", canonical, None, None, no_local,
            queue_key=queue_key, options=options, user=client.user,
        )
    else:
        old = client.subs.get(mqtt_filter)
        if old is not None:
            old.options = options
            sub = old
        else:
            sub = broker.add_subscription(session_queue(session, live), canonical, no_local=no_local, options=options)
    sub.owner_id = client.client_id
    client.subs[mqtt_filter] = sub
    if checks:
        _apply_checks(session, live)  # before the retained messages below are queued
    if request.retain_handling == 0 or (request.retain_handling == 1 and not existed):
        for message in broker.retained_for(canonical):
            if no_local and message.origin == client.client_id:
                continue
            retained.append(Entry(message, broker.next_seq(), via=RetainedVia(options)))
    return request.qos


def join_shared(session: MqttSession, live: Connected, mqtt_filter: str, group: str, canonical: str) -> None:
    sub = session.broker.shared_subscription(group, canonical)
    prefetch = min(session.peer_receive_maximum, session.settings.max_inflight)
    live.shared_consumers[mqtt_filter] = live.conn.consume(
        sub.queue, partial(deliver, session, live), ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=prefetch,
        check=_check_for(session, live, mqtt_filter),
    )


def leave_shared(session: MqttSession, live: Connected, mqtt_filter: str, group: str, canonical: str) -> None:
    consumer = live.shared_consumers.pop(mqtt_filter, None)
    if consumer is not None:
        live.conn.unsubscribe(consumer)
        session.broker.leave_shared(group, canonical)


def on_unsubscribe(session: MqttSession, live: Connected, packet: mq.Unsubscribe) -> None:
    client = live.client
    codes: list[int] = []
    for mqtt_filter in packet.topic_filters:
        options = client.filters.pop(mqtt_filter, None)
        if options is None:
            codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
            continue
        shared = client.shared.pop(mqtt_filter, None)
        if shared is not None:
            leave_shared(session, live, mqtt_filter, *shared)
        sub = client.subs.pop(mqtt_filter, None)
        if sub is not None:
            if sub.durable_key is not None:
                session.broker.remove_durable(sub.durable_key)
            else:
                session.broker.remove_subscription(sub)
        if live.filtered is not None:
            _mark(live, mqtt_filter, False)
            _apply_checks(session, live)
        codes.append(0)
    session.send_packet(mq.Unsuback(packet.packet_id, codes))
