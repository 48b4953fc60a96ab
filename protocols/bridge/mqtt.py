"""A bridge's link to a remote MQTT broker (3.1.1 or 5), one TCP or TLS connection.

The packets are the listeners' codec's (``MqttDecoder(server=False)``, the same
encoder); what this adds is the client's half of the protocol and the two
rules of a store-and-forward bridge: a local message leaves the outbound queue
only when the remote confirmed it (PUBACK, or PUBREC at QoS 2), and a remote
message is acknowledged only once it is stored here.  A new link is made for
each connection; the ``Bridge`` it serves outlives it.
"""
from __future__ import annotations

from typing import Any

from twisted.logger import Logger

from core.consumer import Consumer
from core.duplicates import forwarding_headers
from core.entry import Entry
from core.errors import BrokerError
from protocols.bridge.bridge import Bridge
from protocols.bridge.link import Link
from protocols.mqtt import codec as mq
from protocols.mqtt.state import BROKER_PROPERTY, RETAIN_HEADER, build_message, message_qos, publish_properties

log = Logger(namespace="gateway.bridge")

MAX_PACKET = 16 * 1024 * 1024
NEVER_EXPIRES = 0xFFFFFFFF


class MqttLink(Link):
    """One connection of a bridge to an MQTT broker.

    Compiled with the hot path (setup.cfg): every message a bridge forwards
    passes through ``_deliver``.  mypyc keeps it a non-native class because its
    base is Twisted's, and interpreted code cannot subclass it (a TypeError at
    import); ``StompLink`` stays interpreted because ``NetworkLink`` extends it.
    """

    answer = "CONNACK"

    def __init__(self, bridge: Bridge, clock: Any, password: bytes | None) -> None:
        super().__init__(bridge, clock, password)
        settings = bridge.settings
        self.level = 5 if settings.version == 5 else 4
        self.decoder = mq.MqttDecoder(MAX_PACKET, level=self.level, server=False)
        self.remote_window = settings.max_inflight
        self.remote_max_packet = 0  # 0: the remote named no limit
        # Out: packet id -> (consumer, the local delivery's tag), awaiting PUBACK (QoS 1) or PUBREC
        # (QoS 2); then PUBREL sent, awaiting PUBCOMP (ids the remote still holds).
        self.outbound: dict[int, tuple[Consumer, int]] = {}
        self.released: dict[int, None] = {}
        self._next_id = 1
        # In: QoS 2 packet ids stored here and PUBREC sent, awaiting PUBREL.
        self.inbound_qos2: dict[int, None] = {}

    def connectionMade(self) -> None:
        bridge = self.bridge
        settings = bridge.settings
        properties: dict[str, Any] = {}
        level = self.level
        if level == 5:
            properties["user_properties"] = [(BROKER_PROPERTY, bridge.broker_name)]
            if not settings.clean_session:
                properties["session_expiry_interval"] = NEVER_EXPIRES
            properties["receive_maximum"] = min(65535, max(1, settings.max_inflight))
            wire_level = 5
        else:
            # Mosquitto's try_private: the bridge bit on the protocol level, unless this remote refused it.
            wire_level = 0x84 if settings.try_private and not bridge.plain_mqtt else 4
        connect = mq.Connect(
            "MQTT", wire_level, settings.clean_session, settings.keepalive, bridge.client_id,
            settings.user, self.password, None, properties,
        )
        self.opened(mq.encode(connect, level))

    def forget(self) -> None:
        self.outbound.clear()
        bridge = self.bridge
        if not self.accepted and self.level == 4 and bridge.settings.try_private and not bridge.plain_mqtt:
            # Closed before a CONNACK (RabbitMQ: "protocol_header_corrupt"): the bit, not the bridge, was
            # refused.  Mosquitto leaves that to the operator; a bridge that never connects helps nobody.
            bridge.plain_mqtt = True
            log.warn("bridge {bridge}: the remote closed the connection to a CONNECT with the bridge bit "
                     "(try_private); connecting as a plain MQTT 3.1.1 client from now on.  Such a remote may "
                     "send back what the bridge publishes to a topic it also subscribes to", bridge=bridge.name)

    def window(self) -> int:
        return self.remote_window

    # -- from the remote --------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        self.last_in = self.clock.seconds()
        try:
            packets = self.decoder.feed(data)
        except mq.MqttProtocolError as exc:
            for packet in exc.packets or ():
                self._handle(packet)
            self.fail(f"the remote sent a malformed packet: {exc}")
            return
        for packet in packets:
            if self.lost:
                return
            self._handle(packet)

    def _handle(self, packet: mq.Packet) -> None:
        if isinstance(packet, mq.Publish):
            self._inbound(packet)
        elif isinstance(packet, mq.Puback):
            self._confirmed(packet.packet_id, packet.reason_code, release=False)
        elif isinstance(packet, mq.Pubrec):
            self._confirmed(packet.packet_id, packet.reason_code, release=True)
        elif isinstance(packet, mq.Pubcomp):
            self.released.pop(packet.packet_id, None)
        elif isinstance(packet, mq.Pubrel):
            self.inbound_qos2.pop(packet.packet_id, None)
            self.write(mq.encode(mq.Pubcomp(packet.packet_id), self.level))
        elif isinstance(packet, mq.Connack):
            self._connack(packet)
        elif isinstance(packet, mq.Suback):
            self._suback(packet)
        elif isinstance(packet, mq.Disconnect):
            self.fail(f"the remote disconnected the bridge: reason 0x{packet.reason_code:02x}"
                       + _reason_string(packet.properties))
        elif isinstance(packet, mq.Pingresp):
            pass
        else:
            self.fail(f"the remote sent an unexpected {type(packet).__name__}")

    def _connack(self, packet: mq.Connack) -> None:
        bridge = self.bridge
        if self.accepted:
            self.fail("the remote sent a second CONNACK")
            return
        if packet.reason_code == 1 and self.level == 4 and not bridge.plain_mqtt and bridge.settings.try_private:
            self.fail("the remote refused the bridge bit (try_private): unacceptable protocol version")
            return  # forget() connects without it next time
        if packet.reason_code:
            self.fail(f"the remote refused the connection: {_connack_reason(packet.reason_code, self.level)}"
                      + _reason_string(packet.properties))
            return
        props = packet.properties
        for key, value in props.get("user_properties", ()):
            if key == BROKER_PROPERTY:
                bridge.remote_name = value
        self.remote_window = min(self.remote_window, props.get("receive_maximum", 65535))
        self.remote_max_packet = props.get("maximum_packet_size", 0)
        self.accept()
        log.info("bridge {bridge}: connected to {url} as {client} (MQTT {version}{present})", bridge=bridge.name,
                 url=bridge.settings.url, client=bridge.client_id, version="5" if self.level == 5 else "3.1.1",
                 present=", session present" if packet.session_present else "")
        # PUBRELs the remote still waits for (from a link that dropped), before anything new.
        for pid in self.released:
            self.write(mq.encode(mq.Pubrel(pid), self.level))
        self._subscribe()
        keepalive = bridge.settings.keepalive
        if keepalive:
            self._timer = self.clock.callLater(keepalive, self._keepalive)
        self.start_consuming(self._deliver)

    def _subscribe(self) -> None:
        rules = self.bridge.in_rules
        if not rules:
            return
        v5 = self.level == 5
        requests = [
            mq.SubscriptionRequest(t.remote_prefix + t.pattern, t.qos, no_local=v5, retain_as_published=v5)
            for t in rules
        ]
        self.write(mq.encode(mq.Subscribe(1, requests), self.level))

    def _suback(self, packet: mq.Suback) -> None:
        for topic, code in zip(self.bridge.in_rules, packet.reason_codes):
            if code >= 0x80:
                self.bridge.set_state(self.bridge.state, f"the remote refused the subscription to "
                                      f"{topic.remote_prefix + topic.pattern!r} (0x{code:02x})")
                log.warn("bridge {bridge}: {why}", bridge=self.bridge.name, why=self.bridge.last_error)

    def _keepalive(self) -> None:
        self._timer = None
        if self.lost:
            return
        keepalive = self.bridge.settings.keepalive
        if self.clock.seconds() - self.last_in > 1.5 * keepalive:
            self.fail(f"the remote sent nothing for {1.5 * keepalive:g} s (keepalive {keepalive} s)")
            return
        self.write(mq.encode(mq.Pingreq(), self.level))
        self._timer = self.clock.callLater(keepalive, self._keepalive)

    # -- out: local messages to the remote --------------------------------------

    def _deliver(self, consumer: Consumer, entry: Entry, tag: int) -> bool | None:
        bridge = self.bridge
        message = entry.message
        route = bridge.route_for(message.destination)
        if route is None:
            return True  # no MQTT name for it (a STOMP topic with a '+' level): not forwardable
        if bridge.goes_back(message):
            bridge.loops_dropped += 1
            return True
        topic, remote_topic = route
        qos = min(message_qos(message), topic.qos)
        retain = message.headers.get(RETAIN_HEADER) == "1"
        properties = None
        if self.level == 5:
            properties = publish_properties(bridge.broker, message)
            users = properties.get("user_properties") or []
            properties["user_properties"] = [*users, *forwarding_headers(message, bridge.broker_name)]
        pid = self._allocate() if qos else None
        try:
            data = mq.encode_publish(remote_topic, message.body, qos, retain, bool(qos and entry.redeliveries),
                                     pid, properties, self.level)
        except ValueError as exc:
            bridge.refused += 1
            log.warn("bridge {bridge}: {dest} cannot be forwarded: {error}", bridge=bridge.name,
                     dest=message.destination, error=str(exc))
            return True
        if self.remote_max_packet and len(data) > self.remote_max_packet:
            bridge.refused += 1
            log.warn("bridge {bridge}: a message on {dest} of {n} bytes is over the remote's maximum packet "
                     "size ({max}); not forwarded", bridge=bridge.name, dest=message.destination, n=len(data),
                     max=self.remote_max_packet)
            return True
        self.write(data)
        if not qos:
            bridge.forwarded += 1
            return True
        assert pid is not None
        self.outbound[pid] = (consumer, tag)
        return None

    def _allocate(self) -> int:
        busy, released = self.outbound, self.released
        for _ in range(65535):
            pid = self._next_id
            self._next_id = pid % 65535 + 1
            if pid not in busy and pid not in released:
                return pid
        raise BrokerError("no free packet identifier")

    def _confirmed(self, pid: int, reason: int, release: bool) -> None:
        held = self.outbound.pop(pid, None)
        if release and reason < 0x80:
            self.released[pid] = None
            self.write(mq.encode(mq.Pubrel(pid), self.level))
        if held is None:
            return
        consumer, tag = held
        bridge = self.bridge
        connection = bridge.connection
        try:
            if reason >= 0x80:
                # Refused by the remote (not authorized, quota, ...): retried as any nacked delivery,
                # until max_redeliveries sends it to the dead-letter queue with the reason.
                bridge.refused += 1
                bridge.set_state(bridge.state, f"the remote refused a message (0x{reason:02x})")
                connection.nack(consumer, tag)
            else:
                bridge.forwarded += 1
                connection.ack(consumer, tag)
        except BrokerError:
            pass  # no longer held (the consumer was replaced): the queue has it back

    # -- in: remote messages to local subscribers -------------------------------

    def _inbound(self, packet: mq.Publish) -> None:
        bridge = self.bridge
        qos, pid = packet.qos, packet.packet_id or 0
        if qos == 2 and pid in self.inbound_qos2:
            self.write(mq.encode(mq.Pubrec(pid), self.level))  # stored already: only the answer was lost
            return
        destination = bridge.local_destination(packet.topic)
        stored = True
        if destination is not None:
            message = build_message(bridge.broker, destination, packet.payload, qos, packet.retain, packet.properties)
            if bridge.arrived(message):
                try:
                    bridge.connection.send(message, retain=packet.retain)
                    bridge.received += 1
                except BrokerError as exc:
                    stored = False
                    self.fail(f"a message from the remote on {packet.topic!r} could not be published here: {exc}")
        if not qos or not stored:
            return
        self.hold_if_full()

        def answer() -> None:
            if self.lost:
                return  # the remote sends it again on the next link (clean_session false)
            if qos == 1:
                self.write(mq.encode(mq.Puback(pid), self.level))
            else:
                self.inbound_qos2[pid] = None
                self.write(mq.encode(mq.Pubrec(pid), self.level))

        bridge.connection.when_durable(answer)


def _reason_string(properties: dict[str, Any]) -> str:
    text = properties.get("reason_string")
    return f": {text}" if text else ""


def _connack_reason(code: int, level: int) -> str:
    if level == 5:
        try:
            return f"{mq.ReasonCode(code).name.lower().replace('_', ' ')} (0x{code:02x})"
        except ValueError:
            return f"reason 0x{code:02x}"
    names = {1: "unacceptable protocol version", 2: "identifier rejected", 3: "server unavailable",
             4: "bad user name or password", 5: "not authorized"}
    return f"{names.get(code, 'refused')} ({code})"
