"""The MQTT state machine without sockets: a fake transport, a virtual clock, two clients on one broker.

Sessions are driven only as a network adapter drives them (bytes in,
``connection_lost``, ``pause_producing``/``resume_producing``, ``shutdown``)
and judged only by what a client would see: the packets written to its
transport, decoded with the codec, and whether the transport was closed.
"""
from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.task import Clock

from core.broker import Broker
from persistence.memory import MemoryStore
from protocols.mqtt import codec as mq
from protocols.mqtt.codec import ReasonCode
from protocols.mqtt.hub import MqttHub
from protocols.mqtt.session import MqttSession
from protocols.mqtt.state import MqttSettings

BOTH = pytest.mark.parametrize("level", [4, 5], ids=["3.1.1", "5.0"])


class FakeTransport:
    def __init__(self) -> None:
        self.data = b""
        self.closed = False
        self.paused: set[str] = set()

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        self.data += data

    def close(self) -> None:
        self.closed = True

    def pause_reading(self, reason: str = "") -> None:
        self.paused.add(reason)

    def resume_reading(self, reason: str = "") -> None:
        self.paused.discard(reason)

    def certificate_user(self) -> str | None:
        return None


class Client:
    """One network connection to the broker, as its client sees it."""

    def __init__(self, hub: MqttHub, level: int) -> None:
        self.level = level
        self.transport = FakeTransport()
        self.session = MqttSession(hub, self.transport, "test")
        self._decoder = mq.MqttDecoder(level=level, server=False)
        self._read = 0

    def send(self, *packets: Any) -> None:
        self.session.data_received(b"".join(mq.encode(p, self.level) for p in packets))

    def received(self) -> list[Any]:
        """The packets written since the last call (whole packets only)."""
        data, self._read = self.transport.data[self._read:], len(self.transport.data)
        packets = self._decoder.feed(data)
        assert self._decoder.buffered == 0, "a packet cut short"
        return packets

    @property
    def closed(self) -> bool:
        return self.transport.closed

    def connect(
        self, client_id: str, clean: bool = True, keep_alive: int = 0, will: mq.Will | None = None, **properties: Any,
    ) -> mq.Connack:
        self.send(mq.Connect("MQTT", self.level, clean, keep_alive, client_id, will=will, properties=properties))
        (connack, *rest) = self.received()
        assert isinstance(connack, mq.Connack) and connack.reason_code == 0, connack
        self.after_connack = rest
        return connack

    def subscribe(self, pid: int, *filters: tuple[str, int]) -> list[int]:
        self.send(mq.Subscribe(pid, [mq.SubscriptionRequest(f, q) for f, q in filters]))
        (suback, *self.after_suback) = self.received()
        assert isinstance(suback, mq.Suback) and suback.packet_id == pid, suback
        return suback.reason_codes


class World:
    """A broker over a memory store with a virtual clock, and its MQTT hub.

    With ``turns`` the broker gathers each session's output until the end of the
    reactor turn, as the gateway does (``callLater(0)``), so ``clock.advance(0)``
    ends a turn; without it every write goes out at once.
    """

    def __init__(self, turns: bool = False, **settings: Any) -> None:
        self.clock = Clock()
        defer = (lambda work: self.clock.callLater(0, work)) if turns else None
        self.broker = Broker(MemoryStore(), self.clock, defer=defer)
        self.broker.start()
        self.hub = MqttHub(self.broker, MqttSettings(**settings))
        self.hub.recover()

    def elapse(self, seconds: float, step: float = 0.1) -> None:
        """Let ``seconds`` pass in small steps, as a running reactor would."""
        for _ in range(round(seconds / step)):
            self.clock.advance(step)

    def client(self, level: int = 4) -> Client:
        return Client(self.hub, level)

    def connected(self, client_id: str, level: int = 4, **kwargs: Any) -> Client:
        c = self.client(level)
        c.connect(client_id, **kwargs)
        return c

    def subscriber(self, client_id: str, topic_filter: str, qos: int = 0, level: int = 4, **kwargs: Any) -> Client:
        c = self.connected(client_id, level, **kwargs)
        assert c.subscribe(1, (topic_filter, qos)) == [qos]
        return c

    def pair(self, topic_filter: str, qos: int = 0, level: int = 4, **kwargs: Any) -> tuple[Client, Client]:
        """A subscriber ("sub", its CONNECT given ``kwargs``) to ``topic_filter`` and a publisher ("pub"), both of ``level``."""
        return self.subscriber("sub", topic_filter, qos, level, **kwargs), self.connected("pub", level)

    def resume(self, client_id: str, level: int, present: bool = True) -> Client:
        """A new connection to the persistent session of ``client_id``; what followed its CONNACK is ``after_connack``."""
        c = self.client(level)
        assert c.connect(client_id, **persistent(level)).session_present is present
        return c

    def with_will(self, client_id: str, level: int, retain: bool = False, **kwargs: Any) -> tuple[Client, Client]:
        """A client connected with the will ``will_of(client_id)``, and a client watching ``will/#``."""
        watcher = self.subscriber(f"watch-{client_id}", "will/#")
        c = self.client(level)
        c.connect(client_id, will=mq.Will(f"will/{client_id}", f"will of {client_id}".encode(), 0, retain), **kwargs)
        return c, watcher


@pytest.fixture
def world() -> World:
    return World()


def will_of(client_id: str, retain: bool = False) -> mq.Publish:
    """The will of ``World.with_will`` as a subscriber receives it."""
    return mq.Publish(f"will/{client_id}", f"will of {client_id}".encode(), 0, retain)


def ended(level: int, reason: int, why: str) -> list[mq.Disconnect]:
    """What the broker writes when it ends a connection: 5.0 a DISCONNECT saying why, 3.1.1 nothing."""
    return [mq.Disconnect(reason, {"reason_string": why})] if level == 5 else []


