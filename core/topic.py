"""Topic subscriptions, the recent-message window for retroactive consumers, and virtual topics."""
from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any, Protocol

from core.destination import ALL_LEVELS, ONE_LEVEL, name_of, topic_levels
from core.message import Message
from core.queue import MessageQueue
from core.selector import Lookup
from core.trie import TopicTrie, filter_matches


class MessageFilter(Protocol):
    """What a subscription's selector does: a JMS selector, or a protocol's own filter (MQTT's AwayFilter)."""

    def matches(self, lookup: Lookup) -> bool: ...


class StoredOptions(Protocol):
    """A protocol's options for a subscription; a durable subscription stores ``record()`` as JSON.

    Recovered from the store they are that record (a dict) until the
    protocol gives them their type again.
    """

    def record(self) -> dict[str, Any]: ...


Options = StoredOptions | dict[str, Any]


class Subscription:
    """One topic subscription: a filter in the trie feeding its own queue.

    Selector and no-local are applied when a message fans out, so a
    subscriber's queue only ever holds what it will be given.
    """

    __slots__ = ("queue", "destination", "levels", "selector", "no_local", "owner_id", "durable_key", "options", "user")

    def __init__(
        self,
        queue: MessageQueue,
        destination: str,
        *,
        selector: MessageFilter | None = None,
        no_local: bool = False,
        owner_id: str | None = None,
        durable_key: str | None = None,
        options: Options | None = None,
        user: str | None = None,
    ) -> None:
        self.queue = queue
        self.destination = destination
        self.levels = topic_levels(name_of(destination))
        self.selector = selector
        self.no_local = no_local
        self.owner_id = owner_id
        self.durable_key = durable_key
        # Protocol-specific options, kept (and stored for durable ones) but not
        # interpreted by the core: MQTT's QoS, retain handling, identifiers.
        self.options = options
        # Who made a durable subscription: it keeps what that user may read, so no other user attaches to it.
        self.user = user

    def redefine(self, options: Options | None, no_local: bool) -> None:
        """Other delivery options for the same messages (MQTT QoS, no local, retain handling)."""
        self.options = options
        self.no_local = no_local

    def wants(self, message: Message) -> bool:
        if self.no_local and message.origin is not None and message.origin == self.owner_id:
            return False
        selector = self.selector
        return selector is None or selector.matches(message.lookup)


# Topics whose matches are remembered; beyond it the cache starts over (bounded memory).
ROUTE_CACHE_SIZE = 10_000


def _remembered(message: Message) -> int:
    return len(message.body) + _WINDOW_OVERHEAD


_WINDOW_OVERHEAD = 300  # a Message with a few headers, beside its body


class TopicSpace:
    def __init__(self, retroactive_count: int, retroactive_memory: int = 8 * 1024 * 1024) -> None:
        self.trie: TopicTrie[Subscription] = TopicTrie()
        self.retroactive_count = retroactive_count
        # The windows of all topics together stay under retroactive_memory bytes:
        # a fleet publishing to a million topics must not keep a hundred messages
        # of each.  The topics published to least recently lose their window first.
        self.retroactive_memory = retroactive_memory
        self.recent: OrderedDict[tuple[str, ...], deque[tuple[int, Message]]] = OrderedDict()
        self.recent_bytes = 0
        # destination -> (levels, matching subscriptions): publishing to a topic
        # again costs one dict lookup, not a trie walk.  Any subscription change
        # empties it, so it never answers with a stale set.
        self.routes: dict[str, tuple[tuple[str, ...], list[Subscription]]] = {}

    def __len__(self) -> int:
        """How many subscriptions are in the trie."""
        return len(self.trie)

    def add(self, subscription: Subscription) -> None:
        self.trie.add(subscription.levels, subscription)
        self.routes.clear()

    def remove(self, subscription: Subscription) -> None:
        self.trie.remove(subscription.levels, subscription)
        self.routes.clear()

    def match(self, levels: tuple[str, ...]) -> list[Subscription]:
        return self.trie.match(levels)

    def route(self, destination: str) -> tuple[tuple[str, ...], list[Subscription]]:
        """The levels of a canonical topic and the subscriptions that match it."""
        found = self.routes.get(destination)
        if found is None:
            if len(self.routes) >= ROUTE_CACHE_SIZE:
                self.routes.clear()
            levels = topic_levels(name_of(destination))
            found = self.routes[destination] = (levels, self.trie.match(levels))
        return found

    def remember(self, levels: tuple[str, ...], seq: int, message: Message) -> None:
        if self.retroactive_count <= 0:
            return
        recent = self.recent
        window = recent.get(levels)
        if window is None:
            window = recent[levels] = deque(maxlen=self.retroactive_count)
        else:
            recent.move_to_end(levels)
            if len(window) == self.retroactive_count:
                self.recent_bytes -= _remembered(window[0][1])  # the append pushes it out
        window.append((seq, message))
        self.recent_bytes += _remembered(message)
        if self.recent_bytes > self.retroactive_memory:
            self._shrink(levels)

    def _shrink(self, keep: tuple[str, ...]) -> None:
        recent = self.recent
        while self.recent_bytes > self.retroactive_memory and len(recent) > 1:
            levels, window = recent.popitem(last=False)
            if levels == keep:  # cannot happen while it is the most recent; kept for safety
                recent[levels] = window
                break
            self.recent_bytes -= sum(_remembered(m) for _, m in window)
        kept = recent.get(keep)
        while kept and self.recent_bytes > self.retroactive_memory:
            self.recent_bytes -= _remembered(kept.popleft()[1])

    def replay(self, filter_levels: tuple[str, ...]) -> list[tuple[int, Message]]:
        """Recent messages of every topic the filter matches, oldest first."""
        found: list[tuple[int, Message]] = []
        for levels, window in self.recent.items():
            if filter_matches(filter_levels, levels):
                found.extend(window)
        found.sort(key=lambda item: item[0])
        return found


