"""Errors the core raises for a client's request; sessions turn them into protocol errors."""
from __future__ import annotations


class BrokerError(Exception):
    """A request the broker refuses; str() is the reason a client should see."""


class UnknownDestination(BrokerError):
    pass


class UnknownTransaction(BrokerError):
    pass


class UnknownDelivery(BrokerError):
    """An ack or nack for something this consumer does not hold."""


class SubscriptionError(BrokerError):
    pass


class UserLimit(BrokerError):
    """A user already has as many connections as it may (``max_connections_per_user``)."""
