import pytest

from core.message import Message, MessageFormatError, decode_message, encode_message


def test_round_trip_keeps_every_field():
    m = Message(
        "ID:x-1", "queue://orders", b"\x00\xffbody", {"k": "v", "ünï": "cödé"},
        persistent=True, priority=9, expiration=123, timestamp=456, group_id="g",
        group_seq=-1, correlation_id="c", reply_to="/queue/r", content_type="text/plain",
    )
    back = decode_message(encode_message(m))
    from core.message import FIELDS

    for name in FIELDS:
        if name != "origin":
            assert getattr(back, name) == getattr(m, name), name


def test_optional_fields_absent():
    m = Message("ID:1", "topic://t", b"")
    back = decode_message(encode_message(m))
    assert back.group_id is None and back.reply_to is None and back.content_type is None
    assert back.persistent is False and back.priority == 4


def test_corrupt_and_future_records_are_refused():
    data = encode_message(Message("ID:1", "queue://q", b"abc"))
    with pytest.raises(MessageFormatError):
        decode_message(data[:-2])
    with pytest.raises(MessageFormatError):
        decode_message(b"\x09" + data[1:])


def test_lookup_maps_jms_names():
    m = Message("ID:1", "queue://q", b"", {"color": "red"}, priority=7, persistent=True, group_id="g")
    assert m.lookup("JMSPriority") == 7
    assert m.lookup("JMSDeliveryMode") == "PERSISTENT"
    assert m.lookup("JMSXGroupID") == "g"
    assert m.lookup("color") == "red"
    assert m.lookup("missing") is None


def test_copy_changes_fields_and_not_the_original():
    m = Message("ID:1", "queue://q", b"x", {"a": "1"})
    c = m.copy(destination="queue://DLQ")
    c.headers["b"] = "2"
    assert m.destination == "queue://q" and "b" not in m.headers
    assert c.id == m.id and c.body == b"x"
