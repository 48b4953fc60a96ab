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
