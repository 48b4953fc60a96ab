"""A protocol's own reason an entry reached a queue (``Entry.via``), beside the core's subscriptions.

In a module of its own, kept interpreted when the hot core modules are
compiled (mypyc): protocols subclass it, and interpreted classes cannot
inherit from compiled ones.
"""
from __future__ import annotations


class ViaMarker:
    """Base of a protocol's own answer to "why did this entry reach the queue?".

    The core routes with subscriptions; a protocol that puts entries into a
    queue itself for another reason (MQTT's retained messages sent because
    of a SUBSCRIBE) derives a marker from this and sets it as ``Entry.via``.
    The core never looks inside one, but an entry can leave memory (paged
    out, or stored and read back after a restart) and come back without it.
    A marker whose meaning must survive that names a header in
    ``STORED_HEADER``: the entry's stored copy carries it (set to "1"), and
    the protocol reads it where an entry comes back with no ``via``.
    """

    __slots__ = ()
    STORED_HEADER: str | None = None
