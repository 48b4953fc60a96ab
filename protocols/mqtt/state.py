"""What an MQTT client keeps across its connections, beside the hub that holds it.

Artemis splits MQTT the same way (``MQTTSessionState`` / ``MQTTStateManager``):
the hub and the connection's state machine both use these, and neither has to
import the other for them.

- ``ClientSession``: the session of one client id (MQTT 4.1) -- its queue in
  the core, its subscriptions and their options;
- ``Flows``: the packet ids of its QoS 1/2 flows in progress, made with its first one;
- ``SubscriptionOptions``: what a SUBSCRIBE asked for one filter, stored with
  durable subscriptions;
- ``AwayFilter``: what a persistent session queues while its client is away;
- ``build_message`` and ``message_qos``: between PUBLISH (or a will) and the
  core's protocol-neutral message.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core.consumer import Consumer
from core.via import ViaMarker
from core.errors import BrokerError
from core.message import Message
from core.queue import MessageQueue
from core.selector import Lookup
from core.topic import Subscription
from protocols.mqtt import codec as mq
from protocols.mqtt.names import canonical_to_topic, topic_to_canonical

if TYPE_CHECKING:

    from core.broker import Broker
    from protocols.mqtt.session import MqttSession

# Core message headers that carry MQTT facts; never passed on as user properties.
QOS_HEADER = "mqtt-qos"
RETAIN_HEADER = "mqtt-retain"
FORMAT_HEADER = "mqtt-payload-format"
# Only when a name repeats: the full list in order, since headers hold one value per name.
USER_PROPERTIES_HEADER = "mqtt-user-properties"
# On the stored copy of a retained message sent because of a SUBSCRIBE (RetainedVia): read
# back from the store (paged out, or after a restart) it still goes out with RETAIN 1.
RETAINED_SEND_HEADER = "mqtt-retained-send"
_INTERNAL_PREFIX = "mqtt-"
# A CONNECT and CONNACK user property: a gateway's bridge names its broker, and a gateway answers
# with its own name, so each side knows which broker a message would go back to.
BROKER_PROPERTY = "gateway-broker"
PUBACK_HEAD = b"\x40\x02"  # a 3.x PUBACK before its packet id
MQTT3_CACHE_KEY = "mqtt3"  # Message.cache key of 3.x PUBLISH bytes

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
    # With users configured: the largest CONNECT (with its will) a client not yet logged in may send.
    max_connect_size: int = 65536
    # MQTT filters whose publishes go to a queue of the same name instead of the topic.
    queue_topics: list[str] = field(default_factory=list)



@dataclass(frozen=True, slots=True)
class SubscriptionOptions:
    """What a SUBSCRIBE asked for one filter (MQTT 5 3.8.3.1; 3.x has only the QoS).

    Durable subscriptions store ``record()`` as JSON with short keys; that
    record is what older stores hold too, so ``from_record`` reads both.
    """

    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    identifier: int | None = None  # MQTT 5 subscription identifier

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"qos": self.qos, "nl": self.no_local, "rap": self.retain_as_published, "rh": self.retain_handling}
        if self.identifier:
            out["id"] = self.identifier
        return out

    @classmethod
    def from_record(cls, record: Any) -> SubscriptionOptions:
        """From a stored record (a dict with short keys); what is not one gives the defaults."""
        if isinstance(record, cls):
            return record
        if not isinstance(record, dict):
            return cls()
        return cls(
            int(record.get("qos", 0)), bool(record.get("nl")), bool(record.get("rap")),
            int(record.get("rh", 0)), int(record["id"]) if record.get("id") else None,
        )


NO_OPTIONS = SubscriptionOptions()


def options_of(sub: Subscription) -> SubscriptionOptions:
    """A subscription's MQTT options; typed on first use for subscriptions recovered from the store."""
    options = sub.options
    if options.__class__ is SubscriptionOptions:
        return options  # the class test is the hot path's cheapest check
    typed = SubscriptionOptions.from_record(options) if options is not None else NO_OPTIONS
    if options is not None:
        sub.options = typed
    return typed


class RetainedVia(ViaMarker):
    """Entry.via marker for a retained message sent because of a SUBSCRIBE (retain flag 1)."""

    __slots__ = ("options",)
    STORED_HEADER = RETAINED_SEND_HEADER

    def __init__(self, options: SubscriptionOptions) -> None:
        self.options = options


@dataclass
class Inflight:
    consumer: Consumer
    tag: int
    seq: int


class Flows:
    """The QoS 1 and 2 flows of one session in progress, by packet id (MQTT 4.3)."""

    __slots__ = ("outbound", "released", "released_inflight", "inbound_qos2", "ids_by_seq", "next_id")

    def __init__(self) -> None:
        self.outbound: dict[int, Inflight] = {}       # packet id -> PUBLISH awaiting PUBACK/PUBREC
        # PUBREL sent, awaiting PUBCOMP: packet id -> message seq (stored, so a
        # restart still resends PUBREL) ...
        self.released: dict[int, int] = {}
        # ... and, while its connection lives, the delivery itself, held until
        # PUBCOMP so it keeps its receive-maximum slot (MQTT 5 4.9).
        self.released_inflight: dict[int, Inflight] = {}
        self.inbound_qos2: dict[int, None] = {}       # PUBREC sent, awaiting PUBREL (keys; smaller than a set)
        self.ids_by_seq: dict[int, int] = {}          # message -> packet id it was first sent with
        self.next_id = 1

    def packet_id_for(self, seq: int) -> int:
        """The packet id for a message: first choice derived from its sequence, so a
        retransmission after a restart carries the same id with nothing stored."""
        pid = self.ids_by_seq.get(seq) or seq % 65535 + 1
        if pid in self.outbound or pid in self.released:
            pid = self.allocate_id()
        return pid

    def allocate_id(self) -> int:
        busy = self.outbound
        for _ in range(65535):
            pid = self.next_id
            self.next_id = pid % 65535 + 1
            if pid not in busy and pid not in self.released:
                return pid
        raise BrokerError("no free packet identifier")


