"""Publishing rows to the broker: ``df.write`` and ``df.writeStream`` with format "gateway".

Each row becomes one message.  Exactly-once rests on the broker's duplicate
detection: every row carries an id that a retry of the same work computes
again, so what a failed attempt already published is dropped the second
time.  The id is made from who wrote the row (the streaming query and batch,
or the batch job), the Spark partition, a digest of the row's content and
how many identical rows came before it in that partition; the digest rather
than the row's position makes a retried task that meets its rows in another
order produce the same ids.  The broker answers a POST only once the rows are
on disk, so a task that returns has stored everything it was given.
"""
from __future__ import annotations

import bisect
import hashlib
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from spark.client import BrokerClient
from spark.errors import GatewayError, OptionError, user_facing
from spark.options import WriteOptions

log = logging.getLogger("spark.gateway")

# Local properties Spark sets on every task of a micro-batch (StreamExecution.QUERY_ID_KEY,
# MicroBatchExecution.BATCH_ID_KEY); the query id survives restarts from the checkpoint.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"

HEADERS_TYPE = pa.map_(pa.string(), pa.string())
# Rough per-row framing cost in an IPC request beyond the values themselves.
ROW_OVERHEAD = 24


@dataclass
class Published(WriterCommitMessage):
    """What one task stored: the driver adds these up for its log line."""

    partition: int
    rows: int
    accepted: int
    duplicates: int
    requests: int


def check_broker(opts: WriteOptions) -> None:
    """Reach the broker once from the driver, so a wrong URL fails the write now, not in every task."""
    with BrokerClient(opts.url, opts.timeout, authorization=opts.authorization) as client:
        client.streams()


def check_input(schema: StructType, opts: WriteOptions) -> None:
    """Refuse, on the driver, input that every task would fail on."""
    types = {f.name: f.dataType for f in schema.fields}
    if "body" not in types:
        raise GatewayError(
            f"gateway: writing needs a 'body' column (binary or string) with each message's payload; "
            f"the data has columns {', '.join(types) or 'none'}")
    if not isinstance(types["body"], (BinaryType, StringType)):
        raise GatewayError(f"gateway: column 'body' must be binary or string, got {types['body'].simpleString()}")
    if opts.destination is None:
        if "destination" not in types:
            raise GatewayError(
                "gateway: writing needs a destination: a 'destination' column (string, e.g. topic://a.b or /queue/x) "
                "or the option 'destination'")
    if "destination" in types and not isinstance(types["destination"], StringType):
        raise GatewayError(f"gateway: column 'destination' must be a string, got {types['destination'].simpleString()}")
    headers = types.get("headers")
    if headers is not None and not (
        isinstance(headers, MapType) and isinstance(headers.keyType, StringType) and isinstance(headers.valueType, StringType)
    ):
        raise GatewayError(f"gateway: column 'headers' must be map<string,string>, got {types['headers'].simpleString()}")
    if opts.id_column is not None:
        if opts.id_column not in types:
            raise OptionError("idColumn", opts.id_column, f"must name a column of the data (columns: {', '.join(types)})")
        if not isinstance(types[opts.id_column], StringType):
            raise OptionError("idColumn", opts.id_column, f"must name a string column, not {types[opts.id_column].simpleString()}")


