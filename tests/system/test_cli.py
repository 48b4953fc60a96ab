"""``gateway run`` as a real process: defaults, flags, config errors, clean shutdown on signals."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support import Collector, wait_until


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
        """The first line of the output with ``text`` (the barrier on a process: what it logs)."""
        def line() -> str | None:
            exited = self.proc.poll() is not None
            if exited:
                self._reader.join(5)  # every line it wrote is read
            found = next((line for line in list(self.lines) if text in line), None)
            if found is None and exited:
                raise AssertionError(f"exited ({self.proc.returncode}) without {text!r}:\n{''.join(self.lines)}")
            return found

        return wait_until(line, timeout, lambda: f"{text!r} in the output:\n{''.join(self.lines)}", interval=0.05)

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


# -- where is everything: the version, the start-up summary, the paths of a configuration file ----------


def setup_cfg_version() -> str:
    """The version as setup.cfg declares it, read on its own (the package reads it through its metadata)."""
    import configparser

    parser = configparser.ConfigParser()
    parser.read(Path(__file__).resolve().parents[2] / "setup.cfg")
    return parser.get("metadata", "version")


def gateway_command() -> list[str]:
    script = Path(sys.executable).with_name("gateway")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gateway.cli"]


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_flag_prints_the_package_version_and_exits_0(tmp_path, flag):
    done = subprocess.run([*gateway_command(), flag], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == f"gateway {setup_cfg_version()}"
    # What a bug report needs besides: which Python, and whether the hot path is compiled.
    assert second.startswith(f"Python {sys.version_info.major}.{sys.version_info.minor}.") and "hot path: " in second
    assert done.stderr == ""


def summary_of(broker: BrokerProcess) -> list[str]:
    """The start-up summary's lines: the ``ready`` line and the tab-indented ones Twisted writes after it."""
    broker.wait_for_line("\tadmin API: ")  # its last line when the admin listener is on
    lines = list(broker.lines)
    (start,) = [i for i, line in enumerate(lines) if f"[gateway#info] gateway {setup_cfg_version()} ready" in line]
    block = [lines[start].split("] ", 1)[1].rstrip("\n")]
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        block.append(line[1:].rstrip("\n"))
    return block


def test_the_start_up_summary_names_the_version_the_data_directory_and_every_address(tmp_path):
    import json
    import urllib.request

    stomp_port, mqtt_port, ws_port, admin_port = (free_port() for _ in range(4))
    broker = BrokerProcess(
        "--stomp-port", str(stomp_port), "--mqtt-port", str(mqtt_port), "--ws-port", str(ws_port),
        "--admin-port", str(admin_port), "--data-dir", "relative/data", cwd=tmp_path,
    )
    try:
        summary = summary_of(broker)
        ws = f"ws://127.0.0.1:{ws_port}"
        admin = f"http://127.0.0.1:{admin_port}"
        assert summary[0] == f"gateway {setup_cfg_version()} ready"
        assert summary[1] == f"data directory: {tmp_path / 'relative' / 'data'}"  # absolute, whatever was given
        assert summary[2].startswith("hot path: ")
        assert summary[3:] == [
            f"STOMP: 127.0.0.1:{stomp_port}",
            f"MQTT: 127.0.0.1:{mqtt_port}",
            f"WebSocket: {ws}/ws, {ws}/stomp (STOMP); {ws}/mqtt (MQTT)",
            f"console: {admin}/console/",
            f"metrics: {admin}/metrics",
            f"admin API: {admin}/api/v1",
        ]
        # The addresses it prints are the ones that answer.
        with urllib.request.urlopen(summary[-3].split(": ", 1)[1], timeout=10) as page:
            assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
        with urllib.request.urlopen(summary[-2].split(": ", 1)[1], timeout=10) as metrics:
            assert f'gateway_info{{name="gateway",version="{setup_cfg_version()}"}} 1.0' in metrics.read().decode()
        with urllib.request.urlopen(summary[-1].split(": ", 1)[1], timeout=10) as index:
            assert json.load(index)["version"] == setup_cfg_version()
        assert sum(f"gateway {setup_cfg_version()} ready" in line for line in broker.lines) == 1
        # A warning only for pure Python nobody asked for: none from an editable install (a developer's) or a
        # compiled one; the install the tests run against says which it is.
        unintended = subprocess.run(
            [sys.executable, "-c", "from gateway.compiled import unintended_pure_python as u; print(u() or '')"],
            cwd=tmp_path, capture_output=True, text=True, check=True,
        ).stdout.strip()
        warnings = [line.split("] ", 1)[1].rstrip("\n") for line in broker.lines if "#warn]" in line]
        assert warnings == ([unintended] if unintended else []), "".join(broker.lines)
    finally:
        assert broker.stop() == 0, "".join(broker.lines)


def test_the_summary_says_which_listeners_are_off(tmp_path):
    broker = BrokerProcess(
        "--stomp-port", "0", "--mqtt-port", "0", "--ws-port", "0", "--admin-port", "0",
        "--data-dir", str(tmp_path / "d"), cwd=tmp_path,
    )
    try:
        line = broker.wait_for_line("\tadmin HTTP: ")
        assert line.rstrip("\n") == "\tadmin HTTP: off (no console, no /metrics)"
        for name in ("STOMP", "MQTT", "WebSocket"):
            assert f"\t{name}: off\n" in broker.lines
    finally:
        assert broker.stop() == 0, "".join(broker.lines)


def test_paths_in_a_config_file_are_read_from_its_directory_not_the_current_one(tmp_path):
    """data_dir, users_file and audit_log in one file, run from another directory: all three beside the file."""
    import stomp

    from gateway.auth.users import Cost, PasswordHash, write_lines

    etc = tmp_path / "etc"
    run_dir = tmp_path / "run"
    etc.mkdir()
    run_dir.mkdir()
    write_lines(str(etc / "users"), [f"alice:{PasswordHash.make(b'secret', Cost(ln=10))}"])
    port = free_port()
    (etc / "gw.toml").write_text(
        '[broker]\ndata_dir = "var/data"\n'
        f'[stomp]\nport = {port}\n[mqtt]\nport = 0\n[websocket]\nport = 0\n[admin]\nport = 0\n'
        '[auth]\nusers_file = "users"\naudit_log = "audit.jsonl"\n'
    )
    broker = BrokerProcess("--config", "../etc/gw.toml", cwd=run_dir)
    try:
        broker.wait_for_line(f"STOMP listening on 127.0.0.1:{port}")
        assert broker.wait_for_line("\tdata directory: ").rstrip("\n") == f"\tdata directory: {etc / 'var' / 'data'}"
        assert (etc / "var" / "data" / "store").is_dir() and (etc / "audit.jsonl").is_file()
        assert sorted(p.name for p in run_dir.iterdir()) == []  # nothing landed in the current directory
        conn = stomp.Connection12([("127.0.0.1", port)])
        conn.connect("alice", "secret", wait=True)  # the users file beside the configuration was read
        conn.disconnect()
    finally:
        assert broker.stop() == 0, "".join(broker.lines)

    # A flag stays relative to the current directory, as any command line's path.
    broker = BrokerProcess("--config", "../etc/gw.toml", "--data-dir", "here", cwd=run_dir)
    try:
        assert broker.wait_for_line("\tdata directory: ").rstrip("\n") == f"\tdata directory: {run_dir / 'here'}"
    finally:
        assert broker.stop() == 0, "".join(broker.lines)