def persistent(level: int) -> dict[str, Any]:
    """CONNECT arguments of a session that outlives its connection, in the level's own terms."""
    return {"clean": False, "session_expiry_interval": 3600} if level == 5 else {"clean": False}


# -- CONNECT ---------------------------------------------------------------------------


def test_connack_311_has_no_properties_and_no_session(world):
    c = world.client(4)
    c.send(mq.Connect("MQTT", 4, True, 60, "c1"))
    assert c.received() == [mq.Connack(False, 0, {})]
    assert not c.closed


def test_connack_50_announces_the_limits():
    w = World(receive_maximum=7, max_packet_size=5000, topic_alias_maximum=3)
    c = w.client(5)
    c.send(mq.Connect("MQTT", 5, True, 60, "c1"))
    assert c.received() == [mq.Connack(False, 0, {"receive_maximum": 7, "maximum_packet_size": 5000, "topic_alias_maximum": 3})]


def test_empty_client_id_is_assigned_one_in_50(world):
    first, second = world.client(5), world.client(5)
    ids = [c.connect("").properties["assigned_client_identifier"] for c in (first, second)]
    assert all(ids) and ids[0] != ids[1]
    # The assigned id is the session's: a connection that uses it takes the session over.
    world.connected(ids[0], 5)
    assert first.received() == ended(5, ReasonCode.SESSION_TAKEN_OVER, "another connection uses this client id")
    assert first.closed and not second.closed


def test_empty_client_id_in_311_needs_a_clean_session(world):
    accepted = world.client(4)
    assert accepted.connect("") == mq.Connack(False, 0, {})  # no way to tell a 3.1.1 client its id
    refused = world.client(4)
    refused.send(mq.Connect("MQTT", 4, False, 60, ""))
    assert refused.received() == [mq.Connack(False, mq.ConnackReturnCode.IDENTIFIER_REJECTED)]
    assert refused.closed


@BOTH
def test_packet_before_connect_closes_without_an_answer(world, level):
    watcher = world.subscriber("watch", "t", 0)
    c = world.client(level)
    c.send(mq.Publish("t", b"early"))
    assert c.transport.data == b"" and c.closed
    assert watcher.received() == []
    c.send(mq.Connect("MQTT", level, True, 60, "late"))  # nothing more is read
    assert c.transport.data == b""


@BOTH
def test_second_connect_is_a_protocol_error(world, level):
    c, watcher = world.with_will("twice", level)
    c.send(mq.Connect("MQTT", level, True, 60, "twice"))
    assert c.received() == ended(level, ReasonCode.PROTOCOL_ERROR, "a second CONNECT")
    assert c.closed
    # A protocol error is an abnormal end: the will is published (3.1.2.5 / 5.0 3.1.2.5).
    assert watcher.received() == [will_of("twice")]


def test_connect_timeout_closes_a_connection_that_sends_no_connect():
    w = World(connect_timeout=5.0)
    silent, prompt = w.client(), w.client()
    w.clock.advance(4.9)
    assert not silent.closed
    prompt.connect("prompt")
    w.clock.advance(0.2)
    assert silent.closed and silent.transport.data == b""
    w.clock.advance(60)
    assert not prompt.closed and prompt.received() == []


# -- keep-alive ------------------------------------------------------------------------


@BOTH
def test_keep_alive_silence_closes_and_publishes_the_will(world, level):
    c, watcher = world.with_will("sleepy", level, keep_alive=10)
    world.elapse(6)
    c.send(mq.Pingreq())  # the last sign of life
    assert c.received() == [mq.Pingresp()]
    world.elapse(14.9)  # not yet 1.5 x keep-alive
    assert not c.closed and watcher.received() == []
    world.elapse(0.2)  # closed as the silence reaches 1.5 x keep-alive, not half a period later
    assert c.closed
    assert c.received() == ended(level, ReasonCode.KEEP_ALIVE_TIMEOUT, "keep-alive timeout")
    assert watcher.received() == [will_of("sleepy")]


def test_any_packet_renews_the_keep_alive(world):
    c = world.connected("awake", keep_alive=10)
    for _ in range(5):
        world.elapse(9)
        c.send(mq.Pingreq())
        assert c.received() == [mq.Pingresp()]
    world.elapse(14.9)
    assert not c.closed
    world.elapse(0.2)
    assert c.closed


def test_keep_alive_zero_never_times_out(world):
    c = world.connected("forever", keep_alive=0)
    world.clock.advance(100_000)
    assert not c.closed


# -- SUBSCRIBE and PUBLISH -------------------------------------------------------------


@BOTH
def test_suback_grants_the_requested_qos_and_refuses_invalid_filters(world, level):
    c = world.connected("subs", level)
    codes = c.subscribe(5, ("a/b", 0), ("a/+", 1), ("a/#", 2), ("a/#/b", 1))
    assert codes == [0, 1, 2, ReasonCode.TOPIC_FILTER_INVALID if level == 5 else 0x80]


@BOTH
def test_a_clean_session_gets_its_queue_with_its_first_subscription(world, level):
    # An idle device that never subscribes costs no queue and no consumer (memory per connection).
    pub = world.connected("pub", level)
    pub.send(mq.Publish("lazy/kept", b"kept", 0, True))
    idle = world.connected("idle", level)
    client = world.hub.clients["idle"]
    assert client.queue is None and world.broker.connection_count() == 2
    assert not client.subscribed and not client.has_flows  # nor any of the dicts a subscription or a flow needs
    assert [c for conn in world.broker.connections.values() for c in conn.consumers.values()] == []
    assert idle.subscribe(2, ("lazy/#", 1)) == [1]
    assert client.queue is not None and client.queue.name == "mqtt://idle" and len(client.queue.consumers) == 1
    assert [(p.topic, p.payload) for p in idle.after_suback] == [("lazy/kept", b"kept")]
    pub.send(mq.Publish("lazy/new", b"new"))
    assert [(p.topic, p.payload) for p in idle.received()] == [("lazy/new", b"new")]