class ClientSession:
    """What survives between connections of one client id (MQTT 4.1)."""

    # One per MQTT client id, kept while its session lives: slots, for the memory of many idle devices.
    __slots__ = (
        "client_id", "queue", "durable", "expiry", "_filters", "_subs", "_shared", "_flows", "live", "expiry_timer",
        "will_timer", "pending_will", "left_at", "user",
    )

    def __init__(self, client_id: str, queue: MessageQueue | None, durable: bool) -> None:
        self.client_id = client_id
        # A persistent session's queue exists from the start; a clean one's from its
        # first subscription (MqttHub.clean_queue).
        self.queue = queue
        self.durable = durable
        self.expiry = 0                     # seconds after disconnect; NEVER_EXPIRES
        # Made on first use, as the flows are with the first QoS 1/2 one: an empty
        # dict is 64 bytes, and eight of them were a sixth of an idle connection.
        self._filters: dict[str, SubscriptionOptions] | None = None
        self._subs: dict[str, Subscription] | None = None
        self._shared: dict[str, tuple[str, str]] | None = None
        self._flows: Flows | None = None
        self.live: MqttSession | None = None
        # Twisted's IDelayedCall, as callLater returns it.
        self.expiry_timer: Any = None
        self.will_timer: Any = None
        self.pending_will: mq.Will | None = None      # a will waiting out its delay
        self.left_at = 0                               # epoch ms of the last disconnect (0: connected)
        self.user: str | None = None                   # who made it; another user may not take it over

    @property
    def filters(self) -> dict[str, SubscriptionOptions]:
        """MQTT filter -> what its SUBSCRIBE asked; every filter of the session, shared ones included."""
        found = self._filters
        if found is None:
            found = self._filters = {}
        return found

    @property
    def subs(self) -> dict[str, Subscription]:
        """MQTT filter -> its core subscription (not shared), routing into the session's queue."""
        found = self._subs
        if found is None:
            found = self._subs = {}
        return found

    @property
    def shared(self) -> dict[str, tuple[str, str]]:
        """Shared MQTT filter -> (group, canonical filter)."""
        found = self._shared
        if found is None:
            found = self._shared = {}
        return found

    @property
    def subscribed(self) -> bool:
        """Whether it ever had a subscription (reading without making the dicts)."""
        return self._filters is not None

    @property
    def flows(self) -> Flows:
        """Its QoS 1/2 flows, made on first use."""
        flows = self._flows
        if flows is None:
            flows = self._flows = Flows()
        return flows

    @property
    def has_flows(self) -> bool:
        """Whether any QoS 1/2 flow was ever started (reading without making them)."""
        return self._flows is not None

    def state(self) -> bytes:
        """What must outlive the process: expiry and the QoS 2 flows in progress."""
        flows = self._flows
        return json.dumps({
            "expiry": self.expiry, "left_at": self.left_at,
            "released": flows.released if flows is not None else {},
            "inbound": sorted(flows.inbound_qos2) if flows is not None else [], "user": self.user,
        }).encode()


# The headers of a PUBLISH with no user properties, retain flag or payload format, by QoS:
# one map shared by all such messages, so a flood of them makes no dict each and a
# stream's encoder meets the same map again (no comparison per record).  Nothing changes
# a message's headers in place: Message.copy copies them, a bridge that puts its remote
# on the path gives the message new ones (Bridge.arrived).
_PLAIN_HEADERS = ({QOS_HEADER: "0"}, {QOS_HEADER: "1"}, {QOS_HEADER: "2"})


def build_message(broker: Broker, destination: str, payload: bytes, qos: int, retain: bool, props: dict[str, Any]) -> Message:
    """A core message from a PUBLISH or a will: MQTT 5 properties become the common fields and headers."""
    users = props.get("user_properties", ())
    if not users and not retain and props.get("payload_format_indicator") != 1 and 0 <= qos <= 2:
        headers = _PLAIN_HEADERS[qos]
    else:
        headers = {}
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


def publish_properties(broker: Broker, message: Message) -> dict[str, Any]:
    """The MQTT 5 PUBLISH properties a message carries (a subscriber's, or a bridge's to its remote)."""
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
        remaining = -(-(message.expiration - broker.now_ms()) // 1000)
        # A STOMP producer may set expires further ahead than MQTT's u32 seconds.
        props["message_expiry_interval"] = min(max(1, remaining), 0xFFFFFFFF)
    return props


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

    def matches(self, lookup: Lookup) -> bool:
        if not self.granted:
            return False
        qos = lookup(QOS_HEADER)
        if qos is None:
            return lookup("JMSDeliveryMode") == "PERSISTENT"  # STOMP: persistent counts as QoS 1
        return qos in ("1", "2")
