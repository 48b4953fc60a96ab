"""MQTT deliveries from the broker to the client, and the acknowledgements that end their flows.

The sink of every consumer a session has is ``deliver`` (bound with the
session and its ``Connected``).  A 3.x PUBLISH depends only on the message,
QoS, retain and DUP, so its bytes are built once per message
(``publish_parts``) and shared by every 3.x subscriber; a 5.0 PUBLISH carries
this subscriber's subscription identifiers and topic alias, so it is encoded
per subscriber (``encode_v5``).  QoS 1/2 deliveries are tracked by packet id
until PUBACK, or PUBREC, PUBREL and PUBCOMP, and the client's receive maximum
(with the socket's back-pressure) decides whether its consumers get more.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from core import destination as dest
from core.consumer import Consumer
from core.duplicates import forwarding_headers
from core.entry import Entry
from core.errors import BrokerError
from core.message import Message
from core.topic import Subscription
from core.trie import filter_matches
from protocols.lifecycle import fail_soon
from protocols.mqtt import codec as mq
from protocols.mqtt.codec import ReasonCode
from protocols.mqtt.connected import Connected
from protocols.mqtt.names import canonical_to_topic
from protocols.mqtt.state import (
    MQTT3_CACHE_KEY,
    NO_OPTIONS,
    RETAIN_HEADER,
    RETAINED_SEND_HEADER,
    Inflight,
    RetainedVia,
    SubscriptionOptions,
    message_qos,
    options_of,
    publish_properties,
)

if TYPE_CHECKING:
    from protocols.mqtt.session import MqttSession

log = Logger(namespace="gateway.mqtt")


def deliver(session: MqttSession, live: Connected, consumer: Consumer, entry: Entry, tag: int) -> bool:
    """Write one delivery; True when it needs no acknowledgement (QoS 0).

    A failure here (a bug, a message this client cannot be sent) costs this
    client its connection on the next turn, never the other subscribers of
    the fan-out: the delivery stays unacknowledged and goes back to the queue.
    """
    try:
        return deliver_one(session, live, consumer, entry, tag)
    except Exception:
        fail_soon(session, session.broker.clock, log, f"delivering {entry.message.id}", "")
        return False


def deliver_one(session: MqttSession, live: Connected, consumer: Consumer, entry: Entry, tag: int) -> bool:
    message = entry.message
    via = entry.via
    options_all: tuple[SubscriptionOptions, ...]
    if type(via) is Subscription:
        options = via.options
        if options.__class__ is not SubscriptionOptions:  # the usual case costs one test, no call
            options = _options(live, consumer, via)
        granted = options.qos
        retain = options.retain_as_published and bool(message.headers.get(RETAIN_HEADER))
        options_all = (options,)
    else:
        if isinstance(via, RetainedVia):
            options_all = (via.options,)
            retain = True
        else:
            if isinstance(via, tuple):
                options_all = tuple(_options(live, consumer, s) for s in via)
            else:  # rebuilt from the store: no record of what matched
                options_all = _recovered_options(live, message)
            # A retained message sent because of a SUBSCRIBE keeps RETAIN 1 when it comes back from the store.
            retain = bool(message.headers.get(RETAINED_SEND_HEADER)) or (
                bool(message.headers.get(RETAIN_HEADER)) and any(o.retain_as_published for o in options_all))
        granted = max((o.qos for o in options_all), default=0)
    qos = min(message_qos(message), granted)
    if session.level == 5:
        encoded = encode_v5(session, live, message, entry, options_all, qos, retain)
        if encoded is None:
            return True
    else:
        # 3.x: the bytes depend only on the message, QoS, retain and DUP, so they are
        # built once per message and shared by every 3.x subscriber.
        cache = message.cache
        if cache is None:
            cache = message.cache = {}
        dup = bool(qos and entry.redeliveries)
        key = (MQTT3_CACHE_KEY, qos, retain, dup)
        parts = cache.get(key)
        if parts is None:
            topic = topic_of(session, message.destination)
            if topic is None:
                parts = cache[key] = ()
            else:
                parts = cache[key] = mq.publish_parts(topic, message.body, qos, retain, None, session.level, dup)
        if not parts:
            return True  # a STOMP topic with a level MQTT reserves for wildcards
        if not qos:
            data = parts[0] + parts[1]
            if len(data) > session.peer_max_packet:
                return True
            # A stored entry's delivery waits for its delivered mark; any waits behind what went before.
            live.outbox.add(data, entry.stored)
            return True
        pid = live.client.flows.packet_id_for(entry.seq)
        data = b"".join((parts[0], pid.to_bytes(2, "big"), parts[1]))
        if len(data) > session.peer_max_packet:
            return True
        live.outbox.add(data, entry.stored)
        _track(session, live, consumer, tag, entry, pid)
        return False
    # After the batch holding its delivered mark (and anything before it) is on disk.
    live.outbox.add(encoded[0], entry.stored)
    if not qos:
        return True
    _track(session, live, consumer, tag, entry, encoded[1])
    return False


def _track(session: MqttSession, live: Connected, consumer: Consumer, tag: int, entry: Entry, pid: int) -> None:
    flows = live.client.flows
    flows.outbound[pid] = Inflight(consumer, tag, entry.seq)
    flows.ids_by_seq[entry.seq] = pid
    session.inflight += 1
    if session.inflight >= session.send_quota:
        update_flow(session, live)


def encode_v5(
    session: MqttSession, live: Connected, message: Message, entry: Entry, options: tuple[SubscriptionOptions, ...],
    qos: int, retain: bool,
) -> tuple[bytes, int] | None:
    """5.0 bytes for one subscriber (its subscription identifiers and topic alias), or None to skip."""
    topic = topic_of(session, message.destination)
    if topic is None:
        return None
    properties = _properties(session, message, options)
    pid = live.client.flows.packet_id_for(entry.seq) if qos else None
    new_alias = None
    if session.peer_alias_max:
        topic, new_alias = _alias(session, live, topic, properties)
    data = mq.encode_publish(topic, message.body, qos, retain, bool(qos and entry.redeliveries), pid, properties, 5)
    if len(data) > session.peer_max_packet:
        # MQTT-3.1.2-25: too large for the client: discard as if delivered,
        # and do not keep an alias the client never learned.
        if new_alias is not None:
            del live.out_aliases[new_alias]
        return None
    return data, pid or 0


def topic_of(session: MqttSession, destination: str) -> str | None:
    """The MQTT topic of a destination, remembered per destination by the hub (bounded)."""
    topics = session.hub.topics
    topic = topics.get(destination)
    if topic is None:
        if len(topics) >= 10_000:
            topics.clear()  # bounded, as the publish side's names
        topic = topics[destination] = canonical_to_topic(destination) or ""
    return topic or None  # "": MQTT cannot name it


def _recovered_options(live: Connected, message: Message) -> tuple[SubscriptionOptions, ...]:
    """The options of this client's filters that match a message whose entry has no ``via``.

    Entries rebuilt from the store after a restart do not say which
    subscription matched them; without this they would go out at QoS 0
    (acknowledged at once, so a crash of the client loses them).
    """
    levels = dest.topic_levels(dest.name_of(message.destination))
    return tuple(options_of(sub) for sub in live.client.subs.values() if filter_matches(sub.levels, levels))


def _options(live: Connected, consumer: Consumer, sub: Subscription) -> SubscriptionOptions:
    if sub.options is not None:
        return options_of(sub)
    # A shared subscription's queue is common; the options are this member's.
    for mqtt_filter, member in live.shared_consumers.items():
        if member is consumer:
            return live.client.filters.get(mqtt_filter, NO_OPTIONS)
    return NO_OPTIONS


def _properties(session: MqttSession, message: Message, options: tuple[SubscriptionOptions, ...]) -> dict[str, Any]:
    broker = session.broker
    props = publish_properties(broker, message)
    if session.bridge:
        # To another gateway's bridge: the id it drops repeats by and the path it stops loops by.
        props["user_properties"] = [*props.get("user_properties", ()), *forwarding_headers(message, broker.node_name)]
    ids = [o.identifier for o in options if o.identifier]
    if ids:
        props["subscription_identifier"] = ids
    return props


def _alias(session: MqttSession, live: Connected, topic: str, properties: dict[str, Any]) -> tuple[str, str | None]:
    """The topic to send (empty once aliased) and the topic newly given an alias, if any."""
    aliases = live.out_aliases
    alias = aliases.get(topic)
    if alias is not None:
        properties["topic_alias"] = alias
        return "", None
    if len(aliases) < session.peer_alias_max:
        alias = aliases[topic] = len(aliases) + 1
        properties["topic_alias"] = alias
        return topic, topic
    return topic, None


# -- the acknowledgements of QoS 1/2 deliveries ---------------------------------------


def on_puback(session: MqttSession, live: Connected, packet: mq.Puback) -> None:
    flows = live.client.flows
    inflight = flows.outbound.pop(packet.packet_id, None)
    if inflight is not None:
        flows.ids_by_seq.pop(inflight.seq, None)
        _finish(session, live, inflight)


def on_pubrec(session: MqttSession, live: Connected, packet: mq.Pubrec) -> None:
    client = live.client
    flows = client.flows
    inflight = flows.outbound.pop(packet.packet_id, None)
    if inflight is not None:
        flows.ids_by_seq.pop(inflight.seq, None)
    if packet.reason_code >= ReasonCode.UNSPECIFIED_ERROR:  # 0x80 and up: the client refused it
        if inflight is not None:
            _finish(session, live, inflight)  # the client refused it: the flow ends here
        return
    # The client has it; only PUBREL/PUBCOMP remain, and the slot stays taken until PUBCOMP.
    if inflight is not None:
        flows.released[packet.packet_id] = inflight.seq
        flows.released_inflight[packet.packet_id] = inflight
        session.hub.save(client)
    session.send_packet(mq.Pubrel(
        packet.packet_id, 0 if inflight is not None or session.level < 5 else ReasonCode.PACKET_IDENTIFIER_NOT_FOUND,
    ))


def on_pubcomp(session: MqttSession, live: Connected, packet: mq.Pubcomp) -> None:
    client = live.client
    flows = client.flows
    if flows.released.pop(packet.packet_id, None) is not None:
        session.hub.save(client)
    inflight = flows.released_inflight.pop(packet.packet_id, None)
    if inflight is not None:
        _finish(session, live, inflight)


def _finish(session: MqttSession, live: Connected, inflight: Inflight) -> None:
    """A QoS 1/2 flow completed: settle it in the core and give its slot back."""
    session.inflight -= 1
    settle(live, inflight)
    if session.inflight < session.send_quota:
        update_flow(session, live)


def settle(live: Connected, inflight: Inflight) -> None:
    if inflight.consumer.closed:
        return
    try:
        live.conn.ack(inflight.consumer, inflight.tag)
    except BrokerError:
        pass  # already settled (e.g. redelivered after a takeover)


def update_flow(session: MqttSession, live: Connected) -> None:
    """Deliveries stop while the socket is full or the client's receive maximum is reached."""
    conn = live.conn
    if conn is None or session.closed:
        return
    stop = session.transport_paused or session.inflight >= session.send_quota
    if stop and conn.writable:
        conn.pause()
    elif not stop and not conn.writable:
        conn.resume()