@BOTH
def test_qos0_publish_reaches_the_subscriber(world, level):
    sub, pub = world.pair("s/+", 0, level)
    pub.send(mq.Publish("s/x", b"zero"))
    assert pub.received() == []
    assert sub.received() == [mq.Publish("s/x", b"zero", 0, False, False, None)]


@BOTH
def test_delivery_topics_are_remembered_within_a_bound_and_stay_right_past_it(world, level):
    """Deliveries map each destination back to its MQTT topic once; the map is bounded (a fleet's topics)."""
    sub, pub = world.pair("b/#", 0, level)
    for i in range(10_050):
        pub.send(mq.Publish(f"b/{i}/x.y", b"v"))
    got = sub.received()
    assert len(got) == 10_050
    assert [p.topic for p in got[:2]] == ["b/0/x.y", "b/1/x.y"] and got[-1].topic == "b/10049/x.y"
    assert 0 < len(world.hub.topics) <= 10_000
    pub.send(mq.Publish("b/0/x.y", b"again"))  # long since dropped from the map: mapped afresh
    assert sub.received() == [mq.Publish("b/0/x.y", b"again", 0, False, False, None)]


@BOTH
def test_a_topic_mqtt_cannot_name_is_skipped_each_time_and_others_still_come(world, level):
    """A STOMP topic with a level holding '#' has no MQTT name: not delivered, first time or remembered."""
    from core.message import Message

    sub = world.subscriber("sub", "b/#", 0, level)
    for body in (b"one", b"two"):
        world.broker.send(Message(world.broker.new_message_id(), "topic://b.x#y", body, {}))
    world.broker.send(Message(world.broker.new_message_id(), "topic://b.ok", b"named", {}))
    assert [(p.topic, p.payload) for p in sub.received()] == [("b/ok", b"named")]
    assert world.hub.topics["topic://b.x#y"] == ""


@BOTH
def test_qos1_publish_is_acknowledged_and_delivered_at_qos1(world, level):
    sub, pub = world.pair("s/t", 1, level)
    pub.send(mq.Publish("s/t", b"one", 1, False, False, 7))
    assert pub.received() == [mq.Puback(7)]
    (delivery,) = sub.received()
    assert (delivery.topic, delivery.payload, delivery.qos, delivery.dup, delivery.retain) == ("s/t", b"one", 1, False, False)
    assert delivery.packet_id
    sub.send(mq.Puback(delivery.packet_id))
    assert sub.received() == [] and not sub.closed


@BOTH
def test_qos2_flow_in_both_directions(world, level):
    sub, pub = world.pair("s/t", 2, level)
    pub.send(mq.Publish("s/t", b"two", 2, False, False, 9))
    assert pub.received() == [mq.Pubrec(9)]
    (delivery,) = sub.received()  # routed at PUBLISH, before PUBREL
    assert (delivery.payload, delivery.qos) == (b"two", 2) and delivery.packet_id
    pid = delivery.packet_id
    # The publisher resends before its PUBREL: acknowledged again, not routed twice.
    pub.send(mq.Publish("s/t", b"two", 2, False, True, 9))
    assert pub.received() == [mq.Pubrec(9)]
    assert sub.received() == []
    pub.send(mq.Pubrel(9))
    assert pub.received() == [mq.Pubcomp(9)]
    # Outbound: PUBREC from the subscriber gets PUBREL with the same id, PUBCOMP ends it.
    sub.send(mq.Pubrec(pid))
    assert sub.received() == [mq.Pubrel(pid)]
    sub.send(mq.Pubcomp(pid))
    assert sub.received() == [] and not sub.closed


@pytest.mark.parametrize(("published", "granted", "delivered"), [(2, 1, 1), (1, 2, 1), (0, 2, 0), (2, 0, 0)])
def test_delivery_qos_is_the_lower_of_published_and_granted(world, published, granted, delivered):
    sub, pub = world.pair("q/t", granted)
    pub.send(mq.Publish("q/t", b"m", published, False, False, 1 if published else None))
    (delivery,) = sub.received()
    assert delivery.qos == delivered
    assert (delivery.packet_id is None) == (delivered == 0)


# -- retained messages ----------------------------------------------------------------


@BOTH
def test_retained_message_follows_the_suback_of_a_new_subscription(world, level):
    live = world.subscriber("live", "r/#", 1, level)
    pub = world.connected("pub", level)
    pub.send(mq.Publish("r/t", b"kept", 1, True, False, 3))
    assert pub.received() == [mq.Puback(3)]
    (to_live,) = live.received()
    assert (to_live.payload, to_live.retain) == (b"kept", False)  # an established subscription: retain 0
    late = world.connected("late", level)
    assert late.subscribe(1, ("r/+", 1)) == [1]
    (retained,) = late.after_suback
    assert (retained.topic, retained.payload, retained.qos, retained.retain) == ("r/t", b"kept", 1, True)


# -- sessions that outlive the connection ----------------------------------------------


@BOTH
def test_persistent_session_keeps_qos1_messages_while_offline(world, level):
    sub = world.resume("durable", level, present=False)
    assert sub.subscribe(1, ("p/t", 1)) == [1]
    sub.send(mq.Disconnect())
    assert sub.closed
    pub = world.connected("pub", level)
    pub.send(mq.Publish("p/t", b"while away", 1, False, False, 1), mq.Publish("p/t", b"qos0, dropped", 0))
    back = world.resume("durable", level)
    (queued,) = back.after_connack
    assert (queued.topic, queued.payload, queued.qos) == ("p/t", b"while away", 1)
    back.send(mq.Puback(queued.packet_id))
    # The subscription is still there.
    pub.send(mq.Publish("p/t", b"live", 0))
    assert [p.payload for p in back.received()] == [b"live"]


