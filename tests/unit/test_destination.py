import pytest

from core.destination import InvalidDestination, has_wildcard, kind_of, validate


def test_kinds():
    assert kind_of("queue://a") == "queue"
    assert kind_of("topic://a.b") == "topic"
    assert kind_of("temp-queue://c1:x") == "temp-queue"
    with pytest.raises(InvalidDestination):
        kind_of("/queue/a")


def test_wildcards_only_where_allowed():
    assert validate("topic://a.*.c", allow_wildcards=True)
    assert has_wildcard("topic://a.>")
    with pytest.raises(InvalidDestination):
        validate("topic://a.*", allow_wildcards=False)
    with pytest.raises(InvalidDestination):
        validate("topic://a.>.c", allow_wildcards=True)
    with pytest.raises(InvalidDestination):
        validate("queue://", allow_wildcards=False)
