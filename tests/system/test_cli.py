"""``gateway run`` as a real process: defaults, flags, config errors, clean shutdown on signals."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support import Collector


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BrokerProcess:
    def __init__(self, *args: str, cwd: Path) -> None:
        script = Path(sys.executable).with_name("gateway")
        command = [str(script)] if script.exists() else [sys.executable, "-m", "gateway.cli"]
        self.proc = subprocess.Popen(
            command + ["run", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self.lines.append(line)

    def wait_for_line(self, text: str, timeout: float = 15) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if text in line:
                    return line
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not in output:\n{''.join(self.lines)}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_run_with_flags_serves_and_shuts_down_cleanly(tmp_path, sig):
    import stomp

    port = free_port()
    broker = BrokerProcess("--stomp-port", str(port), "--data-dir", str(tmp_path / "d"), "--log-level", "info", cwd=tmp_path)
    try:
        broker.wait_for_line(f"STOMP listening on 127.0.0.1:{port}")
        assert (tmp_path / "d").is_dir()
        # It says whether it runs compiled or pure, as the install it imports from this directory is.
        how = subprocess.run([sys.executable, "-c", "from gateway.compiled import describe; print(describe())"],
                             cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
        assert broker.wait_for_line("hot path: ").rstrip().endswith(f"hot path: {how}")
        conn = stomp.Connection12([("127.0.0.1", port)])
        got = Collector()
        conn.set_listener("c", got)
        conn.connect(wait=True)
        conn.subscribe("/queue/cli", id="1")
        conn.send("/queue/cli", "through a real process")
        assert got.wait_for(1)[0].body == "through a real process"
        code = broker.stop(sig)
        assert code == 0, "".join(broker.lines)
        # The client was told why before the socket closed.
        (error,) = got.wait_for(1, what="errors")
        assert error.headers["message"] == "Broker shutting down"
        assert got.disconnected.wait(5)
        assert any("broker stopped" in line for line in broker.lines)
    finally:
        if broker.proc.poll() is None:
            broker.proc.kill()


def test_embedded_default_uses_data_dir_in_cwd(tmp_path):
    # The default port may be taken on a developer's machine; everything else is the default.
    port = free_port()
    broker = BrokerProcess("--stomp-port", str(port), cwd=tmp_path)
    try:
        line = broker.wait_for_line("STOMP listening on")
        assert "127.0.0.1" in line
        assert (tmp_path / "data").is_dir()
    finally:
        assert broker.stop() == 0


def test_config_file_is_read(tmp_path):
    port = free_port()
    path = tmp_path / "gw.toml"
    path.write_text(f'[broker]\ndata_dir = "{tmp_path / "from-toml"}"\n[stomp]\nport = {port}\n')
    broker = BrokerProcess("--config", str(path), cwd=tmp_path)
    try:
        broker.wait_for_line(f"STOMP listening on 127.0.0.1:{port}")
        assert (tmp_path / "from-toml").is_dir()
    finally:
        assert broker.stop() == 0


def test_bad_config_exits_2_with_reason(tmp_path):
    path = tmp_path / "gw.toml"
    path.write_text("[stomp]\nprot = 1\n")
    broker = BrokerProcess("--config", str(path), cwd=tmp_path)
    assert broker.proc.wait(15) == 2
    broker._reader.join(5)
    assert "unknown setting [stomp] prot" in "".join(broker.lines)


def test_port_in_use_exits_1_with_reason(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        broker = BrokerProcess("--stomp-port", str(port), cwd=tmp_path)
        assert broker.proc.wait(15) == 1
        broker._reader.join(5)
    assert "cannot start" in "".join(broker.lines)


def test_a_signal_right_after_the_first_listener_still_stops_cleanly(tmp_path):
    """SIGTERM can come before the reactor runs (a service manager stopping a broker that just
    started): the listeners are up, Twisted's handlers are not yet; it must still exit 0."""
    for attempt in range(3):
        broker = BrokerProcess(
            "--stomp-port", "0", "--mqtt-port", "0", "--ws-port", "0", "--admin-port", "0",
            "--data-dir", str(tmp_path / f"d{attempt}"), "--log-level", "info", cwd=tmp_path,
        )
        broker.wait_for_line("listener disabled")
        assert broker.stop() == 0, "".join(broker.lines)