@BOTH
def test_clean_start_discards_the_old_session(world, level):
    sub = world.subscriber("fresh", "c/t", 1, level, **persistent(level))
    sub.send(mq.Disconnect())
    pub = world.connected("pub", level)
    pub.send(mq.Publish("c/t", b"for the old session", 1, False, False, 1))
    again = world.client(level)
    assert again.connect("fresh", clean=True).session_present is False
    assert again.after_connack == []
    pub.send(mq.Publish("c/t", b"nobody", 0))
    assert again.received() == []
    again.send(mq.Disconnect())
    # Gone for good: a later persistent session starts empty, without the old queue or subscription.
    later = world.resume("fresh", level, present=False)
    assert later.after_connack == []
    pub.send(mq.Publish("c/t", b"nobody either", 1, False, False, 2))
    assert later.received() == []


@BOTH
def test_unacknowledged_qos1_is_resent_with_dup_and_the_same_packet_id(world, level):
    sub, pub = world.pair("d/t", 1, level, **persistent(level))
    pub.send(mq.Publish("d/t", b"again", 1, False, False, 1))
    (first,) = sub.received()
    assert first.dup is False
    sub.session.connection_lost()
    back = world.resume("sub", level)
    (resent,) = back.after_connack
    assert (resent.payload, resent.dup, resent.packet_id) == (b"again", True, first.packet_id)
    back.send(mq.Puback(resent.packet_id), mq.Disconnect())
    assert world.resume("sub", level).after_connack == []  # the PUBACK settled it


@BOTH
def test_pubrel_is_resent_on_reconnect_until_pubcomp(world, level):
    sub, pub = world.pair("h/t", 2, level, **persistent(level))
    pub.send(mq.Publish("h/t", b"exactly once", 2, False, False, 1))
    (delivery,) = sub.received()
    sub.send(mq.Pubrec(delivery.packet_id))
    assert sub.received() == [mq.Pubrel(delivery.packet_id)]
    sub.session.connection_lost()  # before PUBCOMP
    back = world.resume("sub", level)
    assert back.after_connack == [mq.Pubrel(delivery.packet_id)]  # not the PUBLISH again
    back.send(mq.Pubcomp(delivery.packet_id), mq.Disconnect())
    assert world.resume("sub", level).after_connack == []


@BOTH
def test_second_connection_with_the_same_id_takes_the_session_over(world, level):
    first = world.subscriber("same", "o/t", 1, level, **persistent(level))
    second = world.resume("same", level)
    assert first.received() == ended(level, ReasonCode.SESSION_TAKEN_OVER, "another connection uses this client id")
    assert first.closed and not second.closed
    pub = world.connected("pub", level)
    pub.send(mq.Publish("o/t", b"to the new one", 1, False, False, 1))
    (delivery,) = second.received()
    assert delivery.payload == b"to the new one"
    # The old connection's socket closing afterwards changes nothing: the PUBACK still settles it.
    first.session.connection_lost()
    second.send(mq.Puback(delivery.packet_id), mq.Disconnect())
    assert world.resume("same", level).after_connack == []


# -- MQTT 5 flow control and aliases ---------------------------------------------------


def test_receive_maximum_bounds_unacknowledged_qos1_deliveries(world):
    sub, pub = world.pair("m/t", 1, 5, receive_maximum=2)
    for i in range(5):
        pub.send(mq.Publish("m/t", b"%d" % i, 1, False, False, i + 1))
    first = sub.received()
    assert [p.payload for p in first] == [b"0", b"1"]
    sub.send(mq.Puback(first[0].packet_id))
    (third,) = sub.received()
    assert third.payload == b"2"
    sub.send(mq.Puback(first[1].packet_id), mq.Puback(third.packet_id))
    assert [p.payload for p in sub.received()] == [b"3", b"4"]


def test_receive_maximum_counts_a_qos2_delivery_until_pubcomp(world):
    sub, pub = world.pair("m/t", 2, 5, receive_maximum=1)
    pub.send(mq.Publish("m/t", b"a", 2, False, False, 1), mq.Publish("m/t", b"b", 2, False, False, 2))
    (a,) = sub.received()
    sub.send(mq.Pubrec(a.packet_id))
    assert sub.received() == [mq.Pubrel(a.packet_id)]  # still in flight
    sub.send(mq.Pubcomp(a.packet_id))
    (b,) = sub.received()
    assert (b.payload, b.qos) == (b"b", 2)


def test_one_receive_maximum_spans_shared_and_plain_subscriptions(world):
    sub = world.connected("sub", 5, receive_maximum=1)
    assert sub.subscribe(1, ("$share/g/sh/t", 1), ("pl/t", 1)) == [1, 1]
    pub = world.connected("pub", 5)
    pub.send(mq.Publish("sh/t", b"shared", 1, False, False, 1), mq.Publish("pl/t", b"plain", 1, False, False, 2))
    (first,) = sub.received()
    sub.send(mq.Puback(first.packet_id))
    (second,) = sub.received()
    assert {first.payload, second.payload} == {b"shared", b"plain"}


def test_qos0_deliveries_are_not_bounded_by_receive_maximum(world):
    sub, pub = world.pair("m/t", 0, 5, receive_maximum=1)
    for i in range(4):
        pub.send(mq.Publish("m/t", b"%d" % i))
    assert [p.payload for p in sub.received()] == [b"0", b"1", b"2", b"3"]


