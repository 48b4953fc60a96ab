"""``POST /api/v1/messages``: publishing over HTTP (the Spark sink, scripts, the console).

Rows arrive as an Arrow IPC stream (what Spark's Arrow writers hold already)
or as JSON lines (what a person types into curl).  Every row is checked
before any is routed, so a bad row refuses the request with nothing sent.
The answer waits until what the request stored is on disk: a caller that got
200 can count on its persistent messages, stream records and
duplicate-detection ids surviving a crash.
"""
from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.internet import defer
from twisted.web import server

from core.access import Permission
from core.broker import Broker
from core.destination import InvalidDestination
from core.duplicates import DUPLICATE_ID_HEADER
from core.errors import BrokerError
from core.message import Message
from gateway.admin.http import Answer, HttpError, Router, json_body, request_body, require
from gateway.admin.streams import ARROW_STREAM
from protocols.stomp import names

_CANONICAL = ("queue://", "topic://", "temp-queue://")
_INT64_MAX = 2**63 - 1


@dataclass
class Row:
    destination: str
    body: bytes
    headers: dict[str, str]
    dup_id: str | None
    persistent: bool


def _canonical(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise HttpError(400, f"{where}: destination must be a non-empty string")
    if name.startswith(_CANONICAL):
        return name

    def no_temp(_: str) -> str:
        raise InvalidDestination("temporary queues belong to a connection; HTTP has none")

    try:
        return names.to_canonical(name, no_temp)
    except BrokerError as exc:
        raise HttpError(400, f"{where}: {exc}") from None


def _headers(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    items = value.items() if isinstance(value, dict) else value
    try:
        headers = {k: v for k, v in items}
    except (TypeError, ValueError):
        raise HttpError(400, f"{where}: headers must be a map of strings to strings") from None
    for k, v in headers.items():
        if not isinstance(k, str) or not isinstance(v, str) or not k:
            raise HttpError(400, f"{where}: headers must be a map of non-empty strings to strings")
    return headers


def _from_arrow(data: bytes) -> list[Row]:
    import pyarrow as pa  # loaded by the first Arrow publish, not by every broker

    try:
        table = pa.ipc.open_stream(data).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise HttpError(400, f"the body is not an Arrow IPC stream: {exc}") from None
    columns = set(table.column_names)
    for required in ("destination", "body"):
        if required not in columns:
            raise HttpError(400, f"the Arrow stream has no {required!r} column (it has {sorted(columns)})")
    unknown = columns - {"destination", "body", "headers", "id", "persistent"}
    if unknown:
        raise HttpError(400, f"unknown columns {sorted(unknown)}: expected destination, body, headers, id, persistent")
    body_type = table.schema.field("body").type
    if not (pa.types.is_binary(body_type) or pa.types.is_large_binary(body_type)
            or pa.types.is_string(body_type) or pa.types.is_large_string(body_type)):
        raise HttpError(400, f"column body must be binary or string, not {body_type}")
    n = table.num_rows
    destinations = table.column("destination").to_pylist()
    bodies = table.column("body").to_pylist()
    headers = table.column("headers").to_pylist() if "headers" in columns else [None] * n
    ids = table.column("id").to_pylist() if "id" in columns else [None] * n
    persistent = table.column("persistent").to_pylist() if "persistent" in columns else [True] * n
    rows = []
    for i in range(n):
        where = f"row {i}"
        body = bodies[i]
        if body is None:
            raise HttpError(400, f"{where}: body is null")
        if isinstance(body, str):
            body = body.encode("utf-8")
        dup_id = ids[i]
        if dup_id is not None and not isinstance(dup_id, str):
            raise HttpError(400, f"{where}: id must be a string")
        rows.append(Row(_canonical(destinations[i], where), body, _headers(headers[i], where), dup_id,
                        True if persistent[i] is None else bool(persistent[i])))
    return rows


def _from_json_lines(data: bytes) -> list[Row]:
    rows = []
    for i, line in enumerate(data.splitlines()):
        if not line.strip():
            continue
        where = f"line {i + 1}"
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise HttpError(400, f"{where}: not JSON: {exc}") from None
        except RecursionError:
            raise HttpError(400, f"{where}: JSON nested too deeply") from None
        if not isinstance(item, dict):
            raise HttpError(400, f"{where}: expected an object")
        unknown = set(item) - {"destination", "body", "body_base64", "headers", "id", "persistent"}
        if unknown:
            raise HttpError(400, f"{where}: unknown keys {sorted(unknown)}")
        if "body_base64" in item:
            try:
                body = base64.b64decode(item["body_base64"], validate=True)
            except (ValueError, TypeError):
                raise HttpError(400, f"{where}: body_base64 is not base64") from None
        elif isinstance(item.get("body"), str):
            body = item["body"].encode("utf-8")
        else:
            raise HttpError(400, f"{where}: body must be a string (or body_base64)")
        dup_id = item.get("id")
        if dup_id is not None and not isinstance(dup_id, str):
            raise HttpError(400, f"{where}: id must be a string")
        persistent = item.get("persistent", True)
        if not isinstance(persistent, bool):
            raise HttpError(400, f"{where}: persistent must be true or false")
        rows.append(Row(_canonical(item.get("destination"), where), body, _headers(item.get("headers"), where), dup_id, persistent))
    return rows


class PublishAPI:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def install(self, router: Router) -> None:
        router.add("/api/v1/messages", post=self.publish)

    def publish(self, request: server.Request) -> Any:
        content_type = (request.getHeader("content-type") or "").split(";")[0].strip().lower()
        data = request_body(request)
        if content_type == ARROW_STREAM:
            rows = _from_arrow(data)
        elif content_type in ("application/x-ndjson", "application/jsonl", "application/json-lines"):
            rows = _from_json_lines(data)
        else:
            raise HttpError(415, f"Content-Type must be {ARROW_STREAM} or application/x-ndjson, got {content_type or 'none'!r}", "unsupported_media_type")
        for i, row in enumerate(rows):
            require(request, Permission.WRITE, row.destination, f"row {i}")
        messages = [self.message(row, f"row {i}") for i, row in enumerate(rows)]
        return self.send(messages, request, _accepted)

    def send(self, messages: list[Message], request: server.Request, answer: Callable[[int, int], Answer]) -> Any:
        """Route checked messages, holding them while the store is full (its policy); ``answer``
        (sent, duplicates dropped) once what they stored is on disk.  The console's send uses it too."""
        broker = self.broker
        usage = broker.store_usage
        if usage.full and (
            any(m.persistent for m in messages)
            # Under the disk alarm a stream's record is stored whatever the message.
            or (usage.alarm is not None and any(broker.streams.captures(m.destination) for m in messages))
        ):
            if broker.policy.store_full_policy == "fail":
                if usage.alarm is not None:
                    raise HttpError(507, usage.alarm, "insufficient_storage")
                raise HttpError(503, usage.refusal()[1], "store_full")
            waiting: defer.Deferred[Answer] = defer.Deferred()

            def route() -> None:
                # Run by the store's space waiters: a refusal (a destination gone
                # meanwhile) must answer this request, not escape into the waiter loop.
                defer.maybeDeferred(self._route, messages, request, answer).chainDeferred(waiting)

            usage.when_space(route)
            return waiting
        return self._route(messages, request, answer)

    def message(self, row: Row, where: str) -> Message:
        """The message a row asks for, its fields from the headers that name them (``where``: for errors)."""
        broker = self.broker
        try:
            broker.check_destination(row.destination)
        except BrokerError as exc:
            raise HttpError(400, f"{where}: {exc}") from None
        headers = dict(row.headers)
        fields: dict[str, Any] = {}
        for header, name in (("content-type", "content_type"), ("correlation-id", "correlation_id"), ("JMSXGroupID", "group_id")):
            value = headers.pop(header, None)
            if value is not None:
                fields[name] = value
        reply_to = headers.pop("reply-to", None)
        if reply_to is not None:
            fields["reply_to"] = _canonical(reply_to, where) if reply_to.startswith(("/", *_CANONICAL)) else reply_to
        for header, name, low, high in (("priority", "priority", 0, 9), ("expires", "expiration", 0, _INT64_MAX),
                                        ("JMSXGroupSeq", "group_seq", -1, _INT64_MAX)):
            text = headers.pop(header, None)
            if text is not None:
                try:
                    number = int(text)
                    if not low <= number <= high:
                        raise ValueError
                except ValueError:
                    raise HttpError(400, f"{where}: header {header} must be an integer {low}-{high}, got {text[:40]!r}") from None
                fields[name] = number
        headers.pop("persistent", None)
        if row.dup_id is not None:
            headers[DUPLICATE_ID_HEADER] = row.dup_id
        return Message(
            broker.new_message_id(), row.destination, row.body, headers,
            persistent=row.persistent, timestamp=broker.now_ms(), **fields,
        )

    def _route(
        self, messages: list[Message], request: server.Request, answer: Callable[[int, int], Answer],
    ) -> defer.Deferred[Answer]:
        broker = self.broker
        remote = request.getClientAddress()
        conn = broker.connect(None, protocol="http", remote=f"{getattr(remote, 'host', '?')}:{getattr(remote, 'port', '?')}")
        before = broker.duplicates.dropped
        sent = 0
        try:
            for message in messages:
                conn.send(message)
                sent += 1
        except BrokerError as exc:
            # Checked up front, so only a destination that vanished meanwhile (a temporary queue).
            raise HttpError(400, f"row {sent}: {exc}") from None
        finally:
            conn.close()
        duplicates = broker.duplicates.dropped - before
        done: defer.Deferred[Answer] = defer.Deferred()
        broker.when_durable(lambda: done.callback(answer(sent, duplicates)))
        return done


def _accepted(sent: int, duplicates: int) -> Answer:
    return json_body(200, {"accepted": sent - duplicates, "duplicates": duplicates})
