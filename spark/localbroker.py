"""A broker of their own for the demos (``spark.pipeline``, ``spark.bench`` with ``--start-broker``).

``gateway run`` in a temporary directory, on free loopback ports, with the
streams the caller asks for.  It is a separate process started from the
command line, never an import: ``spark`` talks to brokers over the network
only, so these demos run the same against a broker on another machine.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LocalBroker:
    def __init__(self, config: str, who: str) -> None:
        self.dir = tempfile.mkdtemp(prefix=f"gateway-{who}-")
        path = os.path.join(self.dir, "gateway.toml")
        with open(path, "w") as f:
            f.write(config)
        self.stomp_port, self.mqtt_port, self.admin_port = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.admin_port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "run", "--config", path, "--data-dir", os.path.join(self.dir, "data"),
             "--stomp-port", str(self.stomp_port), "--mqtt-port", str(self.mqtt_port), "--ws-port", "0",
             "--admin-port", str(self.admin_port), "--log-level", "warn"],
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        for port in (self.stomp_port, self.mqtt_port, self.admin_port):
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        self.stop()
                        raise SystemExit(f"{who}: the broker did not start (is the gateway package installed here?)")
                    time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