class VirtualTopics:
    """ActiveMQ's virtual topics: which consumer queues take a copy of a topic's messages.

    A consumer queue is one whose name is the consumer prefix (``Consumer.*.``,
    each ``*`` a group name) followed by the name of a topic under the virtual
    topic prefix (``VirtualTopic.``), or a filter of such topics
    (``Consumer.A.VirtualTopic.>``, as ActiveMQ's wildcard consumer queues).
    Queues are indexed by that topic part in a trie when they are created; a
    publish looks its destination up in a per-destination cache (emptied when
    a queue comes or goes), so routing to the consumer queues is a dict lookup
    for a topic seen before.
    """

    def __init__(self, topic_prefix: str, consumer_prefix: str) -> None:
        if consumer_prefix and not consumer_prefix.endswith("."):
            raise ValueError(f"virtual_topic_consumer_prefix {consumer_prefix!r} must be empty or end with '.'")
        if any(level in (ONE_LEVEL, ALL_LEVELS) for level in topic_prefix.split(".")):
            raise ValueError(
                f"virtual_topic_prefix {topic_prefix!r} is the start of a topic name (such as 'VirtualTopic.'), not a filter"
            )
        levels = tuple(consumer_prefix[:-1].split(".")) if consumer_prefix else ()
        if ALL_LEVELS in levels:
            raise ValueError(f"virtual_topic_consumer_prefix {consumer_prefix!r}: '>' cannot name a consumer group")
        self.topic_prefix = topic_prefix
        self.consumer_levels = levels
        # What a publish tests its destination with, ``str.startswith``: no
        # prefix at all when the feature is off, so the test is always false.
        self.prefix: tuple[str, ...] = ("topic://" + topic_prefix,) if topic_prefix else ()
        self.trie: TopicTrie[MessageQueue] = TopicTrie()
        self.filters: dict[MessageQueue, tuple[str, ...]] = {}
        self.routes: dict[str, tuple[MessageQueue, ...]] = {}

    def __len__(self) -> int:
        return len(self.filters)

    def topic_filter(self, queue_name: str) -> tuple[str, ...] | None:
        """The levels of the topic (or filter) a queue is a consumer queue of; None for any other queue."""
        if not self.prefix or not queue_name.startswith("queue://"):
            return None
        levels = name_of(queue_name).split(".")
        n = len(self.consumer_levels)
        if len(levels) <= n:
            return None
        for want, got in zip(self.consumer_levels, levels):
            if want != got and want != ONE_LEVEL:
                return None
        topic = levels[n:]
        if not ".".join(topic).startswith(self.topic_prefix):
            return None
        if any(level == ALL_LEVELS for level in topic[:-1]):
            return None  # '>' before the end: no topic could match; a plain queue
        return tuple(topic)

    def add(self, queue: MessageQueue) -> bool:
        """Index a queue if its name makes it a consumer queue; True if it does."""
        if queue in self.filters:
            return True
        levels = self.topic_filter(queue.name)
        if levels is None:
            return False
        self.filters[queue] = levels
        self.trie.add(levels, queue)
        self.routes.clear()
        return True

    def remove(self, queue: MessageQueue) -> bool:
        levels = self.filters.pop(queue, None)
        if levels is None:
            return False
        self.trie.remove(levels, queue)
        self.routes.clear()
        return True

    def route(self, destination: str) -> tuple[MessageQueue, ...]:
        """The consumer queues of a virtual topic (a canonical ``topic://`` name under the prefix)."""
        found = self.routes.get(destination)
        if found is None:
            if len(self.routes) >= ROUTE_CACHE_SIZE:
                self.routes.clear()
            found = self.routes[destination] = tuple(self.trie.match(topic_levels(name_of(destination))))
        return found
