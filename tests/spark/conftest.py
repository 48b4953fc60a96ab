"""Fixtures for the Spark connector's tests: one real SparkSession, real broker processes.

Nothing is mocked: the broker runs as ``python -m gateway.cli run`` (as it
would beside a Spark cluster, whose executors reach it only over HTTP) and
Spark runs locally with two cores.  Starting Spark costs seconds, so one
session serves every test; a broker costs well under a second, so each
module gets its own with the streams it needs.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Iterator

import pytest

from tests.spark_jvm import archiving_options, class_archive, exit_jvm


@pytest.fixture(scope="package")
def spark(tmp_path_factory: Any) -> Iterator[Any]:
    """One local[2] SparkSession for the tests of this package, with the gateway format registered.

    Package-scoped so that its JVM exits when these tests end, leaving the
    archive of its classes for the Spark drivers of later tests (tests/spark_jvm.py).
    """
    pytest.importorskip("pyspark")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from spark import GatewayDataSource

    session = (
        SparkSession.builder.master("local[2]")
        .appName("gateway-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .config("spark.driver.extraJavaOptions", archiving_options(class_archive(tmp_path_factory)))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(GatewayDataSource)
    yield session
    for query in session.streams.active:
        query.stop()
    exit_jvm(session)
