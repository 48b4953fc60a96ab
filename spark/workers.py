"""Whether Spark's Python workers can import this connector, checked on the driver before they fail.

Spark runs every piece of a Python data source (its planning too) in Python
worker processes started with ``SparkContext.pythonExec``: the
``PYSPARK_PYTHON`` of the driver's environment when the session started, or
``python3`` on the PATH, not the driver's own interpreter.  A connector
installed only in a virtual environment then fails each task with
"ModuleNotFoundError: No module named 'spark'" inside a long JVM trace.  When
Spark is local, the workers' interpreter is on this machine, so registering
the format asks it once, in the driver's working directory as the workers
run, and refuses with what to change.  On a cluster the executors are
elsewhere: nothing is checked there (the README says what to install).
"""
from __future__ import annotations

import os
import subprocess
import sys

from spark.errors import GatewayError

_FIND = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('spark') else 3)"
_checked: set[tuple[str, str]] = set()


def worker_python_problem(python: str, cwd: str) -> str | None:
    """Why ``python`` (run in ``cwd``, as Spark's workers are) cannot import the connector; None when it can."""
    try:
        found = subprocess.run([python, "-c", _FIND], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot be run ({exc})"
    if found.returncode == 3:
        return "cannot import this connector (no module named 'spark')"
    if found.returncode != 0:
        return f"failed: {found.stderr.strip()[-300:]}"
    return None


def check_worker_python() -> None:
    """Raise ``GatewayError`` on a driver whose local Spark's Python workers cannot import this connector."""
    try:
        from pyspark import SparkContext
    except ImportError:
        return
    context = SparkContext._active_spark_context
    if context is None or not str(context.master).startswith("local"):
        return  # in a worker, a Spark Connect client, or a cluster: not for this process to see
    python, cwd = str(context.pythonExec), os.getcwd()
    if (python, cwd) in _checked:
        return
    problem = worker_python_problem(python, cwd)
    if problem is not None:
        how = "PYSPARK_PYTHON" if "PYSPARK_PYTHON" in os.environ else "PYSPARK_PYTHON is not set, so python3 on the PATH"
        raise GatewayError(
            f"gateway: Spark's Python workers run {python!r} ({how}), which {problem}: every read and write of "
            f"the gateway format would fail in its tasks.  Set PYSPARK_PYTHON to a Python that has the connector "
            f"before the SparkSession starts, e.g. `export PYSPARK_PYTHON={sys.executable}` in the shell, or "
            f"os.environ['PYSPARK_PYTHON'] = sys.executable at the top of the script (spark.pyspark.python does not "
            f"reach a Python data source in PySpark 4); or install the connector for {python}"
        )
    _checked.add((python, cwd))
