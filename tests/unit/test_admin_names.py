"""Destination names in admin paths and bodies (gateway/admin/names.py): plain or canonical, looked up or checked."""
from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from core.broker import Broker
from gateway.admin.http import HttpError
from gateway.admin.names import canonical, plain, queue_name, topic_name
from persistence.memory import MemoryStore


@pytest.fixture
def broker():
    return Broker(MemoryStore(), Clock())


def test_views_look_names_up_as_they_are():
    assert queue_name("orders.eu") == queue_name("queue://orders.eu") == "queue://orders.eu"
    assert topic_name("a.b") == topic_name("topic://a.b") == "topic://a.b"
    assert queue_name("a.*") == "queue://a.*"  # not checked: such a queue is just not found
    assert plain("queue://orders.eu") == "orders.eu" and plain("topic://a://b") == "a://b"


def test_actions_take_a_plain_or_a_canonical_name_of_their_kind(broker):
    assert canonical("queue", "orders.eu", broker) == "queue://orders.eu"
    assert canonical("queue", "queue://orders.eu", broker) == "queue://orders.eu"
    with pytest.raises(HttpError, match="wildcard"):
        canonical("topic", "sensors.>", broker)  # an action names one topic, never a filter
    with pytest.raises(HttpError, match="'topic://a' is not a queue name") as refused:
        canonical("queue", "topic://a", broker)
    assert refused.value.status == 400 and refused.value.extra == {}


def test_a_name_to_send_to_or_create_is_checked_as_a_producers(broker):
    assert canonical("queue", "a.*", broker) == "queue://a.*"  # finding what exists: a queue may be named so
    with pytest.raises(HttpError, match="a queue is one queue named in full") as refused:
        canonical("queue", "a.*", broker, target=True)  # but no producer could make it
    assert refused.value.status == 400


def test_a_name_from_a_body_field_is_named_in_the_error(broker):
    with pytest.raises(HttpError, match="^field 'to': 'topic://x' is not a queue name$") as refused:
        canonical("queue", "topic://x", broker, field="to", target=True)
    assert refused.value.extra == {"field": "to"}
    with pytest.raises(HttpError, match="^field 'to': empty destination name$") as refused:
        canonical("queue", "", broker, field="to", target=True)
    assert refused.value.extra == {"field": "to"}
