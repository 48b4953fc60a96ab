"""One message as an operator reads and writes it in JSON: what a browse or a get shows, what a send takes.

A body is shown as text when it is UTF-8 and as base64 otherwise, so any
message fits a JSON answer; a browse cuts it to ``preview`` bytes (never
inside a character).  A send (``POST /api/v1/queues/{name}/messages`` and the
topic's, the console's Send) takes the body either way and goes through the
publish path (gateway/admin/publish.py), so it is checked, stamped and
stored as any HTTP publish is.
"""
from __future__ import annotations

import base64
import codecs
from typing import Any

from twisted.web import server

from core.access import Permission
from core.operations import Browsed
from gateway.admin.bodies import bool_field, document, int_field
from gateway.admin.changes import Changes
from gateway.admin.http import Answer, HttpError, json_body, require
from gateway.admin.publish import PublishAPI, Row


def send(publisher: PublishAPI, changes: Changes, request: server.Request, destination: str) -> Any:
    """Send the message the body describes to ``destination`` (canonical); answered once it is stored."""
    require(request, Permission.ADMIN, destination)
    doc = document(request, ("body", "body_base64", "headers", "persistent", "priority"))
    if "body" in doc and "body_base64" in doc:
        raise HttpError(400, "give either field 'body' or field 'body_base64'", field="body_base64")
    if "body_base64" in doc:
        encoded = doc["body_base64"]
        try:
            if not isinstance(encoded, str):
                raise TypeError
            body = base64.b64decode(encoded, validate=True)
        except (ValueError, TypeError):
            raise HttpError(400, "field 'body_base64' must be base64 text", field="body_base64") from None
    else:
        text = doc.get("body", "")
        if not isinstance(text, str):
            raise HttpError(400, "field 'body' must be a string (or give body_base64)", field="body")
        body = text.encode("utf-8")
    headers = doc.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(k, str) and k and isinstance(v, str) for k, v in headers.items()):
        raise HttpError(400, "field 'headers' must be an object of strings", field="headers")
    headers = dict(headers)
    priority = int_field(doc, "priority", 0, 9)
    if priority is not None:
        headers["priority"] = str(priority)
    persistent = bool_field(doc, "persistent", True)
    message = publisher.message(Row(destination, body, headers, None, persistent), "field 'headers'")

    def answer(sent: int, duplicates: int) -> Answer:
        changes.noted(request, "send", destination, id=message.id)
        return json_body(200, {
            "destination": destination, "id": message.id, "persistent": message.persistent,
            "duplicate": bool(duplicates),
        })

    return publisher.send([message], request, answer)


def browsed(item: Browsed, preview: int) -> dict[str, Any]:
    """A message as a browse shows it: its first ``preview`` bytes, and where it stands in its queue."""
    entry = item.entry
    message = entry.message
    body = message.body
    shown = body[:preview]
    truncated = len(body) > preview
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(shown, final=not truncated)
        encoding = "utf-8"
    except UnicodeDecodeError:
        text = base64.b64encode(shown).decode("ascii")
        encoding = "base64"
    out: dict[str, Any] = {
        "id": message.id, "seq": entry.seq, "headers": message.headers, "persistent": message.persistent,
        "priority": message.priority, "redelivered": entry.redeliveries > 0, "redeliveries": entry.redeliveries,
        "timestamp": message.timestamp, "expires": message.expiration, "size": len(body),
        "body": text, "encoding": encoding, "truncated": truncated, "in_flight": item.in_flight,
    }
    for name in ("correlation_id", "reply_to", "content_type", "group_id"):
        value = getattr(message, name)
        if value is not None:
            out[name] = value
    if message.group_id is not None:
        out["group_seq"] = message.group_seq
    return out


def taken(item: Browsed) -> dict[str, Any]:
    """A message taken off its queue: the whole body, none of the queue's bookkeeping."""
    out = browsed(item, len(item.entry.message.body))
    for name in ("seq", "in_flight", "truncated", "redelivered", "redeliveries"):
        del out[name]
    return out
