"""Request bodies of operators' actions: a JSON object whose every field is checked.

An unknown field is refused rather than ignored (a move with a misspelt
``"selecter"`` would otherwise move every message), and each error names its
field, in the text a person reads and in ``field`` for a program.
"""
from __future__ import annotations

import json
from typing import Any

from twisted.web import server

from core.operations import Selection
from core.selector import SelectorError, compile_selector
from gateway.admin.http import HttpError, request_body

MAX_IDS = 100_000


def document(request: server.Request, fields: tuple[str, ...]) -> dict[str, Any]:
    """The body as a JSON object with only these fields (an empty body: none of them)."""
    data = request_body(request)
    if not data.strip():
        return {}
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise HttpError(400, f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise HttpError(400, "the body's JSON is nested too deeply") from None
    if not isinstance(doc, dict):
        raise HttpError(400, f"the body must be a JSON object with the fields {', '.join(fields)}")
    for name in doc:
        if name not in fields:
            raise HttpError(400, f"unknown field {name!r}; expected {', '.join(fields)}", field=name)
    return doc


def text_field(doc: dict[str, Any], name: str, required: bool = False) -> str | None:
    value = doc.get(name)
    if value is None:
        if required:
            raise HttpError(400, f"field {name!r} is required", field=name)
        return None
    if not isinstance(value, str) or not value:
        raise HttpError(400, f"field {name!r} must be a non-empty string", field=name)
    return value


def int_field(doc: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = doc.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise HttpError(400, f"field {name!r} must be an integer {low}-{high}", field=name)
    return value


def bool_field(doc: dict[str, Any], name: str, default: bool) -> bool:
    value = doc.get(name, default)
    if not isinstance(value, bool):
        raise HttpError(400, f"field {name!r} must be true or false", field=name)
    return value


def selection(doc: dict[str, Any]) -> Selection:
    """``ids``, ``selector`` (both: a message must satisfy both) and ``limit``; none of them: all."""
    ids = doc.get("ids")
    if ids is not None and (not isinstance(ids, list) or len(ids) > MAX_IDS or not all(isinstance(i, str) and i for i in ids)):
        raise HttpError(400, f"field 'ids' must be a list of at most {MAX_IDS} message ids (strings)", field="ids")
    text = text_field(doc, "selector")
    selector = None
    if text is not None:
        try:
            selector = compile_selector(text)
        except SelectorError as exc:
            raise HttpError(400, f"field 'selector': {exc}", field="selector") from None
    limit = int_field(doc, "limit", 1, 2**62)
    return Selection(set(ids) if ids is not None else None, selector, limit)
