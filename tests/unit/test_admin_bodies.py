"""Actions' JSON bodies (gateway/admin/bodies.py): every field checked, and named when it is wrong."""
from __future__ import annotations

import io

import pytest
from twisted.web.test.requesthelper import DummyRequest

from core.message import Message
from gateway.admin.bodies import MAX_IDS, bool_field, document, int_field, selection, text_field
from gateway.admin.http import HttpError


def with_body(data: bytes) -> DummyRequest:
    request = DummyRequest([])
    request.content = io.BytesIO(data)
    return request


def refused(call, *args):
    with pytest.raises(HttpError) as error:
        call(*args)
    assert error.value.status == 400
    return error.value


def test_a_document_has_only_the_fields_asked_for():
    assert document(with_body(b'{"to": "b", "limit": 2}'), ("to", "limit", "ids")) == {"to": "b", "limit": 2}
    assert document(with_body(b"  \n"), ("to",)) == {}  # no body: no fields
    error = refused(document, with_body(b'{"to": "b", "selecter": "x"}'), ("to", "selector"))
    assert error.error == "unknown field 'selecter'; expected to, selector" and error.extra == {"field": "selecter"}


@pytest.mark.parametrize("data, text", [
    (b"{not json", "the body is not JSON"),
    (b"[1]", "the body must be a JSON object with the fields to"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
])
def test_a_body_that_is_no_json_object(data, text):
    assert text in refused(document, with_body(data), ("to",)).error


def test_fields_by_type():
    doc = {"to": "b", "empty": "", "n": 3, "flag": True, "no": None}
    assert text_field(doc, "to") == "b" and text_field(doc, "absent") is None
    assert refused(text_field, doc, "absent", True).error == "field 'absent' is required"
    assert refused(text_field, doc, "empty").extra == {"field": "empty"}
    assert refused(text_field, doc, "n").error == "field 'n' must be a non-empty string"
    assert int_field(doc, "n", 1, 9) == 3 and int_field(doc, "no", 1, 9) is None
    assert refused(int_field, doc, "flag", 0, 9).error == "field 'flag' must be an integer 0-9"  # true is no integer
    assert refused(int_field, doc, "n", 4, 9).extra == {"field": "n"}
    assert bool_field(doc, "flag", False) is True and bool_field(doc, "absent", True) is True
    assert refused(bool_field, doc, "n", False).error == "field 'n' must be true or false"


def test_a_selection():
    everything = selection({})
    assert (everything.ids, everything.selector, everything.limit) == (None, None, None)
    chosen = selection({"ids": ["ID:1", "ID:2"], "selector": "color = 'red'", "limit": 5})
    assert chosen.ids == {"ID:1", "ID:2"} and chosen.limit == 5
    red = Message("ID:1", "queue://q", headers={"color": "red"})
    blue = Message("ID:2", "queue://q", headers={"color": "blue"})
    other = Message("ID:3", "queue://q", headers={"color": "red"})
    assert [chosen.wants(m) for m in (red, blue, other)] == [True, False, False]  # both: ids and selector


@pytest.mark.parametrize("doc, field", [
    ({"ids": "ID:1"}, "ids"),
    ({"ids": ["ID:1", 2]}, "ids"),
    ({"ids": [""]}, "ids"),
    ({"ids": ["x"] * (MAX_IDS + 1)}, "ids"),
    ({"selector": "color ="}, "selector"),
    ({"selector": ""}, "selector"),
    ({"limit": 0}, "limit"),
])
def test_a_bad_selection_names_its_field(doc, field):
    assert refused(selection, doc).extra == {"field": field}
