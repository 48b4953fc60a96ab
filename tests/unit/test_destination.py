import pytest

from core.destination import InvalidDestination, kind_of, validate, wildcard_level


def test_kinds():
    assert kind_of("queue://a") == "queue"
    assert kind_of("topic://a.b") == "topic"
    assert kind_of("temp-queue://c1:x") == "temp-queue"
    with pytest.raises(InvalidDestination):
        kind_of("/queue/a")


def test_wildcards_only_where_allowed():
    assert validate("topic://a.*.c", allow_wildcards=True)
    assert wildcard_level("topic://a.>") == ">"
    with pytest.raises(InvalidDestination):
        validate("topic://a.*", allow_wildcards=False)
    with pytest.raises(InvalidDestination):
        validate("topic://a.>.c", allow_wildcards=True)
    with pytest.raises(InvalidDestination):
        validate("queue://", allow_wildcards=False)


def test_a_wildcard_in_a_topic_to_send_to_says_what_to_send_to_instead():
    with pytest.raises(InvalidDestination) as refused:
        validate("topic://prices.*", allow_wildcards=False)
    assert str(refused.value) == (
        "topic name 'prices.*' has the wildcard '*': wildcards are for subscribing; "
        "send to a full topic name, which subscribers of 'prices.*' receive"
    )


def test_wildcard_levels_of_queues_and_topics():
    assert wildcard_level("queue://a.*") == "*" and wildcard_level("queue://a.b.>") == ">"
    assert wildcard_level("topic://a.*.>") == "*"
    # Only a whole level is a wildcard; temporary queues and streams have none.
    assert wildcard_level("queue://a.b*") == "" and wildcard_level("queue://a>b") == ""
    assert wildcard_level("temp-queue://c1:a.*") == "" and wildcard_level("stream://a") == ""
    # Queue names are not checked by validate (configured patterns such as queue://orders.>
    # use it); the rule for names to send to is the broker's (test_broker.py).
    assert validate("queue://orders.>", allow_wildcards=True)
