"""The MQTT state machine: packets in, calls on the core; deliveries out, PUBLISHes.

Two objects, because an MQTT session outlives its network connection:

- ``ClientSession`` is the session of one client id: its queue in the core
  (durable when the session outlives the connection), its subscriptions and
  options, the packet ids of QoS 1/2 flows in progress.  The ``MqttHub``
  keeps them by client id, shared by the TCP and WebSocket listeners.
- ``MqttSession`` is one network connection's protocol state: the decoder,
  keep-alive, topic aliases, the negotiated limits, and the core connection.

Every subscription of a client feeds the client's one queue, so a message
matching several of its filters is delivered once, at the highest granted
QoS (MQTT 3.1.1 3.3.5), carrying every matching subscription identifier (5.0).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from core import destination as dest
from core.consumer import AckMode, Consumer
from core.destination import InvalidDestination
from core.entry import Entry
from core.errors import BrokerError
from core.message import Message
from core.queue import MessageQueue
from core.retained import RetainedLimit
from core.topic import Subscription
from core.trie import filter_matches
from protocols.mqtt import codec as mq
from protocols.mqtt.codec import MqttDecoder, MqttProtocolError, ReasonCode
from protocols.mqtt.names import (
    InvalidTopic,
    canonical_to_topic,
    filter_to_canonical,
    split_shared,
    topic_to_canonical,
)
from protocols.outbox import Outbox
from protocols.transport import Transport

if TYPE_CHECKING:
    from protocols.mqtt.hub import MqttHub

log = Logger(namespace="gateway.mqtt")

# Core message headers that carry MQTT facts; never passed on as user properties.
QOS_HEADER = "mqtt-qos"
RETAIN_HEADER = "mqtt-retain"
FORMAT_HEADER = "mqtt-payload-format"
# Only when a name repeats: the full list in order, since headers hold one value per name.
USER_PROPERTIES_HEADER = "mqtt-user-properties"
_INTERNAL_PREFIX = "mqtt-"
_PUBACK = b"\x40\x02"  # a 3.x PUBACK before its packet id
_MQTT3 = "mqtt3"  # Message.cache key of 3.x PUBLISH bytes

NEVER_EXPIRES = 0xFFFFFFFF


@dataclass
class MqttSettings:
    # Largest packet accepted (and announced to 5.0 clients); checked before it is buffered.
    max_packet_size: int = 4 * 1024 * 1024
    # QoS 1/2 PUBLISHes a client may have unacknowledged towards us (5.0 receive maximum).
    receive_maximum: int = 1000
    # QoS 1/2 deliveries in flight to a client that sets no receive maximum of its own.
    max_inflight: int = 1000
    topic_alias_maximum: int = 100
    # 0 accepts the client's keep-alive; otherwise an upper bound told to 5.0 clients.
    server_keep_alive: int = 0
    keep_alive_grace: float = 1.5
    max_subscriptions: int = 1000
    connect_timeout: float = 10.0
    # MQTT filters whose publishes go to a queue of the same name instead of the topic.
    queue_topics: list[str] = field(default_factory=list)



class RetainedVia:
    """Entry.via marker for a retained message sent because of a SUBSCRIBE (retain flag 1)."""

    __slots__ = ("options",)

    def __init__(self, options: dict) -> None:
        self.options = options


@dataclass
class Inflight:
    consumer: Consumer
    tag: int
    seq: int


class ClientSession:
    """What survives between connections of one client id (MQTT 4.1)."""

    def __init__(self, client_id: str, queue: MessageQueue, durable: bool) -> None:
        self.client_id = client_id
        self.queue = queue
        self.durable = durable
        self.expiry = 0                     # seconds after disconnect; NEVER_EXPIRES
        self.filters: dict[str, dict] = {}  # MQTT filter -> options (qos, nl, rap, rh, id)
        self.subs: dict[str, Subscription] = {}
        self.shared: dict[str, tuple[str, str]] = {}  # filter -> (group, canonical filter)
        self.outbound: dict[int, Inflight] = {}       # packet id -> PUBLISH awaiting PUBACK/PUBREC
        # PUBREL sent, awaiting PUBCOMP: packet id -> message seq (stored, so a
        # restart still resends PUBREL) ...
        self.released: dict[int, int] = {}
        # ... and, while its connection lives, the delivery itself, held until
        # PUBCOMP so it keeps its receive-maximum slot (MQTT 5 4.9).
        self.released_inflight: dict[int, Inflight] = {}
        self.inbound_qos2: set[int] = set()           # PUBREC sent, awaiting PUBREL
        self.ids_by_seq: dict[int, int] = {}          # message -> packet id it was first sent with
        self.next_id = 1
        self.live: MqttSession | None = None
        self.expiry_timer: Any = None
        self.will_timer: Any = None
        self.pending_will: mq.Will | None = None      # a will waiting out its delay
        self.left_at = 0                               # epoch ms of the last disconnect (0: connected)

    def packet_id_for(self, seq: int) -> int:
        """The packet id for a message: first choice derived from its sequence, so a
        retransmission after a restart carries the same id with nothing stored."""
        pid = self.ids_by_seq.get(seq) or seq % 65535 + 1
        if pid in self.outbound or pid in self.released:
            pid = self.allocate_id()
        return pid

    def state(self) -> bytes:
        """What must outlive the process: expiry and the QoS 2 flows in progress."""
        return json.dumps({
            "expiry": self.expiry, "left_at": self.left_at,
            "released": self.released, "inbound": sorted(self.inbound_qos2),
        }).encode()

    def allocate_id(self) -> int:
        busy = self.outbound
        for _ in range(65535):
            pid = self.next_id
            self.next_id = pid % 65535 + 1
            if pid not in busy and pid not in self.released:
                return pid
        raise BrokerError("no free packet identifier")


def build_message(broker: Any, destination: str, payload: bytes, qos: int, retain: bool, props: dict) -> Message:
    """A core message from a PUBLISH or a will: MQTT 5 properties become the common fields and headers."""
    headers: dict[str, str] = {}
    users = props.get("user_properties", ())
    for key, value in users:
        headers.setdefault(key, value)
    if len(headers) < len(users):
        headers[USER_PROPERTIES_HEADER] = json.dumps(users)
    headers[QOS_HEADER] = str(qos)
    if retain:
        headers[RETAIN_HEADER] = "1"
    if props.get("payload_format_indicator") == 1:
        headers[FORMAT_HEADER] = "1"
    now = broker.now_ms()
    expiry = props.get("message_expiry_interval")
    reply_to = props.get("response_topic")
    correlation = props.get("correlation_data")
    return Message(
        broker.new_message_id(), destination, payload, headers,
        persistent=qos > 0, timestamp=now,
        expiration=now + expiry * 1000 if expiry else 0,
        content_type=props.get("content_type"),
        reply_to=topic_to_canonical(reply_to) if reply_to else None,
        # Correlation data is bytes; surrogateescape keeps any bytes exact for MQTT peers.
        correlation_id=correlation.decode("utf-8", "surrogateescape") if correlation is not None else None,
    )


def _user_property_list(text: str) -> list[tuple[str, str]] | None:
    """The exact user properties an MQTT 5 publisher sent (repeated names included), or None.

    Any client can set this header (a STOMP SEND can): what is not a JSON
    list of string pairs, or is nested deep enough to exhaust the parser, is
    ignored rather than failing every MQTT 5 delivery of the message.
    """
    if len(text) > 1_000_000:
        return None
    try:
        pairs = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(pairs, list):
        return None
    out = []
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str) and isinstance(pair[1], str)):
            return None
        out.append((pair[0], pair[1]))
    return out


def message_qos(message: Message) -> int:
    """The QoS a message was published with; STOMP's persistent messages count as QoS 1."""
    text = message.headers.get(QOS_HEADER)
    if text is not None:
        return 2 if text == "2" else 1 if text == "1" else 0
    return 1 if message.persistent else 0