def test_outbound_topic_aliases_only_for_a_client_that_allows_them(world):
    sub, pub = world.pair("al/#", 0, 5, topic_alias_maximum=1)
    plain = world.subscriber("plain", "al/#", 0, 5)  # no topic alias maximum: 0
    pub.send(mq.Publish("al/x", b"1"), mq.Publish("al/x", b"2"), mq.Publish("al/y", b"3"))
    assert sub.received() == [
        mq.Publish("al/x", b"1", properties={"topic_alias": 1}),
        mq.Publish("", b"2", properties={"topic_alias": 1}),
        mq.Publish("al/y", b"3"),  # the one alias is taken
    ]
    assert plain.received() == [mq.Publish("al/x", b"1"), mq.Publish("al/x", b"2"), mq.Publish("al/y", b"3")]


def test_inbound_topic_alias_maps_to_the_topic_it_was_set_with(world):
    sub, pub = world.pair("in/#", 0, 5)
    pub.send(mq.Publish("in/x", b"set", properties={"topic_alias": 3}), mq.Publish("", b"used", properties={"topic_alias": 3}))
    assert sub.received() == [mq.Publish("in/x", b"set"), mq.Publish("in/x", b"used")]
    assert not pub.closed


@pytest.mark.parametrize(
    ("alias", "reason", "why"),
    [(101, ReasonCode.TOPIC_ALIAS_INVALID, "topic alias 101 is above the maximum"), (4, ReasonCode.PROTOCOL_ERROR, "topic alias 4 is not set")],
)
def test_bad_inbound_topic_alias_disconnects(world, alias, reason, why):
    pub = world.connected("pub", 5)
    pub.send(mq.Publish("", b"x", properties={"topic_alias": alias}))
    assert pub.received() == ended(5, reason, why)
    assert pub.closed


# -- UNSUBSCRIBE -----------------------------------------------------------------------


@BOTH
def test_unsubscribe_gets_unsuback_and_stops_delivery(world, level):
    sub = world.subscriber("sub", "u/t", 0, level)
    sub.send(mq.Unsubscribe(4, ["u/t", "u/never"]))
    # 3.1.1 UNSUBACK carries only the packet id; 5.0 one reason code per filter.
    codes = [0, ReasonCode.NO_SUBSCRIPTION_EXISTED] if level == 5 else []
    assert sub.received() == [mq.Unsuback(4, codes)]
    pub = world.connected("pub", level)
    pub.send(mq.Publish("u/t", b"unheard"))
    assert sub.received() == []


# -- DISCONNECT, wills, errors ---------------------------------------------------------


@BOTH
def test_disconnect_closes_and_discards_the_will(world, level):
    c, watcher = world.with_will("polite", level)
    c.send(mq.Disconnect())
    assert c.closed and c.received() == []  # no DISCONNECT back
    c.session.connection_lost()
    assert watcher.received() == []


def test_disconnect_with_will_message_publishes_the_will(world):
    watcher = world.subscriber("watch", "will/#", 1)
    c = world.client(5)
    c.connect("leaving", will=mq.Will("will/leaving", b"bye", 1, False, {"content_type": "text/plain"}))
    c.send(mq.Disconnect(ReasonCode.DISCONNECT_WITH_WILL_MESSAGE))
    assert c.closed and c.received() == []
    (will,) = watcher.received()
    assert (will.topic, will.payload, will.qos) == ("will/leaving", b"bye", 1)


@pytest.mark.parametrize("reason", [ReasonCode.UNSPECIFIED_ERROR, ReasonCode.MALFORMED_PACKET, ReasonCode.QUOTA_EXCEEDED])
def test_disconnect_on_an_error_publishes_the_will(world, reason):
    """Only a normal disconnection (0x00) deletes the will (MQTT-3.1.2-10); a client ending on an error gets it sent."""
    c, watcher = world.with_will("failing", 5)
    c.send(mq.Disconnect(reason))
    assert c.closed and c.received() == []
    assert watcher.received() == [will_of("failing")]


@pytest.mark.parametrize("keep_alive", [0, 61])
def test_311_keep_alive_outside_the_server_limit_is_refused(keep_alive):
    """3.1.1 cannot be told a server keep-alive: CONNACK 2 (as Mosquitto's max_keepalive), not a drop later."""
    world = World(server_keep_alive=60)
    c = world.client(4)
    c.send(mq.Connect("MQTT", 4, True, keep_alive, "slow-pinger"))
    assert c.received() == [mq.Connack(False, mq.ConnackReturnCode.IDENTIFIER_REJECTED)]
    assert c.closed
    ok = world.connected("on-time", 4, keep_alive=60)
    world.elapse(89.9)
    assert not ok.closed


def test_50_keep_alive_above_the_server_limit_is_lowered_and_announced():
    world = World(server_keep_alive=60)
    c = world.client(5)
    connack = c.connect("told", keep_alive=0)
    assert connack.properties["server_keep_alive"] == 60
    world.elapse(89.9)
    assert not c.closed
    world.elapse(0.2)
    assert c.closed


@BOTH
def test_lost_connection_publishes_the_retained_will(world, level):
    c, watcher = world.with_will("dropped", level, retain=True)
    c.session.connection_lost()
    assert watcher.received() == [will_of("dropped")]  # retain 0 to an established subscription
    late = world.connected("late", level)
    late.subscribe(1, ("will/dropped", 0))
    assert late.after_suback == [will_of("dropped", retain=True)]


@BOTH
def test_malformed_packet_closes_the_connection(world, level):
    c, watcher = world.with_will("broken", level)
    c.session.data_received(b"\x30\xff\xff\xff\xff\x7f")  # a five-byte remaining length
    assert c.received() == ended(level, ReasonCode.MALFORMED_PACKET, "Malformed remaining length")
    assert c.closed
    assert watcher.received() == [will_of("broken")]


