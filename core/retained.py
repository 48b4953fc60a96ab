"""Retained messages: kept in the store, with only a compact index in memory.

A device retaining a message on ever new topics (``dev/<n>/state``) once grew
the broker by 1.1 KiB per topic, all of it loaded again at every start.  Now
memory holds the topic names (grouped by first level, so a filter whose first
level is exact looks at one group) and each message's stored size; the
messages stay in the store and are read back when a subscription asks for
them.  ``max_retained_messages`` and ``max_retained_bytes`` bound what is
kept (EMQX's ``max_retained_messages``); a new topic past either bound is not
retained, and the session answers as its protocol allows.

A stored record is the message's own encoding, after a small prefix with the
publisher's identity (MQTT 5's no-local applies to retained messages too),
so ``origin``, which ``encode_message`` leaves out, survives a restart.
Records written before the prefix existed still read.
"""
from __future__ import annotations

import struct
from typing import Callable

from core.destination import name_of, topic_levels
from core.errors import BrokerError
from core.message import Message, decode_message, encode_message
from core.storage import RETAINED_KIND
from core.trie import filter_matches
from persistence.store import Store, StoreUnavailable

_PREFIX = b"\x01R"  # never the start of a bare encoded message (version 1, then flags 0 or 1)
_EXPIRATION = struct.Struct(">q")
_EXPIRATION_AT = 3  # in an encoded message: version, flags, priority, then expiration


def _pack(message: Message) -> bytes:
    origin = (message.origin or "").encode("utf-8", "surrogateescape")
    return _PREFIX + len(origin).to_bytes(2, "big") + origin + encode_message(message)


def _message_start(data: bytes) -> int:
    if data[:2] == _PREFIX:
        return 4 + int.from_bytes(data[2:4], "big")
    return 0


def _unpack(data: bytes) -> Message:
    start = _message_start(data)
    message = decode_message(data[start:])
    if start:
        origin = data[4:start].decode("utf-8", "surrogateescape")
        message.origin = origin or None
    return message


def _expiration(data: bytes) -> int:
    expiration: int = _EXPIRATION.unpack_from(data, _message_start(data) + _EXPIRATION_AT)[0]
    return expiration


class RetainedLimit(BrokerError):
    """A new topic's retained message past max_retained_messages or max_retained_bytes."""


class RetainedMessages:
    def __init__(self, store: Store, max_count: int, max_bytes: int, now_ms: Callable[[], int]) -> None:
        self.store = store
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.now_ms = now_ms
        # first level -> {canonical topic name: stored size}
        self.index: dict[str, dict[str, int]] = {}
        self.expiring: dict[str, int] = {}  # only the topics whose message expires: name -> ms
        self.exempt: set[str] = set()  # the broker's own ($SYS): not counted against the bounds
        self.count = 0
        self.bytes = 0
        self.refused = 0

    def __len__(self) -> int:
        return self.count

    def retain(self, message: Message, bounded: bool = True) -> None:
        """Keep it as its topic's retained one (an empty body clears it); RetainedLimit past the bounds.

        ``bounded`` False is for the broker's own figures ($SYS): they neither
        count against the bounds nor are refused by them.
        """
        name = name_of(message.destination)
        if not message.body:
            self._drop(name)
            return
        data = _pack(message)
        if not bounded:
            self.exempt.add(name)
            self.index.setdefault(name.split(".", 1)[0], {})[name] = len(data)
            self.store.put_record(RETAINED_KIND, name, data)
            return
        first = name.split(".", 1)[0]
        bucket = self.index.get(first)
        old = bucket.get(name) if bucket is not None else None
        grows = len(data) - (old or 0)
        if (old is None and self.max_count and self.count >= self.max_count) or (
            self.max_bytes and grows > 0 and self.bytes + grows > self.max_bytes
        ):
            self.refused += 1
            limit = "max_retained_messages" if old is None and self.max_count and self.count >= self.max_count else "max_retained_bytes"
            raise RetainedLimit(f"the broker keeps no more retained messages ({limit})")
        if bucket is None:
            bucket = self.index[first] = {}
        bucket[name] = len(data)
        if old is None:
            self.count += 1
        self.bytes += grows
        if message.expiration:
            self.expiring[name] = message.expiration
        else:
            self.expiring.pop(name, None)
        self.store.put_record(RETAINED_KIND, name, data)

    def _drop(self, name: str) -> None:
        first = name.split(".", 1)[0]
        bucket = self.index.get(first)
        if bucket is None or name not in bucket:
            return
        size = bucket.pop(name)
        if name in self.exempt:
            self.exempt.discard(name)
        else:
            self.bytes -= size
            self.count -= 1
        if not bucket:
            del self.index[first]
        self.expiring.pop(name, None)
        self.store.delete_record(RETAINED_KIND, name)

    def _buckets(self, filter_levels: tuple[str, ...]) -> list[dict[str, int]]:
        """The index buckets a filter can match in: its first level's, or all but ``$`` ones for a wildcard."""
        first = filter_levels[0]
        if first in ("*", ">"):
            return [b for level, b in self.index.items() if not level.startswith("$")]
        bucket = self.index.get(first)
        return [] if bucket is None else [bucket]

    def topics(self, destination: str) -> list[tuple[str, int]]:
        """(canonical name, stored bytes) of the retained topics a filter matches, sorted by name,
        from the index alone (nothing read from the store): what an operator lists."""
        filter_levels = topic_levels(name_of(destination))
        buckets = self._buckets(filter_levels)
        now = self.now_ms()
        found = []
        for bucket in buckets:
            for name, size in bucket.items():
                expiration = self.expiring.get(name)
                if (expiration is None or expiration > now) and filter_matches(filter_levels, topic_levels(name)):
                    found.append((name, size))
        found.sort()
        return found

    def holds(self, name: str) -> bool:
        """Whether a topic (canonical name, without the scheme) has a retained message."""
        bucket = self.index.get(name.split(".", 1)[0])
        return bucket is not None and name in bucket

    def matching(self, destination: str) -> list[Message]:
        """Retained messages of every topic a filter matches, read from the store."""
        filter_levels = topic_levels(name_of(destination))
        buckets = self._buckets(filter_levels)
        now = self.now_ms()
        names = []
        wildcard = any(level in ("*", ">") for level in filter_levels)
        for bucket in buckets:
            if not wildcard:
                name = ".".join(filter_levels)
                if name in bucket:
                    names.append(name)
                continue
            names.extend(name for name in bucket if filter_matches(filter_levels, topic_levels(name)))
        if not names:
            return []
        try:
            self.store.flush()  # reads see written batches: a message retained this turn is in the pending one
        except StoreUnavailable:
            pass  # a full disk: what is on it is sent; one retained since waits among the kept writes
        found = []
        for name in names:
            expiration = self.expiring.get(name)
            if expiration is not None and expiration <= now:
                self._drop(name)
                continue
            data = self.store.get_record(RETAINED_KIND, name)
            if data is not None:
                found.append(_unpack(data))
        return found

    def recover(self) -> None:
        """The index from the store's records, without keeping (or decoding) the messages."""
        for name, data in self.store.iter_records(RETAINED_KIND):
            first = name.split(".", 1)[0]
            self.index.setdefault(first, {})[name] = len(data)
            if name.startswith("$SYS."):
                self.exempt.add(name)  # the broker's own figures, retained again at every interval
                continue
            self.count += 1
            self.bytes += len(data)
            expiration = _expiration(data)
            if expiration:
                self.expiring[name] = expiration
