import pytest

from core.destination import InvalidDestination
from protocols.stomp.names import from_canonical, to_canonical


def temp(name):
    return f"temp-queue://c1:{name}"


@pytest.mark.parametrize("stomp, canonical", [
    ("/queue/a.b", "queue://a.b"),
    ("/topic/a.*.>", "topic://a.*.>"),
    ("/remote-temp-queue/c9:r", "temp-queue://c9:r"),
])
def test_round_trip(stomp, canonical):
    assert to_canonical(stomp, temp) == canonical
    assert from_canonical(canonical) == stomp


def test_own_temp_queue_and_reply_to_form():
    assert to_canonical("/temp-queue/r", temp) == "temp-queue://c1:r"
    assert from_canonical("temp-queue://c1:r") == "/remote-temp-queue/c1:r"


@pytest.mark.parametrize("bad", ["/foo/bar", "queue", "/queue/", "/temp-queue/", ""])
def test_unknown_or_empty_refused(bad):
    with pytest.raises(InvalidDestination):
        to_canonical(bad, temp)


def test_composites_in_order_without_repeats_and_bare_parts_typed_by_the_one_before():
    from protocols.stomp.names import to_canonical_all

    assert to_canonical_all("/queue/a", temp) == ["queue://a"]
    assert to_canonical_all("/queue/a,/topic/b,c,/queue/a", temp) == ["queue://a", "topic://b", "topic://c"]
    assert to_canonical_all("/queue/a,b,/temp-queue/r", temp) == ["queue://a", "queue://b", "temp-queue://c1:r"]


@pytest.mark.parametrize("bad, why", [
    ("a,/queue/b", "starts without a type"),
    ("/queue/a,", "empty part"),
    ("/queue/a,/exchange/amq.fanout/x", "exchange 'amq.fanout' does not exist here"),
])
def test_composites_that_cannot_be_meant(bad, why):
    from protocols.stomp.names import to_canonical_all

    with pytest.raises(InvalidDestination, match=why):
        to_canonical_all(bad, temp)


def test_a_comma_outside_a_send_is_refused():
    with pytest.raises(InvalidDestination, match="subscribe to each"):
        to_canonical("/queue/a,/queue/b", temp)


def test_rabbitmq_forms():
    assert to_canonical("/exchange/amq.topic/a.b", temp) == "topic://a.b"
    assert from_canonical("topic://a.b") == "/topic/a.b"
    assert to_canonical("/amq/queue/jobs", temp, lambda name: "queue://" + name) == "queue://jobs"
    with pytest.raises(InvalidDestination, match="use /queue/jobs"):
        to_canonical("/amq/queue/jobs", temp)  # no way to look it up (HTTP): never created
    with pytest.raises(InvalidDestination, match="use /topic/k for a topic or /queue/k for a queue"):
        to_canonical("/exchange/custom/k", temp)