def test_a_read_is_handled_up_to_its_bad_bytes_and_their_acks_precede_the_disconnect():
    w = World(turns=True)  # output gathered until the reactor turn ends, as in the gateway
    sub, pub = w.pair("k/t", 0, 5)
    pub.session.data_received(mq.encode(mq.Publish("k/t", b"kept", 1, False, False, 5), 5) + b"\x00\x00")  # reserved type 0
    assert pub.received() == [mq.Puback(5), *ended(5, ReasonCode.MALFORMED_PACKET, "Reserved packet type 0")]
    assert pub.closed
    w.clock.advance(0)  # the turn ends
    assert sub.received() == [mq.Publish("k/t", b"kept")]
    assert pub.received() == []


@BOTH
def test_shutdown_tells_50_clients_why_and_publishes_the_will(world, level):
    c, watcher = world.with_will("bye", level)
    c.session.shutdown()
    assert c.received() == ended(level, ReasonCode.SERVER_SHUTTING_DOWN, "the broker is shutting down")
    assert c.closed
    # Not a DISCONNECT from the client: the will is due (5.0 3.1.2.5).
    assert watcher.received() == [will_of("bye")]


# -- back-pressure from the transport --------------------------------------------------


def test_paused_transport_holds_deliveries_until_resumed(world):
    sub, pub = world.pair("bp/t", 1)
    sub.session.pause_producing()
    pub.send(mq.Publish("bp/t", b"1", 1, False, False, 1), mq.Publish("bp/t", b"2", 0))
    assert pub.received() == [mq.Puback(1)]  # the publisher is not held up
    assert sub.received() == []
    sub.session.resume_producing()
    assert [(p.payload, p.qos) for p in sub.received()] == [(b"1", 1), (b"2", 0)]


# -- authentication and authorization ----------------------------------------------------------


class LaterAuthenticator:
    """Answers when the test says, as a slow hash off the reactor thread would."""

    def __init__(self, at_once: tuple[str, ...] = ()) -> None:
        self.pending: list[Any] = []
        self.at_once = at_once  # client ids answered at once (anonymous)

    def authenticate(self, credentials: Any, answer: Any) -> None:
        from core.access import ANONYMOUS

        if credentials.client_id in self.at_once:
            answer(ANONYMOUS, "")
        else:
            self.pending.append((credentials, answer))


class SensorsOnly:
    """Write and read below sensors/ only."""

    def allowed(self, principal: Any, permission: Any, destination: str, client_id: Any = None) -> bool:
        return destination.startswith("topic://sensors.")

    def reading(self, principal: Any, destination: str, client_id: Any = None) -> Any:
        from core.access import Reading

        return Reading.WHOLE if self.allowed(principal, None, destination) else Reading.REFUSED

    def reader(self, principal: Any, client_id: Any = None) -> None:
        return None

    version = 0


def secured_world(authenticator: Any = None, access: Any = None) -> World:
    from protocols.auth import Anonymous

    world = World()
    world.hub = MqttHub(world.broker, MqttSettings(), authenticator=authenticator or Anonymous(), access=access)
    return world


@BOTH
def test_packets_after_connect_wait_for_the_credentials(level):
    from core.access import Principal

    auth = LaterAuthenticator(at_once=("watcher",))
    world = secured_world(auth)
    sub = world.subscriber("watcher", "sensors/#", 1, level)
    c = world.client(level)
    c.send(
        mq.Connect("MQTT", level, True, 0, "dev1", username="dev1", password=b"pw"),
        mq.Publish("sensors/t", b"21", 1, False, packet_id=5),
    )
    ((credentials, answer),) = auth.pending
    assert (credentials.login, credentials.secret, credentials.client_id) == ("dev1", b"pw", "dev1")
    assert c.received() == [] and c.transport.paused == {"authenticating"}
    answer(Principal("dev1"), "")
    connack, puback = c.received()
    assert connack.reason_code == 0 and puback == mq.Puback(5)
    assert c.transport.paused == set()
    assert [p.payload for p in sub.received()] == [b"21"]


@pytest.mark.parametrize(("level", "username", "code"), [
    (4, "dev1", mq.ConnackReturnCode.BAD_USERNAME_OR_PASSWORD),
    (4, None, mq.ConnackReturnCode.NOT_AUTHORIZED),
    (5, "dev1", ReasonCode.BAD_USER_NAME_OR_PASSWORD),
    (5, None, ReasonCode.NOT_AUTHORIZED),
])
def test_refused_credentials_get_the_connack_of_the_level(level, username, code):
    auth = LaterAuthenticator()
    world = secured_world(auth)
    c = world.client(level)
    c.send(mq.Connect("MQTT", level, True, 0, "dev1", username=username, password=b"nope" if username else None))
    auth.pending[0][1](None, "bad user name or password")
    (connack,) = c.received()
    assert connack.reason_code == code and not connack.session_present and c.closed
    assert "dev1" not in world.hub.clients


@BOTH
def test_denied_publish_and_subscribe(level):
    world = secured_world(access=SensorsOnly())
    sub = world.subscriber("watcher", "sensors/#", 1, level)
    c = world.connected("dev1", level)
    assert c.subscribe(2, ("admin/#", 1), ("sensors/a", 1)) == [ReasonCode.NOT_AUTHORIZED if level == 5 else 0x80, 1]
    c.send(mq.Publish("admin/cmd", b"x", 1, False, packet_id=3))
    if level == 5:
        assert c.received() == [mq.Puback(3, ReasonCode.NOT_AUTHORIZED, {"reason_string": "publishing to admin/cmd is not allowed for this user"})]
    else:
        assert c.received() == [mq.Puback(3)]  # 3.1.1 cannot be told: acknowledged and dropped
    assert not c.closed and sub.received() == []
    c.send(mq.Publish("sensors/a", b"ok", 1, False, packet_id=4))
    assert mq.Puback(4) in c.received()
    assert [p.payload for p in sub.received()] == [b"ok"]


