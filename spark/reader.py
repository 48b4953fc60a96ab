"""Reading a broker stream: offsets on the driver, ranges of records on the executors.

Offsets are ``{"<partition>": next_offset}``; Spark checkpoints them, so a
restarted query plans exactly the ranges it planned before and re-reads the
same records (offsets are dense and never reused, as Kafka's).  The driver
only talks to the broker about offsets and reader registrations; each Spark
task opens its own connection in ``read()`` and turns the broker's Arrow IPC
answers into Spark's Arrow batches with column operations only, because any
per-record Python work would cap throughput far below what Spark can take.
"""
from __future__ import annotations

import logging
import math
import os
import queue
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark.client import BrokerClient
from spark.errors import BrokerError, DataLossError, OffsetOutOfRange, OptionError, shielded, user_facing
from spark.options import EARLIEST, LATEST, ReadOptions

log = logging.getLogger("spark.gateway")

# An offset of this source as Spark checkpoints it (JSON): {"<partition>": next_offset}.  Offsets
# Spark hands back are typed dict[str, Any]: they come from a checkpoint, and _parse checks them.
Offset = dict[str, int]


def read_schema(include_headers: bool) -> StructType:
    """The columns of a read, named as Kafka's source names them where they mean the same."""
    fields = [
        StructField("stream", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("destination", StringType()),
        StructField("message_id", StringType()),
        StructField("body", BinaryType()),
    ]
    if include_headers:
        fields.append(StructField("headers", MapType(StringType(), StringType())))
    return StructType(fields)


def check_schema(schema: StructType, include_headers: bool) -> None:
    """A user-given schema must be ours: Spark rejects batches that differ, with a far worse message."""
    expected = read_schema(include_headers)
    if [(f.name, f.dataType) for f in schema.fields] != [(f.name, f.dataType) for f in expected.fields]:
        raise OptionError(
            "schema", schema.simpleString(),
            f"cannot be chosen for the gateway source; leave it out (the source's schema is {expected.simpleString()}, "
            f"with headers only when includeHeaders=true)")


# -- partitions and the executor side ---------------------------------------------------


@dataclass
class GatewayPartition(InputPartition):
    """One Spark task's range [start, end) of one stream partition, with all it needs to read it alone."""

    url: str
    stream: str
    partition: int
    start: int
    end: int
    fail_on_data_loss: bool
    include_headers: bool
    max_records: int | None
    max_bytes: int | None
    timeout: float
    retry: float = 0.0
    authorization: str | None = None


class _Converter:
    """Turns one broker answer into one Spark batch: column references, two casts, two constant columns."""

    def __init__(self, target: pa.Schema, stream: str, partition: int) -> None:
        self.target = target
        self.stream = pa.scalar(stream, pa.string())
        self.partition = pa.scalar(partition, pa.int32())

    def __call__(self, table: pa.Table) -> pa.RecordBatch:
        n = table.num_rows
        columns = []
        for field in self.target:
            name = field.name
            if name == "stream":
                column: Any = pa.repeat(self.stream, n)
            elif name == "partition":
                column = pa.repeat(self.partition, n)
            else:
                column = table.column(name)
                column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
                if column.type != field.type:
                    column = column.cast(field.type)  # timestamp ms -> us, string/map flavours
            columns.append(column)
        return pa.RecordBatch.from_arrays(columns, schema=self.target)


def read_partition(part: InputPartition, schema: StructType) -> Iterator[pa.RecordBatch]:
    """Fetch [start, end) following X-Stream-Next-Offset; runs on an executor from a pickled reader.

    The next answer is fetched in a thread while Spark consumes the current
    batch: the socket read and Arrow's parsing release the GIL, so the
    broker's work and Spark's overlap instead of taking turns.
    """
    if not isinstance(part, GatewayPartition):
        return  # Spark's placeholder partition for an empty batch read
    convert = _Converter(to_arrow_schema(schema, timezone="UTC"), part.stream, part.partition)
    for table in _prefetched(_tables(part), depth=2):
        yield convert(table)


def _tables(part: GatewayPartition) -> Iterator[pa.Table]:
    """The range as parsed answers, with failOnDataLoss applied where records are gone."""
    pos, end = part.start, part.end
    # The driver planned this range with the broker: a broker away now is restarting, not misconfigured.
    with BrokerClient(part.url, part.timeout, retry=part.retry, reached=True, authorization=part.authorization) as client:
        while pos < end:
            try:
                answer = client.records(part.stream, part.partition, pos, end, part.max_records, part.max_bytes)
            except OffsetOutOfRange as exc:
                if pos < exc.earliest:
                    data_lost(part.stream, part.partition, pos, min(exc.earliest, end), exc.earliest, part.fail_on_data_loss)
                    pos = exc.earliest
                    continue
                missing(part.stream, part.partition, pos, end, exc.latest, part.fail_on_data_loss)
                return
            if answer.next_offset <= pos:
                # Nothing at pos although the plan said records exist up to end.
                missing(part.stream, part.partition, pos, end, answer.latest, part.fail_on_data_loss)
                return
            table = pa.ipc.open_stream(pa.py_buffer(answer.data)).read_all()
            got = table.num_rows
            if got != answer.next_offset - pos or (got and table.column("offset")[0].as_py() != pos):
                raise BrokerError(
                    f"gateway: the broker at {part.url} answered stream {part.stream!r} partition {part.partition} "
                    f"from {pos} with {got} records ending at {answer.next_offset}; the offsets do not line up")
            if answer.next_offset > end:  # a broker that ignored `to`
                table = table.slice(0, end - pos)
            if table.num_rows:
                # The broker sends stored chunks as they are (often many small batches):
                # one combined batch per answer keeps the per-batch costs of Arrow and
                # of Spark's JVM side off the per-record budget.
                if table.num_columns and table.column(0).num_chunks > 1:
                    table = table.combine_chunks()
                yield table
            pos = min(answer.next_offset, end)


_DONE = object()


def _prefetched(items: Iterator[Any], depth: int) -> Iterator[Any]:
    """Run ``items`` in a thread, at most ``depth`` ahead; its exceptions surface here, in order."""
    slots: queue.Queue[tuple[Any, BaseException | None]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        slots.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            slots.put((_DONE, None))
        except BaseException as exc:  # handed to the consumer, raised there
            slots.put((_DONE, exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None and stop.is_set():
                close()

    worker = threading.Thread(target=produce, name="gateway-fetch", daemon=True)
    worker.start()
    try:
        while True:
            item, exc = slots.get()
            if item is _DONE:
                if exc is not None:
                    raise exc
                return
            yield item
    finally:
        stop.set()
        worker.join(timeout=5)


def data_lost(stream: str, partition: int, start: int, stop: int, earliest: int, fail: bool) -> None:
    """Kafka's failOnDataLoss for records retention removed before the query read them."""
    what = (f"stream {stream!r} partition {partition}: offsets {start} to {stop - 1} were removed by the broker's "
            f"retention before this query read them (the partition now starts at {earliest})")
    if fail:
        raise DataLossError(
            f"gateway: data loss: {what}. The query stops rather than skip them. To skip lost records and continue "
            f"from the earliest offset, set the option failOnDataLoss=false; to keep records longer, raise the "
            f"stream's max_bytes or max_age_seconds on the broker.")
    log.warning("gateway: %s; skipping to offset %d because failOnDataLoss=false", what, earliest)


def missing(stream: str, partition: int, start: int, end: int, latest: int, fail: bool) -> None:
    """Records the query planned that the broker does not have: it lost its data or was replaced."""
    what = (f"stream {stream!r} partition {partition}: the query expected records up to offset {end - 1}, "
            f"but the broker's partition ends at offset {latest} (was its data directory reset?)")
    if fail:
        raise DataLossError(
            f"gateway: data loss: {what}. Set the option failOnDataLoss=false to go on without them, "
            f"or start a new query (new checkpoint) against this broker.")
    log.warning("gateway: %s; reading only what exists because failOnDataLoss=false", what)


# -- planning on the driver -----------------------------------------------------------------


def bounds_of(info: dict[str, Any]) -> dict[int, tuple[int, int]]:
    return {int(p["partition"]): (int(p["earliest"]), int(p["latest"])) for p in info["partitions"]}


def split(ranges: list[tuple[int, int, int]], min_partitions: int | None) -> list[tuple[int, int, int]]:
    """At least ``min_partitions`` pieces when there are that many records, each range cut evenly.

    Pieces per range are proportional to its size, as Kafka's offset range
    calculator does, rounded up so the total is never short.
    """
    total = sum(e - s for _, s, e in ranges)
    if not min_partitions or len(ranges) >= min_partitions or total == 0:
        return ranges
    out: list[tuple[int, int, int]] = []
    for p, s, e in ranges:
        size = e - s
        parts = max(1, min(size, math.ceil(size * min_partitions / total)))
        out.extend((p, s + size * i // parts, s + size * (i + 1) // parts) for i in range(parts))
    return out


def allocate(available: dict[int, int], budget: int) -> dict[int, int]:
    """Split a row budget across partitions in proportion to what each has, never exceeding it.

    Kafka prorates and rounds per partition, which can overshoot
    maxOffsetsPerTrigger; largest remainders keep the sum exact.
    """
    total = sum(available.values())
    if total <= budget:
        return dict(available)
    got = {p: n * budget // total for p, n in available.items()}
    remainder = {p: n * budget % total for p, n in available.items()}
    left = budget - sum(got.values())
    for p in sorted(remainder, key=lambda p: (-remainder[p], p))[:left]:
        got[p] += 1
    return got


def resolve_start(opts: ReadOptions, client: BrokerClient, bounds: dict[int, tuple[int, int]]) -> dict[int, int]:
    """startingTimestamp, then startingOffsets, against the broker's current bounds."""
    if opts.starting_timestamp is not None:
        found = client.offsets_for_time(opts.stream, opts.starting_timestamp)
        return {p: found.get(p, latest) for p, (_, latest) in bounds.items()}
    spec = opts.starting
    if spec == "earliest":
        return {p: earliest for p, (earliest, _) in bounds.items()}
    if spec == "latest":
        return {p: latest for p, (_, latest) in bounds.items()}
    assert isinstance(spec, dict)
    _known_partitions("startingOffsets", spec, bounds, opts.stream)
    start = {}
    for p, (earliest, latest) in bounds.items():
        want = spec.get(p, EARLIEST)  # unnamed partitions start at their beginning, as new ones do
        value = earliest if want == EARLIEST else latest if want == LATEST else want
        if value > latest:
            raise OptionError("startingOffsets", _spec_text(spec),
                              f"asks for offset {value} of stream {opts.stream!r} partition {p}, beyond its end: the "
                              f"partition holds offsets {earliest} to {latest} (latest = {latest} is the next offset)")
        start[p] = value
    return start


def _known_partitions(option: str, spec: dict[int, int], bounds: dict[int, tuple[int, int]], stream: str) -> None:
    unknown = sorted(set(spec) - set(bounds))
    if unknown:
        raise OptionError(option, _spec_text(spec),
                          f"names partition(s) {', '.join(map(str, unknown))}, but stream {stream!r} has partitions 0 to {len(bounds) - 1}")


def _spec_text(spec: dict[int, int]) -> str:
    return "{" + ", ".join(f'"{p}": {o}' for p, o in sorted(spec.items())) + "}"


def plan(opts: ReadOptions, schema: StructType, ranges: list[tuple[int, int, int]]) -> list[GatewayPartition]:
    return [
        GatewayPartition(opts.url, opts.stream, p, s, e, opts.fail_on_data_loss, opts.include_headers,
                         opts.max_records_per_fetch, opts.max_bytes_per_fetch, opts.timeout, opts.retry, opts.authorization)
        for p, s, e in split(ranges, opts.min_partitions)
    ]


def checked_ranges(opts: ReadOptions, wanted: list[tuple[int, int, int]], bounds: dict[int, tuple[int, int]]) -> list[tuple[int, int, int]]:
    """The ranges that still exist; what retention removed or the broker lacks is data loss."""
    out = []
    for p, s, e in wanted:
        earliest, latest = bounds.get(p, (0, 0))
        if p not in bounds:
            missing(opts.stream, p, s, e, 0, opts.fail_on_data_loss)
            continue
        if s < earliest:
            data_lost(opts.stream, p, s, min(earliest, e), earliest, opts.fail_on_data_loss)
            s = earliest
        if e > latest:
            missing(opts.stream, p, max(s, latest), e, latest, opts.fail_on_data_loss)
            e = latest
        if s < e:
            out.append((p, s, e))
    return out


# -- batch ----------------------------------------------------------------------------------


class GatewayBatchReader(DataSourceReader):
    """``spark.read.format("gateway")``: one range per partition, resolved when the query is planned."""

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    @user_facing
    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        with BrokerClient(opts.url, opts.timeout, authorization=opts.authorization) as client:
            bounds = bounds_of(client.stream(opts.stream))
            start = resolve_start(opts, client, bounds)
        end = self._end(bounds)
        wanted = []
        for p in sorted(bounds):
            if start[p] > end[p]:
                raise OptionError("endingOffsets", _spec_text(end) if isinstance(opts.ending, dict) else opts.ending,
                                  f"ends stream {opts.stream!r} partition {p} at {end[p]}, before its start {start[p]} "
                                  f"(startingOffsets/startingTimestamp)")
            wanted.append((p, start[p], end[p]))
        return plan(opts, self.schema, checked_ranges(opts, wanted, bounds))

    def _end(self, bounds: dict[int, tuple[int, int]]) -> dict[int, int]:
        spec = self.opts.ending
        if spec == "latest":
            return {p: latest for p, (_, latest) in bounds.items()}
        assert isinstance(spec, dict)
        _known_partitions("endingOffsets", spec, bounds, self.opts.stream)
        end = {}
        for p, (earliest, latest) in bounds.items():
            want = spec.get(p, LATEST)
            value = latest if want == LATEST else want
            if value > latest:
                raise OptionError("endingOffsets", _spec_text(spec),
                                  f"asks for offset {value} of stream {self.opts.stream!r} partition {p}, beyond its end: "
                                  f"the partition holds offsets {earliest} to {latest}")
            end[p] = value
        return end

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return shielded(read_partition(partition, self.schema))


# -- streaming ------------------------------------------------------------------------------


class GatewayStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("gateway")``.

    The instance Spark keeps on the driver plans offsets and registers the
    query's position with the broker, so age retention keeps what the query
    has not committed; the copies pickled to executors only ``read()``.
    """

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        # Like a Kafka group id: the broker keeps records for this name.
        self.reader_name = opts.reader_name or f"spark-{uuid.uuid4()}"
        self._client: BrokerClient | None = None
        self._target: dict[int, int] | None = None  # Trigger.AvailableNow's end
        self._registered: dict[int, int] | None = None
        self._registered_at = 0.0
        self._lease = 600.0
        self._latest: tuple[float, dict[int, int]] | None = None
        self._on_terminate: Any = None  # the SIGTERM handler to put back once stopped
        self._asked = False  # whether latestOffset was called before (see _bounds_after)
        self._long_poll = True  # False once the broker turned out to have no long poll

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        state["_on_terminate"] = None
        return state

    @property
    def client(self) -> BrokerClient:
        if self._client is None:
            # Retries only once the broker has answered: a wrong URL fails the query's start at once.
            self._client = BrokerClient(self.opts.url, self.opts.timeout, retry=self.opts.retry, authorization=self.opts.authorization)
        return self._client

    def _bounds(self) -> dict[int, tuple[int, int]]:
        info = self.client.stream(self.opts.stream)
        self._lease = float(info.get("reader_lease_seconds") or self._lease)
        bounds = bounds_of(info)
        self._latest = (time.monotonic(), {p: latest for p, (_, latest) in bounds.items()})
        return bounds

    @user_facing
    def initialOffset(self) -> Offset:
        bounds = self._bounds()
        return _offsets(resolve_start(self.opts, self.client, bounds))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    @user_facing
    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {p: latest for p, (_, latest) in self._bounds().items()}

    def _bounds_after(self, begin: dict[int, int]) -> dict[int, tuple[int, int]]:
        """The broker's bounds; when the query has read all it knows of, they may wait for new records.

        Spark's default trigger asks again at once when there was nothing, a
        hundred times a second; the broker's long poll instead answers when a
        batch moves an end, or after latestOffsetWaitMs (as Kafka's
        fetch.max.wait.ms), so an idle query costs a request a second.  Never
        waits on the first call of a query run (Trigger.Once calls it only
        then), under Trigger.AvailableNow (it stops at its target), or when
        the ends last seen are ahead of ``begin`` (records are there: a read
        limit left them for the next batch).
        """
        wait = self.opts.latest_offset_wait_ms
        first, self._asked = not self._asked, True
        seen = self._latest[1] if self._latest is not None else None
        if (first or not wait or self._target is not None or seen is None or not self._long_poll
                or any(begin.get(p, 0) < latest for p, latest in seen.items())):
            return self._bounds()
        try:
            bounds = self.client.stream_bounds(self.opts.stream, [seen[p] for p in sorted(seen)], wait)
        except BrokerError as exc:
            if exc.status != 404 or exc.code != "not_found":
                raise
            self._long_poll = False  # an older broker: ask as before
            return self._bounds()
        self._latest = (time.monotonic(), {p: latest for p, (_, latest) in bounds.items()})
        return bounds

    @user_facing
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> Offset:
        begin = _parse(start)
        bounds = self._bounds_after(begin)
        end = dict(begin)  # partitions the broker no longer lists stay where they were
        available: dict[int, int] = {}
        for p, (earliest, latest) in bounds.items():
            s = begin.setdefault(p, 0)  # a partition added since: from its first record
            cap = latest if self._target is None else min(latest, self._target.get(p, s))
            first = max(s, earliest)  # where the read really begins if retention took the head
            available[p] = max(0, cap - first)
            end[p] = max(s, first)
        if isinstance(limit, ReadMaxRows):
            take = allocate(available, limit.max_rows)
        else:
            take = available
        for p, n in take.items():
            end[p] = max(begin[p], end[p] + n) if n else begin[p]
        self._register(begin)
        return _offsets(end)

    @user_facing
    def reportLatestOffset(self) -> Offset | None:
        if self._latest is None or time.monotonic() - self._latest[0] > 1.0:
            self._bounds()
        assert self._latest is not None
        return _offsets(self._latest[1])

    @user_facing
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, stop = _parse(start), _parse(end)
        wanted = [(p, begin.get(p, 0), e) for p, e in sorted(stop.items()) if e > begin.get(p, 0)]
        if not wanted:
            return []
        return plan(self.opts, self.schema, checked_ranges(self.opts, wanted, self._bounds()))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return shielded(read_partition(partition, self.schema))

    @user_facing
    def commit(self, end: dict[str, Any]) -> None:
        # Spark commits batch N's end while planning batch N+1: from here on the
        # query never needs anything before it, even after a restart.
        self._register(_parse(end))

    def stop(self) -> None:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
            self._restore_terminate()
        else:
            self._on_terminate = None  # the handler is running: it restores what was there
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._registered is not None:
            self._registered = None
            try:
                # A short timeout: a broker that is gone must not hold up the query's shutdown.
                with BrokerClient(self.opts.url, min(self.opts.timeout, 5.0), authorization=self.opts.authorization) as client:
                    client.delete_reader(self.opts.stream, self.reader_name)
            except BrokerError as exc:
                log.warning("gateway: could not unregister reader %s of stream %r (its lease will expire): %s",
                            self.reader_name, self.opts.stream, exc)

    def _stop_on_terminate(self) -> None:
        """Unregister when Spark ends the query: it stops the source by terminating this process.

        Spark 4.x ends the Python process that hosts this reader with SIGTERM
        instead of asking it to stop, so ``stop()`` would never run and the
        broker would keep the reader until its lease ran out.  The handler is
        installed only once the reader has registered, which happens only in
        that dedicated process, and then lets the signal do what it did before.
        """
        if self._on_terminate is not None or threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)

        def terminated(signum: int, frame: Any) -> None:
            # Spark signals more than once while stopping a worker; a second SIGTERM
            # arriving while the DELETE is on its way must not cut it short.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            try:
                self.stop()
            finally:
                signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
                if callable(previous):
                    previous(signum, frame)
                elif previous != signal.SIG_IGN:
                    os.kill(os.getpid(), signum)  # the default action, now that it is back

        signal.signal(signal.SIGTERM, terminated)
        self._on_terminate = previous if previous is not None else signal.SIG_DFL

    def _restore_terminate(self) -> None:
        if self._on_terminate is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_terminate)
            self._on_terminate = None

    def _register(self, offsets: dict[int, int]) -> None:
        """PUT the offsets the query still needs; again only when they move or a quarter lease passed."""
        now = time.monotonic()
        if offsets == self._registered and now - self._registered_at < max(1.0, self._lease / 4):
            return
        self.client.put_reader(self.opts.stream, self.reader_name, offsets)
        self._registered, self._registered_at = dict(offsets), now
        self._stop_on_terminate()


def _offsets(offsets: dict[int, int]) -> Offset:
    return {str(p): int(o) for p, o in sorted(offsets.items())}


def _parse(offsets: dict[str, Any]) -> dict[int, int]:
    try:
        return {int(p): int(o) for p, o in offsets.items()}
    except (TypeError, ValueError, AttributeError):
        raise DataLossError(
            f"gateway: the checkpoint holds offsets {offsets!r}, which are not this source's "
            f'{{"<partition>": offset}}; was the checkpoint written by another source?') from None
