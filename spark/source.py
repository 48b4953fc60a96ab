"""The ``gateway`` Python data source: where Spark asks for readers and writers.

Options are parsed here, on the driver, so a bad value fails ``load()`` or
``start()`` with a message naming the option instead of failing every task.
Names and defaults follow Spark's Kafka source where they mean the same:

Reading (``spark.read`` / ``spark.readStream``):

=====================  ==========================================================
url                    required: the broker's admin HTTP address
stream                 required: the stream's name
startingOffsets        ``earliest`` | ``latest`` | ``{"0": 23, "1": -2}`` (-2 earliest,
                       -1 latest; also Kafka's ``{"stream": {...}}``); partitions not
                       named start at their earliest.  Default: ``latest`` for
                       streams, ``earliest`` for batches
startingTimestamp      epoch ms; wins over startingOffsets
endingOffsets          batch only: ``latest`` (default) | JSON (-1 latest)
maxOffsetsPerTrigger   stream only: records per micro-batch, shared by partitions
                       in proportion to what each has
failOnDataLoss         ``true`` (default) | ``false``: skip what retention removed
minPartitions          split ranges so there are at least this many Spark partitions
includeHeaders         ``false`` (default) | ``true``: add ``headers map<string,string>``
readerName             the name the query registers its position under (default
                       ``spark-<uuid4>`` per query run)
maxRecordsPerFetch     records per HTTP answer (default: the broker's, 100,000)
maxBytesPerFetch       bytes per HTTP answer (default: the broker's, 8 MiB)
requestTimeoutMs       HTTP timeout (default 60,000)
latestOffsetWaitMs     stream only: how long the broker may hold latestOffset's
                       question when the query has read everything, answering
                       as soon as a record is written (default 1,000; 0: never
                       wait; at most 30,000 and below requestTimeoutMs)
=====================  ==========================================================

Writing (``df.write`` / ``df.writeStream``; columns ``body`` binary or string,
``destination`` string, optional ``headers`` map<string,string>):

=====================  ==========================================================
url                    required
destination            ``topic://a.b``, ``/queue/x``...: overrides the column, as
                       Kafka's ``topic`` option does
idColumn               a string column to use as duplicate-detection id instead of
                       the computed one
maxRowsPerRequest      rows per POST (default 10,000)
maxBytesPerRequest     bytes per POST (default 4 MiB)
requestTimeoutMs       HTTP timeout (default 60,000)
=====================  ==========================================================
"""
from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from spark.errors import OptionError, user_facing
from spark.options import parse_read_options, parse_write_options
from spark.reader import GatewayBatchReader, GatewayStreamReader, check_schema, read_schema
from spark.workers import check_worker_python
from spark.writer import GatewayBatchWriter, GatewayStreamWriter


class GatewayDataSource(DataSource):
    """Streams of a gateway broker, read by offset over its admin HTTP API, and publishing back to it."""

    @classmethod
    def name(cls) -> str:
        # spark.dataSource.register calls this on the driver, before Spark hands the
        # class to its Python workers: the one moment to say that they cannot import it.
        check_worker_python()
        return "gateway"

    @user_facing
    def schema(self) -> StructType:
        # Spark does not say here whether the read is a stream or a batch, so
        # options that only fit one of them are checked in the readers.
        opts = parse_read_options(self.options, streaming=None)
        return read_schema(opts.include_headers)

    @user_facing
    def reader(self, schema: StructType) -> DataSourceReader:
        opts = parse_read_options(self.options, streaming=False)
        check_schema(schema, opts.include_headers)
        return GatewayBatchReader(opts, schema)

    @user_facing
    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = parse_read_options(self.options, streaming=True)
        check_schema(schema, opts.include_headers)
        return GatewayStreamReader(opts, schema)

    @user_facing
    def writer(self, schema: StructType, overwrite: bool) -> GatewayBatchWriter:
        if overwrite:
            raise OptionError("mode", "overwrite", "is not possible for the gateway sink: published messages cannot be "
                                                   "taken back; use mode('append')")
        return GatewayBatchWriter(parse_write_options(self.options), schema)

    @user_facing
    def streamWriter(self, schema: StructType, overwrite: bool) -> GatewayStreamWriter:
        if overwrite:
            raise OptionError("outputMode", "complete", "is not possible for the gateway sink: published messages cannot "
                                                        "be taken back; use outputMode('append') or 'update'")
        return GatewayStreamWriter(parse_write_options(self.options), schema)
