"""A network of gateway brokers: subscribers and consumers on one broker get what is published on another.

Real brokers on loopback: in-process ones where a test watches their insides,
``gateway run`` processes where it kills them.  Each broker pulls from its
peers what its side wants, so the tests check what users see (every message
once per subscriber, queues drained across brokers, local consumers first)
and what operators pay (nothing crosses to a broker that has no demand).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import stomp

from protocols.bridge.network import NetworkSettings
from tests.bridging import Publisher, Subscriber
from tests.support import BrokerHandle, Collector, call, connect, disconnect, make_config, wait_until
from tests.system.test_bridges import Node
from tests.system.test_disk_full import StompProducer

pytestmark = [pytest.mark.timeout(180)]


def network(tmp_path: Path, *names: str, links: list[tuple[int, int]] | None = None) -> list[BrokerHandle]:
    """In-process brokers, each peering with the others (a full mesh) or along ``links`` (index pairs)."""
    handles = []
    for name in names:
        config = make_config(tmp_path / name)
        config.name = name
        handles.append(BrokerHandle(config))
    pairs = links if links is not None else [(i, j) for i in range(len(names)) for j in range(len(names)) if i != j]
    for i, handle in enumerate(handles):
        peers = [f"127.0.0.1:{handles[j].port}" for a, j in pairs if a == i]
        if peers:
            call(lambda h=handle, p=peers: h.gateway.bridges.start_network(
                NetworkSettings(peers=p, restart_timeout=[0.2, 1.0], demand_interval=0.1)))
    wait_until(lambda: all(s["state"] == "connected" for h in handles for s in links_of(h)), 20, "every link up")
    return handles


def links_of(handle: BrokerHandle) -> list[dict[str, Any]]:
    return call(lambda: [s for s in handle.gateway.bridges.status() if "network" in s])


def pulling(handle: BrokerHandle) -> set[str]:
    return {d for s in links_of(handle) for d in s["network"]["pulling"]}


def pulled_by_peers(handle: BrokerHandle, destination: str) -> bool:
    """Whether some peer's link subscribes here to ``destination``."""
    def check() -> bool:
        if destination.startswith("topic://"):
            return any(s.destination == destination and (s.owner_id or "").endswith(".network") for s in handle.broker.topics.trie)
        queue = handle.broker.queues.get(destination)
        return queue is not None and any(c.remote for c in queue.consumers)
    return bool(call(check))


def stop_all(handles: list[BrokerHandle]) -> None:
    for handle in handles:
        handle.stop()


def test_two_brokers_topics_reach_subscribers_of_both_protocols_only_while_they_are_there(tmp_path):
    a, b = network(tmp_path, "node-a", "node-b")
    try:
        stomp_conn, stomp_got = connect(b)
        stomp_conn.subscribe("/topic/news.>", id="1")
        mqtt_sub = Subscriber(b.mqtt_port, "news/#")
        wait_until(lambda: pulled_by_peers(a, "topic://news.>"), 10, "B pulling news.> from A")
        publisher = Publisher(a.mqtt_port)
        sent = [f"n{i}".encode() for i in range(200)]
        publisher.publish_all("news/world", sent)
        assert [m.body.encode() for m in stomp_got.wait_for(200)] == sent
        assert mqtt_sub.wait_for(200) and mqtt_sub.payloads() == sent
        assert stomp_got.messages[0].headers["gateway-path"] == "node-a"
        # The demand goes with the subscribers: A stops sending B anything on news.
        disconnect(stomp_conn)
        mqtt_sub.close()
        wait_until(lambda: not pulled_by_peers(a, "topic://news.>"), 10, "B's pull withdrawn")
        before = links_of(b)[0]["in"]["received"]
        publisher.publish_all("news/world", [b"nobody there"])
        marker_sub = Subscriber(a.mqtt_port, "news/#")  # a barrier on A: the publish was routed
        publisher.publish_all("news/world", [b"barrier"])
        marker_sub.wait_for_payload(b"barrier")
        assert links_of(b)[0]["in"]["received"] == before
        marker_sub.close()
        publisher.close()
    finally:
        stop_all([a, b])


def test_two_brokers_a_queue_is_drained_across_with_local_consumers_first(tmp_path):
    a, b = network(tmp_path, "node-a", "node-b")
    try:
        far, far_got = connect(b)
        far.subscribe("/queue/work", id="1", ack="auto")
        wait_until(lambda: pulled_by_peers(a, "queue://work"), 10, "B pulling work from A")
        producer = connect(a)[0]
        for i in range(300):
            producer.send("/queue/work", f"w{i}", headers={"persistent": "true"})
        assert [m.body for m in far_got.wait_for(300)] == [f"w{i}" for i in range(300)]
        wait_until(lambda: a.queue_depth("queue://work") == 0 and b.queue_depth("queue://work") == 0, 10, "moved, not copied")
        # A consumer on A with credit is served first: nothing crosses while it keeps up.
        near, near_got = connect(a)
        near.subscribe("/queue/work", id="2", ack="auto")
        for i in range(100):
            producer.send("/queue/work", f"l{i}", headers={"persistent": "true"}, receipt=f"r{i}")
        assert [m.body for m in near_got.wait_for(100)] == [f"l{i}" for i in range(100)]
        far.send("/queue/barrier", "x", receipt="sync")  # far_got has seen all it will by now
        assert len(far_got.messages) == 300
        for conn in (far, near, producer):
            disconnect(conn)
    finally:
        stop_all([a, b])


