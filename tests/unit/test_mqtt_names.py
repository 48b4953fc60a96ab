import pytest

from protocols.mqtt.names import (
    InvalidTopic,
    canonical_to_topic,
    filter_to_canonical,
    split_shared,
    topic_to_canonical,
)


@pytest.mark.parametrize("topic, canonical", [
    ("a/b/c", "topic://a.b.c"),
    ("sensors/temp.c", "topic://sensors.temp/c"),
    ("/leading", "topic://.leading"),
    ("a//b", "topic://a..b"),
    ("$SYS/broker/uptime", "topic://$SYS.broker.uptime"),
])
def test_topics_round_trip(topic, canonical):
    assert topic_to_canonical(topic) == canonical
    assert canonical_to_topic(canonical) == topic


@pytest.mark.parametrize("mqtt_filter, canonical", [
    ("a/+/c", "topic://a.*.c"),
    ("a/#", "topic://a.>"),
    ("#", "topic://>"),
    ("+/x.y", "topic://*.x/y"),
])
def test_filters(mqtt_filter, canonical):
    assert filter_to_canonical(mqtt_filter) == canonical


@pytest.mark.parametrize("bad", ["", "a/#/b", "a/b#", "a+/b", "a/*", "a/>"])
def test_invalid_filters(bad):
    with pytest.raises(InvalidTopic):
        filter_to_canonical(bad)


@pytest.mark.parametrize("bad", ["a/*", ">/x"])
def test_reserved_levels_cannot_be_published(bad):
    with pytest.raises(InvalidTopic):
        topic_to_canonical(bad)


def test_stomp_topics_mqtt_cannot_express():
    assert canonical_to_topic("topic://issue#5") is None
    assert canonical_to_topic("queue://a") is None


def test_shared():
    assert split_shared("$share/g1/a/+") == ("g1", "a/+")
    assert split_shared("a/b") == (None, "a/b")
    for bad in ("$share/g1", "$share//a", "$share/g+/a"):
        with pytest.raises(InvalidTopic):
            split_shared(bad)
