"""The dispatcher through the core API, with a virtual clock and no sockets."""
from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from core.broker import Broker
from core.consumer import AckMode
from core.destination import InvalidDestination
from core.entry import Entry
from core.errors import (
    BrokerError,
    SubscriptionError,
    UnknownDelivery,
    UnknownDestination,
    UnknownTransaction,
)
from core.message import Message
from core.policy import Policy
from core.storage import RECORD_OVERHEAD
from persistence.memory import MemoryStore


class Sink:
    def __init__(self):
        self.got = []  # (body, tag, redeliveries)

    def __call__(self, consumer, entry, tag):
        self.got.append((entry.message.body.decode(), tag, entry.redeliveries))

    @property
    def bodies(self):
        return [b for b, _, _ in self.got]


def make(policy=None, store=None):
    clock = Clock()
    clock.advance(1_000_000)
    broker = Broker(store or MemoryStore(), clock, policy or Policy())
    broker.start()
    return broker, clock


def msg(broker, dest, body, **kw):
    return Message(broker.new_message_id(), dest, body.encode(), timestamp=broker.now_ms(), **kw)


def send(conn, dest, *bodies, **kw):
    for body in bodies:
        conn.send(msg(conn.broker, dest, body, **kw))


def test_round_robin_over_consumers_with_credit():
    broker, _ = make()
    c = broker.connect()
    sinks = [Sink(), Sink(), Sink()]
    for s in sinks:
        c.subscribe("queue://q", s, ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=2)
    send(c, "queue://q", *[str(i) for i in range(9)])
    assert [s.bodies for s in sinks] == [["0", "3"], ["1", "4"], ["2", "5"]]
    assert len(broker.queues["queue://q"]) == 3
    consumer = next(iter(c.consumers.values()))
    c.ack(consumer, sinks[0].got[0][1])
    assert sinks[0].bodies == ["0", "3", "6"]


def test_client_ack_is_cumulative_and_unknown_tag_refused():
    broker, _ = make()
    c = broker.connect()
    sink = Sink()
    consumer = c.subscribe("queue://q", sink, ack_mode=AckMode.CLIENT)
    send(c, "queue://q", "a", "b", "c")
    c.ack(consumer, sink.got[1][1])
    assert list(consumer.unacked) == [sink.got[2][1]]
    with pytest.raises(UnknownDelivery):
        c.ack(consumer, sink.got[0][1])


def test_consumer_loss_redelivers_in_order_marked_redelivered():
    broker, _ = make()
    c1, c2 = broker.connect(), broker.connect()
    s1 = Sink()
    c1.subscribe("queue://q", s1, ack_mode=AckMode.CLIENT_INDIVIDUAL)
    send(c2, "queue://q", "a", "b", "c")
    c1.close()
    s2 = Sink()
    c2.subscribe("queue://q", s2, ack_mode=AckMode.CLIENT_INDIVIDUAL)
    assert s2.got and [(b, r) for b, _, r in s2.got] == [("a", 1), ("b", 1), ("c", 1)]


def test_nack_past_max_redeliveries_goes_to_dlq_with_reason():
    broker, _ = make(Policy(max_redeliveries=2))
    c = broker.connect()
    sink = Sink()
    consumer = c.subscribe("queue://q", sink, ack_mode=AckMode.CLIENT_INDIVIDUAL)
    send(c, "queue://q", "poison")
    for _ in range(3):
        c.nack(consumer, sink.got[-1][1])
    assert [r for _, _, r in sink.got] == [0, 1, 2]
    (entry,) = broker.queues["queue://DLQ"].messages()
    assert entry.message.body == b"poison"
    assert entry.message.headers["originalDestination"] == "queue://q"
    assert "delivery failed 3 times" in entry.message.headers["dlqDeliveryFailureCause"]


def test_redelivery_delay_with_backoff():
    broker, clock = make(Policy(redelivery_delay_ms=1000, redelivery_backoff=2.0))
    c = broker.connect()
    sink = Sink()
    consumer = c.subscribe("queue://q", sink, ack_mode=AckMode.CLIENT_INDIVIDUAL)
    send(c, "queue://q", "x")
    c.nack(consumer, sink.got[-1][1])
    clock.advance(0.9)
    assert len(sink.got) == 1
    clock.advance(0.2)
    assert len(sink.got) == 2
    c.nack(consumer, sink.got[-1][1])
    clock.advance(1.5)
    assert len(sink.got) == 2
    clock.advance(0.6)
    assert len(sink.got) == 3


