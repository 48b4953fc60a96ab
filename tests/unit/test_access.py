"""The rules engine (core/access.py): deny wins, default deny, groups, placeholders, wildcard subscriptions, $SYS."""
from __future__ import annotations

import itertools

import pytest

from core.access import ANONYMOUS, Permission, Principal, Rule, Rules, covers, fill_level, overlaps
from core.trie import filter_matches

READ, WRITE, ADMIN = Permission.READ, Permission.WRITE, Permission.ADMIN
alice = Principal("alice", frozenset({"devices"}))
bob = Principal("bob")


def rule(who, permissions, destinations, access="allow"):
    return Rule.parse(who, access, permissions, destinations)


def test_default_deny_and_allow():
    rules = Rules([rule("user:alice", ["read"], ["queue://orders"])])
    assert rules.allowed(alice, READ, "queue://orders")
    assert not rules.allowed(alice, WRITE, "queue://orders")
    assert not rules.allowed(alice, READ, "queue://other")
    assert not rules.allowed(alice, READ, "topic://orders")  # the kind is part of the name
    assert not rules.allowed(bob, READ, "queue://orders")
    assert not Rules([]).allowed(alice, READ, "queue://orders")


def test_deny_wins_whatever_the_order():
    allow = rule("*", ["read", "write"], ["topic://sensors.>"])
    deny = rule("group:devices", ["write"], ["topic://sensors.secret.>"], access="deny")
    for order in ([allow, deny], [deny, allow]):
        rules = Rules(order)
        assert rules.allowed(alice, WRITE, "topic://sensors.a")
        assert not rules.allowed(alice, WRITE, "topic://sensors.secret.x")
        assert rules.allowed(alice, READ, "topic://sensors.secret.x")  # the deny names write only
        assert rules.allowed(bob, WRITE, "topic://sensors.secret.x")  # bob is not in devices


def test_who():
    rules = Rules([
        rule("group:devices", ["write"], ["queue://g"]),
        rule("anonymous", ["read"], ["queue://public"]),
        rule("*", ["read"], ["queue://all"]),
    ])
    assert rules.allowed(alice, WRITE, "queue://g") and not rules.allowed(bob, WRITE, "queue://g")
    assert rules.allowed(ANONYMOUS, READ, "queue://public") and not rules.allowed(alice, READ, "queue://public")
    assert all(rules.allowed(p, READ, "queue://all") for p in (alice, bob, ANONYMOUS))


def test_username_and_client_id_fill_a_level():
    rules = Rules([
        rule("*", ["read", "write"], ["topic://sensors.{username}.>"]),
        rule("*", ["read"], ["queue://inbox.{client_id}"]),
    ])
    assert rules.allowed(alice, WRITE, "topic://sensors.alice.temp")
    assert rules.allowed(alice, WRITE, "topic://sensors.alice")  # '>' takes the parent, as in subscriptions
    assert not rules.allowed(bob, WRITE, "topic://sensors.alice.temp")
    assert not rules.allowed(ANONYMOUS, WRITE, "topic://sensors.None.temp")
    assert rules.allowed(bob, READ, "queue://inbox.c1", "c1")
    assert not rules.allowed(bob, READ, "queue://inbox.c1", "c2")
    assert not rules.allowed(bob, READ, "queue://inbox.c1")  # no client id
    for bad in ("*", ">", "a.b/c", "a+", "#", ""):
        assert not rules.allowed(bob, READ, f"queue://inbox.{bad}", bad)
    # A wildcard client id never widens the pattern into a filter.
    assert not rules.allowed(bob, READ, "queue://inbox.*", "*")


def test_a_dotted_name_fills_the_level_as_mqtt_writes_it():
    rules = Rules([rule("*", ["write"], ["topic://sensors.{username}.>"])])
    mail = Principal("alice@example.com")
    # MQTT sensors/alice@example.com/t is canonical topic://sensors.alice@example/com.t
    assert rules.allowed(mail, WRITE, "topic://sensors.alice@example/com.t")
    assert not rules.allowed(mail, WRITE, "topic://sensors.alice@example.com.t")
    assert fill_level("a/b") is None and fill_level(None) is None


