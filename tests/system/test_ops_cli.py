"""``gateway stat | browse | purge | send | consume | dlq list/replay | connections`` as subprocesses against a real broker.

State comes from stomp.py; each command's effect is checked on the broker
(depths, what a consumer gets) as well as in what it prints and its exit status.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

import pytest

from core.access import Rule
from gateway.auth.users import Cost, PasswordHash, write_lines
from tests.integration.admin_support import DLQ, POLICY, dead_letter
from tests.support import BrokerHandle, Collector, connect, disconnect, make_config, sync, wait_until

NOT_A_DLQ = "is not a dead-letter queue (policy: queue://DLQ, or DLQ.<queue> with individual_dlq) (HTTP 400)"
NO_PASSWORD = ("no password for user {user}: set GATEWAY_PASSWORD, or run on a terminal to be asked for it "
               "(or give --token)")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    handle = BrokerHandle(make_config(tmp_path_factory.mktemp("ops"), **POLICY))
    handle.url = f"http://127.0.0.1:{handle.admin_port}"
    yield handle
    handle.stop()


def clean_environment(env=None):
    """os.environ without the developer's own GATEWAY_* settings (a GATEWAY_PASSWORD there would hide a bug), plus ``env``."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}, **(env or {})}


def gateway(handle, *args, stdin=None, env=None):
    """(exit status, stdout, stderr) of ``gateway ARGS --url ...``.

    In a session of its own, without a controlling terminal, as under cron or
    CI: a command that wanted to prompt cannot hang the test on the
    developer's terminal, and the no-terminal path is the one tested.
    """
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args, "--url", handle.url], input=stdin, capture_output=True,
        stdin=subprocess.DEVNULL if stdin is None else None, text=True, timeout=60, env=clean_environment(env),
        start_new_session=True,
    )
    return done.returncode, done.stdout, done.stderr


def rows(output):
    """The table's rows after its header line, split on whitespace."""
    return [line.split() for line in output.splitlines()[1:]]


def columns(output):
    """The table as dicts by header, cut at the headers' positions (for cells with spaces in them)."""
    header, *lines = output.splitlines()
    names = header.split()
    starts = [header.index(" " + n) + 1 if i else 0 for i, n in enumerate(names)]
    ends = [*starts[1:], None]
    return [{n: line[a:b].strip() for n, a, b in zip(names, starts, ends)} for line in lines]


def dead_letters(handle, queue, bodies):
    """Send ``bodies`` to /queue/QUEUE and NACK each delivery until it is dead-lettered (max_redeliveries is 1:
    the second NACK); a receipt barrier after the last NACK, so they are in the DLQ when this returns."""
    conn, got = connect(handle)
    for body in bodies:
        conn.send(f"/queue/{queue}", body, headers={"persistent": "true"})
    conn.subscribe(f"/queue/{queue}", id="dl", ack="client-individual")
    n = len(bodies)
    for attempt in (1, 2):
        for message in got.wait_for(n * attempt)[n * (attempt - 1):]:
            conn.nack(message.headers["ack"])
    sync(conn, got)
    disconnect(conn)


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

    def looked_in_vain() -> int:
        """Gets the admin API answered 404 (no such queue yet): the CLI has looked, and waits on."""
        answered = broker.inspect(lambda: dict(broker.gateway.admin.resource.answered))
        return sum(n for (route, method, status), n in answered.items() if route.endswith("/get") and status == 404)

    answers, before = [], looked_in_vain()  # the module's broker: earlier tests' answers count too
    consume = threading.Thread(target=lambda: answers.append(gateway(broker, "consume", "cli.later", "--wait", "10")))
    consume.start()
    wait_until(lambda: looked_in_vain() > before, 10, "the CLI's first look, before the message exists")
    conn, got = connect(broker)
    conn.send("/queue/cli.later", "arrived", receipt="r")
    got.wait_for(1, what="receipts")
    disconnect(conn)
    consume.join(30)
    assert answers and answers[0][1] == "arrived\n", answers
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
    assert code == 2 and "/topic/x is a topic; this command takes a queue" in err
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


# -- issue 25, stumble 5: what a refusal, a missing password, priorities and dead letters look like ----------------