class _Publisher:
    """One task's publishing: builds request batches, cuts them to size, POSTs them, counts."""

    def __init__(self, opts: WriteOptions, prefix: bytes, partition: int) -> None:
        self.opts = opts
        self.partition = partition
        # Keyed with who wrote the rows, so the per-row hash below is all an id costs.
        self.key = hashlib.blake2b(prefix + b"\0" + str(partition).encode(), digest_size=32).digest()
        self.seen: dict[bytes, int] = {}
        self.pending: list[pa.RecordBatch] = []
        self.pending_rows = 0
        self.pending_bytes = 0
        self.result = Published(partition, 0, 0, 0, 0)
        # The driver checked the broker answers when the query started (see check_broker).
        self.client = BrokerClient(opts.url, opts.timeout, retry=opts.retry, reached=True, authorization=opts.authorization)

    def run(self, batches: Iterator[pa.RecordBatch]) -> Published:
        try:
            for batch in batches:
                if batch.num_rows:
                    self._add(self._request_batch(batch))
            self._flush()
        finally:
            self.client.close()
        return self.result

    def _request_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        names = batch.schema.names
        if self.opts.destination is not None:
            destination = pa.repeat(pa.scalar(self.opts.destination, pa.string()), n)
        else:
            destination = batch.column(names.index("destination")).cast(pa.string())
            if destination.null_count:
                raise GatewayError(
                    f"gateway: {destination.null_count} row(s) have no destination (null 'destination'); "
                    f"fill the column or set the option 'destination'")
        body = batch.column(names.index("body"))
        body = body.cast(pa.binary()) if body.type != pa.binary() else body
        if body.null_count:
            body = pc.fill_null(body, pa.scalar(b"", pa.binary()))  # a null payload is an empty message
        columns = [destination, body]
        fields = ["destination", "body"]
        headers = None
        if "headers" in names:
            headers = batch.column(names.index("headers"))
            if headers.type != HEADERS_TYPE:
                headers = headers.cast(HEADERS_TYPE)
            if headers.null_count:
                headers = pc.fill_null(headers, pa.scalar([], HEADERS_TYPE))
            columns.append(headers)
            fields.append("headers")
        if self.opts.id_column is not None:
            ids = batch.column(names.index(self.opts.id_column)).cast(pa.string())
        else:
            ids = self._ids(destination, body, headers)
        columns.append(ids)
        fields.append("id")
        return pa.RecordBatch.from_arrays(columns, names=fields)

    def _ids(self, destination: pa.Array, body: pa.Array, headers: pa.Array | None) -> pa.Array:
        """Deterministic duplicate-detection ids; the one per-row Python loop of the writer."""
        blake2b = hashlib.blake2b
        key = self.key
        seen = self.seen
        fixed = self.opts.destination
        constant = fixed is not None
        dests = [fixed.encode()] if fixed is not None else [d.encode() for d in destination.to_pylist()]
        bodies = body.to_pylist()
        heads = headers.to_pylist() if headers is not None else None
        out = []
        for i, payload in enumerate(bodies):
            h = blake2b(dests[0] if constant else dests[i], digest_size=16)
            h.update(len(payload).to_bytes(8, "big"))
            h.update(payload)
            if heads is not None and heads[i]:
                for k, v in sorted(heads[i], key=lambda kv: (kv[0], kv[1] or "")):
                    kb, vb = k.encode(), (v or "").encode()
                    h.update(len(kb).to_bytes(4, "big") + kb + len(vb).to_bytes(4, "big") + vb + (b"\1" if v is None else b"\0"))
            digest = h.digest()
            occurrence = seen.get(digest, 0)
            seen[digest] = occurrence + 1
            out.append(blake2b(digest + occurrence.to_bytes(8, "big"), digest_size=16, key=key).hexdigest())
        return pa.array(out, pa.string())

    def _add(self, batch: pa.RecordBatch) -> None:
        """Queue a batch for sending, cut where the request limits fall."""
        max_rows, max_bytes = self.opts.max_rows_per_request, self.opts.max_bytes_per_request
        total = batch.get_total_buffer_size() + ROW_OVERHEAD * batch.num_rows
        if total <= max_bytes:
            start = 0
            while start < batch.num_rows:
                room = max_rows - self.pending_rows
                piece = batch.slice(start, room)
                size = total * piece.num_rows // batch.num_rows
                if self.pending_bytes + size > max_bytes:
                    self._flush()
                    continue
                self._queue(piece, size)
                start += piece.num_rows
            return
        # Big rows: measure each one so no request goes over maxBytesPerRequest.
        sizes = pc.add(pc.binary_length(batch.column("body")), pc.binary_length(batch.column("destination")))
        sizes = pc.add(sizes, ROW_OVERHEAD + 32)
        if "headers" in batch.schema.names:
            headers = batch.column("headers")
            flat = pc.add(pc.binary_length(pc.list_flatten(pc.map_keys(headers))),
                          pc.fill_null(pc.binary_length(pc.list_flatten(pc.map_values(headers))), 0))
            ends = pc.cumulative_sum(flat).to_pylist()
            offsets = headers.offsets.to_pylist()
            base = offsets[0]
            header_sizes = [(ends[b - base - 1] if b > base else 0) - (ends[a - base - 1] if a > base else 0)
                            for a, b in zip(offsets, offsets[1:])]
            sizes = pc.add(sizes, pa.array(header_sizes, pa.int64()))
        cumulative = pc.cumulative_sum(sizes.cast(pa.int64())).to_pylist()
        start = 0
        while start < batch.num_rows:
            before = cumulative[start - 1] if start else 0
            room_bytes = max_bytes - self.pending_bytes
            stop = bisect.bisect_right(cumulative, before + room_bytes, lo=start)
            stop = min(stop, start + max_rows - self.pending_rows)
            if stop <= start:
                if self.pending_rows:
                    self._flush()
                    continue
                stop = start + 1  # one row larger than the limit goes alone; the broker may refuse it (413)
            self._queue(batch.slice(start, stop - start), cumulative[stop - 1] - before)
            start = stop

    def _queue(self, piece: pa.RecordBatch, size: int) -> None:
        self.pending.append(piece)
        self.pending_rows += piece.num_rows
        self.pending_bytes += size
        if self.pending_rows >= self.opts.max_rows_per_request or self.pending_bytes >= self.opts.max_bytes_per_request:
            self._flush()

    def _flush(self) -> None:
        if not self.pending:
            return
        sink = pa.BufferOutputStream()
        schema = self.pending[0].schema
        with pa.ipc.new_stream(sink, schema) as out:
            for piece in self.pending:
                out.write_batch(piece)
        accepted, duplicates = self.client.publish(sink.getvalue().to_pybytes())
        self.result.rows += self.pending_rows
        self.result.accepted += accepted
        self.result.duplicates += duplicates
        self.result.requests += 1
        self.pending, self.pending_rows, self.pending_bytes = [], 0, 0