def test_priority_then_fifo():
    broker, _ = make()
    c = broker.connect()
    for i, p in enumerate([1, 9, 4, 9, 1, 4]):
        send(c, "queue://q", f"{p}-{i}", priority=p)
    sink = Sink()
    c.subscribe("queue://q", sink)
    assert sink.bodies == ["9-1", "9-3", "4-2", "4-5", "1-0", "1-4"]


def test_expired_never_delivered_and_swept_to_dlq():
    broker, clock = make()
    c = broker.connect()
    now = broker.now_ms()
    send(c, "queue://q", "old", expiration=now + 500)
    send(c, "queue://q", "fresh", expiration=now + 60_000)
    send(c, "queue://idle", "idle", expiration=now + 500)
    clock.advance(1.0)  # past the first expiry; the sweep runs every second
    sink = Sink()
    c.subscribe("queue://q", sink)
    assert sink.bodies == ["fresh"]
    dead = [e.message.body for e in broker.queues["queue://DLQ"].messages()]
    assert sorted(dead) == [b"idle", b"old"]


def test_expired_dropped_when_policy_says_so():
    broker, clock = make(Policy(expired_to_dlq=False))
    c = broker.connect()
    send(c, "queue://q", "old", expiration=broker.now_ms() + 10)
    clock.advance(1.0)
    assert len(broker.queues["queue://q"]) == 0
    assert "queue://DLQ" not in broker.queues


def test_groups_stick_and_move_when_owner_leaves():
    broker, _ = make()
    producer = broker.connect()
    conns = [broker.connect() for _ in range(2)]
    sinks = [Sink(), Sink()]
    consumers = [c.subscribe("queue://q", s, ack_mode=AckMode.CLIENT_INDIVIDUAL) for c, s in zip(conns, sinks)]
    for i in range(6):
        send(producer, "queue://q", f"{'AB'[i % 2]}{i}", group_id="AB"[i % 2])
    assert {b[0] for b in sinks[0].bodies} == {"A"} and {b[0] for b in sinks[1].bodies} == {"B"}
    conns[0].close()
    assert sinks[1].bodies == ["B1", "B3", "B5", "A0", "A2", "A4"]
    send(producer, "queue://q", "A6", group_id="A")
    assert sinks[1].bodies[-1] == "A6"
    assert broker.queues["queue://q"].groups["A"] is consumers[1]


def test_group_close_releases_owner():
    broker, _ = make()
    p = broker.connect()
    s1, s2 = Sink(), Sink()
    p.subscribe("queue://q", s1)
    p.subscribe("queue://q", s2)
    send(p, "queue://q", "g1", group_id="g")
    send(p, "queue://q", "g2", group_id="g", group_seq=-1)
    assert "g" not in broker.queues["queue://q"].groups
    assert s1.bodies == ["g1", "g2"]


def test_exclusive_consumer_and_failover_in_subscription_order():
    broker, _ = make()
    p = broker.connect()
    conns = [broker.connect() for _ in range(3)]
    sinks = [Sink() for _ in range(3)]
    for c, s in zip(conns, sinks):
        c.subscribe("queue://q", s, ack_mode=AckMode.CLIENT_INDIVIDUAL, exclusive=True)
    send(p, "queue://q", "1", "2")
    assert sinks[0].bodies == ["1", "2"] and sinks[1].bodies == [] == sinks[2].bodies
    conns[0].close()
    assert [(b, r) for b, _, r in sinks[1].got] == [("1", 1), ("2", 1)]
    send(p, "queue://q", "3")
    assert sinks[1].bodies[-1] == "3" and sinks[2].bodies == []


def test_selector_leaves_non_matching_in_queue():
    broker, _ = make()
    c = broker.connect()
    red = Sink()
    c.subscribe("queue://q", red, selector="color = 'red'")
    send(c, "queue://q", "r1")
    c.send(Message(broker.new_message_id(), "queue://q", b"b1", {"color": "blue"}))
    c.send(Message(broker.new_message_id(), "queue://q", b"r2", {"color": "red"}))
    assert red.bodies == ["r2"]
    assert [e.message.body for e in broker.queues["queue://q"].messages()] == [b"r1", b"b1"]
    with pytest.raises(SubscriptionError, match="invalid selector"):
        c.subscribe("queue://q", Sink(), selector="color = ")


def test_transaction_commit_and_abort():
    broker, _ = make()
    c = broker.connect()
    sink = Sink()
    consumer = c.subscribe("queue://q", sink, ack_mode=AckMode.CLIENT_INDIVIDUAL)
    c.begin("t1")
    c.send(msg(broker, "queue://q", "tx"), "t1")
    assert sink.bodies == []
    c.commit("t1")
    assert sink.bodies == ["tx"]
    c.begin("t2")
    c.ack(consumer, sink.got[0][1], "t2")
    c.abort("t2")
    assert [(b, r) for b, _, r in sink.got] == [("tx", 0), ("tx", 1)]
    with pytest.raises(UnknownTransaction):
        c.commit("nope")
    c.begin("t3")
    with pytest.raises(BrokerError):
        c.begin("t3")


