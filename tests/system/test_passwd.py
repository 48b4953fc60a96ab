"""``gateway passwd`` and the startup refusal, as real processes."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from gateway.auth.users import Users
from tests.system.test_cli import BrokerProcess, free_port


def gateway(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("gateway")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "gateway.cli"]
    return subprocess.run(command + list(args), input=stdin, capture_output=True, text=True, timeout=60, cwd=cwd)


def test_create_change_delete(tmp_path):
    path = tmp_path / "users"
    assert gateway("passwd", str(path), "alice", stdin="first\n").returncode == 0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    users = Users.load(str(path))
    assert users.hash_for("alice").verify(b"first")
    assert gateway("passwd", str(path), "bob", stdin="bobs\n").returncode == 0
    before = path.read_text().splitlines()
    assert gateway("passwd", str(path), "alice", stdin="second\n").returncode == 0
    after = path.read_text().splitlines()
    assert after[1] == before[1] and after[0] != before[0]  # alice changed in place, bob untouched
    assert Users.load(str(path)).hash_for("alice").verify(b"second")
    assert gateway("passwd", "-D", str(path), "alice").returncode == 0
    assert list(Users.load(str(path)).hashes) == ["bob"]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_refusals_say_why(tmp_path):
    path = tmp_path / "users"
    missing = gateway("passwd", "-D", str(path), "alice")
    assert missing.returncode == 1 and "no user 'alice'" in missing.stderr
    empty = gateway("passwd", str(path), "alice", stdin="")
    assert empty.returncode == 1 and "empty password" in empty.stderr
    bad = gateway("passwd", str(path), "a:b", stdin="x\n")
    assert bad.returncode == 1 and "':'" in bad.stderr
    assert not path.exists()


def test_run_refuses_a_public_address_without_users(tmp_path):
    done = gateway("run", "--host", "0.0.0.0", "--data-dir", str(tmp_path / "d"), cwd=tmp_path)
    assert done.returncode == 1
    line = next(line for line in done.stderr.splitlines() if "cannot start" in line)
    assert "stomp on 0.0.0.0" in line and "users_file" in line and "allow_anonymous = true" in line
    config = tmp_path / "gw.toml"
    config.write_text('[mqtt]\nhost = "0.0.0.0"\n')
    done = gateway("run", "--config", str(config), "--data-dir", str(tmp_path / "d"), cwd=tmp_path)
    assert done.returncode == 1 and "mqtt on 0.0.0.0 would let anyone in" in done.stderr
    assert not (tmp_path / "d").exists()  # refused before anything was opened


def test_run_on_a_public_address_with_users(tmp_path):
    assert gateway("passwd", str(tmp_path / "users"), "alice", stdin="pw\n").returncode == 0
    config = tmp_path / "gw.toml"
    port = free_port()
    config.write_text(
        f'[broker]\nhost = "0.0.0.0"\n[stomp]\nport = {port}\n[mqtt]\nport = 0\n[websocket]\nport = 0\n[admin]\nport = 0\n'
        '[auth]\nusers_file = "users"\n[[auth.rules]]\nwho = "*"\npermissions = ["read"]\ndestinations = ["queue://>"]\n'
    )
    broker = BrokerProcess("--config", str(config), "--data-dir", str(tmp_path / "d"), cwd=tmp_path)
    try:
        broker.wait_for_line(f"STOMP listening on 0.0.0.0:{port}")
    finally:
        assert broker.stop() == 0, "".join(broker.lines)


def test_sighup_reloads_users_groups_and_rules_without_dropping_clients(tmp_path):
    import signal

    import stomp

    from gateway.auth.users import Cost, PasswordHash, write_lines
    from tests.support import Collector

    write_lines(str(tmp_path / "users"), [f"ops:{PasswordHash.make(b'ops-pw', Cost(ln=10))}"])
    config = tmp_path / "gateway.toml"

    def rules(*queues: str) -> str:
        return (
            '[auth]\nusers_file = "users"\n[[auth.rules]]\nwho = "user:ops"\npermissions = ["read", "write", "admin"]\n'
            f"destinations = {list(queues)!r}\n".replace("'", '"')
        )

    config.write_text(rules("queue://a"))
    port = free_port()
    broker = BrokerProcess("--config", str(config), "--data-dir", str(tmp_path / "d"), "--stomp-port", str(port),
                           "--mqtt-port", "0", "--ws-port", "0", "--admin-port", "0", cwd=tmp_path)
    try:
        broker.wait_for_line("STOMP listening")
        conn = stomp.Connection12([("127.0.0.1", port)])
        got = Collector()
        conn.set_listener("c", got)
        conn.connect("ops", "ops-pw", wait=True)
        conn.send("/queue/a", "allowed", receipt="r1")
        got.wait_for(1, what="receipts")
        other = stomp.Connection12([("127.0.0.1", port)])
        other_got = Collector()
        other.set_listener("c", other_got)
        other.connect("ops", "ops-pw", wait=True)
        other.send("/queue/b", "not yet")
        assert other_got.wait_for(1, what="errors")[0].headers["message"] == "Access denied"

        config.write_text("this is not TOML [")  # a broken edit: logged, the old rules stay
        broker.proc.send_signal(signal.SIGHUP)
        broker.wait_for_line("configuration not reloaded")
        config.write_text(rules("queue://a", "queue://b"))
        broker.proc.send_signal(signal.SIGHUP)
        broker.wait_for_line("[auth] reloaded: 1 rules")
        conn.send("/queue/b", "allowed now", receipt="r2")  # the same connection, checked by the new rules
        got.wait_for(2, what="receipts")
        assert got.errors == [] and conn.is_connected()
        conn.disconnect()
    finally:
        assert broker.stop() == 0
