"""What a protocol session needs from whatever carries its bytes (TCP or WebSocket)."""
from __future__ import annotations

from typing import Protocol


class Transport(Protocol):
    def write(self, data: bytes) -> None: ...

    def close(self) -> None:
        """Close after the written data is flushed."""

    def pause_reading(self, reason: str = ...) -> None:
        """Read nothing more from the client for ``reason`` (producer flow control)."""

    def resume_reading(self, reason: str = ...) -> None:
        """Read again once no reason to pause holds any more."""

    def certificate_user(self) -> str | None:
        """The CN of the client's verified TLS certificate; None without TLS or without a certificate."""
