"""Who may connect: a limit on connections overall, per source address, and new ones per second per address.

Checked when a connection is accepted; a refused one is still given its
protocol's answer when it sends CONNECT (STOMP an ERROR, MQTT a CONNACK with
"server unavailable" / 0x97 quota exceeded), so a well-behaved client learns
why instead of seeing a bare reset, and the refusal is logged.  A limit of 0
is no limit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from twisted.logger import Logger

log = Logger(namespace="gateway.protocols")


@dataclass
class AdmissionSettings:
    max_connections: int = 100_000
    max_connections_per_address: int = 0
    max_connection_rate_per_address: int = 0  # new connections per second from one address


class Refusal(NamedTuple):
    why: str
    rate: bool  # refused for connecting too often (MQTT 5: 0x9F), not for too many (0x97)


class Admission:
    def __init__(self, settings: AdmissionSettings, clock: Any) -> None:
        self.settings = settings
        self.clock = clock
        self.total = 0
        self.by_address: dict[str, int] = {}
        self._recent: dict[str, list[float]] = {}  # address -> [window start, connections in it]
        self.refused = 0

    def admit(self, address: str) -> Refusal | None:
        """Count the connection in, or say why it is refused."""
        s = self.settings
        reason = None
        rate = False
        if s.max_connections and self.total >= s.max_connections:
            reason = f"the broker has {self.total} connections, its limit (max_connections)"
        elif s.max_connections_per_address and self.by_address.get(address, 0) >= s.max_connections_per_address:
            reason = f"{address} has {s.max_connections_per_address} connections, the limit per address (max_connections_per_address)"
        elif s.max_connection_rate_per_address and not self._rate_ok(address):
            reason = (f"{address} opened more than {s.max_connection_rate_per_address} connections in a second "
                      f"(max_connection_rate_per_address)")
            rate = True
        if reason is not None:
            self.refused += 1
            log.info("connection from {address} refused: {why}", address=address, why=reason)
            return Refusal(reason, rate)
        self.total += 1
        self.by_address[address] = self.by_address.get(address, 0) + 1
        return None

    def _rate_ok(self, address: str) -> bool:
        now = self.clock.seconds()
        window = self._recent.get(address)
        if window is None or now - window[0] >= 1.0:
            if len(self._recent) >= 100_000:
                # Bounded: forget the addresses whose second is over.
                self._recent = {a: w for a, w in self._recent.items() if now - w[0] < 1.0}
            window = self._recent[address] = [now, 0.0]
        window[1] += 1
        return window[1] <= self.settings.max_connection_rate_per_address

    def release(self, address: str) -> None:
        self.total -= 1
        n = self.by_address.get(address, 0) - 1
        if n > 0:
            self.by_address[address] = n
        else:
            self.by_address.pop(address, None)
