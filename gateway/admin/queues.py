"""``/api/v1/queues`` and ``/api/v1/dlq``: queues for operators, as ActiveMQ's console offers them.

A queue's figures and consumers; and the actions: browse without consuming,
send, create, get (take messages off), purge, delete, move messages, replay
dead letters.  Producers are not listed: STOMP and MQTT clients never declare
one, and tracking every (connection, destination) pair a client ever sent to
would cost a set insertion per message.

Names in paths are plain queue names (``/api/v1/queues/orders.eu``),
URL-encoded; a canonical name (``queue://orders.eu``) is accepted too, and
every answer names the canonical destination (gateway/admin/names.py).
Everything needs ``admin`` on the queue once users are configured; the list
shows only what the caller may administer, and a refusal says nothing of
whether the queue exists.  The core does an action's work a chunk per reactor
turn (core/operations.py), so a request acting on 100,000 messages waits for
its answer while clients keep being served; the answer comes once the last
change is on disk.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.web import server

from core import operations
from core.access import Permission
from core.broker import Broker
from core.entry import Entry
from core.errors import BrokerError, UnknownDestination
from core.message import Message
from core.operations import Browsed, Walk
from core.queue import MessageQueue
from gateway.admin import message_json
from gateway.admin.bodies import document, int_field, selection, text_field
from gateway.admin.changes import Audit, Changes
from gateway.admin.descriptions import queue_figures
from gateway.admin.http import Answer, HttpError, Router, int_query, json_body, permitted, require
from gateway.admin.listing import page_request, paged
from gateway.admin.message_json import browsed, taken
from gateway.admin.names import QUEUE_PREFIX, canonical, plain, queue_name
from gateway.admin.publish import PublishAPI

DEFAULT_BROWSE = 50
MAX_BROWSE = 1000
DEFAULT_PREVIEW = 256
MAX_PREVIEW = 1 << 16
MAX_SEQ = 2**63 - 1  # sequence numbers are 8 bytes in the store's keys


class QueuesAPI:
    def __init__(self, broker: Broker, audit: Audit | None = None) -> None:
        self.broker = broker
        self.publisher = PublishAPI(broker)
        self.changes = Changes(broker, audit)

    def install(self, router: Router) -> None:
        router.add("/api/v1/queues", get=self.list)
        router.add("/api/v1/queues/{name}", get=self.describe, put=self.create, delete=self.delete)
        router.add("/api/v1/queues/{name}/messages", get=self.browse, post=self.send)
        router.add("/api/v1/queues/{name}/get", post=self.get)
        router.add("/api/v1/queues/{name}/purge", post=self.purge)
        router.add("/api/v1/queues/{name}/move", post=self.move)
        router.add("/api/v1/queues/{name}/replay", post=self.replay_queue)
        router.add("/api/v1/dlq/replay", post=self.replay_dlq)

    # -- views --------------------------------------------------------------------------

    def _describe(self, queue: MessageQueue, now: int) -> dict[str, Any]:
        return {
            "name": plain(queue.name), "destination": queue.name,
            "dead_letter_queue": self.broker.is_dead_letter_queue(queue.name),
            **queue_figures(queue, now),
        }

    def list(self, request: server.Request) -> Any:
        sorts = {
            "name": lambda q: q.name,
            "messages": lambda q: len(q) + q.inflight,
            "ready": len,
            "unacknowledged": lambda q: q.inflight,
            "consumers": lambda q: len(q.consumers),
            "enqueued": lambda q: q.enqueued,
            "dequeued": lambda q: q.dequeued,
        }
        page = page_request(request, sorts, "name")
        now = self.broker.now_ms()
        visible = [
            q for name, q in self.broker.queues.items()
            if name.startswith(QUEUE_PREFIX) and permitted(request, Permission.ADMIN, name)
        ]
        return json_body(200, paged(
            page, visible, text=lambda q: q.name[len(QUEUE_PREFIX):], sorts=sorts,
            describe=lambda q: self._describe(q, now), name="queues",
        ))

    def describe(self, request: server.Request, name: str) -> Any:
        """One queue, with its consumers and the streams it feeds."""
        destination = queue_name(name)
        require(request, Permission.ADMIN, destination)
        queue = self.broker.queues.get(destination)
        if queue is None:
            raise HttpError(404, f"no queue {destination}", "unknown_queue")
        answer = self._describe(queue, self.broker.now_ms())
        answer["consumer_list"] = [
            {
                "id": c.id, "connection": getattr(c.owner, "id", None),
                "client_id": getattr(c.owner, "client_id", None),
                "ack_mode": c.ack_mode.value, "prefetch": c.prefetch, "unacknowledged": c.held(),
                "selector": getattr(c.selector, "text", None), "exclusive": c.exclusive,
            }
            for c in queue.consumers
        ]
        answer["streams"] = [
            f"/api/v1/streams/{s.name}" for s in self.broker.streams.streams.values() if s.matches(destination)
        ]
        return json_body(200, answer)

    # -- browse and send ------------------------------------------------------------------

    def _queue(self, request: server.Request, name: str) -> tuple[str, MessageQueue]:
        """The queue, once the request may act on it (checked first: a refusal says nothing of what exists)."""
        full = canonical("queue", name, self.broker)
        require(request, Permission.ADMIN, full)
        queue = self.broker.queue(full, create=False)
        if queue is None:
            raise HttpError(404, f"no queue {full}", "unknown_queue", destination=full)
        return full, queue

    def browse(self, request: server.Request, name: str) -> Answer:
        full, queue = self._queue(request, name)
        start = int_query(request, "from", 0, high=MAX_SEQ)
        limit = int_query(request, "limit", DEFAULT_BROWSE, low=1, high=MAX_BROWSE)
        preview = int_query(request, "preview", DEFAULT_PREVIEW, low=0, high=MAX_PREVIEW)
        page, following = operations.browse(queue, start, limit)
        return json_body(200, {
            "destination": full, "depth": len(queue), "in_flight": queue.inflight,
            "messages": [browsed(item, preview) for item in page], "next": following,
        })

    def send(self, request: server.Request, name: str) -> Any:
        return message_json.send(self.publisher, self.changes, request, canonical("queue", name, self.broker, target=True))

    # -- create and get -------------------------------------------------------------------

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
            self.changes.noted(request, "create", full)
        return self.changes.durably(json_body(201 if created else 200, {"destination": full, "created": created}))

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
        took: list[Browsed] = []
        now = self.broker.now_ms()

        def check(message: Message) -> str | None:
            return "expired" if message.expiration and message.expiration <= now else None

        def act(message: Message) -> None:
            took.append(Browsed(Entry(message, 0), False))

        def answer(walk: Walk) -> Answer:
            self.changes.noted(request, "get", full, count=len(took))
            return json_body(200, {
                "destination": full, "messages": [taken(item) for item in took], "depth": len(queue),
            })

        return _walked(lambda finished: operations.DeliveryOrderWalk(
            self.broker, queue, chosen, finished, act=act, check=check,
        ).start()).addCallback(answer)

    # -- purge and delete -----------------------------------------------------------------

    def purge(self, request: server.Request, name: str) -> Any:
        full, queue = self._queue(request, name)
        document(request, ())

        def answer(walk: Walk) -> Answer:
            self.changes.noted(request, "purge", full, purged=walk.done)
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
                self.changes.noted(request, "delete", full, purged=walk.done + rest)
                done.callback(json_body(200, {"destination": full, "deleted": True, "purged": walk.done + rest}))

            broker.when_durable(answer)
            return done

        return _walked(lambda finished: operations.purge(broker, queue, finished)).addCallback(purged)

    # -- move and replay ------------------------------------------------------------------

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
            self.changes.noted(request, "move", full, to=target, moved=walk.done)
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
            self.changes.noted(request, "replay", full, replayed=walk.done, skipped=walk.skipped_count)
            return json_body(200, {
                "destination": full, "replayed": walk.done, "skipped": _skipped(walk), "skipped_count": walk.skipped_count,
            })

        return _walked(lambda finished: operations.replay(self.broker, queue, chosen, allowed, finished)).addCallback(answer)


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
