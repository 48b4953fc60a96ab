"""Operators' actions on queues and topics, as ActiveMQ's console offers them: browse a queue
without consuming it, purge it, delete it, send a message, move messages, replay the DLQ.

Names in paths are plain queue or topic names (``/api/v1/queues/orders.eu``),
URL-encoded; every answer names the canonical destination.  Every action needs
``admin`` on the destinations it touches.  The core does the work a chunk per
reactor turn (core/operations.py), so a request acting on 100,000 messages
waits for its answer while clients keep being served; the answer comes once
the last change is on disk.
"""
from __future__ import annotations

import base64
import codecs
import json
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger
from twisted.web import server

from core import operations
from core.access import Permission
from core.broker import Broker
from core.errors import BrokerError, UnknownDestination
from core.operations import Browsed, Selection, Walk
from core.entry import Entry
from core.message import Message
from core.queue import MessageQueue
from core.selector import SelectorError, compile_selector
from gateway.admin.http import (
    Answer,
    HttpError,
    Router,
    grant_of,
    int_query,
    json_body,
    permitted,
    request_body,
    require,
)
from gateway.admin.publish import PublishAPI, Row

log = Logger(namespace="gateway.admin")

DEFAULT_BROWSE = 50
MAX_BROWSE = 1000
DEFAULT_PREVIEW = 256
MAX_PREVIEW = 1 << 16
MAX_SEQ = 2**63 - 1  # sequence numbers are 8 bytes in the store's keys
MAX_IDS = 100_000

# An operator's action, for the audit log: (event, fields).
Audit = Callable[..., None]


# -- request bodies: a JSON object whose every field is checked ------------------------


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


# -- names -----------------------------------------------------------------------------


def canonical(kind: str, name: str, broker: Broker, field: str | None = None, target: bool = False) -> str:
    """``orders.eu`` -> ``queue://orders.eu`` (a canonical name of that kind passes as it is).

    ``target``: a name to send, move to or create, checked as a producer's
    (``Broker.check_destination``: no ``a.*``); other names find what exists.
    """
    where = f"field {field!r}: " if field else ""
    extra = {"field": field} if field else {}
    if "://" in name:
        if not name.startswith(f"{kind}://"):
            raise HttpError(400, f"{where}{name!r} is not a {kind} name", **extra)
        full = name
    else:
        full = f"{kind}://{name}"
    try:
        if target:
            broker.check_destination(full)
        else:
            broker.check_name(full, allow_wildcards=False)
    except BrokerError as exc:
        raise HttpError(400, f"{where}{exc}", **extra) from None
    return full


def _walked(start: Callable[[Callable[[Walk], None]], object]) -> defer.Deferred[Walk]:
    """Run a core walk; fires with it once its last chunk is on disk."""
    done: defer.Deferred[Walk] = defer.Deferred()

    def finished(walk: Walk) -> None:
        if walk.error is not None:
            done.errback(HttpError(
                500, f"the action stopped after {walk.done} messages; see the broker's log", "internal_error", done=walk.done,
            ))
        else:
            done.callback(walk)

    start(finished)
    return done


def _skipped(walk: Walk) -> list[dict[str, str]]:
    return [{"id": message_id, "reason": reason} for message_id, reason in walk.skipped]