def test_topic_fanout_wildcards_and_no_local():
    broker, _ = make()
    a, b = broker.connect(), broker.connect()
    exact, wild, rest, mine = Sink(), Sink(), Sink(), Sink()
    b.subscribe("topic://s.t.x", exact)
    b.subscribe("topic://s.*.x", wild)
    b.subscribe("topic://s.>", rest)
    a.subscribe("topic://s.>", mine, no_local=True)
    send(a, "topic://s.t.x", "1")
    send(a, "topic://s.u", "2")
    assert exact.bodies == ["1"] and wild.bodies == ["1"] and rest.bodies == ["1", "2"]
    assert mine.bodies == []


def test_durable_subscription_keeps_messages_while_away_one_stored_copy():
    store = MemoryStore()
    broker, _ = make(store=store)
    sub_conn = broker.connect(client_id="app")
    sink = Sink()
    consumer = sub_conn.subscribe("topic://news", sink, durable_name="n1", ack_mode=AckMode.CLIENT_INDIVIDUAL)
    other = broker.connect(client_id="app2")
    other.subscribe("topic://news", Sink(), durable_name="n2", ack_mode=AckMode.CLIENT_INDIVIDUAL)
    sub_conn.unsubscribe(consumer)
    p = broker.connect()
    send(p, "topic://news", "a", "b", persistent=True)
    assert [seq for seq, _ in store.iter_messages("topic://news")] and len(list(store.iter_messages("topic://news"))) == 2
    sink2 = Sink()
    sub_conn.subscribe("topic://news", sink2, durable_name="n1", ack_mode=AckMode.CLIENT_INDIVIDUAL)
    assert sink2.bodies == ["a", "b"]
    with pytest.raises(SubscriptionError, match="already active"):
        broker.connect(client_id="app").subscribe("topic://news", Sink(), durable_name="n1")
    with pytest.raises(SubscriptionError, match="client id"):
        p.subscribe("topic://news", Sink(), durable_name="x")


def test_recovery_rebuilds_queues_durables_and_scheduled():
    store = MemoryStore()
    broker, clock = make(store=store)
    c = broker.connect(client_id="app")
    consumer = c.subscribe("topic://t", Sink(), durable_name="d", ack_mode=AckMode.CLIENT_INDIVIDUAL)
    c.unsubscribe(consumer)
    send(c, "queue://q", "p1", persistent=True, priority=1)
    send(c, "queue://q", "p9", persistent=True, priority=9)
    send(c, "queue://q", "transient")
    send(c, "topic://t", "t1", persistent=True)
    c.send(msg(broker, "queue://later", "s1", persistent=True), delay_ms=5000)
    broker.stop()

    again, clock2 = make(store=store.reopen())
    c2 = again.connect(client_id="app")
    sink = Sink()
    c2.subscribe("queue://q", sink)
    assert sink.bodies == ["p9", "p1"]
    dsink = Sink()
    c2.subscribe("topic://t", dsink, durable_name="d")
    assert dsink.bodies == ["t1"]
    assert again.scheduled_count == 1
    clock2.advance(6)
    assert [e.message.body for e in again.queues["queue://later"].messages()] == [b"s1"]
    # New messages sort after recovered ones.
    assert again.next_seq() > max(s for s, _ in store.iter_messages("queue://q"))


def test_acked_persistent_messages_leave_the_store():
    store = MemoryStore()
    broker, _ = make(store=store)
    c = broker.connect()
    sink = Sink()
    consumer = c.subscribe("queue://q", sink, ack_mode=AckMode.CLIENT_INDIVIDUAL)
    send(c, "queue://q", "a", "b", persistent=True)
    assert len(list(store.iter_messages("queue://q"))) == 2
    c.ack(consumer, sink.got[0][1])
    assert [d for _, d in store.iter_messages("queue://q")] and len(list(store.iter_messages("queue://q"))) == 1


def test_temp_queue_lives_and_dies_with_its_connection():
    broker, _ = make()
    owner, other = broker.connect(), broker.connect()
    name = owner.temp_queue("replies")
    sink = Sink()
    owner.subscribe(name, sink)
    send(other, name, "reply")
    assert sink.bodies == ["reply"]
    with pytest.raises(SubscriptionError):
        other.subscribe(name, Sink())
    owner.close()
    with pytest.raises(UnknownDestination):
        send(other, name, "late")


