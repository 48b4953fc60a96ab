"""Topic subscriptions and the recent-message window for retroactive consumers."""
from __future__ import annotations

from collections import deque

from core.destination import name_of, topic_levels
from core.message import Message
from core.queue import MessageQueue
from core.selector import Selector
from core.trie import TopicTrie, filter_matches


class Subscription:
    """One topic subscription: a filter in the trie feeding its own queue.

    Selector and no-local are applied when a message fans out, so a
    subscriber's queue only ever holds what it will be given.
    """

    __slots__ = ("queue", "destination", "levels", "selector", "no_local", "owner_id", "durable_key", "options")

    def __init__(
        self,
        queue: MessageQueue,
        destination: str,
        *,
        selector: Selector | None = None,
        no_local: bool = False,
        owner_id: str | None = None,
        durable_key: str | None = None,
        options: dict | None = None,
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

    def wants(self, message: Message) -> bool:
        if self.no_local and message.origin is not None and message.origin == self.owner_id:
            return False
        selector = self.selector
        return selector is None or selector.matches(message.lookup)


# Topics whose matches are remembered; beyond it the cache starts over (bounded memory).
ROUTE_CACHE_SIZE = 10_000


class TopicSpace:
    def __init__(self, retroactive_count: int) -> None:
        self.trie: TopicTrie[Subscription] = TopicTrie()
        self.retroactive_count = retroactive_count
        self.recent: dict[tuple[str, ...], deque[tuple[int, Message]]] = {}
        # destination -> (levels, matching subscriptions): publishing to a topic
        # again costs one dict lookup, not a trie walk.  Any subscription change
        # empties it, so it never answers with a stale set.
        self.routes: dict[str, tuple[tuple[str, ...], list[Subscription]]] = {}

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
        window = self.recent.get(levels)
        if window is None:
            window = self.recent[levels] = deque(maxlen=self.retroactive_count)
        window.append((seq, message))

    def replay(self, filter_levels: tuple[str, ...]) -> list[tuple[int, Message]]:
        """Recent messages of every topic the filter matches, oldest first."""
        found: list[tuple[int, Message]] = []
        for levels, window in self.recent.items():
            if filter_matches(filter_levels, levels):
                found.extend(window)
        found.sort(key=lambda item: item[0])
        return found
