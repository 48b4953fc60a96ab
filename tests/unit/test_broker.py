"""The dispatcher through the core API, with a virtual clock and no sockets."""
from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from core.broker import Broker
from core.consumer import AckMode
from core.errors import (
    BrokerError,
    SubscriptionError,
    UnknownDelivery,
    UnknownDestination,
    UnknownTransaction,
)
from core.message import Message
from core.policy import Policy
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