def test_scheduled_delivery_waits():
    broker, clock = make()
    c = broker.connect()
    sink = Sink()
    c.subscribe("queue://q", sink)
    c.send(msg(broker, "queue://q", "later"), delay_ms=2000)
    c.send(msg(broker, "queue://q", "sooner"), delay_ms=1000)
    clock.advance(1.5)
    assert sink.bodies == ["sooner"]
    clock.advance(1.0)
    assert sink.bodies == ["sooner", "later"]


def test_retroactive_replays_last_n():
    broker, _ = make(Policy(retroactive_count=2))
    c = broker.connect()
    send(c, "topic://r", "1", "2", "3")
    retro, plain = Sink(), Sink()
    c.subscribe("topic://r", retro, retroactive=True)
    c.subscribe("topic://r", plain)
    assert retro.bodies == ["2", "3"] and plain.bodies == []


def test_paused_connection_gets_nothing_until_resumed():
    broker, _ = make()
    c = broker.connect()
    sink = Sink()
    c.subscribe("queue://q", sink)
    c.pause()
    send(broker.connect(), "queue://q", "a", "b")
    assert sink.bodies == []
    c.resume()
    assert sink.bodies == ["a", "b"]


def test_held_output_stops_deliveries_apart_from_the_sockets_pause():
    """A session holding all it may for the disk (protocols.outbox) takes its consumers' credit;
    giving it back while the socket is full does not resume them."""
    broker, _ = make()
    c = broker.connect()
    sink = Sink()
    c.subscribe("queue://q", sink)
    c.hold_output()
    send(broker.connect(), "queue://q", "a")
    assert sink.bodies == []
    c.pause()
    c.release_output()
    assert sink.bodies == []
    c.hold_output()
    c.resume()
    assert sink.bodies == []
    c.release_output()
    assert sink.bodies == ["a"]


def test_delivered_but_unacked_comes_back_redelivered_after_a_restart():
    store = MemoryStore()
    broker, clock = make(store=store)
    c = broker.connect()
    sink = Sink()
    c.subscribe("queue://q", sink, ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=1)
    send(c, "queue://q", "seen", "unseen", persistent=True)
    clock.advance(0)  # the delivered mark is written once per turn
    assert sink.bodies == ["seen"]

    again, _ = make(store=store.reopen())  # the process died: nothing was acked
    sink2 = Sink()
    again.connect().subscribe("queue://q", sink2, ack_mode=AckMode.CLIENT_INDIVIDUAL)
    assert [(b, r) for b, _, r in sink2.got] == [("seen", 1), ("unseen", 0)]


def test_queue_beyond_its_memory_limit_pages_through_the_store_in_order():
    store = MemoryStore()
    policy = Policy(queue_memory_limit=20 * 1400)  # about 20 messages of 1000 bytes
    broker, _ = make(policy, store)
    c = broker.connect()
    for i in range(100):
        c.send(Message(broker.new_message_id(), "queue://deep", b"%04d" % i + b"x" * 996, persistent=True))
    queue = broker.queues["queue://deep"]
    assert len(queue) == 100 and queue.pending.size <= 21 and queue.paged >= 79
    assert queue.pending.bytes <= policy.queue_memory_limit + 1400
    sink = Sink()
    consumer = c.subscribe("queue://deep", sink, ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=10)
    seen = []
    while len(seen) < 100:
        assert sink.got, f"stalled after {len(seen)}"
        body, tag, _ = sink.got.pop(0)
        seen.append(body[:4])
        c.ack(consumer, tag)
    assert seen == ["%04d" % i for i in range(100)]
    assert len(queue) == 0 and not list(store.iter_messages("queue://deep"))


def test_recovery_leaves_a_deep_queue_in_the_store():
    store = MemoryStore()
    policy = Policy(queue_memory_limit=10 * 1400)
    broker, _ = make(policy, store)
    c = broker.connect()
    for i in range(50):
        c.send(Message(broker.new_message_id(), "queue://deep", b"%04d" % i + b"x" * 996, persistent=True))
    again, _ = make(policy, store.reopen())
    queue = again.queues["queue://deep"]
    assert len(queue) == 50 and queue.pending.size <= 11
    sink = Sink()
    again.connect().subscribe("queue://deep", sink)
    assert [b[:4] for b in sink.bodies] == ["%04d" % i for i in range(50)]


def test_purge_of_a_paged_queue_empties_the_store():
    store = MemoryStore()
    broker, _ = make(Policy(queue_memory_limit=5 * 1400), store)
    c = broker.connect()
    for i in range(30):
        c.send(Message(broker.new_message_id(), "queue://p", b"x" * 1000, persistent=True))
    assert broker.queues["queue://p"].purge() == 30
    assert len(broker.queues["queue://p"]) == 0 and not list(store.iter_messages("queue://p"))