@pytest.mark.parametrize("shape", ["ring", "mesh"])
def test_three_brokers_deliver_each_message_once_per_subscriber(tmp_path, shape):
    links = [(0, 1), (1, 2), (2, 0)] if shape == "ring" else None
    nodes = network(tmp_path, "node-a", "node-b", "node-c", links=links)
    try:
        subscribers = [Subscriber(h.mqtt_port, "t/#") for h in nodes]
        wait_until(lambda: all(pulled_by_peers(h, "topic://t.>") for h in nodes), 10, "every broker pulling t/#")
        publishers = [Publisher(h.mqtt_port) for h in nodes]
        expected = []
        for i, publisher in enumerate(publishers):
            payloads = [f"{i}:{n}".encode() for n in range(100)]
            publisher.publish_all("t/x", payloads)
            expected += payloads
        for publisher in publishers:
            publisher.publish_all("t/end", [f"end {id(publisher)}".encode()])
        for subscriber in subscribers:
            for publisher in publishers:
                subscriber.wait_for_payload(f"end {id(publisher)}".encode())
        # Whatever was still going round would have come before a second round of markers.
        for publisher in publishers:
            publisher.publish_all("t/end", [f"again {id(publisher)}".encode()])
        for subscriber in subscribers:
            for publisher in publishers:
                subscriber.wait_for_payload(f"again {id(publisher)}".encode())
            got = subscriber.payloads()
            assert sorted(p for p in got if b":" in p) == sorted(expected)
            assert len(got) == len(set(got)) == 306
        dropped = sum(call(lambda h=h: h.broker.duplicates.dropped) for h in nodes)
        print(f"\nthree brokers in a {shape}: 300 messages, each subscriber got each once; copies dropped: {dropped}")
        for client in (*subscribers, *publishers):
            client.close()
    finally:
        stop_all(nodes)


class Acking(Collector):
    """A consumer that acknowledges each message once it has it (client-individual), across reconnects."""

    def consume(self, port: int, host: str = "127.0.0.1") -> Any:
        self.conn = stomp.Connection12([(host, port)])
        self.conn.set_listener("c", self)
        self.conn.connect(wait=True)
        self.conn.subscribe("/queue/orders", id="1", ack="client-individual")
        return self.conn

    def on_message(self, frame: Any) -> None:
        super().on_message(frame)
        try:
            self.conn.ack(frame.headers["ack"])
        except Exception:  # the broker was killed under it: the message comes again
            pass


def test_a_queue_moves_exactly_once_across_kill_9_of_each_broker_in_turn(tmp_path):
    """A producer on A, the consumer on B: kill -9 of A, then of B, while the queue crosses."""
    a, b = Node(tmp_path, "node-a", start=False), Node(tmp_path, "node-b", start=False)
    peer = '[network]\npeers = ["127.0.0.1:{port}"]\nrestart_timeout = [0.2, 0.5]\ndemand_interval = 0.1\n'
    a.configure(peer.format(port=b.stomp))
    b.configure(peer.format(port=a.stomp))
    a.start()
    b.start()
    try:
        got = Acking()
        consumer = got.consume(b.stomp)
        receipted: set[int] = set()
        for round, (node, at) in enumerate(((a, 2000), (b, 6000))):
            producer = StompProducer(a.stomp, "/queue/orders", 6000, window=200, first=round * 6000)
            producer.start()
            wait_until(lambda: len(got.messages) > at, 60, f"{at} consumed on B")
            node.kill()
            producer.join(60)
            receipted |= set(producer.receipted)  # a kill of A cut its producer short; what had receipts counts
            node.start()
            if node is b:
                consumer = got.consume(b.stomp)  # what it had not acknowledged comes again, flagged
        wait_until(lambda: receipted <= {int(m.body[:6]) for m in got.messages}, 90, "every receipted message on B")
        seqs = [int(m.body[:6]) for m in got.messages]
        first = [int(m.body[:6]) for m in got.messages if "redelivered" not in m.headers]
        print(f"\na queue across kill -9 of each broker: {len(receipted)} receipted, {len(seqs)} consumed, "
              f"{len(set(seqs))} distinct, {len(seqs) - len(first)} redelivered to the consumer after B's kill")
        # Each message came to B once: a second copy only ever as a redelivery of one the consumer had not acked.
        assert len(first) == len(set(first)), "a message crossed twice"
        disconnect(consumer)
    finally:
        a.stop()
        b.stop()