def test_dlq_replay_of_a_queue_that_is_no_dlq_says_the_brokers_error(broker):
    """A typo must not print "no dead letters" and exit 0: the broker's 400 is the answer, on stderr, exit 1."""
    for args in (("--queue", "DLQQ"), ("--queue", "/queue/DLQQ", "--json")):
        code, out, err = gateway(broker, "dlq", "replay", *args)
        assert (code, out, err) == (1, "", f"gateway dlq: queue://DLQQ {NOT_A_DLQ}\n")
    # An existing, empty queue that is no DLQ: the same refusal, not "no dead letters".
    assert gateway(broker, "send", "cli.nodlq", "--body", "x")[0] == 0
    assert gateway(broker, "consume", "cli.nodlq")[1] == "x\n"
    code, out, err = gateway(broker, "dlq", "replay", "--queue", "cli.nodlq")
    assert (code, out, err) == (1, "", f"gateway dlq: queue://cli.nodlq {NOT_A_DLQ}\n")
    # A DLQ's name the broker has not made yet (no message failed there): nothing to do, and that is success.
    code, out, err = gateway(broker, "dlq", "replay", "--queue", "DLQ.cli.never")
    assert (code, out, err) == (0, "queue://DLQ.cli.never: no dead letters\n", "")


def test_dlq_replay_that_leaves_dead_letters_behind_exits_1(broker):
    """Skipped dead letters and --id not found are named on stderr with exit 1; the summary stays on stdout."""
    dlq = "DLQ.cli.stray"  # a DLQ of its own, so the shared DLQ of test_dlq_replay is left alone
    code, out, _ = gateway(broker, "send", dlq, "--body", "no home", "--json")
    stray = json.loads(out)["id"]
    code, out, err = gateway(broker, "dlq", "replay", "--queue", dlq)
    assert code == 1 and out.splitlines() == [
        f"queue://{dlq}: 0 replayed, 1 skipped",
        f"  {stray}: no originalDestination header: not a dead letter of this broker",
    ]
    assert err == f"gateway dlq: 1 dead letters could not be replayed and are still in queue://{dlq}\n"
    code, out, err = gateway(broker, "dlq", "replay", "--queue", dlq, "--id", "ID:nowhere")
    assert (code, out) == (1, f"queue://{dlq}: 0 replayed, 0 skipped\n")
    assert err == f"gateway dlq: 1 of 1 ids given not found ready in queue://{dlq}\n"
    assert broker.queue_depth(f"queue://{dlq}") == 1


@pytest.fixture(scope="module")
def individual(tmp_path_factory):
    """A broker with a dead-letter queue per queue (DLQ.<queue>), so the listing is this module's alone."""
    handle = BrokerHandle(make_config(tmp_path_factory.mktemp("ops-dlq"), **POLICY, individual_dlq=True))
    handle.url = f"http://127.0.0.1:{handle.admin_port}"
    yield handle
    handle.stop()


def test_dlq_list_shows_each_dead_letter_queue_with_its_depth(individual):
    assert gateway(individual, "dlq", "list") == (0, "no dead-letter queues\n", "")
    dead_letters(individual, "cli.orders", ["order-0", "order-1"])
    dead_letters(individual, "cli.billing", ["bill-0"])
    assert gateway(individual, "send", "cli.plain", "--body", "not dead")[0] == 0  # an ordinary queue: not listed
    code, out, err = gateway(individual, "dlq", "list")
    assert code == 0, err
    assert out.splitlines()[0].split() == ["Name", "Messages", "Ready", "Unacked", "Consumers", "Enqueued", "OldestAge"]
    listed = rows(out)
    assert [row[:6] for row in listed] == [
        ["DLQ.cli.billing", "1", "1", "0", "0", "1"],
        ["DLQ.cli.orders", "2", "2", "0", "0", "2"],
    ]
    assert all(row[6][:-1].isdigit() and row[6][-1] in "smhd" for row in listed)
    assert [row[:6] for row in rows(gateway(individual, "dlq", "list", "orders")[1])] == [listed[1][:6]]  # the age ticks
    assert gateway(individual, "dlq", "list", "nothing-like-it") == (0, "no dead-letter queues matching 'nothing-like-it'\n", "")
    listed = json.loads(gateway(individual, "dlq", "list", "--json", "--sort=-messages")[1])
    assert [(q["destination"], q["ready"], q["dead_letter_queue"]) for q in listed] == [
        ("queue://DLQ.cli.orders", 2, True), ("queue://DLQ.cli.billing", 1, True),
    ]


