"""Operators' walks over a queue (core/operations.py) with a virtual clock: chunks per turn,
what they leave alone, and a restart over the same store."""
from __future__ import annotations

from twisted.internet.task import Clock

from core import operations
from core.broker import Broker
from core.consumer import AckMode
from core.message import Message
from core.operations import Selection
from core.policy import Policy
from core.selector import compile_selector
from persistence.memory import MemoryStore


class SmallBatches(MemoryStore):
    """A store whose batches hold few operations (RocksStore's ``max_batch``): five messages a chunk."""

    max_batch = 64 + 3 * 5


def make(store=None, **policy):
    clock = Clock()
    clock.advance(1_000_000)
    broker = Broker(store or MemoryStore(), clock, Policy(**policy))
    broker.start()
    return broker, clock


def send(broker, dest, *bodies, **headers):
    conn = broker.connect()
    for body in bodies:
        conn.send(Message(broker.new_message_id(), dest, body.encode(), dict(headers), persistent=True,
                          timestamp=broker.now_ms()))
    conn.close()


def run(clock, walk_started):
    """Run the walk to its end; and how many chunks it did in the turn it started in."""
    done = []
    walk = walk_started(done.append)
    first_turn = walk.chunks
    while not done:
        clock.advance(0)
    assert done == [walk] and walk.error is None
    return walk, first_turn


def bodies(broker, name):
    return [e.message.body.decode() for e in sorted(broker.queues[name].pending, key=lambda e: e.seq)]


def test_a_move_goes_a_chunk_per_turn_in_order():
    broker, clock = make(SmallBatches())
    send(broker, "queue://a", *[str(i) for i in range(23)])
    assert operations.chunk_size(broker) == 5
    walk, first_turn = run(clock, lambda done: operations.move(broker, broker.queues["queue://a"], "queue://b", Selection(), done))
    assert walk.done == 23 and walk.chunks == 5 and first_turn == 1
    assert bodies(broker, "queue://b") == [str(i) for i in range(23)] and len(broker.queues["queue://a"]) == 0


def test_a_walk_leaves_later_arrivals_and_messages_in_flight():
    broker, clock = make(SmallBatches())
    send(broker, "queue://a", *[str(i) for i in range(12)])
    conn = broker.connect()
    got = []
    conn.subscribe("queue://a", lambda c, e, t: got.append(e), ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=2)
    done = []
    walk = operations.purge(broker, broker.queues["queue://a"], done.append)
    send(broker, "queue://a", "late")  # between the first chunk and the next
    while not done:
        clock.advance(0)
    assert walk.done == 10 and [e.message.body for e in got] == [b"0", b"1"]
    assert bodies(broker, "queue://a") == ["late"]


def test_a_selection_with_ids_selector_and_limit():
    broker, clock = make()
    send(broker, "queue://a", "r0", "b1", "r2", "b3", "r4", color="red")
    queue = broker.queues["queue://a"]
    ids = {e.message.id for e in queue.pending if e.message.body in (b"b1", b"r2", b"r4")}
    selection = Selection(ids, compile_selector("color = 'red'"), limit=2)
    walk, _ = run(clock, lambda done: operations.move(broker, queue, "queue://b", selection, done))
    assert walk.done == 2 and bodies(broker, "queue://b") == ["b1", "r2"]


def test_replay_reasons_and_a_restart_over_the_same_store():
    store = MemoryStore()
    broker, clock = make(store, max_redeliveries=0)
    send(broker, "queue://home", "x", "y")
    conn = broker.connect()
    conn.subscribe("queue://home", lambda c, e, t: None, ack_mode=AckMode.CLIENT_INDIVIDUAL)
    for consumer in list(conn.consumers.values()):
        for tag in list(consumer.unacked):
            conn.nack(consumer, tag)
    conn.close()
    send(broker, "queue://DLQ", "forged", originalDestination="queue://DLQ.x")
    dlq = broker.queues["queue://DLQ"]
    assert len(dlq) == 3
    walk, _ = run(clock, lambda done: operations.replay(broker, dlq, Selection(), lambda d: d != "queue://nope", done))
    assert walk.done == 2 and walk.skipped_count == 1 and "dead-letter queue" in walk.skipped[0][1]
    home = [e.message for e in broker.queues["queue://home"].pending]
    assert sorted(m.body for m in home) == [b"x", b"y"]
    assert all("originalDestination" not in m.headers and "dlqDeliveryFailureCause" not in m.headers for m in home)
    again, _ = make(store.reopen())
    assert sorted(bodies(again, "queue://home")) == ["x", "y"] and bodies(again, "queue://DLQ") == ["forged"]


def test_wildcard_targets_are_refused_before_anything_moves_and_replay_skips_them():
    """A move to ``queue://a.*`` would make a queue nothing else reaches: refused before the walk
    starts.  A dead letter whose ``originalDestination`` is such a name (a queue made before the
    rule, or a forged header) stays in the DLQ with the reason; a virtual topic's wildcard
    consumer queue is a queue like any other and takes its dead letters back."""
    import pytest

    from core.destination import InvalidDestination

    broker, clock = make()
    send(broker, "queue://a", "m")
    with pytest.raises(InvalidDestination, match="queue name 'b.>' has the wildcard '>'"):
        operations.move(broker, broker.queues["queue://a"], "queue://b.>", Selection(), lambda walk: None)
    assert "queue://b.>" not in broker.queues and bodies(broker, "queue://a") == ["m"]

    send(broker, "queue://DLQ", "lost", originalDestination="queue://a.*")
    send(broker, "queue://DLQ", "copy", originalDestination="queue://Consumer.A.VirtualTopic.>")
    walk, _ = run(clock, lambda done: operations.replay(broker, broker.queues["queue://DLQ"], Selection(), lambda d: True, done))
    assert walk.done == 1 and [reason for _, reason in walk.skipped] == [
        "originalDestination queue://a.*: queue name 'a.*' has the wildcard '*', but a queue is one queue named in full: "
        "use a plain queue name, or a topic (send to full topic names, subscribe to the topic 'a.*' to receive them all)"
    ]
    assert "queue://a.*" not in broker.queues and bodies(broker, "queue://DLQ") == ["lost"]
    assert bodies(broker, "queue://Consumer.A.VirtualTopic.>") == ["copy"]