def test_durable_subscription_backlog_pages_through_the_store():
    store = MemoryStore()
    policy = Policy(queue_memory_limit=10 * 1400)
    broker, _ = make(policy, store)
    sub = broker.connect(client_id="app")
    consumer = sub.subscribe("topic://t", Sink(), durable_name="d", ack_mode=AckMode.CLIENT_INDIVIDUAL)
    sub.unsubscribe(consumer)
    p = broker.connect()
    for i in range(60):
        p.send(Message(broker.new_message_id(), "topic://t", b"%04d" % i + b"x" * 996, persistent=True))
    queue = broker.durable_queues["app:d"]
    assert len(queue) == 60 and queue.pending.size <= 11
    sink = Sink()
    again = broker.connect(client_id="app")
    consumer = again.subscribe("topic://t", sink, durable_name="d", ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=5)
    seen = []
    while sink.got:
        body, tag, _ = sink.got.pop(0)
        seen.append(body[:4])
        again.ack(consumer, tag)
    assert seen == ["%04d" % i for i in range(60)]
    assert not list(store.iter_messages("topic://t"))  # one copy, deleted after the ack


def test_recovery_pages_a_deep_durable_backlog():
    store = MemoryStore()
    policy = Policy(queue_memory_limit=10 * 1400)
    broker, _ = make(policy, store)
    sub = broker.connect(client_id="app")
    sub.unsubscribe(sub.subscribe("topic://t", Sink(), durable_name="d"))
    p = broker.connect()
    for i in range(40):
        p.send(Message(broker.new_message_id(), "topic://t", b"%04d" % i + b"x" * 996, persistent=True))
    again, _ = make(policy, store.reopen())
    assert again.durable_queues["app:d"].pending.size <= 11
    sink = Sink()
    again.connect(client_id="app").subscribe("topic://t", sink, durable_name="d")
    assert [b[:4] for b in sink.bodies] == ["%04d" % i for i in range(40)]


def test_non_persistent_messages_beyond_memory_spill_and_keep_their_order():
    spill = MemoryStore()
    clock = Clock()
    broker = Broker(MemoryStore(), clock, Policy(queue_memory_limit=10 * 1400), spill=spill)
    broker.start()
    c = broker.connect()
    for i in range(50):
        persistent = i % 3 == 0
        c.send(Message(broker.new_message_id(), "queue://mixed", b"%04d" % i + b"x" * 996, persistent=persistent))
    queue = broker.queues["queue://mixed"]
    assert queue.pending.size <= 11 and queue.spilled > 0
    assert len(list(spill.iter_messages("queue://mixed"))) == queue.spilled
    sink = Sink()
    c.subscribe("queue://mixed", sink)
    assert [b[:4] for b in sink.bodies] == ["%04d" % i for i in range(50)]
    assert not list(spill.iter_messages("queue://mixed"))


# -- virtual topics (ActiveMQ's) ----------------------------------------------------

VT = "topic://VirtualTopic.orders"
QA = "queue://Consumer.A.VirtualTopic.orders"
QB = "queue://Consumer.B.VirtualTopic.orders"


def test_virtual_topic_copies_each_message_to_every_existing_consumer_queue():
    store = MemoryStore()
    broker, _ = make(store=store)
    p = broker.connect()
    send(p, VT, "before", persistent=True)  # no consumer queue yet: kept nowhere, as a topic message
    assert store.destinations() == [] and QA not in broker.queues
    a1, a2, b1, topic_sink = Sink(), Sink(), Sink(), Sink()
    c = broker.connect()
    c.subscribe(QA, a1, ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=10)
    c.subscribe(QA, a2, ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=10)
    c.subscribe(QB, b1, ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=10)
    c.subscribe(VT, topic_sink)
    received = broker.messages_received
    send(p, VT, *[str(i) for i in range(6)])
    assert broker.messages_received == received + 6  # counted once, however many copies
    # Group A shares them, group B gets all, the topic is still a topic.
    assert a1.bodies == ["0", "2", "4"] and a2.bodies == ["1", "3", "5"]
    assert b1.bodies == topic_sink.bodies == [str(i) for i in range(6)]
    # A consumer queue that appears later gets what is published from then on.
    late = Sink()
    c.subscribe("queue://Consumer.C.VirtualTopic.orders", late)
    send(p, VT, "6")
    assert late.bodies == ["6"] and b1.bodies[-1] == "6"
    # Each copy is the queue's own message: addressed to it, naming the topic.
    copy = next(iter(broker.queues[QA].consumers[0].unacked.values())).message
    assert copy.destination == QA and copy.headers["originalDestination"] == VT
    # Other topics and other queues are left alone.
    send(p, "topic://orders", "plain")
    send(p, "topic://VirtualTopicX.orders", "not under the prefix")
    assert b1.bodies[-1] == "6"


