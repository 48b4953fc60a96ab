"""A consumer: one subscription's claim on a queue, with its credit and unacked deliveries."""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    from core.access import Reader
    from core.entry import Entry
    from core.queue import MessageQueue
    from core.topic import MessageFilter


class AckMode(enum.Enum):
    AUTO = "auto"                      # settled when sent
    CLIENT = "client"                  # an ack settles everything delivered before it
    CLIENT_INDIVIDUAL = "client-individual"


class Owner(Protocol):
    """What a consumer needs from its connection: whether its socket can take more."""

    writable: bool
    output_held: bool  # its session already holds all it may until the store's sync
    id: str
    messages_out: int  # deliveries to it, for operators
    messages_denied: int  # deliveries its rules denied (skipped, see Consumer.check), for operators


# sink(consumer, entry, tag): the session turns a delivery into a frame.  A true
# result means the delivery needs no ack (MQTT QoS 0) and is settled at once.
Sink = Callable[["Consumer", "Entry", int], "bool | None"]


class Consumer:
    """Of its queue a consumer uses ``note_delivered`` and ``settle`` only; the queue
    hands it message groups (``own_group``, ``release_group``) and ``detach``es it."""

    __slots__ = (
        "id", "owner", "queue", "ack_mode", "prefetch", "selector", "exclusive",
        "sink", "unacked", "next_tag", "groups", "closed", "handle", "check", "remote",
    )

    def __init__(
        self,
        id: str,
        owner: Owner,
        queue: "MessageQueue",
        sink: Sink,
        *,
        ack_mode: AckMode = AckMode.AUTO,
        prefetch: int = 1000,
        selector: "MessageFilter | None" = None,
        exclusive: bool = False,
        handle: object = None,
        check: "Reader | None" = None,
        remote: bool = False,
    ) -> None:
        self.id = id
        self.owner = owner
        self.queue = queue
        self.sink = sink
        self.ack_mode = ack_mode
        self.prefetch = max(1, prefetch)
        self.selector = selector
        self.exclusive = exclusive
        # Deliveries awaiting an ack, by tag, in delivery order.
        self.unacked: dict[int, "Entry"] = {}
        self.next_tag = 1
        # Message groups this consumer owns, so leaving releases them in O(own groups).
        # Keys only: an empty dict is 64 bytes where an empty set is 216 (one per idle consumer).
        self.groups: dict[str, None] = {}
        self.closed = False
        # The session's own object for this subscription (e.g. the STOMP id).
        self.handle = handle
        # Set only on a subscription that a deny rule overlaps (a wildcard beside a denied
        # topic): each delivery asks it, and what the subscriber may not read is skipped.
        self.check = check
        # Another broker of the network consuming for its own consumers: served only when no
        # consumer here has credit (ActiveMQ's decreased priority for network consumers).
        self.remote = remote

    def has_credit(self) -> bool:
        owner = self.owner
        return owner.writable and not owner.output_held and len(self.unacked) < self.prefetch and not self.closed

    def accepts(self, entry: "Entry") -> bool:
        selector = self.selector
        return selector is None or selector.matches(entry.message.lookup)

    def deliver(self, entry: "Entry") -> None:
        """Hand an entry to the session (the queue counted it as sent)."""
        queue = self.queue
        check = self.check
        if check is not None and not check.permits(entry.message.destination):
            # Skipped silently, as Mosquitto does, and done with as if acknowledged: it
            # would be skipped again on any redelivery.  Counted for operators.
            self.owner.messages_denied += 1
            queue.settle(entry)
            return
        self.owner.messages_out += 1
        if entry.stored:
            queue.note_delivered(entry)
        tag = self.next_tag
        self.next_tag = tag + 1
        if self.ack_mode is AckMode.AUTO:
            self.sink(self, entry, tag)
            queue.settle(entry)
        else:
            unacked = self.unacked
            unacked[tag] = entry
            if self.sink(self, entry, tag) and unacked.pop(tag, None) is not None:
                # The session needs no ack for this one (MQTT QoS 0): settled as it goes out.
                queue.settle(entry)

    def held(self) -> int:
        """How many deliveries await an ack."""
        return len(self.unacked)

    def own_group(self, group: str) -> None:
        """The queue gave this consumer a message group."""
        self.groups[group] = None

    def release_group(self, group: str) -> None:
        """The queue took a message group back (closed, or moved to another consumer)."""
        self.groups.pop(group, None)

    def detach(self) -> tuple[list[str], list[Entry]]:
        """Leave the queue for good: returns the groups it owned and its unacked
        entries (oldest first), and holds neither any more."""
        self.closed = True
        groups = list(self.groups)
        self.groups.clear()
        unacked = list(self.unacked.values())
        self.unacked.clear()
        return groups, unacked

    def take(self, tag: int) -> list["Entry"]:
        """Remove and return what an ack or nack of ``tag`` covers.

        Client mode is cumulative (everything delivered up to the tag);
        client-individual is the one delivery.
        """
        unacked = self.unacked
        if tag not in unacked:
            return []
        if self.ack_mode is AckMode.CLIENT:
            taken: list[Entry] = []
            for t in list(unacked):
                taken.append(unacked.pop(t))
                if t == tag:
                    break
            return taken
        return [unacked.pop(tag)]

    def __repr__(self) -> str:
        return f"<Consumer {self.id} on {self.queue.name}>"
