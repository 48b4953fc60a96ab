"""MQTT PUBLISH from the client to the broker, and the inbound half of QoS 2 (PUBREL).

A PUBLISH is resolved to its destination (a dict lookup for a topic seen
before), checked against the rules (remembered for the last topic allowed),
built into a ``core.message.Message`` and sent through the core connection;
its PUBACK or PUBREC goes to the outbox, so it leaves only once what the
publish stored is on disk.  Producer flow control is the shared
``ProducerHold`` (protocols/lifecycle.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from twisted.logger import Logger

from core.access import Permission
from core.errors import BrokerError
from core.retained import RetainedLimit
from core.trie import filter_matches
from protocols.lifecycle import hold_if_stored, store_refusal
from protocols.mqtt import codec as mq
from protocols.mqtt.codec import MqttProtocolError, ReasonCode
from protocols.mqtt.connected import Connected
from protocols.mqtt.names import InvalidTopic, topic_to_canonical
from protocols.mqtt.state import PUBACK_HEAD, build_message

if TYPE_CHECKING:
    from protocols.mqtt.session import MqttSession

log = Logger(namespace="gateway.mqtt")


def may_publish(session: MqttSession, destination: str, client_id: str) -> bool:
    """The rules' WRITE check, remembered for the last topic allowed.

    A device publishes to one topic over and over, and for a topic the
    decision depends on nothing but the rules (queues also on whether
    they exist, and DLQs on admin), so it stands until they are reloaded.
    """
    access = session.hub.access
    version = access.version
    if destination == session.published_to and version == session.published_version:
        return True
    if not access.allowed(session.principal, Permission.WRITE, destination, client_id):
        return False
    if destination.startswith("topic://"):
        session.published_to = destination
        session.published_version = version
    return True


def on_publish(session: MqttSession, live: Connected, packet: mq.Publish) -> None:
    props = packet.properties
    topic = packet.topic
    level = session.level
    if level == 5:
        alias = props.get("topic_alias")
        if alias is not None:
            if alias > session.settings.topic_alias_maximum:
                raise MqttProtocolError(ReasonCode.TOPIC_ALIAS_INVALID, f"topic alias {alias} is above the maximum")
            if topic:
                live.in_aliases[alias] = topic
            else:
                topic = live.in_aliases.get(alias, "")
                if not topic:
                    raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR, f"topic alias {alias} is not set")
    qos = packet.qos
    pid = packet.packet_id or 0  # set whenever qos > 0 (the decoder checks)
    if qos == 2 and pid in live.client.flows.inbound_qos2:
        # A retransmission of something already routed: acknowledge, do not route twice.
        session.send_packet(mq.Pubrec(pid))
        return
    if qos and len(live.client.flows.inbound_qos2) >= session.settings.receive_maximum:
        raise MqttProtocolError(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED, "too many QoS 2 messages awaiting PUBREL")
    if props.get("payload_format_indicator") == 1:
        try:
            packet.payload.decode("utf-8")
        except UnicodeDecodeError:
            reject_publish(session, packet, ReasonCode.PAYLOAD_FORMAT_INVALID, "payload is not UTF-8 as its format indicator says")
            return
    broker = session.broker
    usage = broker.store_usage
    if qos and usage.full:
        refused = store_refusal(broker, True)
        if refused is not None:
            reject_publish(session, packet, ReasonCode.QUOTA_EXCEEDED, refused[1])
            return
    stored_before = usage.bytes
    appended_before = broker.streams.appended
    try:
        destination = publish_destination(session, topic)
        if session.checked and not may_publish(session, destination, live.client.client_id):
            log.info(
                "[{label}] {user} may not publish to {topic!r}: dropped", label=session.label,
                user=session.principal.name or "anonymous", topic=topic,
            )
            if level == 5 and qos:
                reject_publish(session, packet, ReasonCode.NOT_AUTHORIZED, f"publishing to {topic} is not allowed for this user")
                return
            # 3.x has no way to say so (and 5.0 QoS 0 no answer): acknowledged, not routed,
            # so the client does not resend it forever (as Mosquitto).
        else:
            message = build_message(broker, destination, packet.payload, qos, packet.retain, props)
            try:
                live.conn.send(message, retain=packet.retain and destination.startswith("topic://"))
            except RetainedLimit as limit:  # not `exc`: compiled (mypyc), one name has one type per function
                if level == 5 and qos:
                    reject_publish(session, packet, ReasonCode.QUOTA_EXCEEDED, str(limit))  # PUBACK/PUBREC 0x97: not published
                    return
                # 3.x (and a 5.0 QoS 0 publish, which has no answer): published, not retained.
                log.info("[{label}] retained flag dropped on {topic!r}: {why}", label=session.label, topic=topic, why=str(limit))
                message = build_message(broker, destination, packet.payload, qos, False, props)
                live.conn.send(message)
    except (InvalidTopic, BrokerError) as exc:
        reject_publish(session, packet, ReasonCode.TOPIC_NAME_INVALID, str(exc))
        return
    if usage.full and session.hold is None:
        # Producer flow control: read nothing more from this client until there is room.
        hold_if_stored(session, session.transport, broker, qos > 0, stored_before, appended_before, log, "publisher")
    if qos == 1:
        live.outbox.add(PUBACK_HEAD + pid.to_bytes(2, "big") if level < 5 else mq.encode(mq.Puback(pid), 5))
    elif qos == 2:
        live.client.flows.inbound_qos2[pid] = None
        session.hub.save(live.client)  # in the message's batch, before PUBREC
        live.outbox.add(mq.encode(mq.Pubrec(pid), level))


def reject_publish(session: MqttSession, packet: mq.Publish, reason: ReasonCode, why: str) -> None:
    if packet.qos and session.level == 5:
        props = {"reason_string": why} if session.problem_information else {}
        ack = mq.Puback if packet.qos == 1 else mq.Pubrec
        session.send_packet(ack(packet.packet_id or 0, reason, props))
        return
    raise MqttProtocolError(reason, why)


def publish_destination(session: MqttSession, topic: str) -> str:
    hub = session.hub
    names = hub.destinations
    destination = names.get(topic)
    if destination is None:
        canonical = topic_to_canonical(topic)
        destination = canonical
        for levels in hub.queue_filters:
            if filter_matches(levels, tuple(canonical[8:].split("."))):
                destination = "queue://" + canonical[8:]
                break
        if len(names) >= 10_000:
            names.clear()  # bounded: a device fleet publishing to a million topics
        names[topic] = destination
    return destination


def on_pubrel(session: MqttSession, live: Connected, packet: mq.Pubrel) -> None:
    inbound = live.client.flows.inbound_qos2
    known = packet.packet_id in inbound
    if known:
        del inbound[packet.packet_id]
        session.hub.save(live.client)
    reason = 0 if known or session.level < 5 else ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
    session.send_packet(mq.Pubcomp(packet.packet_id, reason))