class QueueActions:
    def __init__(self, broker: Broker, audit: Audit | None = None) -> None:
        self.broker = broker
        self.publisher = PublishAPI(broker)
        self.audit = audit

    def install(self, router: Router) -> None:
        router.add("/api/v1/queues/{name}", delete=self.delete, put=self.create)
        router.add("/api/v1/queues/{name}/get", post=self.get)
        router.add("/api/v1/queues/{name}/messages", get=self.browse, post=self.send_to_queue)
        router.add("/api/v1/queues/{name}/purge", post=self.purge)
        router.add("/api/v1/queues/{name}/move", post=self.move)
        router.add("/api/v1/queues/{name}/replay", post=self.replay_queue)
        router.add("/api/v1/dlq/replay", post=self.replay_dlq)
        router.add("/api/v1/topics/{name}/messages", post=self.send_to_topic)

    def _queue(self, request: server.Request, name: str) -> tuple[str, MessageQueue]:
        """The queue, once the request may act on it (checked first: a refusal says nothing of what exists)."""
        full = canonical("queue", name, self.broker)
        require(request, Permission.ADMIN, full)
        queue = self.broker.queue(full, create=False)
        if queue is None:
            raise HttpError(404, f"no queue {full}", "unknown_queue", destination=full)
        return full, queue

    def _done(self, request: server.Request, action: str, destination: str, **fields: Any) -> None:
        grant = grant_of(request)
        user = grant.principal.name if grant is not None else None
        log.info("admin {action} on {destination} by {user}: {fields}", action=action, destination=destination,
                 user=user or "anonymous", fields=fields)
        if self.audit is not None:
            self.audit("admin_action", user=user, action=action, destination=destination, **fields)

    # -- browse ------------------------------------------------------------------------

    def browse(self, request: server.Request, name: str) -> Answer:
        full, queue = self._queue(request, name)
        start = int_query(request, "from", 0, high=MAX_SEQ)
        limit = int_query(request, "limit", DEFAULT_BROWSE, low=1, high=MAX_BROWSE)
        preview = int_query(request, "preview", DEFAULT_PREVIEW, low=0, high=MAX_PREVIEW)
        page, following = operations.browse(queue, start, limit)
        return json_body(200, {
            "destination": full, "depth": len(queue), "in_flight": queue.inflight,
            "messages": [_browsed(item, preview) for item in page], "next": following,
        })

    # -- send --------------------------------------------------------------------------

    def send_to_queue(self, request: server.Request, name: str) -> Any:
        return self._send(request, canonical("queue", name, self.broker, target=True))

    def send_to_topic(self, request: server.Request, name: str) -> Any:
        return self._send(request, canonical("topic", name, self.broker, target=True))

    def _send(self, request: server.Request, destination: str) -> Any:
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
        message = self.publisher.message(Row(destination, body, headers, None, persistent), "field 'headers'")

        def answer(sent: int, duplicates: int) -> Answer:
            self._done(request, "send", destination, id=message.id)
            return json_body(200, {
                "destination": destination, "id": message.id, "persistent": message.persistent,
                "duplicate": bool(duplicates),
            })

        return self.publisher.send([message], request, answer)

    # -- create and get ----------------------------------------------------------------

    def create(self, request: server.Request, name: str) -> Any:
        """PUT: the queue exists afterwards (201 made now, 200 there already), kept across restarts while empty.

        With users configured a client needs ``admin`` on a queue to create it by
        sending or subscribing; an operator creates it here so that producers
        and consumers with ``write`` and ``read`` only can use it.
        """
        full = canonical("queue", name, self.broker, target=True)
        require(request, Permission.ADMIN, full)
        document(request, ())
        if self.broker.is_dead_letter_queue(full):
            raise HttpError(400, f"{full} is a dead-letter queue: the broker makes it when it needs it", destination=full)
        _, created = self.broker.declare_queue(full)
        if created:
            self._done(request, "create", full)
        done: defer.Deferred[Answer] = defer.Deferred()
        self.broker.when_durable(lambda: done.callback(json_body(201 if created else 200, {"destination": full, "created": created})))
        return done

    def get(self, request: server.Request, name: str) -> Any:
        """Take up to ``count`` ready messages off the queue, in the order a consumer would get them
        (RabbitMQ's "Get messages", acknowledged): highest priority first (``DeliveryOrderWalk``).

        The answer comes once their removal is on disk: a message answered here is
        delivered to no one else.  An empty queue answers at once with none.
        """
        full, queue = self._queue(request, name)
        doc = document(request, ("count", "selector"))
        count = int_field(doc, "count", 1, MAX_BROWSE) or 1
        chosen = selection({"selector": doc["selector"]} if "selector" in doc else {})
        chosen.limit = count
        taken: list[Browsed] = []
        now = self.broker.now_ms()

        def check(message: Message) -> str | None:
            return "expired" if message.expiration and message.expiration <= now else None

        def act(message: Message) -> None:
            taken.append(Browsed(Entry(message, 0), False))

        def answer(walk: Walk) -> Answer:
            self._done(request, "get", full, count=len(taken))
            return json_body(200, {
                "destination": full, "messages": [_taken(item) for item in taken], "depth": len(queue),
            })

        return _walked(lambda finished: operations.DeliveryOrderWalk(self.broker, queue, chosen, finished, act=act, check=check).start()).addCallback(answer)

    # -- purge and delete ------------------------------------------------------------------

    def purge(self, request: server.Request, name: str) -> Any:
        full, queue = self._queue(request, name)
        document(request, ())

        def answer(walk: Walk) -> Answer:
            self._done(request, "purge", full, purged=walk.done)
            return json_body(200, {"destination": full, "purged": walk.done})

        return _walked(lambda finished: operations.purge(self.broker, queue, finished)).addCallback(answer)

    def delete(self, request: server.Request, name: str) -> Any:
        """Refused while the queue has consumers, as ActiveMQ ("Destination still has an active subscription")."""
        full, queue = self._queue(request, name)
        if queue.consumers:
            raise HttpError(409, f"queue {full} has {len(queue.consumers)} consumers; close them first",
                            "has_consumers", destination=full, consumers=len(queue.consumers))
        broker = self.broker

        def purged(walk: Walk) -> defer.Deferred[Answer]:
            try:
                rest = broker.delete_queue(full)
            except UnknownDestination:
                rest = 0  # deleted by another request meanwhile
            except BrokerError:  # a consumer came while the messages went
                raise HttpError(409, f"queue {full} got a consumer while being deleted; {walk.done} messages were purged",
                                "has_consumers", destination=full, purged=walk.done) from None
            done: defer.Deferred[Answer] = defer.Deferred()

            def answer() -> None:
                self._done(request, "delete", full, purged=walk.done + rest)
                done.callback(json_body(200, {"destination": full, "deleted": True, "purged": walk.done + rest}))

            broker.when_durable(answer)
            return done

        return _walked(lambda finished: operations.purge(broker, queue, finished)).addCallback(purged)

    # -- move and replay -----------------------------------------------------------------

    def move(self, request: server.Request, name: str) -> Any:
        full, queue = self._queue(request, name)
        doc = document(request, ("to", "ids", "selector", "limit"))
        to = text_field(doc, "to", required=True)
        assert to is not None
        target = canonical("queue", to, self.broker, field="to", target=True)
        if target == full:
            raise HttpError(400, f"field 'to': the messages are in {full} already", field="to")
        require(request, Permission.ADMIN, target, "field 'to'")
        chosen = selection(doc)

        def answer(walk: Walk) -> Answer:
            self._done(request, "move", full, to=target, moved=walk.done)
            return json_body(200, {"destination": full, "to": target, "moved": walk.done})

        return _walked(lambda finished: operations.move(self.broker, queue, target, chosen, finished)).addCallback(answer)

    def replay_dlq(self, request: server.Request) -> Any:
        doc = document(request, ("queue", "ids", "selector", "limit"))
        name = text_field(doc, "queue") or self.broker.policy.dead_letter_queue
        return self._replay(request, canonical("queue", name, self.broker, field="queue" if "queue" in doc else None), doc)

    def replay_queue(self, request: server.Request, name: str) -> Any:
        return self._replay(request, canonical("queue", name, self.broker), document(request, ("ids", "selector", "limit")))

    def _replay(self, request: server.Request, full: str, doc: dict[str, Any]) -> Any:
        """Each dead letter back to its ``originalDestination``; the answer waits for the last of them.

        Whether the name is a dead-letter queue is checked before whether the
        queue exists: a mistyped name is a 400 "not a dead-letter queue", so
        a 404 means only that no message has failed yet (the broker makes a
        DLQ with its first dead letter), which ``gateway dlq replay`` reports
        as "no dead letters" and a typo as the error it is.
        """
        full = canonical("queue", full, self.broker)
        require(request, Permission.ADMIN, full)
        if not self.broker.is_dead_letter_queue(full):
            raise HttpError(400, f"{full} is not a dead-letter queue (policy: {self.broker.policy.dead_letter_queue}, "
                                 "or DLQ.<queue> with individual_dlq)", destination=full)
        full, queue = self._queue(request, full)
        chosen = selection(doc)

        def allowed(destination: str) -> bool:
            return permitted(request, Permission.ADMIN, destination)

        def answer(walk: Walk) -> Answer:
            self._done(request, "replay", full, replayed=walk.done, skipped=walk.skipped_count)
            return json_body(200, {
                "destination": full, "replayed": walk.done, "skipped": _skipped(walk), "skipped_count": walk.skipped_count,
            })

        return _walked(lambda finished: operations.replay(self.broker, queue, chosen, allowed, finished)).addCallback(answer)


def _taken(item: Browsed) -> dict[str, Any]:
    """A message taken off its queue: the whole body, none of the queue's bookkeeping."""
    out = _browsed(item, len(item.entry.message.body))
    for name in ("seq", "in_flight", "truncated", "redelivered", "redeliveries"):
        del out[name]
    return out


def _browsed(item: Browsed, preview: int) -> dict[str, Any]:
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
