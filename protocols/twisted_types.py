"""A typed view of the Twisted transport under a connection adapter.

Twisted declares its transports as zope.interface ``Interface`` classes whose
methods have no ``self``, which mypy reads wrongly without the mypy-zope
plugin; and ``Protocol.transport`` is Optional until ``makeConnection``.
``StreamTransport`` names what the adapters call, with Twisted's signatures,
and ``connected`` is the one cast.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from twisted.internet.interfaces import IAddress, ITransport


class StreamTransport(Protocol):
    """``ITCPTransport`` with ``IProducer``/``IConsumer``: what a connected TCP (or TLS) transport offers."""

    producer: Any

    def getPeer(self) -> IAddress: ...

    def write(self, data: bytes) -> None: ...

    def loseConnection(self) -> None: ...

    def abortConnection(self) -> None: ...

    def registerProducer(self, producer: Any, streaming: bool) -> None: ...

    def unregisterProducer(self) -> None: ...

    def pauseProducing(self) -> None: ...

    def resumeProducing(self) -> None: ...


def connected(transport: ITransport | None) -> StreamTransport:
    """A protocol's transport once it is connected (Twisted also allows None: before ``makeConnection``)."""
    return cast(StreamTransport, transport)
