"""Java options for the tests' Spark JVMs, and the class archive the first one leaves.

A Spark driver loads some 10,000 classes before its first micro-batch; on two
cores that is most of the 20 s a fault test's restarted driver takes to commit
one.  The shared SparkSession of tests/spark runs with
``-XX:ArchiveClassesAtExit`` and, as its package ends, exits cleanly so that
the JVM writes the classes it loaded into an archive (Java's AppCDS).  Drivers
started later (tests/system/test_spark_faults.py) map that archive instead of
loading the classes again: about 5 s less per start, measured here.  Without
the archive (those tests run alone) they start the slow way; the JVM also
ignores an archive whose class path does not match, so it can only cost time.

Both use the JIT's first tier only: a test's JVM lives for seconds to a
minute, so the optimising compiler's work never pays off, and on two cores
its threads compete with the test.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

FIRST_TIER = "-XX:TieredStopAtLevel=1"
# The archive's notes (a line for each class of a signed jar it leaves out) are not the test's output.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def class_archive(tmp_path_factory: Any) -> Path:
    """Where this test session's archive of Spark's classes is (or will be) written."""
    return Path(tmp_path_factory.getbasetemp()) / "spark-classes.jsa"


def archiving_options(archive: Path) -> str:
    """For the first JVM: write the classes it loaded to ``archive`` when it exits."""
    return f"{FIRST_TIER} {QUIET} -XX:ArchiveClassesAtExit={archive}"


def driver_options(archive: Path) -> str:
    """For a later JVM: map the archive when the first one left it."""
    if archive.is_file():
        return f"{FIRST_TIER} {QUIET} -XX:SharedArchiveFile={archive}"
    return FIRST_TIER


def exit_jvm(session: Any, timeout: float = 60) -> None:
    """Stop a SparkSession and let its JVM exit as it does when Python ends: its stdin closed.

    PySpark's gateway JVM calls ``System.exit`` when its standard input ends;
    only a clean exit writes the archive (a killed JVM leaves none).
    """
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    session.stop()
    proc = getattr(gateway, "proc", None) if gateway is not None else None
    if proc is None:
        return
    gateway.shutdown()
    proc.stdin.close()
    proc.wait(timeout)
    SparkContext._gateway = None
    SparkContext._jvm = None