def test_virtual_topic_persistent_copies_are_queue_messages_with_their_own_records():
    store = MemoryStore()
    broker, _ = make(store=store)
    c = broker.connect()
    for q in (QA, QB):
        c.unsubscribe(c.subscribe(q, Sink()))  # the queues exist; their consumers have gone
    send(c, VT, "p1", persistent=True)
    send(c, VT, "t1")
    assert store.destinations() == [QA, QB]  # nothing under the topic itself
    (seq_a, _), = store.iter_messages(QA)
    (seq_b, _), = store.iter_messages(QB)
    assert seq_a != seq_b
    assert [len(broker.queues[q]) for q in (QA, QB)] == [2, 2]
    # Each stored copy counts against the store limit (a producer is held back by it).
    assert broker.store_usage.bytes == 2 * (len(b"p1") + RECORD_OVERHEAD)
    # Inside a transaction the copies are made at COMMIT, and not at all on ABORT.
    c.begin("tx1")
    c.send(msg(broker, VT, "in-tx", persistent=True), transaction="tx1")
    assert [len(broker.queues[q]) for q in (QA, QB)] == [2, 2]
    c.commit("tx1")
    c.begin("tx2")
    c.send(msg(broker, VT, "aborted", persistent=True), transaction="tx2")
    c.abort("tx2")
    assert [[e.message.body for e in broker.queues[q].messages()] for q in (QA, QB)] == [[b"p1", b"t1", b"in-tx"]] * 2


def test_virtual_topic_groups_acks_redelivery_and_dead_letters_are_the_queues():
    broker, _ = make(Policy(max_redeliveries=1, individual_dlq=True))
    c = broker.connect()
    s1, s2, b = Sink(), Sink(), Sink()
    k1 = c.subscribe(QA, s1, ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=10)
    c.subscribe(QA, s2, ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=10)
    c.subscribe(QB, b, ack_mode=AckMode.AUTO)
    send(c, VT, "g1", "g2", "g3", group_id="order-7")
    assert s1.bodies == ["g1", "g2", "g3"] and s2.bodies == []  # one group, one consumer
    # The owner leaves: its unacked messages go to the other member of group A, redelivered.
    c.unsubscribe(k1)
    assert [(body, r) for body, _, r in s2.got] == [("g1", 1), ("g2", 1), ("g3", 1)]
    assert b.bodies == ["g1", "g2", "g3"]  # group B is not touched
    k2 = next(k for k in c.consumers.values() if k.queue.name == QA)
    c.nack(k2, s2.got[0][1])  # the second failure: past max_redeliveries=1
    (dead,) = broker.queues["queue://DLQ.Consumer.A.VirtualTopic.orders"].messages()
    assert dead.message.body == b"g1" and dead.message.headers["originalDestination"] == QA
    assert "queue://DLQ.Consumer.A.VirtualTopic.orders" not in [q.name for q in broker.virtual.filters]


def test_virtual_topic_wildcard_consumer_queues():
    broker, _ = make()
    c = broker.connect()
    every, eu, exact = Sink(), Sink(), Sink()
    wild = c.subscribe("queue://Consumer.A.VirtualTopic.>", every, ack_mode=AckMode.CLIENT_INDIVIDUAL)
    c.subscribe("queue://Consumer.B.VirtualTopic.*.orders", eu)
    c.subscribe("queue://Consumer.C.VirtualTopic.eu.orders", exact)
    for name in ("queue://Consumer.E.F.VirtualTopic.x", "queue://Consumer.VirtualTopic.x"):
        c.subscribe(name, Sink())  # ordinary queues: not consumer queues of anything
    # Not a consumer queue either ('>' before the end filters nothing), so its wildcard
    # makes it a queue nobody could send to: refused rather than made.
    with pytest.raises(InvalidDestination, match="queue name 'Consumer.D.VirtualTopic.>.x' has the wildcard '>'"):
        c.subscribe("queue://Consumer.D.VirtualTopic.>.x", Sink())
    assert "queue://Consumer.D.VirtualTopic.>.x" not in broker.queues
    send(c, VT, "o")
    send(c, "topic://VirtualTopic.eu.orders", "eu")
    send(c, "topic://VirtualTopic.eu.orders.late", "deep")
    assert every.bodies == ["o", "eu", "deep"] and eu.bodies == ["eu"] and exact.bodies == ["eu"]
    assert sorted(q.name for q in broker.virtual.filters) == [
        "queue://Consumer.A.VirtualTopic.>", "queue://Consumer.B.VirtualTopic.*.orders",
        "queue://Consumer.C.VirtualTopic.eu.orders",
    ]
    # A wildcard queue's consumers learn the topic from the copy.
    assert [e.message.headers["originalDestination"] for e in wild.unacked.values()] == [
        VT, "topic://VirtualTopic.eu.orders", "topic://VirtualTopic.eu.orders.late",
    ]


