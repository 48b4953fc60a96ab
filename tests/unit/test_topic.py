"""Topic routing caches and the recent-message windows, through the core with no sockets."""
from __future__ import annotations

from core.message import Message
from core.topic import TopicSpace
from tests.unit.test_broker import Sink, make, send


def test_route_cache_follows_subscription_changes():
    broker, _ = make()
    conn = broker.connect("c")
    early = Sink()
    conn.subscribe("topic://a.b", early)
    send(conn, "topic://a.b", "1")
    late = Sink()
    wild = conn.subscribe("topic://a.*", late)
    send(conn, "topic://a.b", "2")  # the cached route must include the new wildcard subscriber
    conn.unsubscribe(wild)
    send(conn, "topic://a.b", "3")  # and drop it again
    assert early.bodies == ["1", "2", "3"]
    assert late.bodies == ["2"]


def test_windows_of_all_topics_stay_under_their_memory_budget():
    space = TopicSpace(retroactive_count=100, retroactive_memory=100_000)
    body = b"x" * 700  # 1000 bytes counted with the overhead
    for i in range(1000):  # a fleet: 1000 topics, one message each
        levels = ("devices", str(i))
        space.remember(levels, i, Message(f"m{i}", "topic://devices." + str(i), body))
    assert space.recent_bytes <= 100_000
    assert len(space.recent) == 100  # the most recently published topics kept theirs
    assert ("devices", "999") in space.recent and ("devices", "0") not in space.recent


def test_a_hot_topic_keeps_its_newest_messages_within_the_budget():
    space = TopicSpace(retroactive_count=100, retroactive_memory=10_000)
    for i in range(50):
        space.remember(("hot",), i, Message(f"m{i}", "topic://hot", b"y" * 700))
    window = space.recent[("hot",)]
    assert [seq for seq, _ in window] == list(range(40, 50))
    assert space.recent_bytes == 10 * 1000


def test_retroactive_subscriber_still_gets_recent_messages():
    broker, _ = make()
    conn = broker.connect("c")
    send(conn, "topic://news", "old1", "old2")
    got = Sink()
    conn.subscribe("topic://news", got, retroactive=True)
    assert got.bodies == ["old1", "old2"]
