"""Who a connection is, and what it may do with a destination.

The core knows destinations, so the rules are matched here; where users and
rules come from (a file, the configuration) is the gateway's business, and
the protocol sessions ask ``Access.allowed`` at each point that matters.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol


class Permission(enum.Enum):
    READ = "read"    # subscribe, browse, stream reads
    WRITE = "write"  # send, publish, retained messages, wills
    ADMIN = "admin"  # create and delete, purge, durable subscriptions, the admin API


@dataclass(frozen=True)
class Principal:
    """An authenticated user (``name``) with its groups; ``name`` None is anonymous."""

    name: str | None
    groups: frozenset[str] = field(default_factory=frozenset)

    @property
    def anonymous(self) -> bool:
        return self.name is None


ANONYMOUS = Principal(None)


class Access(Protocol):
    """What a session asks before acting for a principal."""

    def allowed(self, principal: Principal, permission: Permission, destination: str, client_id: str | None = None) -> bool:
        """``destination`` is canonical (``topic://a.b``, ``queue://q``, ``stream://s``)."""


class AllowAll:
    """No rules configured and anonymous access allowed (the loopback default): everything is allowed."""

    def allowed(self, principal: Principal, permission: Permission, destination: str, client_id: str | None = None) -> bool:
        return True