def test_virtual_topic_prefixes_are_configurable_and_can_be_turned_off():
    broker, _ = make(Policy(virtual_topic_prefix="VT.", virtual_topic_consumer_prefix="Group.*.Sub."))
    c = broker.connect()
    mine, amq = Sink(), Sink()
    c.subscribe("queue://Group.x.Sub.VT.a", mine)
    c.subscribe("queue://Consumer.A.VirtualTopic.a", amq)
    send(c, "topic://VT.a", "1")
    send(c, "topic://VirtualTopic.a", "2")
    assert mine.bodies == ["1"] and amq.bodies == []

    broker, _ = make(Policy(virtual_topic_prefix="VT.", virtual_topic_consumer_prefix=""))
    c = broker.connect()
    same_name = Sink()
    c.subscribe("queue://VT.a", same_name)  # an empty consumer prefix: the queue has the topic's name
    send(c, "topic://VT.a", "3")
    assert same_name.bodies == ["3"]

    store = MemoryStore()
    broker, _ = make(Policy(virtual_topic_prefix=""), store=store)
    c = broker.connect()
    off = Sink()
    c.subscribe(QA, off)
    send(c, VT, "4", persistent=True)
    assert off.bodies == [] and len(broker.virtual) == 0 and store.destinations() == []

    with pytest.raises(ValueError, match="end with"):
        make(Policy(virtual_topic_consumer_prefix="Consumer.*"))
    with pytest.raises(ValueError, match="'>'"):
        make(Policy(virtual_topic_consumer_prefix="Consumer.>."))
    with pytest.raises(ValueError, match="not a filter"):
        make(Policy(virtual_topic_prefix="VirtualTopic.>"))  # ActiveMQ's name="VirtualTopic.>" is prefix "VirtualTopic."


def test_virtual_topic_consumer_queues_and_their_messages_survive_a_restart():
    store = MemoryStore()
    broker, _ = make(store=store)
    c = broker.connect()
    for q in (QA, QB):
        c.unsubscribe(c.subscribe(q, Sink()))
    send(c, VT, "kept", persistent=True)
    send(c, VT, "transient")
    b_sink = Sink()
    consumer = c.subscribe(QB, b_sink, ack_mode=AckMode.CLIENT_INDIVIDUAL)
    for _, tag, _ in list(b_sink.got):
        c.ack(consumer, tag)  # group B has nothing left: its queue is empty at the restart
    assert list(store.iter_messages(QB)) == []
    broker.stop()

    again, _ = make(store=store.reopen())
    # Both queues are consumer queues again (B from its record, A also from its messages).
    assert sorted(q.name for q in again.virtual.filters) == [QA, QB]
    p = again.connect()
    send(p, VT, "after", persistent=True)  # before either group is back
    a_sink, b_sink = Sink(), Sink()
    p.subscribe(QA, a_sink)
    p.subscribe(QB, b_sink)
    assert [(b, r) for b, _, r in a_sink.got] == [("kept", 0), ("after", 0)]
    assert b_sink.bodies == ["after"]


def test_virtual_topic_records_follow_the_policy_and_deleted_queues():
    store = MemoryStore()
    broker, _ = make(store=store)
    c = broker.connect()
    c.unsubscribe(c.subscribe(QA, Sink()))
    c.unsubscribe(c.subscribe(QB, Sink()))
    send(c, VT, "x", persistent=True)
    consumer = c.subscribe(QB, Sink())
    with pytest.raises(BrokerError, match="has consumers"):
        broker.delete_queue(QB)
    c.unsubscribe(consumer)
    assert broker.delete_queue(QA) == 1
    assert QA not in broker.queues and list(store.iter_messages(QA)) == []
    send(c, VT, "y")
    assert QA not in broker.queues  # no longer copied to
    with pytest.raises(UnknownDestination):
        broker.delete_queue(QA)
    broker.stop()

    again, _ = make(store=store.reopen())
    assert [q.name for q in again.virtual.filters] == [QB]
    again.stop()
    # Under another naming the old records describe no consumer queue: they go.
    reopened = store.reopen()
    other, _ = make(Policy(virtual_topic_consumer_prefix="Group.*."), store=reopened)
    assert len(other.virtual) == 0 and list(reopened.iter_records("consumer-queue")) == []


