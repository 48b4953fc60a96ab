"""What a broker of the network may be given: never a message that has been there, nor one that has gone far enough.

Another gateway's network link consumes here for its own consumers.  Giving it a
message whose path already names it would send the message round a loop (a
queue message would then come back as a loop and be dropped: lost), and the
network's ``ttl`` bounds how many brokers a message crosses.  So its consumers
and subscriptions carry this filter where a selector goes: checked per message
only for them.
"""
from __future__ import annotations

from collections.abc import Callable

from core.duplicates import BROKER_PATH_HEADER


class PathFilter:
    __slots__ = ("peer", "ttl")

    def __init__(self, peer: str, ttl: int) -> None:
        self.peer = peer
        self.ttl = ttl

    def matches(self, lookup: Callable[[str], object]) -> bool:
        path = lookup(BROKER_PATH_HEADER)
        if not isinstance(path, str) or not path:
            return True
        crossed = path.split(",")
        return self.peer not in crossed and len(crossed) < self.ttl
