"""Typed views of the Twisted objects the gateway calls: its reactor, ports, timers and transports.

Twisted types its reactor and transports as zope.interface ``Interface``
classes, whose methods are declared without ``self``.  mypy reads them
properly only with the mypy-zope plugin; without it every call on an
``IReactorCore`` or an ``ITransport`` is an error.  These Protocols name
what the gateway calls, with the signatures of Twisted's interfaces, and
the objects Twisted hands out are cast to them in one place each:
``installed_reactor`` for the global reactor, ``connected_transport`` for a
connection's transport.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from twisted.internet.address import IPv4Address, IPv6Address
    from twisted.internet.defer import Deferred
    from twisted.internet.interfaces import ITransport
    from twisted.internet.protocol import Factory


class DelayedCall(Protocol):
    """``IDelayedCall``: what ``callLater`` returns."""

    def active(self) -> bool: ...

    def cancel(self) -> None: ...


class ListeningPort(Protocol):
    """``IListeningPort`` of a TCP listener."""

    def getHost(self) -> IPv4Address | IPv6Address: ...

    def stopListening(self) -> Deferred[None] | None: ...


class Reactor(Protocol):
    """The parts of ``IReactorCore``, ``IReactorTime``, ``IReactorTCP`` and ``IReactorThreads`` the gateway uses."""

    @property
    def running(self) -> bool: ...

    def run(self) -> None: ...

    def stop(self) -> None: ...

    def seconds(self) -> float: ...

    # ``f`` (Twisted's ReactorBase says ``callable``) as core.broker.Clock names it: a Reactor is a Clock.
    def callLater(self, delay: float, f: Callable[..., Any], *args: object, **kw: object) -> DelayedCall: ...

    def callFromThread(self, f: Callable[..., Any], *args: object, **kwargs: object) -> None: ...

    def callInThread(self, f: Callable[..., Any], *args: object, **kwargs: object) -> None: ...

    def addSystemEventTrigger(
        self, phase: str, eventType: str, callable: Callable[..., Any], *args: object, **kwargs: object,
    ) -> Any: ...

    def listenTCP(self, port: int, factory: Factory, backlog: int = 50, interface: str = "") -> ListeningPort: ...


class Transport(Protocol):
    """The parts of ``ITransport`` the gateway uses."""

    def write(self, data: bytes) -> None: ...

    def loseConnection(self) -> None: ...


def installed_reactor() -> Reactor:
    """Twisted's global reactor; the first call installs the default one, as the import does."""
    from twisted.internet import reactor

    return cast(Reactor, reactor)


def connected_transport(transport: ITransport | None) -> Transport:
    """A protocol's ``transport`` once it is connected (Twisted declares None too: before ``makeConnection``)."""
    return cast(Transport, transport)