def test_virtual_topic_duplicates_retained_and_streams_see_the_publish_once():
    from core.stream_config import StreamSpec

    clock = Clock()
    clock.advance(1_000_000)
    store = MemoryStore()
    broker = Broker(store, clock, Policy(), streams=[StreamSpec("s", ["topic://VirtualTopic.>"])])
    broker.start()
    c = broker.connect()
    a = Sink()
    c.subscribe(QA, a)
    dup = {"_AMQ_DUPL_ID": "one"}
    c.send(msg(broker, VT, "once", headers=dup, persistent=True))
    c.send(msg(broker, VT, "once", headers=dup, persistent=True))  # a retry: dropped before any copy
    c.send(msg(broker, VT, "kept"), retain=True)
    assert a.bodies == ["once", "kept"]
    assert [m.body for m in broker.retained_for(VT)] == [b"kept"]  # retained as the topic's
    store.flush()
    stream = broker.streams.get("s")
    assert stream.read(0, 0, None).count == 2  # the publishes, not the copies
    broker.stop()


def test_virtual_topic_copies_are_written_in_the_publishs_batch(tmp_path):
    import gc

    from persistence.rocks import RocksStore

    path = str(tmp_path / "store")
    store = RocksStore(path)
    broker, _ = make(store=store)
    c = broker.connect()
    for q in (QA, QB):
        c.unsubscribe(c.subscribe(q, Sink()))
    store.flush()
    send(c, VT, "both or neither", persistent=True)
    assert list(store.iter_messages(QA)) == list(store.iter_messages(QB)) == []  # still in the open batch
    store.flush()
    assert len(list(store.iter_messages(QA))) == len(list(store.iter_messages(QB))) == 1
    broker.stop()
    store.close()
    del broker, c, store
    gc.collect()

    store = RocksStore(path)
    again, _ = make(store=store)
    assert sorted(q.name for q in again.virtual.filters) == [QA, QB]
    sink = Sink()
    again.connect().subscribe(QA, sink)
    assert sink.bodies == ["both or neither"]
    again.stop()
    store.close()


def test_virtual_topic_copy_keeps_every_field_of_the_message():
    from core.broker import _consumer_copy

    original = Message(
        "ID:x-1", VT, b"body", {"k": "v"}, persistent=True, priority=7, expiration=123, timestamp=45,
        group_id="g", group_seq=3, correlation_id="c", reply_to="queue://r", content_type="text/plain", origin="conn-1",
    )
    copy = _consumer_copy(original, QA)
    assert (copy.destination, copy.headers, copy.cache) == (QA, {"k": "v", "originalDestination": VT}, None)
    assert original.headers == {"k": "v"}
    from core.message import FIELDS

    for name in FIELDS:
        if name not in ("destination", "headers"):
            assert getattr(copy, name) == getattr(original, name), name
    # A field added to Message must be set above (non-default) and copied by _consumer_copy.
    assert {name for name in (*FIELDS, "cache") if getattr(original, name) in (None, 0, False, b"", {})} == {"cache"}


def test_a_wildcard_queue_is_no_place_to_send_to_create_or_subscribe():
    """``queue://a.*`` would be a queue of that literal name no other name reaches: refused
    where a producer, an operator or a subscription names it, with what to use instead;
    nothing is made.  A queue of such a name made before the rule can still be drained."""
    broker, _ = make()
    c = broker.connect()
    refusal = (
        "queue name 'a.*' has the wildcard '*', but a queue is one queue named in full: use a plain "
        "queue name, or a topic (send to full topic names, subscribe to the topic 'a.*' to receive them all)"
    )
    for attempt in (
        lambda: send(c, "queue://a.*", "x"),
        lambda: broker.declare_queue("queue://a.*"),
        lambda: c.subscribe("queue://a.*", Sink()),
    ):
        with pytest.raises(InvalidDestination) as refused:
            attempt()
        assert str(refused.value) == refusal
    assert "queue://a.*" not in broker.queues and broker.messages_received == 0
    # '>' before the end filters nothing: no topic is suggested.
    with pytest.raises(InvalidDestination, match=r"subscribe to a topic filter to receive them all\)$"):
        send(c, "queue://a.>.b", "x")
    # A plain name with a '*' inside a level is a plain name.
    send(c, "queue://a.b*", "plain")
    assert [e.message.body for e in broker.queues["queue://a.b*"].messages()] == [b"plain"]
    # Made before the rule (as recovery would, from the store): a consumer drains it.
    broker.queue("queue://old.*").enqueue(Entry(msg(broker, "queue://old.*", "kept"), broker.next_seq()))
    drained = Sink()
    c.subscribe("queue://old.*", drained)
    assert drained.bodies == ["kept"]
