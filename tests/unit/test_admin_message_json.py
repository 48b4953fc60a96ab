"""One message as the admin API shows it (gateway/admin/message_json.py): text or base64, cut or whole.

The send side (a body, headers, priority and persistence from JSON) is
exercised over HTTP, with its refusals, in tests/integration/test_admin_queues.py
and test_admin_topics.py.
"""
from __future__ import annotations

import base64

from core.entry import Entry
from core.message import Message
from core.operations import Browsed
from gateway.admin.message_json import browsed, taken


def item(body: bytes, **fields) -> Browsed:
    message = Message("ID:1", "queue://q", body, {"k": "v"}, persistent=True, priority=7, timestamp=123, **fields)
    return Browsed(Entry(message, 42, redeliveries=2), True)


def test_a_text_body_is_shown_as_text():
    shown = browsed(item(b"hello"), 256)
    assert (shown["body"], shown["encoding"], shown["truncated"], shown["size"]) == ("hello", "utf-8", False, 5)
    assert (shown["id"], shown["seq"], shown["headers"], shown["priority"], shown["persistent"]) == ("ID:1", 42, {"k": "v"}, 7, True)
    assert (shown["redelivered"], shown["redeliveries"], shown["in_flight"], shown["timestamp"]) == (True, 2, True, 123)
    assert "correlation_id" not in shown and "group_seq" not in shown  # absent fields are left out


def test_a_binary_body_is_shown_as_base64():
    shown = browsed(item(b"\xff\x00\x01"), 256)
    assert shown["encoding"] == "base64" and base64.b64decode(shown["body"]) == b"\xff\x00\x01"


def test_a_preview_never_cuts_a_character():
    shown = browsed(item("é".encode() * 3), 3)  # 6 bytes: the third byte starts a character
    assert (shown["body"], shown["encoding"], shown["truncated"], shown["size"]) == ("é", "utf-8", True, 6)
    assert browsed(item(b"abc"), 0)["body"] == ""


def test_message_fields_are_shown_when_set():
    shown = browsed(item(b"x", correlation_id="c1", reply_to="queue://r", content_type="text/plain", group_id="g", group_seq=3), 9)
    assert {k: shown[k] for k in ("correlation_id", "reply_to", "content_type", "group_id", "group_seq")} == {
        "correlation_id": "c1", "reply_to": "queue://r", "content_type": "text/plain", "group_id": "g", "group_seq": 3,
    }


def test_a_taken_message_is_whole_without_the_queues_bookkeeping():
    shown = taken(item(b"x" * 1000))
    assert shown["body"] == "x" * 1000 and shown["size"] == 1000
    assert not {"seq", "in_flight", "truncated", "redelivered", "redeliveries"} & set(shown)