def test_browse_of_a_dead_letter_queue_shows_where_each_was_going_and_why_it_failed(individual):
    dead_letters(individual, "cli.why", ["why-0", "why-1"])
    code, out, err = gateway(individual, "browse", "DLQ.cli.why")
    assert code == 0, err
    assert out.splitlines()[0].split() == [
        "Id", "Priority", "Persistent", "Redeliveries", "State", "OriginalDestination", "Cause", "Body",
    ]
    shown = columns(out)
    assert [(m["OriginalDestination"], m["Body"]) for m in shown] == [("queue://cli.why", "why-0"), ("queue://cli.why", "why-1")]
    assert all(m["Cause"].startswith("delivery failed 2 times (max_redeliveries=1); last: ") for m in shown)
    # An ordinary queue's table keeps its columns.
    assert gateway(individual, "send", "cli.ordinary", "--body", "b")[0] == 0
    header = gateway(individual, "browse", "cli.ordinary")[1].splitlines()[0]
    assert header.split() == ["Id", "Priority", "Persistent", "Redeliveries", "State", "Body"]
    # What browse showed is what replay uses: the letters go home.
    assert gateway(individual, "dlq", "replay", "--queue", "DLQ.cli.why")[:2] == (0, "queue://DLQ.cli.why: 2 replayed, 0 skipped\n")
    assert individual.queue_depth("queue://cli.why") == 2 and individual.queue_depth("queue://DLQ.cli.why") == 0


def test_consume_takes_messages_in_the_order_a_stomp_consumer_gets_them(broker):
    """Highest priority first, arrival order within a priority: what a STOMP subscriber is given."""
    sent = [("low", 0), ("mid", 4), ("high", 9), ("mid-2", 4), ("low-2", 0)]
    conn, got = connect(broker)
    for queue in ("cli.prio.stomp", "cli.prio.cli"):
        for body, priority in sent:
            conn.send(f"/queue/{queue}", body, headers={"priority": str(priority), "persistent": "true"})
    sync(conn, got)
    conn.subscribe("/queue/cli.prio.stomp", id="s")
    stomp_order = [m.body for m in got.wait_for(5)]
    disconnect(conn)
    assert stomp_order == ["high", "mid", "mid-2", "low", "low-2"]
    code, out, err = gateway(broker, "consume", "cli.prio.cli")
    assert (code, out) == (0, "high\n"), err
    code, out, err = gateway(broker, "consume", "cli.prio.cli", "--count", "4")
    assert (code, out.splitlines()) == (0, stomp_order[1:]), err
    assert broker.queue_depth("queue://cli.prio.cli") == 0


def test_a_missing_password_without_a_terminal_is_one_clear_line(broker):
    """No terminal, no GATEWAY_PASSWORD: say how to give one, exit 2, and never read the password from stdin
    (for ``send`` that is the message body)."""
    code, out, err = gateway(broker, "stat", "-u", "alice")
    assert (code, out, err) == (2, "", "gateway stat: " + NO_PASSWORD.format(user="alice") + "\n")
    code, out, err = gateway(broker, "send", "cli.pw", "--user", "alice", stdin="first line\nsecond\n")
    assert (code, out, err) == (2, "", "gateway send: " + NO_PASSWORD.format(user="alice") + "\n")
    assert broker.queue_depth("queue://cli.pw") == 0


def on_a_terminal(handle, args, typed):
    """Run ``gateway ARGS`` with a pseudo-terminal as its controlling terminal, type ``typed`` at the
    password prompt; (exit status, everything the terminal showed).

    The child is a new session that opens the terminal's slave side first
    (which makes it its controlling terminal, as a login shell's), then
    becomes ``gateway``: no fork of this multi-threaded test process.
    """
    master, slave = os.openpty()
    name = os.ttyname(slave)
    become = (
        "import os, sys; fd = os.open(sys.argv[1], os.O_RDWR); [os.dup2(fd, n) for n in (0, 1, 2)]; "
        "os.execv(sys.executable, [sys.executable, '-m', 'gateway.cli', *sys.argv[2:]])"
    )
    child = subprocess.Popen([sys.executable, "-c", become, name, *args, "--url", handle.url],
                             env=clean_environment(), start_new_session=True, cwd=os.getcwd())
    deadline = time.monotonic() + 30
    shown = b""
    try:
        while not shown.endswith(b"Password for " + args[args.index("--user") + 1].encode() + b": "):
            chunk = terminal_output(master, deadline)
            assert chunk, f"no password prompt; the terminal showed {shown!r}"
            shown += chunk
        os.close(slave)  # the child has it open: from now on the master reads EOF once the child is done
        slave = None
        os.write(master, typed)
        while chunk := terminal_output(master, deadline):
            shown += chunk
        return child.wait(timeout=30), shown.decode(errors="replace").replace("\r\n", "\n")
    finally:
        os.close(master)
        if slave is not None:
            os.close(slave)
        if child.poll() is None:
            child.kill()
            child.wait()


def terminal_output(master, deadline):
    """The next bytes the terminal shows; b"" once the child has closed it (EIO on Linux)."""
    ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
    assert ready, "the terminal showed nothing more in 30 s"
    try:
        return os.read(master, 4096)
    except OSError:
        return b""


