"""The connector on a cluster: spark-submit to local-cluster mode, executors in processes of their own.

DESIGN.md asks for one check that ``spark/`` runs unchanged where executors
are separate processes (as on a standalone, YARN or Kubernetes cluster):
the connector ships to them as a zip with ``--py-files``, every read task
opens its own connection from a pickled partition, and nothing is shared
with the driver's process.  The driver's own Python processes (Spark runs
the streaming source in one) find it on PYTHONPATH, as README.rst says.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.spark.support import ROOT, BrokerProcess

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(300)]


def test_read_stream_and_write_with_executors_in_other_processes(tmp_path):
    submit = Path(sys.executable).with_name("spark-submit")
    if not submit.exists():
        pytest.skip("spark-submit is not beside this Python (pip install pyspark provides it)")
    package = tmp_path / "gateway_spark.zip"
    with zipfile.ZipFile(package, "w") as archive:
        for path in sorted((ROOT / "spark").glob("*.py")):
            archive.write(path, f"spark/{path.name}")
    broker = BrokerProcess(tmp_path / "broker", {"cluster": {"destinations": ["topic://cluster.>"], "partitions": 2}})
    try:
        sent = broker.publish_json([{"destination": f"topic://cluster.d{i % 5}", "body": f"r{i}"} for i in range(3000)])
        assert sent["accepted"] == 3000
        result = tmp_path / "result.json"
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(package)}
        run = subprocess.run(
            [str(submit), "--master", "local-cluster[2,1,1024]", "--py-files", str(package),
             "--conf", "spark.driver.host=127.0.0.1",
             # The JIT's first tier only, in the driver and both executors: three JVMs that live
             # for seconds, whose optimising compiler would only compete for the two cores.
             "--driver-java-options", "-XX:TieredStopAtLevel=1",
             "--conf", "spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1",
             str(ROOT / "tests" / "spark" / "cluster_app.py"),
             broker.url, "cluster", str(result)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
        seen = json.loads(result.read_text())
        positions = {(p, o) for p, o, _ in seen["rows"]}
        assert len(seen["rows"]) == len(positions) == 3000
        assert sorted(b for _, _, b in seen["rows"]) == sorted(f"r{i}" for i in range(3000))
        assert seen["streamed"] == 3000
        assert seen["driver_pid"] not in seen["worker_pids"] and len(seen["worker_pids"]) >= 2
        written = broker.stream("cluster")
        assert sum(p["latest"] for p in written["partitions"]) == 3050  # the sink's 50 rows, once
    finally:
        broker.stop()
