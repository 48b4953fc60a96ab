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


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local[2] SparkSession for the whole test session, with the gateway format registered."""
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
        # The JIT's first tier only: the tests' jobs are small and short, and on two cores the
        # optimising compiler's threads mostly compete with them.
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(GatewayDataSource)
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()