def test_wildcard_subscriptions_need_a_covering_allow():
    rules = Rules([rule("*", ["read"], ["topic://sensors.{username}.>"])])
    assert not rules.allowed(alice, READ, "topic://sensors.>")
    assert not rules.allowed(alice, READ, "topic://sensors.*.temp")
    assert rules.allowed(alice, READ, "topic://sensors.alice.>")
    assert rules.allowed(alice, READ, "topic://sensors.alice.*.temp")
    assert not rules.allowed(bob, READ, "topic://sensors.alice.>")
    assert not rules.allowed(alice, READ, "topic://>")


def test_a_deny_overlapping_a_filter_refuses_it_whole():
    rules = Rules([
        rule("*", ["read"], ["topic://sensors.>"]),
        rule("*", ["read"], ["topic://sensors.private.>"], access="deny"),
    ])
    assert rules.allowed(bob, READ, "topic://sensors.public.>")
    assert not rules.allowed(bob, READ, "topic://sensors.>")  # would include sensors.private.*
    assert not rules.allowed(bob, READ, "topic://sensors.*.x")  # sensors.private.x
    assert not rules.allowed(bob, READ, "topic://sensors.private")  # '>' in the deny takes the parent


def test_sys_topics_read_by_rule_never_written():
    rules = Rules([
        rule("*", ["read", "write"], ["topic://>"]),
        rule("group:devices", ["read", "write"], ["topic://$SYS.>"]),
    ])
    assert not rules.allowed(bob, READ, "topic://$SYS.broker.uptime")  # '>' does not reach $ topics
    assert rules.allowed(alice, READ, "topic://$SYS.broker.uptime")
    assert rules.allowed(alice, READ, "topic://$SYS.>")
    assert not rules.allowed(alice, WRITE, "topic://$SYS.broker.uptime")
    assert rules.allowed(bob, READ, "topic://>")  # which never delivers $SYS either


def test_streams_and_admin_are_destinations_too():
    rules = Rules([rule("user:alice", ["read"], ["stream://sensors"]), rule("user:bob", ["admin"], ["queue://>"])])
    assert rules.allowed(alice, READ, "stream://sensors") and not rules.allowed(alice, READ, "stream://orders")
    assert rules.allowed(bob, ADMIN, "queue://a.b") and not rules.allowed(bob, READ, "queue://a.b")


@pytest.mark.parametrize("who, access, permissions, destinations, error", [
    ("alice", "allow", ["read"], ["queue://a"], "who must be"),
    ("user:", "allow", ["read"], ["queue://a"], "who must be"),
    ("*", "permit", ["read"], ["queue://a"], "access must be"),
    ("*", "allow", ["rw"], ["queue://a"], "unknown permission 'rw'"),
    ("*", "allow", [], ["queue://a"], "permissions must be"),
    ("*", "allow", ["read"], [], "destinations must be"),
    ("*", "allow", ["read"], ["/topic/a"], "not a pattern"),
    ("*", "allow", ["read"], ["topic://a.>.b"], "must be the last level"),
    ("*", "allow", ["read"], ["topic://a.x{username}"], "whole level"),
    ("*", "allow", ["read"], ["topic://a.{user}"], "whole level"),
])
def test_bad_rules_say_why(who, access, permissions, destinations, error):
    with pytest.raises(ValueError, match=error):
        Rule.parse(who, access, permissions, destinations)


def test_decisions_are_cached_and_bounded():
    rules = Rules([rule("*", ["read"], ["queue://>"])])
    rules.CACHE_SIZE = 3
    for i in range(10):
        assert rules.allowed(bob, READ, f"queue://q{i}")
    assert len(rules._cache) <= 3