def _task() -> Any:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise GatewayError("gateway: write() must run inside a Spark task")
    return ctx


def _totals(messages: List[Optional[WriterCommitMessage]]) -> Published:
    total = Published(-1, 0, 0, 0, 0)
    for m in messages:
        if isinstance(m, Published):
            total.rows += m.rows
            total.accepted += m.accepted
            total.duplicates += m.duplicates
            total.requests += m.requests
    return total


class GatewayBatchWriter(DataSourceArrowWriter):
    """``df.write.format("gateway")``: ids keyed by a job id made on the driver.

    Spark retries a failed task with the same pickled writer, so the retry's
    ids match the first attempt's; running the whole job again makes a new
    writer and publishes again, as re-running any batch job would.
    """

    @user_facing
    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        check_input(schema, opts)
        check_broker(opts)
        self.opts = opts
        self.job = uuid.uuid4().hex

    @user_facing
    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        ctx = _task()
        return _Publisher(self.opts, f"job:{self.job}".encode(), ctx.partitionId()).run(iterator)

    def commit(self, messages: List[Optional[WriterCommitMessage]]) -> None:
        t = _totals(messages)
        log.info("gateway: write job %s published %d rows (%d accepted, %d duplicates dropped) in %d requests",
                 self.job, t.rows, t.accepted, t.duplicates, t.requests)

    def abort(self, messages: List[Optional[WriterCommitMessage]]) -> None:
        t = _totals(messages)
        log.warning("gateway: write job %s failed after its finished tasks published %d rows; they stay published",
                    self.job, t.rows)


class GatewayStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("gateway")``: ids keyed by query id and batch id, which a retry reuses."""

    @user_facing
    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        check_input(schema, opts)
        check_broker(opts)
        self.opts = opts
        self.fallback = uuid.uuid4().hex

    @user_facing
    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        ctx = _task()
        query, batch = ctx.getLocalProperty(QUERY_ID_PROPERTY), ctx.getLocalProperty(BATCH_ID_PROPERTY)
        if query is None or batch is None:
            # Without them a retried batch cannot be recognised; say so rather than pretend.
            log.warning("gateway: Spark did not give this task its streaming query and batch ids (%s, %s); "
                        "a retried micro-batch may publish its rows twice", QUERY_ID_PROPERTY, BATCH_ID_PROPERTY)
            prefix = f"writer:{self.fallback}"
        else:
            prefix = f"query:{query}:batch:{batch}"
        return _Publisher(self.opts, prefix.encode(), ctx.partitionId()).run(iterator)

    def commit(self, messages: List[Optional[WriterCommitMessage]], batchId: int) -> None:
        t = _totals(messages)
        log.info("gateway: micro-batch %d published %d rows (%d accepted, %d duplicates dropped) in %d requests",
                 batchId, t.rows, t.accepted, t.duplicates, t.requests)

    def abort(self, messages: List[Optional[WriterCommitMessage]], batchId: int) -> None:
        t = _totals(messages)
        log.warning("gateway: micro-batch %d failed after its finished tasks published %d rows; "
                    "its retry publishes them again under the same ids, which the broker drops", batchId, t.rows)