class AwayFilter:
    """Stands in as the selector of a persistent session's subscription while its client is away.

    It lets through only what would be delivered at QoS 1 or 2 (the lower of the
    published and the granted QoS), so QoS 0 messages are not queued for an absent
    client (Mosquitto's default, ``queue_qos0_messages false``) and cannot pile up
    in memory while it is gone.  Being a selector, it drops them before they reach
    the session queue; the hub puts it in place on detach and removes it on attach.
    """

    __slots__ = ("granted",)

    def __init__(self, granted: int) -> None:
        self.granted = granted

    def matches(self, lookup: Any) -> bool:
        if not self.granted:
            return False
        qos = lookup(QOS_HEADER)
        if qos is None:
            return lookup("JMSDeliveryMode") == "PERSISTENT"  # STOMP: persistent counts as QoS 1
        return qos in ("1", "2")


class MqttSession:
    def __init__(self, hub: "MqttHub", transport: Transport, remote: str = "") -> None:
        self.hub = hub
        self.broker = hub.broker
        self.settings = hub.settings
        self.transport = transport
        self.remote = remote
        self.decoder = MqttDecoder(max_packet_size=self.settings.max_packet_size, server=True)
        self.level = 4
        self.client: ClientSession | None = None
        self.conn: Any = None
        self._outbox: Outbox | None = None
        self.consumer: Consumer | None = None
        self.shared_consumers: dict[str, Consumer] = {}
        self.closed = False
        self.label = remote
        self.will: mq.Will | None = None
        self.keep_alive = 0
        self._last_read = self.broker.clock.seconds()
        self._timer: Any = self.broker.clock.callLater(self.settings.connect_timeout, self._connect_timed_out)
        # What the client told us it accepts (5.0).
        self.peer_receive_maximum = 65535
        self.peer_max_packet = mq.MAX_PACKET_SIZE
        self.peer_alias_max = 0
        self.in_aliases: dict[int, str] = {}
        self.out_aliases: dict[str, int] = {}
        self.problem_information = True
        self.normal_disconnect = False
        # QoS 1/2 deliveries unfinished on this connection, across all its consumers:
        # the client's receive maximum bounds them all together.
        self._inflight = 0
        self._send_quota = self.settings.max_inflight
        self._transport_paused = False
        self._held = False  # reading paused by producer flow control
        self._refusal: Any = None  # why this connection may not CONNECT (connection limits)
        # Why the session ended, for transports that can say (WebSocket close codes).
        self.close_reason = "normal"

    # -- input ------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self._last_read = self.broker.clock.seconds()
        try:
            packets = self.decoder.feed(data)
        except MqttProtocolError as exc:
            for packet in exc.packets:
                if self.closed:
                    return
                self._dispatch(packet)
            if not self.closed:
                self._protocol_error(exc.reason_code, exc.message, exc)
            return
        for packet in packets:
            if self.closed:
                return
            self._dispatch(packet)

    def _dispatch(self, packet: Any) -> None:
        try:
            if self.client is None:
                if not isinstance(packet, mq.Connect):
                    raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR, "the first packet must be CONNECT")
                self._on_connect(packet)
                return
            handler = self._handlers.get(type(packet))
            if handler is None:
                raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR, f"unexpected {type(packet).__name__}")
            handler(self, packet)
        except MqttProtocolError as exc:
            self._protocol_error(exc.reason_code, exc.message)
        except Exception:
            # A bug must cost one client its connection, never the reactor its loop.
            log.failure("[{label}] internal error handling {p}", label=self.label, p=type(packet).__name__)
            self._protocol_error(ReasonCode.UNSPECIFIED_ERROR, "internal error")

    # -- connecting -------------------------------------------------------

    def _connect_timed_out(self) -> None:
        self._timer = None
        if self.client is None and not self.closed:
            log.info("[{label}] no CONNECT in time: closing", label=self.label)
            self._close()

    def refuse_connect(self, refusal: Any) -> None:
        """The connection limits refuse this client: its CONNECT gets a CONNACK saying so."""
        self._refusal = refusal

    def fail_unfinished(self, seconds: float) -> None:
        """Held an unfinished packet too long (the broker-wide budget for them): closed, 5.0 told why."""
        if not self.closed:
            self._server_disconnect(
                ReasonCode.QUOTA_EXCEEDED, f"no packet completed in {seconds:.0f} s while one was unfinished (partial_frame_timeout)",
            )

    def _on_connect(self, packet: mq.Connect) -> None:
        self.level = packet.level
        props = packet.properties
        if self._refusal is not None:
            # 3.x: server unavailable; 5.0: quota exceeded, or connection rate exceeded.
            reason = ReasonCode.CONNECTION_RATE_EXCEEDED if self._refusal.rate else ReasonCode.QUOTA_EXCEEDED
            self._refuse(0x03, reason, self._refusal.why)
            return
        client_id = packet.client_id
        assigned = None
        if not client_id:
            if self.level == 3:
                # MQTT 3.1 (3.1 spec, CONNECT payload) has no assigned ids: 1-23 characters, or return code 2.
                self._refuse(0x02, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "MQTT 3.1 client ids are 1-23 characters")
                return
            if self.level < 5 and not packet.clean_start:
                self._refuse(0x02, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "an empty client id needs a clean session")
                return
            client_id = assigned = self.hub.assign_client_id()
        if self.level == 3 and len(client_id) > 23:
            self._refuse(0x02, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "MQTT 3.1 client ids are 1-23 characters")
            return
        if self.level == 5 and props.get("authentication_method"):
            self._refuse(0x05, ReasonCode.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not configured")
            return
        if self.level == 5:
            self.peer_receive_maximum = props.get("receive_maximum", 65535)
            self.peer_max_packet = props.get("maximum_packet_size", mq.MAX_PACKET_SIZE)
            self.peer_alias_max = props.get("topic_alias_maximum", 0)
            self.problem_information = props.get("request_problem_information", 1) == 1
            expiry = props.get("session_expiry_interval", 0)
        else:
            expiry = 0 if packet.clean_start else NEVER_EXPIRES
        if packet.will is not None:
            try:
                self.broker.check_name(topic_to_canonical(packet.will.topic), allow_wildcards=False)
            except (InvalidTopic, InvalidDestination) as exc:
                # Refused now, not silently dropped when the will is due: 5.0 says why in
                # the CONNACK (0x90); 3.x has no return code for it and gets a close.
                if self.level == 5:
                    self._refuse(0, ReasonCode.TOPIC_NAME_INVALID, f"will topic: {exc}")
                else:
                    log.info("[{label}] CONNECT refused: will topic: {why}", label=self.label, why=str(exc))
                    self._close()
                return
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

        client, present = self.hub.attach(self, client_id, packet.clean_start, expiry)
        self.client = client
        self.label = f"{self.remote} {client_id}"
        self.will = packet.will
        self.conn = self.broker.connect(client_id, protocol=f"mqtt/{self.level}", remote=self.remote)
        self._outbox = Outbox(self.broker.turn_end, self.conn.when_durable, self._write)
        keep_alive = packet.keep_alive
        server_keep_alive = None
        limit = self.settings.server_keep_alive
        if limit and (keep_alive == 0 or keep_alive > limit):
            keep_alive = server_keep_alive = limit
        self.keep_alive = keep_alive

        ack_props: dict[str, Any] = {}
        if self.level == 5:
            ack_props = {
                "receive_maximum": self.settings.receive_maximum,
                "maximum_packet_size": self.settings.max_packet_size,
                "topic_alias_maximum": self.settings.topic_alias_maximum,
            }
            if assigned is not None:
                ack_props["assigned_client_identifier"] = assigned
            if server_keep_alive is not None:
                ack_props["server_keep_alive"] = server_keep_alive
            if props.get("request_response_information"):
                ack_props["response_information"] = f"response/{client_id}"
        self._send(mq.Connack(present, 0, ack_props))
        log.info("[{label}] connected with MQTT level {mqtt_level}, session present: {p}", label=self.label, mqtt_level=self.level, p=present)

        for pid in sorted(client.released):
            self._send(mq.Pubrel(pid))
        self._send_quota = prefetch = min(self.peer_receive_maximum, self.settings.max_inflight)
        self.consumer = self.conn.consume(client.queue, self._deliver, ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=prefetch)
        for mqtt_filter, (group, canonical) in client.shared.items():
            self._join_shared(mqtt_filter, group, canonical)
        if keep_alive:
            self._arm_keep_alive()

    def _refuse(self, return_code: int, reason: int, why: str) -> None:
        log.info("[{label}] CONNECT refused: {why}", label=self.label, why=why)
        code = reason if self.level == 5 else return_code
        props = {"reason_string": why} if self.level == 5 else {}
        self._send(mq.Connack(False, code, props))
        self._close()

    def _arm_keep_alive(self) -> None:
        if not self.closed and self.keep_alive:
            self._timer = self.broker.clock.callLater(self.keep_alive / 2, self._check_keep_alive)

    def _check_keep_alive(self) -> None:
        self._timer = None
        if self.closed:
            return
        silence = self.broker.clock.seconds() - self._last_read
        if silence > self.keep_alive * self.settings.keep_alive_grace:
            log.info("[{label}] keep-alive timeout after {s:.1f}s", label=self.label, s=silence)
            self._server_disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT, "keep-alive timeout")
            return
        self._arm_keep_alive()

    # -- publishing (client -> broker) -------------------------------------

    def _on_publish(self, packet: mq.Publish) -> None:
        props = packet.properties
        topic = packet.topic
        if self.level == 5:
            alias = props.get("topic_alias")
            if alias is not None:
                if alias > self.settings.topic_alias_maximum:
                    raise MqttProtocolError(ReasonCode.TOPIC_ALIAS_INVALID, f"topic alias {alias} is above the maximum")
                if topic:
                    self.in_aliases[alias] = topic
                else:
                    topic = self.in_aliases.get(alias, "")
                    if not topic:
                        raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR, f"topic alias {alias} is not set")
        qos = packet.qos
        pid = packet.packet_id
        if qos == 2 and pid in self.client.inbound_qos2:  # type: ignore[union-attr]
            # A retransmission of something already routed: acknowledge, do not route twice.
            self._send(mq.Pubrec(pid))
            return
        if qos and len(self.client.inbound_qos2) >= self.settings.receive_maximum:  # type: ignore[union-attr]
            raise MqttProtocolError(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED, "too many QoS 2 messages awaiting PUBREL")
        if props.get("payload_format_indicator") == 1:
            try:
                packet.payload.decode("utf-8")
            except UnicodeDecodeError:
                self._reject_publish(packet, ReasonCode.PAYLOAD_FORMAT_INVALID, "payload is not UTF-8 as its format indicator says")
                return
        usage = self.broker.store_usage
        if qos and usage.full and self.broker.policy.store_full_policy == "fail":
            self._reject_publish(packet, ReasonCode.QUOTA_EXCEEDED, "the broker's store is full")
            return
        stored_before = usage.bytes
        try:
            destination = self._publish_destination(topic)
            message = self._message(destination, packet, props)
            try:
                self.conn.send(message, retain=packet.retain and destination.startswith("topic://"))
            except RetainedLimit as exc:
                if self.level == 5 and qos:
                    self._reject_publish(packet, ReasonCode.QUOTA_EXCEEDED, str(exc))  # PUBACK/PUBREC 0x97: not published
                    return
                # 3.x (and a 5.0 QoS 0 publish, which has no answer): published, not retained.
                log.info("[{label}] retained flag dropped on {topic!r}: {why}", label=self.label, topic=topic, why=str(exc))
                message = build_message(self.broker, destination, packet.payload, qos, False, props)
                self.conn.send(message)
        except (InvalidTopic, BrokerError) as exc:
            self._reject_publish(packet, ReasonCode.TOPIC_NAME_INVALID, str(exc))
            return
        if qos and usage.full and usage.bytes > stored_before and not self._held and self.broker.policy.store_full_policy == "block":
            # Producer flow control: read nothing more from this client until there is room.
            self._held = True
            log.info("[{label}] store limit reached: holding this publisher", label=self.label)
            self.transport.pause_reading("store limit")
            usage.when_space(self._release_hold)
        if qos == 1:
            self._outbox.add(_PUBACK + pid.to_bytes(2, "big") if self.level < 5 else mq.encode(mq.Puback(pid), 5))  # type: ignore[union-attr]
        elif qos == 2:
            self.client.inbound_qos2.add(pid)  # type: ignore[union-attr]
            self.hub.save(self.client)  # type: ignore[arg-type]  # in the message's batch, before PUBREC
            self._outbox.add(mq.encode(mq.Pubrec(pid), self.level))  # type: ignore[union-attr]

    def _release_hold(self) -> None:
        self._held = False
        if not self.closed:
            log.info("[{label}] store has room again: resuming this publisher", label=self.label)
            self.transport.resume_reading("store limit")

    def _reject_publish(self, packet: mq.Publish, reason: int, why: str) -> None:
        if packet.qos and self.level == 5:
            props = {"reason_string": why} if self.problem_information else {}
            ack = mq.Puback if packet.qos == 1 else mq.Pubrec
            self._send(ack(packet.packet_id, reason, props))
            return
        raise MqttProtocolError(reason, why)

    def _publish_destination(self, topic: str) -> str:
        names = self.hub.destinations
        destination = names.get(topic)
        if destination is None:
            canonical = topic_to_canonical(topic)
            destination = canonical
            for levels in self.hub.queue_filters:
                if filter_matches(levels, tuple(canonical[8:].split("."))):
                    destination = "queue://" + canonical[8:]
                    break
            if len(names) >= 10_000:
                names.clear()  # bounded: a device fleet publishing to a million topics
            names[topic] = destination
        return destination

    def _message(self, destination: str, packet: mq.Publish, props: dict) -> Message:
        return build_message(self.broker, destination, packet.payload, packet.qos, packet.retain, props)

    def _on_pubrel(self, packet: mq.Pubrel) -> None:
        known = packet.packet_id in self.client.inbound_qos2  # type: ignore[union-attr]
        if known:
            self.client.inbound_qos2.discard(packet.packet_id)  # type: ignore[union-attr]
            self.hub.save(self.client)  # type: ignore[arg-type]
        reason = 0 if known or self.level < 5 else ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
        self._send(mq.Pubcomp(packet.packet_id, reason))

    # -- delivering (broker -> client) --------------------------------------

    def _deliver(self, consumer: Consumer, entry: Entry, tag: int) -> bool:
        """Write one delivery; True when it needs no acknowledgement (QoS 0).

        A failure here (a bug, a message this client cannot be sent) costs this
        client its connection on the next turn, never the other subscribers of
        the fan-out: the delivery stays unacknowledged and goes back to the queue.
        """
        try:
            return self._deliver_one(consumer, entry, tag)
        except Exception:
            log.failure("[{label}] internal error delivering {id}", label=self.label, id=entry.message.id)
            self.broker.clock.callLater(0, self._server_disconnect, ReasonCode.UNSPECIFIED_ERROR, "internal error")
            return False

    def _deliver_one(self, consumer: Consumer, entry: Entry, tag: int) -> bool:
        message = entry.message
        client = self.client
        via = entry.via
        if via.__class__ is Subscription:
            options = via.options  # type: ignore[union-attr]
            if options is None:
                options = self._options(consumer, via)  # type: ignore[arg-type]
            granted = options.get("qos", 0)
            retain = bool(options.get("rap")) and bool(message.headers.get(RETAIN_HEADER))
            options_all: tuple[dict, ...] = (options,)
        else:
            if isinstance(via, RetainedVia):
                options_all = (via.options,)
                retain = True
            else:
                if via is None:
                    options_all = self._recovered_options(message)
                else:
                    options_all = tuple(self._options(consumer, s) for s in via)  # type: ignore[union-attr]
                retain = bool(message.headers.get(RETAIN_HEADER)) and any(o.get("rap") for o in options_all)
            granted = max((o.get("qos", 0) for o in options_all), default=0)
        qos = min(message_qos(message), granted)
        if client is None:
            return True  # not expressible in MQTT: count it as delivered
        if self.level == 5:
            data = self._encode_v5(message, entry, options_all, qos, retain)
            if data is None:
                return True
        else:
            # 3.x: the bytes depend only on the message, QoS, retain and DUP, so they are
            # built once per message and shared by every 3.x subscriber.
            cache = message.cache
            if cache is None:
                cache = message.cache = {}
            dup = bool(qos and entry.redeliveries)
            key = (_MQTT3, qos, retain, dup)
            parts = cache.get(key)
            if parts is None:
                topic = canonical_to_topic(message.destination)
                if topic is None:
                    parts = cache[key] = ()
                else:
                    parts = cache[key] = mq.publish_parts(topic, message.body, qos, retain, None, self.level, dup)
            if not parts:
                return True  # a STOMP topic with a level MQTT reserves for wildcards
            if not qos:
                data = parts[0] + parts[1]
                if len(data) > self.peer_max_packet:
                    return True
                # After the batch holding anything before it is on disk (order).
                self._outbox.add(data)  # type: ignore[union-attr]
                return True
            pid = client.packet_id_for(entry.seq)
            data = b"".join((parts[0], pid.to_bytes(2, "big"), parts[1]))
            if len(data) > self.peer_max_packet:
                return True
            self._outbox.add(data)  # type: ignore[union-attr]
            self._track(consumer, tag, entry, pid)
            return False
        # After the batch holding its delivered mark (and anything before it) is on disk.
        self._outbox.add(data[0])  # type: ignore[union-attr]
        if not qos:
            return True
        self._track(consumer, tag, entry, data[1])
        return False

    def _track(self, consumer: Consumer, tag: int, entry: Entry, pid: int) -> None:
        client = self.client
        client.outbound[pid] = Inflight(consumer, tag, entry.seq)  # type: ignore[union-attr]
        client.ids_by_seq[entry.seq] = pid  # type: ignore[union-attr]
        self._inflight += 1
        if self._inflight >= self._send_quota:
            self._update_flow()

    def _encode_v5(self, message: Message, entry: Entry, options: tuple[dict, ...], qos: int, retain: bool) -> tuple[bytes, int] | None:
        """5.0 bytes for one subscriber (its subscription identifiers and topic alias), or None to skip."""
        topic = canonical_to_topic(message.destination)
        if topic is None:
            return None
        properties = self._properties(message, options)
        pid = self.client.packet_id_for(entry.seq) if qos else None  # type: ignore[union-attr]
        new_alias = None
        if self.peer_alias_max:
            topic, new_alias = self._alias(topic, properties)
        data = mq.encode_publish(topic, message.body, qos, retain, bool(qos and entry.redeliveries), pid, properties, 5)
        if len(data) > self.peer_max_packet:
            # MQTT-3.1.2-25: too large for the client: discard as if delivered,
            # and do not keep an alias the client never learned.
            if new_alias is not None:
                del self.out_aliases[new_alias]
            return None
        return data, pid or 0

    def _recovered_options(self, message: Message) -> tuple[dict, ...]:
        """The options of this client's filters that match a message whose entry has no ``via``.

        Entries rebuilt from the store after a restart do not say which
        subscription matched them; without this they would go out at QoS 0
        (acknowledged at once, so a crash of the client loses them).
        """
        client = self.client
        if client is None:
            return ()
        levels = dest.topic_levels(dest.name_of(message.destination))
        return tuple(sub.options or {} for sub in client.subs.values() if filter_matches(sub.levels, levels))

    def _options(self, consumer: Consumer, sub: Subscription) -> dict:
        if sub.options is not None:
            return sub.options
        # A shared subscription's queue is common; the options are this member's.
        for mqtt_filter, member in self.shared_consumers.items():
            if member is consumer:
                return self.client.filters.get(mqtt_filter, {})  # type: ignore[union-attr]
        return {}

    def _properties(self, message: Message, options: tuple[dict, ...]) -> dict:
        props: dict[str, Any] = {}
        every = message.headers.get(USER_PROPERTIES_HEADER)
        users = _user_property_list(every) if every is not None else None
        if users is None:
            users = [(k, v) for k, v in message.headers.items() if not k.startswith(_INTERNAL_PREFIX)]
        if users:
            props["user_properties"] = users
        if message.content_type is not None:
            props["content_type"] = message.content_type
        if message.reply_to is not None:
            response = canonical_to_topic(message.reply_to)
            if response:
                props["response_topic"] = response
        if message.correlation_id is not None:
            props["correlation_data"] = message.correlation_id.encode("utf-8", "surrogateescape")
        if message.headers.get(FORMAT_HEADER) == "1":
            props["payload_format_indicator"] = 1
        if message.expiration:
            remaining = -(-(message.expiration - self.broker.now_ms()) // 1000)
            # A STOMP producer may set expires further ahead than MQTT's u32 seconds.
            props["message_expiry_interval"] = min(max(1, remaining), 0xFFFFFFFF)
        ids = [o["id"] for o in options if o.get("id")]
        if ids:
            props["subscription_identifier"] = ids
        return props

    def _alias(self, topic: str, properties: dict) -> tuple[str, str | None]:
        """The topic to send (empty once aliased) and the topic newly given an alias, if any."""
        alias = self.out_aliases.get(topic)
        if alias is not None:
            properties["topic_alias"] = alias
            return "", None
        if len(self.out_aliases) < self.peer_alias_max:
            alias = self.out_aliases[topic] = len(self.out_aliases) + 1
            properties["topic_alias"] = alias
            return topic, topic
        return topic, None

    def _on_puback(self, packet: mq.Puback) -> None:
        inflight = self.client.outbound.pop(packet.packet_id, None)  # type: ignore[union-attr]
        if inflight is not None:
            self.client.ids_by_seq.pop(inflight.seq, None)  # type: ignore[union-attr]
            self._finish(inflight)

    def _on_pubrec(self, packet: mq.Pubrec) -> None:
        client = self.client
        inflight = client.outbound.pop(packet.packet_id, None)  # type: ignore[union-attr]
        if inflight is not None:
            client.ids_by_seq.pop(inflight.seq, None)  # type: ignore[union-attr]
        if packet.reason_code >= 0x80:
            if inflight is not None:
                self._finish(inflight)  # the client refused it: the flow ends here
            return
        # The client has it; only PUBREL/PUBCOMP remain, and the slot stays taken until PUBCOMP.
        if inflight is not None:
            client.released[packet.packet_id] = inflight.seq  # type: ignore[union-attr]
            client.released_inflight[packet.packet_id] = inflight  # type: ignore[union-attr]
            self.hub.save(client)  # type: ignore[arg-type]
        self._send(mq.Pubrel(packet.packet_id, 0 if inflight is not None or self.level < 5 else ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))

    def _on_pubcomp(self, packet: mq.Pubcomp) -> None:
        client = self.client
        if client.released.pop(packet.packet_id, None) is not None:  # type: ignore[union-attr]
            self.hub.save(client)  # type: ignore[arg-type]
        inflight = client.released_inflight.pop(packet.packet_id, None)  # type: ignore[union-attr]
        if inflight is not None:
            self._finish(inflight)

    def _finish(self, inflight: Inflight) -> None:
        """A QoS 1/2 flow completed: settle it in the core and give its slot back."""
        self._inflight -= 1
        self._settle(inflight)
        if self._inflight < self._send_quota:
            self._update_flow()

    def _settle(self, inflight: Inflight) -> None:
        if inflight.consumer.closed:
            return
        try:
            self.conn.ack(inflight.consumer, inflight.tag)
        except BrokerError:
            pass  # already settled (e.g. redelivered after a takeover)

    def _update_flow(self) -> None:
        """Deliveries stop while the socket is full or the client's receive maximum is reached."""
        conn = self.conn
        if conn is None or self.closed:
            return
        stop = self._transport_paused or self._inflight >= self._send_quota
        if stop and conn.writable:
            conn.pause()
        elif not stop and not conn.writable:
            conn.resume()

    # -- subscriptions -------------------------------------------------------

    def _on_subscribe(self, packet: mq.Subscribe) -> None:
        client = self.client
        sub_id = packet.properties.get("subscription_identifier") if self.level == 5 else None
        codes = []
        retained: list[Entry] = []
        for request in packet.subscriptions:
            codes.append(self._subscribe_one(client, request, sub_id, retained))  # type: ignore[arg-type]
        self._send(mq.Suback(packet.packet_id, codes))
        # Retained messages follow the SUBACK, through the queue like any delivery (flow control, QoS).
        for entry in retained:
            client.queue.enqueue(entry)  # type: ignore[union-attr]

    def _subscribe_one(
        self, client: ClientSession, request: mq.SubscriptionRequest, sub_id: int | None, retained: list[Entry],
    ) -> int:
        mqtt_filter = request.topic_filter
        try:
            group, inner = split_shared(mqtt_filter)
            canonical = filter_to_canonical(inner)
            self.broker.check_name(canonical, allow_wildcards=True)
        except (InvalidTopic, InvalidDestination) as exc:
            log.info("[{label}] SUBSCRIBE {f!r} refused: {why}", label=self.label, f=mqtt_filter, why=str(exc))
            return ReasonCode.TOPIC_FILTER_INVALID if self.level == 5 else 0x80
        if group is not None and request.no_local and self.level == 5:
            raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR, "no local on a shared subscription")
        existed = mqtt_filter in client.filters
        if not existed and len(client.filters) >= self.settings.max_subscriptions:
            return ReasonCode.QUOTA_EXCEEDED if self.level == 5 else 0x80
        options = {"qos": request.qos, "nl": request.no_local, "rap": request.retain_as_published, "rh": request.retain_handling}
        if sub_id:
            options["id"] = sub_id
        client.filters[mqtt_filter] = options
        if group is not None:
            if not existed:
                client.shared[mqtt_filter] = (group, canonical)
                self._join_shared(mqtt_filter, group, canonical)
            return request.qos
        broker = self.broker
        if client.durable:
            sub = broker.durable_subscription(
                f"{self.hub.queue_key(client.client_id)}\x1f{mqtt_filter}", canonical, None, None, request.no_local,
                queue_key=self.hub.queue_key(client.client_id), options=options,
            )
        else:
            old = client.subs.get(mqtt_filter)
            if old is not None:
                old.options = options
                sub = old
            else:
                sub = broker.add_subscription(client.queue, canonical, no_local=request.no_local, options=options)
        sub.owner_id = client.client_id
        client.subs[mqtt_filter] = sub
        if request.retain_handling == 0 or (request.retain_handling == 1 and not existed):
            for message in broker.retained_for(canonical):
                if request.no_local and message.origin == client.client_id:
                    continue
                retained.append(Entry(message, broker.next_seq(), via=RetainedVia(options)))
        return request.qos

    def _join_shared(self, mqtt_filter: str, group: str, canonical: str) -> None:
        sub = self.broker.shared_subscription(group, canonical)
        prefetch = min(self.peer_receive_maximum, self.settings.max_inflight)
        self.shared_consumers[mqtt_filter] = self.conn.consume(
            sub.queue, self._deliver, ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=prefetch,
        )

    def _leave_shared(self, mqtt_filter: str, group: str, canonical: str) -> None:
        consumer = self.shared_consumers.pop(mqtt_filter, None)
        if consumer is not None:
            self.conn.unsubscribe(consumer)
            self.broker.leave_shared(group, canonical)

    def _on_unsubscribe(self, packet: mq.Unsubscribe) -> None:
        client = self.client
        codes = []
        for mqtt_filter in packet.topic_filters:
            options = client.filters.pop(mqtt_filter, None)  # type: ignore[union-attr]
            if options is None:
                codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
                continue
            shared = client.shared.pop(mqtt_filter, None)  # type: ignore[union-attr]
            if shared is not None:
                self._leave_shared(mqtt_filter, *shared)
            sub = client.subs.pop(mqtt_filter, None)  # type: ignore[union-attr]
            if sub is not None:
                if sub.durable_key is not None:
                    self.broker.remove_durable(sub.durable_key)
                else:
                    self.broker.remove_subscription(sub)
            codes.append(0)
        self._send(mq.Unsuback(packet.packet_id, codes))

    # -- the rest of the protocol ----------------------------------------------

    def _on_pingreq(self, packet: mq.Pingreq) -> None:
        self._send(mq.Pingresp())

    def _on_connect_again(self, packet: mq.Connect) -> None:
        raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR, "a second CONNECT")

    def _on_disconnect(self, packet: mq.Disconnect) -> None:
        client = self.client
        if self.level == 5:
            new_expiry = packet.properties.get("session_expiry_interval")
            if new_expiry is not None:
                if client.expiry == 0 and new_expiry:  # type: ignore[union-attr]
                    raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR, "session expiry set on DISCONNECT after 0 at CONNECT")
                client.expiry = new_expiry  # type: ignore[union-attr]
            if packet.reason_code == ReasonCode.DISCONNECT_WITH_WILL_MESSAGE:
                self._close()
                return
        self.normal_disconnect = True
        self.will = None
        self._close()

    def _on_auth(self, packet: mq.Auth) -> None:
        raise MqttProtocolError(ReasonCode.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not configured")

    _handlers = {
        mq.Publish: _on_publish,
        mq.Puback: _on_puback,
        mq.Pubrec: _on_pubrec,
        mq.Pubrel: _on_pubrel,
        mq.Pubcomp: _on_pubcomp,
        mq.Subscribe: _on_subscribe,
        mq.Unsubscribe: _on_unsubscribe,
        mq.Pingreq: _on_pingreq,
        mq.Disconnect: _on_disconnect,
        mq.Connect: _on_connect_again,
        mq.Auth: _on_auth,
    }

    # -- output and teardown ---------------------------------------------------

    def _send(self, packet: Any) -> None:
        self._write(mq.encode(packet, self.level))

    def _write(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def _protocol_error(self, reason: int, why: str, exc: MqttProtocolError | None = None) -> None:
        log.info("[{label}] protocol error: {why}", label=self.label, why=why)
        if self.close_reason == "normal":
            self.close_reason = "error"
        if self.client is None:
            # Errors in or before CONNECT: a CONNACK where the client's version has one.
            level = getattr(exc, "protocol_level", None) or self.decoder.level
            return_code = getattr(exc, "connack_return_code", None)
            if level == 5:
                self.level = 5
                self._send(mq.Connack(False, reason, {"reason_string": why}))
            elif return_code is not None:
                # An unsupported level (say 6) has no encoding of its own: answer in the
                # 3.1.1 layout, where return code 1 says "unacceptable protocol version".
                self.level = level if level in (3, 4) else 4
                self._send(mq.Connack(False, return_code))
            self._close()
            return
        self._server_disconnect(reason, why)

    def _server_disconnect(self, reason: int, why: str) -> None:
        """5.0 gets a DISCONNECT with the reason; 3.x just a closed socket (it has no server DISCONNECT)."""
        if self._outbox is not None and not self.closed:
            self._outbox.submit()  # frames gathered before the DISCONNECT go out before it
        if self.level == 5 and not self.closed:
            props = {"reason_string": why} if self.problem_information else {}
            self._send(mq.Disconnect(reason, props))
        self._close()

    def shutdown(self) -> None:
        if not self.closed:
            self.close_reason = "shutdown"
            self._server_disconnect(ReasonCode.SERVER_SHUTTING_DOWN, "the broker is shutting down")

    def take_over(self) -> None:
        """Another connection claims this client id (MQTT-3.1.4-3)."""
        self._server_disconnect(ReasonCode.SESSION_TAKEN_OVER, "another connection uses this client id")

    def _close(self) -> None:
        if self.closed:
            return
        if self._outbox is not None:
            self._outbox.submit()  # what this turn gathered goes out before the close
        self._release()
        self.transport.close()

    def _release(self) -> None:
        self.closed = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self.client is not None:
            # Released QoS 2 deliveries are the client's: settle them, keep only
            # their packet ids for the PUBREL a reconnect will get.
            for inflight in self.client.released_inflight.values():
                self._settle(inflight)
            self.client.released_inflight.clear()
        for mqtt_filter, (group, canonical) in list((self.client.shared if self.client else {}).items()):
            self._leave_shared(mqtt_filter, group, canonical)
        if self.conn is not None:
            self.conn.close()  # unacked deliveries go back to the session queue
        if self.client is not None:
            self.client.outbound.clear()
            self.hub.detach(self, self.will, self.level)

    def connection_lost(self) -> None:
        """The socket is gone; after our own close (takeover, DISCONNECT, error) there is nothing left to do.

        Releasing twice would be harmful, not idle: after a takeover the client
        session already belongs to the new connection, and clearing its
        ``outbound`` would make the broker ignore the new connection's PUBACKs.
        """
        if self.closed:
            return
        log.info("[{label}] connection lost", label=self.label)
        self._release()

    def pause_producing(self) -> None:
        self._transport_paused = True
        self._update_flow()

    def resume_producing(self) -> None:
        self._transport_paused = False
        self._update_flow()
