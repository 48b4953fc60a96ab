"""Who a connection is, and what it may do with a destination.

The core knows destinations, so the rules are matched here; where users and
rules come from (a file, the configuration) is the gateway's business, and
the protocol sessions ask ``Access.allowed`` at each point that matters.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, Protocol


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


class Reading(enum.Enum):
    """What the rules make of a subscription (``read`` on a destination or a filter)."""

    REFUSED = "refused"    # no allow covers all of it, or a deny covers all of it
    WHOLE = "whole"        # every message it can match may be delivered
    # Granted, but a deny overlaps it (``#`` beside a denied ``test/nosubscribe``): each
    # message is checked at delivery and the denied ones are skipped, as Mosquitto does.
    FILTERED = "filtered"


class Access(Protocol):
    """What a session asks before acting for a principal."""

    def allowed(self, principal: Principal, permission: Permission, destination: str, client_id: str | None = None) -> bool:
        """``destination`` is canonical (``topic://a.b``, ``queue://q``, ``stream://s``)."""

    def reading(self, principal: Principal, destination: str, client_id: str | None = None) -> Reading:
        """Whether a subscription to ``destination`` (a name or a filter) is granted, and how.

        ``allowed(READ)`` answers only for the whole of a filter; a filter a deny
        overlaps is FILTERED here, and the session checks its deliveries with a ``reader``.
        """

    def reader(self, principal: Principal, client_id: str | None = None) -> Reader | None:
        """The delivery check of one session (None: nothing can be denied, there are no rules)."""

    @property
    def version(self) -> int:
        """Changes whenever the rules do (a reload): a session may remember a decision about a
        topic, which depends on nothing else, for as long as this stays the same."""


class AllowAll:
    """No rules configured and anonymous access allowed (the loopback default): everything is allowed."""

    def allowed(self, principal: Principal, permission: Permission, destination: str, client_id: str | None = None) -> bool:
        return True

    def reading(self, principal: Principal, destination: str, client_id: str | None = None) -> Reading:
        return Reading.WHOLE

    def reader(self, principal: Principal, client_id: str | None = None) -> Reader | None:
        return None

    @property
    def version(self) -> int:
        return 0


# Rules: who may do what with which destinations ([[auth.rules]] in the configuration).

WHO_ALL = "*"
WHO_ANONYMOUS = "anonymous"
USERNAME = "{username}"
CLIENT_ID = "{client_id}"
# "broker": the admin API's broker-wide resources (broker://connections, broker://metrics).
_KINDS = ("queue", "topic", "temp-queue", "stream", "broker")
_ONE, _REST = "*", ">"  # core.destination's wildcards (levels, as in core/trie.py)
# What a name may not contain to fill one level of a pattern: separators and wildcards of both protocols.
_NOT_IN_A_LEVEL = frozenset(".*>+#")
_SWAP = str.maketrans({"/": ".", ".": "/"})


@dataclass(frozen=True)
class Rule:
    """One ``[[auth.rules]]`` entry, checked: build it with ``Rule.parse``.

    ``who``: ``user:NAME``, ``group:NAME``, ``anonymous`` or ``*`` (everyone,
    anonymous included).  ``destinations``: canonical names with the broker's
    wildcards (``*`` one level, ``>`` the rest) and ``{username}`` or
    ``{client_id}`` filling a whole level.
    """

    who: str
    allow: bool
    permissions: frozenset[Permission]
    destinations: tuple[str, ...]

    @classmethod
    def parse(cls, who: object, access: object, permissions: object, destinations: object) -> Rule:
        """Raises ValueError saying what is wrong, in the configuration's words."""
        if not isinstance(who, str) or not (
            who in (WHO_ALL, WHO_ANONYMOUS) or (who.startswith(("user:", "group:")) and who.split(":", 1)[1])
        ):
            raise ValueError(f'who must be "user:NAME", "group:NAME", "anonymous" or "*", got {who!r}')
        if access not in ("allow", "deny"):
            raise ValueError(f'access must be "allow" or "deny", got {access!r}')
        known = {p.value: p for p in Permission}
        if not isinstance(permissions, list) or not permissions:
            raise ValueError(f"permissions must be a non-empty list of {', '.join(known)}")
        for p in permissions:
            if p not in known:
                raise ValueError(f"unknown permission {p!r}: use {', '.join(known)}")
        if not isinstance(destinations, list) or not destinations:
            raise ValueError('destinations must be a non-empty list of patterns like "topic://sensors.>"')
        for pattern in destinations:
            _check_pattern(pattern)
        return cls(who, access == "allow", frozenset(known[p] for p in permissions), tuple(destinations))


def _check_pattern(pattern: object) -> None:
    if not isinstance(pattern, str) or "://" not in pattern or pattern.split("://", 1)[0] not in _KINDS:
        raise ValueError(f"{pattern!r} is not a pattern like \"topic://sensors.>\" (queue://, topic://, temp-queue://, stream:// or broker://)")
    levels = pattern.split("://", 1)[1].split(".")
    if levels == [""]:
        raise ValueError(f"{pattern!r}: empty name")
    for i, level in enumerate(levels):
        if level == _REST and i != len(levels) - 1:
            raise ValueError(f"{pattern!r}: '>' must be the last level")
        if ("{" in level or "}" in level) and level not in (USERNAME, CLIENT_ID):
            raise ValueError(f"{pattern!r}: {USERNAME} and {CLIENT_ID} must fill a whole level, as in \"topic://sensors.{{username}}.>\"")


def fill_level(value: str | None) -> str | None:
    """A user name or client id as one level of a canonical name, or None when it cannot be one.

    The name fills the level as an MQTT client writes it: a ``.`` in it is
    the ``/`` of the canonical level (core's swap, protocols/mqtt/names.py),
    so user ``alice@example.com`` owns MQTT ``sensors/alice@example.com/#``.
    A name with a separator or a wildcard of either protocol, or no name
    (anonymous), fills no level: such a pattern never matches it.
    """
    if not value:
        return None
    level = value.translate(_SWAP)
    if _NOT_IN_A_LEVEL.intersection(level):
        return None
    return level


def covers(pattern: tuple[str, ...], target: tuple[str, ...]) -> bool:
    """Whether every name that ``target`` (a name or a filter) matches is matched by ``pattern``.

    The semantics are the trie's (core/trie.py): ``*`` one level, ``>`` this
    level and all below (the parent included), and a leading wildcard never
    matches a first level starting with ``$``.  For a name without wildcards
    this is ``filter_matches``.
    """
    if target and target[0].startswith("$") and target[0] not in (_ONE, _REST) and pattern and pattern[0] in (_ONE, _REST):
        return False
    for i, t in enumerate(target):
        if i >= len(pattern):
            return False
        p = pattern[i]
        if p == _REST:
            return True
        if t == _REST:
            # Names of this level and below, and the parent: only ``*.>`` at the top, where there is no parent, is as wide.
            return i == 0 and pattern == (_ONE, _REST)
        if (t == _ONE and p != _ONE) or (p != _ONE and p != t):
            return False
    return len(pattern) == len(target) or (len(pattern) == len(target) + 1 and pattern[-1] == _REST)


def overlaps(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Whether some name is matched by both ``a`` and ``b`` (names or filters)."""
    for first, second in ((a, b), (b, a)):
        if first and second and first[0] in (_ONE, _REST) and second[0] not in (_ONE, _REST) and second[0].startswith("$"):
            return False
    for x, y in zip(a, b):
        if x == _REST or y == _REST:
            return True
        if x != y and x != _ONE and y != _ONE:
            return False
    if len(a) == len(b):
        return True
    longer = a if len(a) > len(b) else b
    return len(longer) == min(len(a), len(b)) + 1 and longer[-1] == _REST


@dataclass(frozen=True)
class _Pattern:
    kind: str
    levels: tuple[str, ...]
    filled: bool  # has {username} or {client_id}

    def resolve(self, principal: Principal, client_id: str | None) -> tuple[str, ...] | None:
        if not self.filled:
            return self.levels
        out = []
        for level in self.levels:
            if level == USERNAME or level == CLIENT_ID:
                value = fill_level(principal.name if level == USERNAME else client_id)
                if value is None:
                    return None
                level = value
            out.append(level)
        return tuple(out)


def _applies(who: str, principal: Principal) -> bool:
    if who == WHO_ALL:
        return True
    if who == WHO_ANONYMOUS:
        return principal.anonymous
    kind, name = who.split(":", 1)
    return principal.name == name if kind == "user" else name in principal.groups


class Rules:
    """``Access`` from a list of rules: deny wins; what no rule allows is denied.

    A destination with wildcards (a subscription such as ``topic://sensors.>``)
    is ``allowed`` only when one allow pattern covers it, every name it can
    match (``covers``), and no deny pattern shares a name with it (``overlaps``).
    A subscription is granted on less (``reading``): one allow must still
    cover the filter, but a deny that overlaps it without covering it only
    filters it, message by message at delivery (``Reader``), as Mosquitto
    does; a filter wider than any allow is still refused.  Publishing to
    ``$SYS`` is refused whatever the rules say: those topics are the broker's own.
    """

    CACHE_SIZE = 10_000

    def __init__(self, rules: list[Rule]) -> None:
        self._cache: dict[tuple[Principal, Permission, str, str | None], bool] = {}
        self._version = 0
        # Readers whose session wants to hear of a reload (Reader.listen), so that a
        # subscription a new deny overlaps starts being checked at its next delivery.
        self._listening: dict[Reader, None] = {}
        self.replace(rules)

    @property
    def version(self) -> int:
        return self._version

    def replace(self, rules: list[Rule]) -> None:
        """New rules (a reload): every session holding this object checks by them from now on."""
        self.rules = list(rules)
        # permission -> kind -> [(who, allow, pattern)], in the configured order.
        self._compiled: dict[Permission, dict[str, list[tuple[str, bool, _Pattern]]]] = {p: {} for p in Permission}
        for rule in self.rules:
            for destination in rule.destinations:
                kind, name = destination.split("://", 1)
                levels = tuple(name.split("."))
                pattern = _Pattern(kind, levels, USERNAME in levels or CLIENT_ID in levels)
                for permission in rule.permissions:
                    self._compiled[permission].setdefault(kind, []).append((rule.who, rule.allow, pattern))
        self._cache.clear()
        self._version += 1
        for reader in list(self._listening):
            reader.rules_changed()

    def allowed(self, principal: Principal, permission: Permission, destination: str, client_id: str | None = None) -> bool:
        key = (principal, permission, destination, client_id)
        known = self._cache.get(key)
        if known is not None:
            return known
        decision = self._decide(principal, permission, destination, client_id)
        if len(self._cache) >= self.CACHE_SIZE:
            self._cache.clear()
        self._cache[key] = decision
        return decision

    def _decide(self, principal: Principal, permission: Permission, destination: str, client_id: str | None) -> bool:
        kind, sep, name = destination.partition("://")
        if not sep:
            return False
        target = tuple(name.split("."))
        if permission is Permission.WRITE and kind == "topic" and target[0] == "$SYS":
            return False
        allowed = False
        for who, allow, pattern in self._compiled[permission].get(kind, ()):
            if not _applies(who, principal):
                continue
            levels = pattern.resolve(principal, client_id)
            if levels is None:
                continue
            if allow:
                allowed = allowed or covers(levels, target)
            elif overlaps(levels, target):
                return False
        return allowed

    def reading(self, principal: Principal, destination: str, client_id: str | None = None) -> Reading:
        """Subscriptions are rare beside deliveries: decided afresh, not cached."""
        kind, sep, name = destination.partition("://")
        if not sep:
            return Reading.REFUSED
        target = tuple(name.split("."))
        covered = filtered = False
        for who, allow, pattern in self._compiled[Permission.READ].get(kind, ()):
            if not _applies(who, principal):
                continue
            levels = pattern.resolve(principal, client_id)
            if levels is None:
                continue
            if allow:
                covered = covered or covers(levels, target)
            elif overlaps(levels, target):
                if covers(levels, target):
                    return Reading.REFUSED  # nothing it matches could ever be delivered
                filtered = True
        if not covered:
            return Reading.REFUSED
        return Reading.FILTERED if filtered else Reading.WHOLE

    def reader(self, principal: Principal, client_id: str | None = None) -> Reader | None:
        return Reader(self, principal, client_id)

    def listen(self, reader: Reader) -> None:
        self._listening[reader] = None

    def forget(self, reader: Reader) -> None:
        self._listening.pop(reader, None)


# Topics one reader remembers its answer for; beyond it the cache starts over (bounded memory).
READER_CACHE_SIZE = 1000


class Reader:
    """One session's check of each delivery of its subscriptions that a deny rule overlaps.

    Only those subscriptions' consumers carry it (``Consumer.check``), so the
    common path pays nothing.  Its answer for a topic depends on nothing but
    the rules, so it is remembered per topic for as long as the rules'
    version stays the same: a subscriber of ``#`` among a fleet of topics
    pays one dict lookup per delivery.  It asks the rules themselves, under
    any wrapper: a skipped delivery is counted (``Connection.messages_denied``),
    not written to the audit log, which would take one line per message.
    """

    __slots__ = ("rules", "principal", "client_id", "version", "answers", "on_change")

    def __init__(self, rules: Rules, principal: Principal, client_id: str | None) -> None:
        self.rules = rules
        self.principal = principal
        self.client_id = client_id
        self.version = rules.version
        self.answers: dict[str, bool] = {}
        self.on_change: Callable[[], None] | None = None

    def reading(self, destination: str) -> Reading:
        """What the current rules make of a subscription of this session (after a reload, or a restart)."""
        return self.rules.reading(self.principal, destination, self.client_id)

    def permits(self, destination: str) -> bool:
        """Whether a message on ``destination`` (a topic name) may be delivered now."""
        answers = self.answers
        version = self.rules._version  # the attribute, not the property: this is per delivery
        if version != self.version:
            answers.clear()
            self.version = version
        known = answers.get(destination)
        if known is None:
            if len(answers) >= READER_CACHE_SIZE:
                answers.clear()
            known = answers[destination] = self.rules.allowed(self.principal, Permission.READ, destination, self.client_id)
        return known

    def listen(self, on_change: Callable[[], None]) -> None:
        """Call ``on_change`` whenever the rules are replaced, until ``close``."""
        self.on_change = on_change
        self.rules.listen(self)

    def rules_changed(self) -> None:
        on_change = self.on_change
        if on_change is not None:
            on_change()

    def close(self) -> None:
        self.on_change = None
        self.rules.forget(self)


class DeadLetterAccess:
    """Dead-letter queues need ``admin`` besides the permission asked for.

    A DLQ gathers failed messages from every queue, so a rule that lets a user
    read ``queue://>`` should not also let it read what other queues' messages
    became; and a client writing to a DLQ would forge dead letters.  The
    broker's own moves into the DLQ are not client operations and are not asked.
    """

    def __init__(self, access: Access, is_dead_letter_queue: Callable[[str], bool]) -> None:
        self.access = access
        self.is_dead_letter_queue = is_dead_letter_queue

    @property
    def version(self) -> int:
        return self.access.version

    def allowed(self, principal: Principal, permission: Permission, destination: str, client_id: str | None = None) -> bool:
        if not self.access.allowed(principal, permission, destination, client_id):
            return False
        if permission is Permission.ADMIN or not self.is_dead_letter_queue(destination):
            return True
        return self.access.allowed(principal, Permission.ADMIN, destination, client_id)

    def reading(self, principal: Principal, destination: str, client_id: str | None = None) -> Reading:
        found = self.access.reading(principal, destination, client_id)
        if found is Reading.REFUSED or not self.is_dead_letter_queue(destination):
            return found
        return found if self.access.allowed(principal, Permission.ADMIN, destination, client_id) else Reading.REFUSED

    def reader(self, principal: Principal, client_id: str | None = None) -> Reader | None:
        return self.access.reader(principal, client_id)


class CreationAccess:
    """A queue that does not exist yet is created only by a principal with ``admin`` on it.

    As in ActiveMQ (admin to auto-create) and RabbitMQ (configure to declare):
    ``write`` lets a producer fill the queues an operator meant, not
    conjure new ones by typo or on purpose; each stays in the store until
    deleted.  Topics are not created, streams are configured, temporary
    queues belong to their connection; so only ``queue://`` is asked.
    ``exists`` is set once the broker is built (its queue table).
    """

    def __init__(self, access: Access, exists: Callable[[str], bool] | None = None) -> None:
        self.access = access
        self.exists: Callable[[str], bool] = exists or (lambda destination: True)

    @property
    def version(self) -> int:
        return self.access.version

    def allowed(self, principal: Principal, permission: Permission, destination: str, client_id: str | None = None) -> bool:
        if not self.access.allowed(principal, permission, destination, client_id):
            return False
        if permission is Permission.ADMIN or not destination.startswith("queue://") or self.exists(destination):
            return True
        return self.access.allowed(principal, Permission.ADMIN, destination, client_id)

    def reading(self, principal: Principal, destination: str, client_id: str | None = None) -> Reading:
        found = self.access.reading(principal, destination, client_id)
        if found is Reading.REFUSED or not destination.startswith("queue://") or self.exists(destination):
            return found
        return found if self.access.allowed(principal, Permission.ADMIN, destination, client_id) else Reading.REFUSED

    def reader(self, principal: Principal, client_id: str | None = None) -> Reader | None:
        return self.access.reader(principal, client_id)
