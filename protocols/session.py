"""What the connection adapters (TCP and WebSocket) need from a protocol's session.

STOMP and MQTT sessions are different state machines behind one surface, so
one adapter carries either; naming that surface lets a type checker hold both
sides to it.
"""
from __future__ import annotations

from typing import Protocol

from protocols.admission import Refusal
from protocols.lifecycle import CloseReason


class Decoder(Protocol):
    @property
    def buffered(self) -> int:
        """Bytes held towards a frame not yet complete (the partial-frame budget counts them)."""


class Session(Protocol):
    @property
    def decoder(self) -> Decoder: ...

    @property
    def label(self) -> str:
        """Who, for log lines: the peer's address, and the client id once connected."""

    # Why the session ended, for WebSocket close codes.
    @property
    def close_reason(self) -> CloseReason: ...

    def data_received(self, data: bytes) -> None: ...

    def connection_lost(self) -> None: ...

    def shutdown(self) -> None: ...

    def pause_producing(self) -> None: ...

    def resume_producing(self) -> None: ...

    def refuse_connect(self, refusal: Refusal) -> None: ...

    def fail_unfinished(self, seconds: float) -> None: ...