class CountedRules:
    """The real rules, counting the checks that reach them."""

    def __init__(self, rules: list) -> None:
        from core.access import Rules

        self.rules = Rules(rules)
        self.checks = 0

    @property
    def version(self) -> int:
        return self.rules.version

    def allowed(self, principal: Any, permission: Any, destination: str, client_id: Any = None) -> bool:
        self.checks += 1
        return self.rules.allowed(principal, permission, destination, client_id)

    def reading(self, principal: Any, destination: str, client_id: Any = None) -> Any:
        return self.rules.reading(principal, destination, client_id)

    def reader(self, principal: Any, client_id: Any = None) -> Any:
        return self.rules.reader(principal, client_id)


@BOTH
def test_a_publish_check_is_remembered_per_topic_until_the_rules_are_reloaded(level):
    from core.access import Permission, Rule

    allow = Rule("*", True, frozenset({Permission.READ, Permission.WRITE}), ("topic://sensors.>",))
    deny = Rule("*", False, frozenset({Permission.WRITE}), ("topic://sensors.b",))
    access = CountedRules([allow])
    world = secured_world(access=access)
    sub = world.subscriber("watcher", "sensors/#", 1, level)
    c = world.connected("dev1", level)
    checks = access.checks
    for n, topic in enumerate(["sensors/a", "sensors/a", "sensors/b", "sensors/b", "sensors/b"]):
        c.send(mq.Publish(topic, b"%d" % n, 1, False, packet_id=n + 1))
    assert access.checks - checks == 2  # one per change of topic
    assert [p.payload for p in sub.received()] == [b"0", b"1", b"2", b"3", b"4"]
    # A reload (SIGHUP) that denies sensors/b: the remembered decision goes with the old rules.
    access.rules.replace([allow, deny])
    c.send(mq.Publish("sensors/b", b"denied", 1, False, packet_id=10))
    assert sub.received() == [] and access.checks - checks == 3
    c.send(mq.Publish("sensors/a", b"still", 1, False, packet_id=11))
    assert [p.payload for p in sub.received()] == [b"still"]


def paho_rules(*extra: Any) -> Any:
    """The rules the Eclipse Paho interoperability suites assume: everything but reading test/nosubscribe."""
    from core.access import Rule, Rules

    return Rules([
        Rule.parse("*", "allow", ["read", "write"], ["topic://>"]),
        Rule.parse("*", "deny", ["read"], ["topic://test.nosubscribe"]),
        *extra,
    ])


@BOTH
def test_wildcards_a_deny_overlaps_are_granted_at_their_qos_and_filtered_at_delivery(level):
    world = secured_world(access=paho_rules())
    pub = world.connected("pub", level)
    pub.send(mq.Publish("test/nosubscribe", b"retained, denied", 1, True, False, 1), mq.Publish("TopicA/B", b"retained", 1, True, False, 2))
    assert pub.received() == [mq.Puback(1), mq.Puback(2)]
    sub = world.connected("sub", level)
    refused = ReasonCode.NOT_AUTHORIZED if level == 5 else 0x80
    assert sub.subscribe(1, ("#", 1), ("+/+", 2), ("test/nosubscribe", 1), ("$SYS/#", 0)) == [1, 2, refused, refused]
    # The retained messages of each granted filter, but the denied one (skipped for both).
    assert [(p.topic, p.retain) for p in sub.after_suback] == [("TopicA/B", True)] * 2
    for p in sub.after_suback:
        sub.send(mq.Puback(p.packet_id))
    for n, topic in enumerate(["test/nosubscribe", "TopicA/B", "test/other", "test/nosubscribe/below"]):
        pub.send(mq.Publish(topic, topic.encode(), 1, False, False, 10 + n))
    got = sub.received()
    assert [(p.topic, p.qos) for p in got] == [("TopicA/B", 1), ("test/other", 1), ("test/nosubscribe/below", 1)]
    assert sub.session.conn is not None and sub.session.conn.messages_denied == 3  # two retained, one live
    for p in got:
        sub.send(mq.Puback(p.packet_id))
    sub.send(mq.Disconnect())
    assert world.broker.deliveries_denied == 3  # still counted once the connection is gone


@BOTH
def test_only_the_subscriptions_a_deny_overlaps_carry_a_check(level):
    world = secured_world(access=paho_rules())
    sub = world.connected("sub", level)
    assert sub.subscribe(1, ("TopicA/#", 0), ("$share/g/TopicA/+", 0)) == [0, 0]
    live = sub.session.live
    assert live is not None and live.consumer is not None
    assert live.consumer.check is None and all(c.check is None for c in live.shared_consumers.values())
    assert sub.subscribe(2, ("$share/g/#", 0)) == [0]
    assert live.consumer.check is None  # the session's own queue gets nothing the deny touches
    assert {f: c.check is not None for f, c in live.shared_consumers.items()} == {"$share/g/TopicA/+": False, "$share/g/#": True}
    assert sub.subscribe(3, ("+/nosubscribe", 0)) == [0]
    assert live.consumer.check is not None
    sub.send(mq.Unsubscribe(4, ["+/nosubscribe"]))
    assert live.consumer.check is None


@BOTH
def test_a_shared_group_never_gets_a_denied_message(level):
    world = secured_world(access=paho_rules())
    members = [world.connected(f"m{i}", level) for i in range(2)]
    for m in members:
        assert m.subscribe(1, ("$share/g/test/+", 1)) == [1]
    pub = world.connected("pub", level)
    for n in range(4):
        pub.send(mq.Publish("test/nosubscribe", b"no", 1, False, False, 1 + 2 * n), mq.Publish("test/yes", b"%d" % n, 1, False, False, 2 + 2 * n))
    got = [p for m in members for p in m.received()]
    assert sorted(p.payload for p in got) == [b"0", b"1", b"2", b"3"]


