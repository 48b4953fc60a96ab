"""``gateway stat | browse | purge | send | consume | dlq replay | connections`` as subprocesses against a real broker.

State comes from stomp.py; each command's effect is checked on the broker
(depths, what a consumer gets) as well as in what it prints.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from core.access import Rule
from gateway.auth.users import Cost, PasswordHash, write_lines
from tests.integration.test_admin_actions import DLQ, POLICY, dead_letter
from tests.support import BrokerHandle, Collector, connect, disconnect, make_config


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    handle = BrokerHandle(make_config(tmp_path_factory.mktemp("ops"), **POLICY))
    handle.url = f"http://127.0.0.1:{handle.admin_port}"
    yield handle
    handle.stop()


def gateway(handle, *args, stdin=None, env=None):
    """(exit status, stdout, stderr) of ``gateway ARGS --url ...``."""
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args, "--url", handle.url], input=stdin, capture_output=True,
        text=True, timeout=60, env={**os.environ, **(env or {})},
    )
    return done.returncode, done.stdout, done.stderr


def rows(output):
    """The table's rows after its header line, split on whitespace."""
    return [line.split() for line in output.splitlines()[1:]]


def test_send_stat_browse_consume_purge(broker):
    code, out, err = gateway(broker, "send", "/queue/cli.work", "--body", "job", "-H", "kind=cli", "--count", "3")
    assert (code, out.strip()) == (0, "queue://cli.work: 3 sent"), err
    assert gateway(broker, "send", "cli.work", stdin="from stdin\n")[0] == 0
    code, out, _ = gateway(broker, "stat", "cli.")
    assert code == 0 and out.splitlines()[0].split()[:4] == ["Name", "Messages", "Ready", "Unacked"]
    assert rows(out) == [["cli.work", "4", "4", "0", "0", "4", "0", "0", "0"]]
    listed = json.loads(gateway(broker, "stat", "cli.work", "--json")[1])
    assert [(q["destination"], q["messages"]) for q in listed] == [("queue://cli.work", 4)]
    code, out, _ = gateway(broker, "browse", "cli.work")
    assert code == 0 and [r[-1] for r in rows(out)] == ["job", "job", "job", "stdin\\n"]
    assert broker.queue_depth("queue://cli.work") == 4  # browsing took nothing
    code, out, _ = gateway(broker, "consume", "/queue/cli.work", "--count", "2")
    assert (code, out) == (0, "job\njob\n")
    assert broker.queue_depth("queue://cli.work") == 2
    code, out, _ = gateway(broker, "purge", "cli.work")
    assert (code, out.strip()) == (0, "queue://cli.work: 2 messages purged")
    assert broker.queue_depth("queue://cli.work") == 0
    conn, got = connect(broker)
    conn.subscribe("/queue/cli.work", id="s")
    assert got.settle(0.2) == []  # nothing was left for a consumer
    disconnect(conn)


def test_consume_waits_for_a_message(broker):
    import threading
    import time

    def later():
        time.sleep(0.5)
        conn, got = connect(broker)
        conn.send("/queue/cli.later", "arrived", receipt="r")
        got.wait_for(1, what="receipts")
        disconnect(conn)

    threading.Thread(target=later, daemon=True).start()
    assert gateway(broker, "consume", "cli.later", "--wait", "10")[1] == "arrived\n"
    assert gateway(broker, "consume", "cli.later")[1] == ""  # nothing there: nothing printed


def test_dlq_replay(broker):
    if broker.queue_depth(DLQ) == 0:
        assert gateway(broker, "dlq", "replay")[1].strip() == "queue://DLQ: no dead letters"
    dead_letter(broker, "cli.home", 5)
    code, out, err = gateway(broker, "dlq", "replay", "--limit", "2")
    assert (code, out.strip()) == (0, "queue://DLQ: 2 replayed, 0 skipped"), err
    assert broker.queue_depth(DLQ) == 3
    code, out, _ = gateway(broker, "dlq", "replay", "--json")
    assert json.loads(out) == {"destination": "queue://DLQ", "replayed": 3, "skipped": [], "skipped_count": 0}
    assert broker.queue_depth(DLQ) == 0 and broker.queue_depth("queue://cli.home") == 5


def test_connections_list_and_close(broker):
    conn, got = connect(broker, client_id="cli-watcher")
    code, out, _ = gateway(broker, "connections", "cli-watcher")
    (row,) = rows(out)
    assert code == 0 and row[1:3] == ["stomp/1.2", "cli-watcher"]
    code, out, _ = gateway(broker, "connections", "--close", row[0], "--reason", "maintenance window")
    assert (code, out.strip()) == (0, f"{row[0]} closed: maintenance window")
    (error,) = got.wait_for(1, what="errors")
    assert error.headers["message"] == "maintenance window"
    assert got.disconnected.wait(5)


def test_errors_name_the_problem(broker):
    code, out, err = gateway(broker, "purge", "cli.nope")
    assert (code, out) == (1, "") and err.strip() == "gateway purge: no queue queue://cli.nope (HTTP 404)"
    code, _, err = gateway(broker, "browse", "/topic/x")
    assert code == 1 and "/topic/x is a topic; this command takes a queue" in err
    code, _, err = gateway(broker, "send", "cli.x", "--body", "b", "-H", "novalue")
    assert code == 2 and "must be NAME=VALUE" in err
    gone = subprocess.run([sys.executable, "-m", "gateway.cli", "stat", "--url", "http://127.0.0.1:9"],
                          capture_output=True, text=True, timeout=60)
    assert gone.returncode == 1 and "cannot reach the broker's admin listener at http://127.0.0.1:9" in gone.stderr


def test_credentials_from_flags_and_environment(tmp_path):
    from gateway.cli import main

    users = tmp_path / "users"
    write_lines(str(users), [f"ops:{PasswordHash.make(b'o-secret', Cost(ln=10))}"])
    tokens = str(tmp_path / "tokens")
    assert main(["token", tokens, "ops"]) == 0
    config = make_config(tmp_path)
    config.auth.users_file, config.auth.tokens_file = str(users), tokens
    config.auth.rules = [Rule.parse("user:ops", "allow", ["read", "write", "admin"], ["queue://>", "broker://>"])]
    handle = BrokerHandle(config)
    handle.url = f"http://127.0.0.1:{handle.admin_port}"
    try:
        code, _, err = gateway(handle, "stat")
        assert code == 1 and "HTTP 401: give --user, or --token" in err
        assert gateway(handle, "stat", "--user", "ops", env={"GATEWAY_PASSWORD": "o-secret"})[0] == 0
        assert gateway(handle, "stat", "--user", "ops", env={"GATEWAY_PASSWORD": "wrong"})[0] == 1
        token = [line for line in open(tokens) if not line.startswith("#")]
        assert token  # the file holds digests only; the token itself was printed once
        code, out, err = gateway(handle, "send", "cli.secure", "--body", "x", "--user", "ops", env={"GATEWAY_PASSWORD": "o-secret"})
        assert code == 0, err
        conn = __import__("stomp").Connection12([(handle.host, handle.port)])
        got = Collector()
        conn.set_listener("c", got)
        conn.connect("ops", "o-secret", wait=True)
        conn.subscribe("/queue/cli.secure", id="s")
        assert [m.body for m in got.wait_for(1)] == ["x"]
        disconnect(conn)
    finally:
        handle.stop()
