"""``/api/v1/streams``: offsets, range reads, reader registration, the long poll (docs/streams.rst).

Every route under ``/api/v1/streams`` is registered here; the long poll of a
stream's ends (``.../latest``) keeps its waiting requests in
gateway/admin/stream_poll.py.

Range reads send stored chunks as they lie on disk (Arrow IPC), so serving
Spark costs a store read and one copy per chunk, not work per record.  All
of it runs on the reactor thread, bounded per request by ``max_bytes``.
"""
from __future__ import annotations

import base64
import json
import re
from typing import TYPE_CHECKING, Any

from twisted.web import server

from core.access import Permission
from core.broker import Broker
from core.stream_config import OffsetOutOfRange, StreamError
from core.stream_history import lease_expiring, lease_warning_seconds, partition_lag
from gateway.admin.http import (
    HttpError,
    Router,
    int_query,
    json_body,
    permitted,
    query,
    request_body,
    require,
)
from gateway.admin.stream_poll import StreamPollAPI

if TYPE_CHECKING:
    from core.stream import Stream

ARROW_STREAM = "application/vnd.apache.arrow.stream"
JSON_LINES = "application/x-ndjson"

_READER_NAME = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")
MAX_RECORDS = 1_000_000
DEFAULT_RECORDS = 100_000
DEFAULT_BYTES = 8 << 20
MAX_BYTES = 64 << 20


def _status(exc: StreamError) -> HttpError:
    if isinstance(exc, OffsetOutOfRange):
        return HttpError(416, str(exc), exc.code, earliest=exc.earliest, latest=exc.latest)
    status = 404 if exc.code in ("unknown_stream", "unknown_partition") else 400
    return HttpError(status, str(exc), exc.code)