# covers and overlaps against brute force over a small universe: names of up to four levels
# over a few letters, a "fresh" letter no filter names, and a $ level.
LETTERS = ("a", "b", "$s")
UNIVERSE = [n for k in range(1, 5) for n in itertools.product(LETTERS + ("z",), repeat=k)]
FILTERS = [
    f for k in range(1, 4) for f in itertools.product(LETTERS + ("*", ">"), repeat=k)
    if ">" not in f[:-1]
]


def test_covers_and_overlaps_agree_with_brute_force():
    matched = {f: {n for n in UNIVERSE if filter_matches(f, n)} for f in FILTERS}
    for p, f in itertools.product(FILTERS, FILTERS):
        assert covers(p, f) == (matched[f] <= matched[p]), (p, f)
        assert overlaps(p, f) == bool(matched[f] & matched[p]), (p, f)
    for p in FILTERS:
        for n in UNIVERSE[:40]:
            assert covers(p, n) == filter_matches(p, n)


def test_dead_letter_queues_need_admin_besides_the_permission():
    from core.access import DeadLetterAccess
    from core.policy import Policy

    rules = Rules([
        rule("user:alice", ["read", "write"], ["queue://>"]),
        rule("user:bob", ["read", "admin"], ["queue://DLQ", "queue://DLQ.>"]),
    ])
    access = DeadLetterAccess(rules, Policy().is_dead_letter_queue)
    assert access.allowed(alice, READ, "queue://orders")
    for dlq in ("queue://DLQ", "queue://DLQ.orders"):
        assert rules.allowed(alice, READ, dlq)  # the rules alone would let alice in
        assert not access.allowed(alice, READ, dlq) and not access.allowed(alice, WRITE, dlq)
        assert access.allowed(bob, READ, dlq) and access.allowed(bob, ADMIN, dlq)
        assert not access.allowed(bob, WRITE, dlq)  # admin adds nothing the rules do not allow
    assert not access.allowed(bob, READ, "queue://orders")


def test_creating_a_queue_needs_admin():
    from core.access import CreationAccess

    rules = Rules([
        rule("user:alice", ["read", "write"], ["queue://>", "topic://>"]),
        rule("user:bob", ["read", "write", "admin"], ["queue://>"]),
    ])
    existing = {"queue://orders"}
    access = CreationAccess(rules, existing.__contains__)
    assert access.allowed(alice, WRITE, "queue://orders") and access.allowed(alice, READ, "queue://orders")
    assert not access.allowed(alice, WRITE, "queue://typo") and not access.allowed(alice, READ, "queue://typo")
    assert access.allowed(alice, WRITE, "topic://anything")  # topics are not created
    assert access.allowed(bob, WRITE, "queue://typo")
    existing.add("queue://typo")
    assert access.allowed(alice, WRITE, "queue://typo")


# -- subscriptions a deny overlaps: granted, filtered at delivery (Mosquitto's behaviour) -----------


def paho_rules():
    """The configuration the Eclipse Paho interoperability suites assume."""
    return Rules([
        rule("*", ["read", "write"], ["topic://>"]),
        rule("*", ["read"], ["topic://test.nosubscribe"], access="deny"),
    ])


def test_a_filter_a_deny_overlaps_is_granted_filtered():
    from core.access import Reading

    rules = paho_rules()
    for wide in ("topic://>", "topic://*.*", "topic://test.>", "topic://test.*", "topic://*.nosubscribe"):
        assert rules.reading(ANONYMOUS, wide) is Reading.FILTERED, wide
        assert not rules.allowed(ANONYMOUS, READ, wide)  # the whole filter is still not readable
    for clear in ("topic://TopicA.>", "topic://TopicA.*", "topic://test.other", "topic://*.*.*"):
        assert rules.reading(ANONYMOUS, clear) is Reading.WHOLE, clear
    assert rules.reading(ANONYMOUS, "topic://test.nosubscribe") is Reading.REFUSED
    # '>' takes its parent: test.nosubscribe.> matches the denied name, and below it nothing is denied.
    assert rules.reading(ANONYMOUS, "topic://test.nosubscribe.>") is Reading.FILTERED


