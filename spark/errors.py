"""The errors a user of the ``gateway`` data source can see.

Spark wraps whatever a data source raises in its own exception and keeps the
Python message, so each message here is written to stand on its own: it says
what was asked, what the broker answered and what to change.  One base class
lets callers catch all of them at once.
"""
from __future__ import annotations

import functools
from typing import Callable, Iterator, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class GatewayError(Exception):
    """Anything the gateway data source refuses or cannot do."""


class OptionError(GatewayError, ValueError):
    """An option with a bad value; the message names the option and the value."""

    def __init__(self, option: str, value: object, expected: str) -> None:
        super().__init__(f"gateway: option '{option}' {expected}, got {value!r}")
        self.option = option
        self.value = value


class BrokerError(GatewayError):
    """The broker answered with an error; ``code`` is its machine-readable token."""

    def __init__(self, message: str, status: int = 0, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class BrokerUnreachable(BrokerError, ConnectionError):
    """No HTTP answer at all: wrong URL, broker down, admin listener disabled."""


class UnknownStream(BrokerError):
    """The stream option names a stream the broker does not have."""


class OffsetOutOfRange(BrokerError):
    """A range read the broker refused with 416; carries the partition's current bounds."""

    def __init__(self, message: str, earliest: int, latest: int) -> None:
        super().__init__(message, 416, "offset_out_of_range")
        self.earliest = earliest
        self.latest = latest


class DataLossError(GatewayError):
    """Records the query needs are gone (retention) or never existed (a broker that went back)."""


def user_facing(method: Callable[P, R]) -> Callable[P, R]:
    """Raise our errors from the entry point Spark called, without the frames below it.

    Spark shows the Python traceback with the message; for a bad option or an
    unknown stream the frames inside the connector only bury the sentence
    that matters.  Other exceptions (bugs) keep their full traceback.
    """

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except GatewayError as exc:
            raise exc.with_traceback(None) from None

    return wrapper


def shielded(items: Iterator[T]) -> Iterator[T]:
    """``user_facing`` for the generators that read() and write() consume on executors."""
    try:
        yield from items
    except GatewayError as exc:
        raise exc.with_traceback(None) from None