class StreamsAPI:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.poll = StreamPollAPI(broker)

    def install(self, router: Router) -> None:
        router.add("/api/v1/streams", get=self.list)
        router.add("/api/v1/streams/{name}", get=self.describe)
        router.add("/api/v1/streams/{name}/offsets", get=self.offsets)
        router.add("/api/v1/streams/{name}/partitions/{partition}/records", get=self.records)
        router.add("/api/v1/streams/{name}/readers/{reader}", put=self.register, delete=self.forget)
        # The long poll of the partitions' ends, with the state of its waiting requests (stream_poll.py).
        router.add("/api/v1/streams/{name}/latest", get=self.poll.latest)

    def _stream(self, request: server.Request, name: str) -> Stream:
        """The stream, once the request may read it (checked first: a refusal says nothing of whether it exists)."""
        require(request, Permission.READ, f"stream://{name}")
        try:
            stream: Stream = self.broker.streams.get(name)  # the broker's StreamSet, or NoStreams that raises
            return stream
        except StreamError as exc:
            raise _status(exc) from None

    def list(self, request: server.Request) -> Any:
        return json_body(200, {"streams": [
            self._summary(s) for s in self.broker.streams.streams.values()
            if permitted(request, Permission.READ, f"stream://{s.name}")
        ]})

    def _summary(self, s: Stream) -> dict[str, Any]:
        """A stream in the list: its totals, its append rate, and its readers' worst lag and lease (docs/streams.rst)."""
        now = self.broker.now_ms()
        rates = self.broker.stream_history.rates(s.name, len(s.partitions))
        live = [r for r in s.readers.values() if r.expires_ms > now]
        lease = s.spec.reader_lease_seconds
        return {
            "name": s.name, "partitions": len(s.partitions),
            "records": sum(p.end - p.first for p in s.partitions), "bytes": sum(p.bytes for p in s.partitions),
            "readers": len(s.readers),
            # Sampled by the broker (core/stream_history.py): null until two samples exist.
            "records_per_second": None if any(x is None for x in rates) else round(sum(x or 0.0 for x in rates), 3),
            "max_lag": max((sum(partition_lag(s, r).values()) for r in live), default=None),
            "readers_expiring": sum(1 for r in live if lease_expiring(r, lease, now)),
        }

    def describe(self, request: server.Request, name: str) -> Any:
        """The stream, its partitions and live readers; ``?history=1`` adds the sampled last five minutes.

        Spark's connector reads this answer at every micro-batch, so the
        history (61 samples per stream and per reader by default) is only sent when asked for.
        """
        stream = self._stream(request, name)
        with_history = int_query(request, "history", 0, low=0, high=1) == 1
        spec = stream.spec
        now = self.broker.now_ms()
        history = self.broker.stream_history
        rates = history.rates(stream.name, len(stream.partitions))
        readers = []
        for r in stream.readers.values():
            if r.expires_ms <= now:
                continue
            # Records the reader has yet to read, per partition (what Kafka calls consumer lag).
            lag = partition_lag(stream, r)
            reader: dict[str, Any] = {
                "name": r.name, "offsets": {str(k): v for k, v in sorted(r.offsets.items())},
                "lag": {str(k): v for k, v in lag.items()},
                "expires_in_seconds": round((r.expires_ms - now) / 1000, 1),
                "total_lag": sum(lag.values()),
                "lease_expiring": lease_expiring(r, spec.reader_lease_seconds, now),
            }
            if with_history:
                reader["lag_history"] = history.reader_samples(stream.name, r.name)
            readers.append(reader)
        answer: dict[str, Any] = {
            "name": stream.name,
            "destinations": list(spec.destinations),
            "max_age_seconds": spec.max_age_seconds,
            "max_bytes": spec.max_bytes,
            "reader_lease_seconds": spec.reader_lease_seconds,
            "partitions": [
                {"partition": p.index, "earliest": p.first, "latest": p.end, "bytes": p.bytes,
                 "records": p.end - p.first, "records_per_second": rate}
                for p, rate in zip(stream.partitions, rates)
            ],
            "readers": readers,
            "records_per_second": None if any(x is None for x in rates) else round(sum(x or 0.0 for x in rates), 3),
            "lease_expiring_below_seconds": lease_warning_seconds(spec.reader_lease_seconds),
            "history_interval_seconds": history.interval,
            "history_window_seconds": history.window,
            "now_ms": now,
        }
        if with_history:
            answer["history"] = history.stream_samples(stream.name)
        return json_body(200, answer)

    def offsets(self, request: server.Request, name: str) -> Any:
        stream = self._stream(request, name)
        ts = int_query(request, "timestamp", None, low=0)
        if ts is None:
            raise HttpError(400, "parameter timestamp (epoch milliseconds) is required")
        return json_body(200, {"partitions": [
            {"partition": p.index, "offset": stream.offset_for_time(p.index, ts)} for p in stream.partitions
        ]})

    def records(self, request: server.Request, name: str, partition: str) -> Any:
        stream = self._stream(request, name)
        try:
            index = int(partition)
        except ValueError:
            raise HttpError(404, f"stream {name!r} has no partition {partition!r}", "unknown_partition") from None
        start = int_query(request, "from", None)
        if start is None:
            raise HttpError(400, "parameter from (the first offset to read) is required")
        end = int_query(request, "to", None)
        max_records = int_query(request, "max_records", DEFAULT_RECORDS, low=1, high=MAX_RECORDS)
        max_bytes = int_query(request, "max_bytes", DEFAULT_BYTES, low=1, high=MAX_BYTES)
        fmt = query(request, "format") or "arrow"
        if fmt not in ("arrow", "jsonl"):
            raise HttpError(400, f"parameter format must be arrow or jsonl, got {fmt[:40]!r}")
        try:
            found = stream.read(index, start, end, max_records, max_bytes)
        except StreamError as exc:
            raise _status(exc) from None
        p = stream.partitions[index]
        headers = {
            "X-Stream-Next-Offset": str(found.next),
            "X-Stream-Earliest": str(p.first),
            "X-Stream-Latest": str(p.end),
        }
        if fmt == "arrow":
            from core.records import ipc_stream

            headers["Content-Type"] = ARROW_STREAM
            return 200, headers, b"".join(ipc_stream(found.messages))
        headers["Content-Type"] = JSON_LINES
        return 200, headers, _json_lines(found.messages)

    def register(self, request: server.Request, name: str, reader: str) -> Any:
        stream = self._stream(request, name)
        if not _READER_NAME.match(reader):
            raise HttpError(400, "reader names are 1-200 letters, digits and ._:-")
        try:
            document = json.loads(request_body(request) or b"{}")
            offsets = document["offsets"]
            if not isinstance(offsets, dict):
                raise TypeError
            parsed = {int(k): int(v) for k, v in offsets.items() if not isinstance(v, bool)}
        except (ValueError, KeyError, TypeError, RecursionError):
            raise HttpError(400, 'body must be JSON like {"offsets": {"0": 42, "1": 17}}') from None
        for index in parsed:
            if not 0 <= index < len(stream.partitions):
                raise HttpError(404, f"stream {name!r} has no partition {index}", "unknown_partition")
        self.broker.streams.register_reader(stream.name, reader, parsed)
        return 204, {}, b""

    def forget(self, request: server.Request, name: str, reader: str) -> Any:
        stream = self._stream(request, name)
        self.broker.streams.forget_reader(stream.name, reader)
        return 204, {}, b""


def _json_lines(messages: list[Any]) -> bytes:
    """Records for people: one JSON object a line, bodies as text when they are UTF-8."""
    import pyarrow as pa

    from core.records import SCHEMA

    lines = []
    for message in messages:
        batch = pa.ipc.read_record_batch(pa.py_buffer(bytes(message)), SCHEMA)
        timestamps = batch.column(1).cast(pa.int64()).to_pylist()
        columns = batch.to_pydict()
        for i, body in enumerate(columns["body"]):
            record: dict[str, Any] = {
                "offset": columns["offset"][i],
                "timestamp": timestamps[i],
                "destination": columns["destination"][i],
                "message_id": columns["message_id"][i],
                "headers": dict(columns["headers"][i]),
            }
            try:
                record["body"] = body.decode("utf-8")
            except UnicodeDecodeError:
                record["body_base64"] = base64.b64encode(body).decode("ascii")
            lines.append(json.dumps(record, ensure_ascii=False))
    return ("\n".join(lines) + "\n").encode("utf-8") if lines else b""