def test_a_filter_no_allow_covers_or_a_deny_covers_whole_is_still_refused():
    from core.access import Reading

    rules = Rules([
        rule("*", ["read"], ["topic://sensors.>"]),
        rule("*", ["read"], ["topic://sensors.private.>"], access="deny"),
        rule("user:alice", ["read"], ["topic://alerts.>"], access="deny"),
    ])
    assert rules.reading(bob, "topic://>") is Reading.REFUSED  # wider than any allow
    assert rules.reading(bob, "topic://$SYS.>") is Reading.REFUSED
    assert rules.reading(bob, "topic://sensors.private.*") is Reading.REFUSED  # every name it matches is denied
    assert rules.reading(bob, "topic://sensors.>") is Reading.FILTERED
    assert rules.reading(bob, "topic://sensors.*.x") is Reading.FILTERED
    assert rules.reading(bob, "topic://sensors.public.>") is Reading.WHOLE
    assert rules.reading(alice, "topic://sensors.>") is Reading.FILTERED  # alice's own deny is elsewhere
    assert rules.reading(bob, "queue://sensors") is Reading.REFUSED
    assert rules.reading(bob, "nonsense") is Reading.REFUSED


def test_a_reader_checks_topics_and_remembers_per_rules_version():
    rules = paho_rules()
    reader = rules.reader(ANONYMOUS, "c1")
    assert reader is not None
    assert reader.permits("topic://TopicA.B") and not reader.permits("topic://test.nosubscribe")
    assert reader.answers == {"topic://TopicA.B": True, "topic://test.nosubscribe": False}
    rules.replace([rule("*", ["read"], ["topic://>"]), rule("*", ["read"], ["topic://TopicA.>"], access="deny")])
    # The next delivery is checked by the new rules: what was remembered went with the old ones.
    assert reader.permits("topic://test.nosubscribe") and not reader.permits("topic://TopicA.B")
    assert reader.version == rules.version


def test_a_readers_memory_is_bounded(monkeypatch):
    import core.access

    reader = paho_rules().reader(bob)
    assert reader is not None
    monkeypatch.setattr(core.access, "READER_CACHE_SIZE", 5)
    for i in range(20):
        assert reader.permits(f"topic://t.{i}")
    assert len(reader.answers) <= 5


def test_a_reload_tells_the_readers_that_listen_until_closed():
    rules = paho_rules()
    heard: list[str] = []
    one, two = rules.reader(ANONYMOUS), rules.reader(bob)
    assert one is not None and two is not None
    one.listen(lambda: heard.append("one"))
    two.listen(lambda: heard.append("two"))
    rules.replace(list(rules.rules))
    assert sorted(heard) == ["one", "two"]
    two.close()
    rules.replace(list(rules.rules))
    assert sorted(heard) == ["one", "one", "two"]


def test_wrappers_keep_their_own_refusals_when_reading():
    from core.access import AllowAll, CreationAccess, DeadLetterAccess, Reading

    rules = Rules([rule("*", ["read"], ["queue://>", "topic://>"]), rule("*", ["read"], ["topic://a.b"], access="deny")])
    dead = DeadLetterAccess(rules, lambda name: name == "queue://DLQ")
    assert dead.reading(bob, "queue://DLQ") is Reading.REFUSED  # needs admin too
    assert dead.reading(bob, "topic://a.*") is Reading.FILTERED
    made = CreationAccess(rules, lambda name: name == "queue://made")
    assert made.reading(bob, "queue://made") is Reading.WHOLE
    assert made.reading(bob, "queue://new") is Reading.REFUSED  # creating it needs admin
    assert dead.reader(bob) is not None and made.reader(bob) is not None
    assert AllowAll().reading(bob, "topic://>") is Reading.WHOLE and AllowAll().reader(bob) is None