def test_the_password_is_asked_on_a_terminal(tmp_path):
    users = tmp_path / "users"
    write_lines(str(users), [f"ops:{PasswordHash.make(b'o-secret', Cost(ln=10))}"])
    config = make_config(tmp_path)
    config.auth.users_file = str(users)
    config.auth.rules = [Rule.parse("user:ops", "allow", ["read", "write", "admin"], ["queue://>", "broker://>"])]
    handle = BrokerHandle(config)
    handle.url = f"http://127.0.0.1:{handle.admin_port}"
    try:
        code, shown = on_a_terminal(handle, ["stat", "--user", "ops"], b"o-secret\n")
        assert code == 0, shown
        assert shown.startswith("Password for ops: \n") and "o-secret" not in shown  # asked, not echoed
        assert shown.splitlines()[1].split()[:2] == ["Name", "Messages"]
        code, shown = on_a_terminal(handle, ["stat", "--user", "ops"], b"\x04")  # Ctrl-D at the prompt
        assert code == 2 and shown.endswith("gateway stat: " + NO_PASSWORD.format(user="ops") + "\n"), shown
    finally:
        handle.stop()


def test_consume_of_a_queue_paged_to_the_store_takes_each_message_once(broker):
    """Priority order holds within what is in memory, as for consumers (core/policy.py queue_memory_limit);
    the backlog paged out to the store follows in arrival order.  1500 messages are more than the 64 KiB the
    module's broker keeps in memory per queue, several chunks of the walk and two requests of the command (gateway/admin/queues.py,
    core's DeliveryOrderWalk): none may be lost or taken twice, with or without a selector."""
    pad = "x" * 200
    sent = [f"p{9 if i % 10 == 3 else 0}-{i:03d}-{pad}" for i in range(1500)]
    conn, got = connect(broker)
    for queue in ("cli.deep", "cli.deep.selected"):
        for body in sent:
            conn.send(f"/queue/{queue}", body, headers={"priority": body[1], "persistent": "true"})
    sync(conn, got)
    disconnect(conn)

    def in_memory(name):
        return broker.inspect(lambda: [e.message.body.decode() for e in broker.broker.queues[name].pending])

    memory = in_memory("queue://cli.deep")
    assert 0 < len(memory) < 200 and memory[0].startswith("p9-")  # paged, and a priority-9 at the head
    code, out, err = gateway(broker, "consume", "cli.deep", "--count", "1500")
    taken = out.splitlines()
    assert code == 0, err
    assert taken == memory + [b for b in sent if b not in set(memory)]
    assert broker.queue_depth("queue://cli.deep") == 0

    memory = in_memory("queue://cli.deep.selected")
    code, out, err = gateway(broker, "consume", "cli.deep.selected", "--count", "1500", "--selector", "JMSPriority > 4")
    nines = [b for b in memory if b.startswith("p9-")]
    assert (code, out.splitlines()) == (0, nines + [b for b in sent if b.startswith("p9-") and b not in set(nines)]), err
    assert broker.queue_depth("queue://cli.deep.selected") == 1350


def test_a_url_that_is_not_the_admin_api_is_named_not_a_traceback(broker):
    """--url at the wrong port: an HTML page, a STOMP listener's ERROR frame (what the STOMP port answers,
    after its 30 s CONNECT timeout), the MQTT port: one line on stderr, exit 1."""
    import socketserver
    import threading

    class Html(socketserver.StreamRequestHandler):
        def handle(self):
            self.rfile.readline()
            self.wfile.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/html\r\n\r\n<html>welcome</html>")

    class StompError(socketserver.StreamRequestHandler):
        def handle(self):
            self.rfile.readline()
            self.wfile.write(b"ERROR\nmessage:Connect timeout\n\n\x00")

    servers = [socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler) for handler in (Html, StompError)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        html, stomp_error = (f"http://127.0.0.1:{s.server_address[1]}" for s in servers)
        expected = {
            html: f"gateway stat: {html} answered /api/v1/queues with something that is not JSON; ",
            stomp_error: f"gateway stat: {stomp_error} does not speak HTTP (BadStatusLine: ERROR); ",
            f"http://127.0.0.1:{broker.mqtt_port}": f"gateway stat: cannot reach the broker's admin listener at http://127.0.0.1:{broker.mqtt_port}: ",
        }
        for url, start in expected.items():
            done = subprocess.run([sys.executable, "-m", "gateway.cli", "stat", "--url", url], capture_output=True,
                                  text=True, timeout=60, stdin=subprocess.DEVNULL, env=clean_environment(), start_new_session=True)
            assert (done.returncode, done.stdout) == (1, ""), done.stderr
            assert done.stderr.startswith(start) and "Traceback" not in done.stderr, done.stderr
            assert done.stderr.count("\n") == 1, done.stderr
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
