"""Topic subscriptions indexed by level, so matching costs grow with depth.

Each node holds the subscribers whose filter ends there and children by exact
level plus the two wildcard children.  Publishing walks at most the levels of
the topic times the wildcard branches, whatever the number of subscribers.

Semantics shared by STOMP and MQTT (one topic space):
- ``*`` matches exactly one level, ``>`` this level and every level below,
  and also the parent itself (MQTT's ``sport/#`` matches ``sport``);
- a first level starting with ``$`` is not matched by a wildcard in the first
  level (MQTT 4.7.2), so ``>`` does not see ``$SYS`` topics.
"""
from __future__ import annotations

from typing import Generic, Hashable, Iterator, TypeVar

from core.destination import ALL_LEVELS, ONE_LEVEL

T = TypeVar("T", bound=Hashable)


class _Node(Generic[T]):
    __slots__ = ("children", "subscribers")

    def __init__(self) -> None:
        self.children: dict[str, _Node[T]] = {}
        self.subscribers: dict[T, None] = {}  # insertion-ordered set


class TopicTrie(Generic[T]):
    def __init__(self) -> None:
        self._root: _Node[T] = _Node()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, levels: tuple[str, ...], subscriber: T) -> None:
        node = self._root
        for level in levels:
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        if subscriber not in node.subscribers:
            node.subscribers[subscriber] = None
            self._count += 1

    def remove(self, levels: tuple[str, ...], subscriber: T) -> bool:
        path = [self._root]
        node = self._root
        for level in levels:
            child = node.children.get(level)
            if child is None:
                return False
            node = child
            path.append(node)
        if subscriber not in node.subscribers:
            return False
        del node.subscribers[subscriber]
        self._count -= 1
        # Prune empty branches so a churn of unique topics does not leak nodes.
        for depth in range(len(levels), 0, -1):
            child = path[depth]
            if child.subscribers or child.children:
                break
            del path[depth - 1].children[levels[depth - 1]]
        return True

    def match(self, levels: tuple[str, ...]) -> list[T]:
        """Subscribers whose filter matches the topic, each once, in a stable order.

        An explicit stack, not recursion: a topic's depth is the client's to
        choose, and Python's stack is not (a 30,000-level topic raised
        RecursionError here once).
        """
        found: dict[T, None] = {}
        n = len(levels)
        guard_first = bool(levels) and levels[0].startswith("$")
        stack: list[tuple[_Node[T], int]] = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            children = node.children
            dollar_guard = guard_first and i == 0
            if not dollar_guard:
                rest = children.get(ALL_LEVELS)
                if rest is not None and rest.subscribers:
                    found.update(rest.subscribers)
            if i == n:
                if node.subscribers:
                    found.update(node.subscribers)
                continue
            # Pushed in reverse so the exact branch is walked first, as before.
            if not dollar_guard:
                one = children.get(ONE_LEVEL)
                if one is not None:
                    stack.append((one, i + 1))
            exact = children.get(levels[i])
            if exact is not None:
                stack.append((exact, i + 1))
        return list(found)

    def __iter__(self) -> Iterator[T]:
        stack = [self._root]
        while stack:
            node = stack.pop()
            yield from node.subscribers
            stack.extend(node.children.values())


def filter_matches(filter_levels: tuple[str, ...], levels: tuple[str, ...]) -> bool:
    """Whether one filter matches one topic, by the same rules as the trie."""
    if levels and levels[0].startswith("$") and filter_levels and filter_levels[0] in (ONE_LEVEL, ALL_LEVELS):
        return False
    for i, f in enumerate(filter_levels):
        if f == ALL_LEVELS:
            return True
        if i >= len(levels):
            return False
        if f != ONE_LEVEL and f != levels[i]:
            return False
    return len(filter_levels) == len(levels)
