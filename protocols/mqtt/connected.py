"""An MQTT connection's ``Phase``, and ``Connected``: what it has only once CONNECT is accepted.

Apart from the session (protocols/mqtt/session.py) so that the modules of its
handlers can make and read them without importing the session at run time.
"""
from __future__ import annotations

import enum

from core.connection import Connection
from core.consumer import Consumer
from protocols.mqtt.state import ClientSession
from protocols.outbox import Outbox

__all__ = ["Connected", "Phase"]


class Phase(enum.Enum):
    """Where a connection is (wsproto's ``ConnectionState``); MQTT has no closing handshake."""

    AWAITING_CONNECT = "awaiting CONNECT"
    AUTHENTICATING = "authenticating"  # CONNECT read, its credentials being checked: reading paused
    CONNECTED = "connected"
    CLOSED = "closed"


class Connected:
    """What exists only once CONNECT is accepted: the client's session, the core connection, the outbox."""

    __slots__ = ("client", "conn", "outbox", "consumer", "_shared_consumers", "_in_aliases", "_out_aliases", "filtered")

    def __init__(self, client: ClientSession, conn: Connection, outbox: Outbox) -> None:
        self.client = client
        self.conn = conn
        self.outbox = outbox
        self.consumer: Consumer | None = None  # on the client's queue, from its first subscription
        # MQTT filters that a deny rule overlaps (granted, checked at delivery); None: none.
        self.filtered: dict[str, None] | None = None
        # The rest is made on first use: most connections never need them, and an empty dict is 64 bytes.
        self._shared_consumers: dict[str, Consumer] | None = None
        self._in_aliases: dict[int, str] | None = None
        self._out_aliases: dict[str, int] | None = None

    @property
    def shared_consumers(self) -> dict[str, Consumer]:
        """MQTT filter -> this connection's consumer of its shared group's queue."""
        found = self._shared_consumers
        if found is None:
            found = self._shared_consumers = {}
        return found

    @property
    def in_aliases(self) -> dict[int, str]:
        """Topic aliases the client set (MQTT 5 3.3.2.3.4)."""
        found = self._in_aliases
        if found is None:
            found = self._in_aliases = {}
        return found

    @property
    def out_aliases(self) -> dict[str, int]:
        """Topic aliases this broker set for the client."""
        found = self._out_aliases
        if found is None:
            found = self._out_aliases = {}
        return found
