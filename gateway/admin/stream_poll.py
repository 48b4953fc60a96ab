"""``GET /api/v1/streams/{name}/latest``: a stream's ends, at once or when they move (a long poll).

A streaming query that has read everything asks again and again whether
there is more: Spark's default trigger calls the source's ``latestOffset``
in a loop, about a hundred times a second.  As Kafka's fetch
(``fetch.max.wait.ms``), the question here may wait: with ``after`` (the
ends the client knows) and ``wait_ms``, the answer comes at once when an end
differs from ``after``, else as soon as a written batch moves one, else
when ``wait_ms`` has passed.  An idle query then costs one request per
``wait_ms`` instead of a hundred a second, and a record is still seen as
soon as it is on disk.

How a waiting request learns of new records: the stream's follower hook
(``Stream.add_feed``: ``appended`` once a batch is on disk), one watch per
stream while anyone waits on it.  Nothing is left behind: an answer, a
timeout or the client leaving removes the request's timer and, with the
last waiter of a stream, its watch.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred
from twisted.web import server

from core.access import Permission
from core.broker import Broker
from core.stream_config import StreamError
from gateway.admin.http import Answer, HttpError, int_query, json_body, query, require

if TYPE_CHECKING:
    from core.stream import Stream

MAX_WAIT_MS = 30_000
# Where the feed hook is refused (the compiled core): how often waited-on streams are checked.
MAX_PARTITIONS = 10_000  # values in ``after``: a stream has far fewer partitions
_OFFSET = re.compile(r"[0-9]{1,20}")


def ends(stream: Stream) -> list[int]:
    """Each partition's ``latest``: the offsets below it are on disk, what readers may see."""
    return [p.end for p in stream.partitions]


def answer(stream: Stream) -> Answer:
    return json_body(200, {"partitions": [
        {"partition": p.index, "earliest": p.first, "latest": p.end} for p in stream.partitions
    ]})


def parse_after(text: str | None) -> list[int] | None:
    """``after=120,7,0``: the ends the client knows, one per partition in order."""
    if text is None:
        return None
    values = text.split(",")
    if len(values) > MAX_PARTITIONS or not all(_OFFSET.fullmatch(v) for v in values):
        raise HttpError(400, f"parameter after must be the partitions' latest offsets, comma-separated in partition "
                             f"order (such as after=120,7), got {text[:60]!r}")
    return [int(v) for v in values]


class _Waiter:
    """One request waiting for its stream's ends to differ from ``after``."""

    __slots__ = ("watch", "after", "deferred", "timer", "done")

    def __init__(self, watch: _Watch, after: list[int], wait_ms: int, request: server.Request) -> None:
        self.watch = watch
        self.after = after
        self.deferred: Deferred[Answer] = Deferred()
        self.done = False
        self.timer = watch.api.clock.callLater(wait_ms / 1000, self.finish)
        # Errback: the client went away before the answer (an idle query stopped).
        request.notifyFinish().addErrback(self.gone)

    def finish(self) -> None:
        """Answer with the ends as they are now (they moved, or the time is up)."""
        if self._end():
            self.deferred.callback(answer(self.watch.stream))

    def gone(self, reason: Any) -> None:
        self._end()  # nobody to answer

    def _end(self) -> bool:
        if self.done:
            return False
        self.done = True
        if self.timer.active():
            self.timer.cancel()
        self.watch.remove(self)
        return True


class _Watch:
    """The waiters on one stream, and how the stream tells of new records while there are any."""

    def __init__(self, api: StreamPollAPI, stream: Stream) -> None:
        self.api = api
        self.stream = stream
        self.waiters: set[_Waiter] = set()
        self.due: Any = None   # the check to run after a written batch

    def add(self, waiter: _Waiter) -> None:
        self.waiters.add(waiter)
        if len(self.waiters) == 1:
            self.stream.add_feed(self)

    def remove(self, waiter: _Waiter) -> None:
        self.waiters.discard(waiter)
        if self.waiters:
            return
        self.stream.remove_feed(self)
        if self.due is not None and self.due.active():
            self.due.cancel()
        self.due = None
        self.api.watches.pop(self.stream.name, None)

    def appended(self, index: int, base: int, messages: list[Any] | None, timestamps: list[int]) -> None:
        """A batch is on disk (``StreamSet._written``): check once every partition of it has its new end."""
        if self.due is None:
            self.due = self.api.clock.callLater(0, self.check)

    def check(self) -> None:
        self.due = None
        now = ends(self.stream)
        for waiter in [w for w in self.waiters if w.after != now]:
            waiter.finish()


class StreamPollAPI:
    """The long poll for a stream's ends (docs/streams.rst, Endpoints); its route is in gateway/admin/streams.py."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.clock = broker.clock
        self.watches: dict[str, _Watch] = {}

    def waiting(self) -> int:
        """Requests waiting now (tests, and a look from the console)."""
        return sum(len(w.waiters) for w in self.watches.values())

    def latest(self, request: server.Request, name: str) -> Any:
        require(request, Permission.READ, f"stream://{name}")  # first: a refusal says nothing of what exists
        try:
            stream: Stream = self.broker.streams.get(name)
        except StreamError as exc:
            raise HttpError(404 if exc.code == "unknown_stream" else 400, str(exc), exc.code) from None
        after = parse_after(query(request, "after"))
        wait_ms = int_query(request, "wait_ms", 0, low=0, high=MAX_WAIT_MS)
        if after is None or wait_ms == 0 or ends(stream) != after:
            return answer(stream)
        watch = self.watches.get(stream.name)
        if watch is None:
            watch = self.watches[stream.name] = _Watch(self, stream)
        waiter = _Waiter(watch, after, wait_ms, request)
        watch.add(waiter)
        return waiter.deferred