@BOTH
def test_a_resumed_session_is_filtered_by_the_rules_of_its_return(level):
    from core.access import Rule

    access = paho_rules()
    world = secured_world(access=access)
    sub = world.resume("keeper", level, present=False)
    assert sub.subscribe(1, ("TopicA/#", 1), ("test/#", 1)) == [1, 1]
    sub.send(mq.Disconnect())
    pub = world.connected("pub", level)
    for n, topic in enumerate(["test/nosubscribe", "TopicA/secret", "TopicA/B", "test/x"]):
        pub.send(mq.Publish(topic, topic.encode(), 1, False, False, n + 1))
    # Away, the rules change: TopicA/secret is denied too (TopicA/# was granted whole).
    access.replace([*access.rules, Rule.parse("*", "deny", ["read"], ["topic://TopicA.secret"])])
    back = world.resume("keeper", level)
    assert [p.topic for p in back.after_connack] == ["TopicA/B", "test/x"]
    assert world.broker.durable_queues["mqtt:keeper"].inflight == 2 and len(world.broker.durable_queues["mqtt:keeper"]) == 0


@BOTH
def test_a_reload_checks_the_next_delivery_of_every_subscription(level):
    from core.access import Rule

    access = paho_rules()
    world = secured_world(access=access)
    sub, pub = world.subscriber("sub", "TopicA/#", 0, level), world.connected("pub", level)
    live = sub.session.live
    assert live is not None and live.consumer is not None and live.consumer.check is None
    allow, deny = access.rules
    access.replace([allow, deny, Rule.parse("*", "deny", ["read"], ["topic://TopicA.secret"])])  # SIGHUP
    assert live.consumer.check is not None
    pub.send(mq.Publish("TopicA/secret", b"now denied", 0), mq.Publish("TopicA/B", b"still", 0))
    assert [p.payload for p in sub.received()] == [b"still"]
    access.replace([allow, deny])  # and back: nothing left to check
    assert live.consumer.check is None
    pub.send(mq.Publish("TopicA/secret", b"allowed again", 0))
    assert [p.payload for p in sub.received()] == [b"allowed again"]
    # Rules that no longer let the filter in at all: its deliveries stop, the client stays connected.
    access.replace([Rule.parse("*", "allow", ["write"], ["topic://>"])])
    pub.send(mq.Publish("TopicA/B", b"not any more", 0))
    assert sub.received() == [] and not sub.closed


@BOTH
def test_a_will_the_user_may_not_publish_refuses_the_connect(level):
    world = secured_world(access=SensorsOnly())
    c = world.client(level)
    c.send(mq.Connect("MQTT", level, True, 0, "dev1", will=mq.Will("admin/gone", b"x", 0, False)))
    (connack,) = c.received()
    assert connack.reason_code == (ReasonCode.NOT_AUTHORIZED if level == 5 else mq.ConnackReturnCode.NOT_AUTHORIZED)
    assert c.closed


# -- the shared lifecycle: producer flow control, why a session ended ----------------------------


@BOTH
def test_a_stored_publish_while_the_store_is_full_holds_the_publisher_until_there_is_room(world, level):
    keeper = world.subscriber("keeper", "t/#", 1, level, **persistent(level))  # its messages are stored
    pub = world.connected("pub", level)
    usage = world.broker.store_usage
    usage.set_alarm("Disk space low", "free disk space is below the floor")
    pub.send(mq.Publish("t/0", b"at qos 0: not stored for the publisher's sake", 0, False))
    assert pub.transport.paused == set() and pub.session.hold is None
    pub.send(mq.Publish("t/1", b"stored", 1, False, packet_id=1))
    assert pub.transport.paused == {"store limit"} and pub.session.hold is not None
    assert pub.received() == [mq.Puback(1)]  # accepted: what was read is handled, only reading stops
    usage.set_alarm("", None)
    assert pub.transport.paused == set() and pub.session.hold is None
    assert [p.payload for p in keeper.received()][-1] == b"stored"


@BOTH
def test_under_the_fail_policy_a_qos_publish_is_refused_while_the_store_is_full(level):
    from core.policy import Policy

    world = World()
    world.broker.policy = Policy(store_full_policy="fail")
    pub = world.connected("pub", level)
    world.broker.store_usage.set_alarm("Disk space low", "free disk space is below the floor")
    pub.send(mq.Publish("t/1", b"refused", 1, False, packet_id=1))
    if level == 5:
        assert pub.received() == [mq.Puback(1, ReasonCode.QUOTA_EXCEEDED, {"reason_string": "free disk space is below the floor"})]
        assert not pub.closed
    else:
        assert pub.closed  # 3.1.1 has no way to say so but the close
    assert pub.transport.paused == set()


def test_why_a_session_ended_is_kept_for_the_websocket_close_frame(world):
    from protocols.lifecycle import CloseReason

    clean, broken, stopped, operated = (world.connected(name, 5) for name in ("clean", "broken", "stopped", "operated"))
    clean.send(mq.Disconnect())
    broken.send(mq.Connect("MQTT", 5, True, 0, "again"))
    stopped.session.shutdown()
    operated.session.close_by_admin("maintenance")
    assert [c.session.close_reason for c in (clean, broken, stopped, operated)] == [
        CloseReason.NORMAL, CloseReason.ERROR, CloseReason.SHUTDOWN, CloseReason.ADMIN,
    ]
    assert all(c.closed for c in (clean, broken, stopped, operated))
    assert world.client().session.gate is not None and clean.session.gate is None  # kept only until CONNECT
