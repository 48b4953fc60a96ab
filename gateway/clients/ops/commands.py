"""``gateway stat | browse | purge | send | consume | dlq list/replay | connections | bridges | streams``: the admin API for people and scripts.

Each command is one or a few admin API requests (``gateway/clients/ops/client.py``)
with the operator's credentials: ``--user`` (password from
``GATEWAY_PASSWORD`` or asked on a terminal) or ``--token``, the broker at
``--url``.  Tables by default, ``--json`` for scripts; the exit status is 0
on success, 1 when the broker refused, could not be reached or did only part
of the work (its message on stderr), 2 for bad arguments or a missing
password.  A refusal never prints as success: the broker's answer decides,
the command does not guess from an empty result.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.parse
from typing import Any

from gateway.clients.ops.client import DEFAULT_URL, AdminClient, OpsError, UsageError, authorization
from gateway.clients.ops.output import Progress, age, dump, table

COMMANDS = ("stat", "browse", "purge", "send", "consume", "dlq", "connections", "bridges", "streams")
REPLAY_CHUNK = 10_000  # dead letters per request, so the progress bar moves and no request is long
# Headers the broker puts on a dead letter (core/broker.py ORIGINAL_DESTINATION, DEAD_LETTER_CAUSE),
# spelled out: these commands import nothing of the broker, so they run where it is not installed.
ORIGINAL_DESTINATION = "originalDestination"
DEAD_LETTER_CAUSE = "dlqDeliveryFailureCause"


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=os.environ.get("GATEWAY_URL", DEFAULT_URL),
                        help=f"the broker's admin listener (GATEWAY_URL; default {DEFAULT_URL})")
    parser.add_argument("-u", "--user", help="user name (GATEWAY_USER); the password from GATEWAY_PASSWORD or asked")
    parser.add_argument("--token", help="a bearer token from `gateway token` (GATEWAY_TOKEN)")
    parser.add_argument("--cacert", metavar="FILE", help="CA certificate to verify an https:// broker with")
    parser.add_argument("--json", action="store_true", help="print the API's JSON instead of a table")


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    stat = commands.add_parser("stat", help="queues with depth, consumers, enqueued and dequeued (as activemq dstat)")
    stat.add_argument("filter", nargs="?", default="", help="only queues whose name contains this")
    stat.add_argument("--sort", default="name", help="name, messages, consumers, enqueued, dequeued; --sort=-FIELD for descending")
    _common(stat)

    browse = commands.add_parser("browse", help="show a queue's messages without consuming them")
    browse.add_argument("queue", metavar="QUEUE", help="queue name (orders, /queue/orders or queue://orders)")
    browse.add_argument("--limit", type=int, default=50, help="messages to show (default 50)")
    browse.add_argument("--preview", type=int, default=200, help="body bytes to show (default 200)")
    _common(browse)

    purge = commands.add_parser("purge", help="remove a queue's ready messages")
    purge.add_argument("queue", metavar="QUEUE")
    _common(purge)

    send = commands.add_parser("send", help="send a message (the body from --body or standard input)")
    send.add_argument("destination", metavar="DEST", help="/queue/NAME, /topic/NAME, queue://NAME or topic://NAME (a bare name is a queue)")
    send.add_argument("--body", help="the body (default: standard input)")
    send.add_argument("-H", "--header", action="append", default=[], metavar="NAME=VALUE", help="a header (repeatable)")
    send.add_argument("--non-persistent", action="store_true", help="not kept on disk (persistent by default)")
    send.add_argument("--priority", type=int, help="0-9")
    send.add_argument("--count", type=int, default=1, help="send it this many times")
    _common(send)

    consume = commands.add_parser("consume", help="take messages off a queue and print them (acknowledged)")
    consume.add_argument("queue", metavar="QUEUE")
    consume.add_argument("--count", type=int, default=1, help="messages to take (default 1)")
    consume.add_argument("--wait", type=float, default=0.0, metavar="SECONDS", help="wait this long for them to arrive")
    consume.add_argument("--selector", help="only messages this JMS selector matches")
    _common(consume)

    dlq = commands.add_parser("dlq", help="dead letters: gateway dlq list, gateway dlq replay")
    actions = dlq.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="the dead-letter queues with their depth (browse one to see why each failed)")
    listing.add_argument("filter", nargs="?", default="", help="only dead-letter queues whose name contains this")
    listing.add_argument("--sort", default="name", help="name, messages, consumers, enqueued, dequeued; --sort=-FIELD for descending")
    _common(listing)
    replay = actions.add_parser("replay", help="send dead letters back to where they failed")
    replay.add_argument("--queue", help="the dead-letter queue (default: the broker's, [policy] dead_letter_queue)")
    replay.add_argument("--selector", help="only dead letters this JMS selector matches")
    replay.add_argument("--id", action="append", default=[], dest="ids", help="only this message id (repeatable)")
    replay.add_argument("--limit", type=int, help="at most this many")
    _common(replay)

    connections = commands.add_parser("connections", help="who is connected; --close ID closes one")
    connections.add_argument("filter", nargs="?", default="", help="only connections whose id, client id, user or address contains this")
    connections.add_argument("--close", metavar="ID", help="close this connection, telling the client --reason")
    connections.add_argument("--reason", default="closed by an administrator")
    _common(connections)

    bridges = commands.add_parser("bridges", help="the bridges to other brokers: state since when, queued, forwarded, last error")
    bridges.add_argument("name", nargs="?", metavar="NAME", help="only this bridge, with its patterns and counters")
    _common(bridges)

    streams = commands.add_parser("streams", help="the streams: records, bytes, append rate, readers' lag and leases")
    streams.add_argument("name", nargs="?", metavar="NAME", help="only this stream: retention, partitions, each reader's position, lag and lease")
    _common(streams)


def run(args: argparse.Namespace) -> int:
    try:
        client = AdminClient(args.url, authorization(args.user, None, args.token), args.cacert)
        return int(_COMMANDS[args.command](client, args) or 0)
    except OpsError as exc:
        print(f"gateway {args.command}: {exc}", file=sys.stderr)
        return exc.exit_status
    except (KeyboardInterrupt, BrokenPipeError):
        return 1


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def queue_name(text: str) -> str:
    """``/queue/a``, ``queue://a`` or ``a`` -> ``a``."""
    for prefix in ("/queue/", "queue://"):
        if text.startswith(prefix):
            return text[len(prefix):]
    if text.startswith(("/topic/", "topic://")):
        raise UsageError(f"{text} is a topic; this command takes a queue")
    return text


def _stat(client: AdminClient, args: argparse.Namespace) -> None:
    queues = client.pages("/api/v1/queues", "queues", filter=args.filter or None, sort=args.sort)
    if args.json:
        dump(queues)
        return
    table(
        [(q["name"], q["messages"], q["ready"], q["unacknowledged"], q["consumers"], q["enqueued"], q["dequeued"],
          q["dead_lettered"], q["expired"]) for q in queues],
        ("Name", "Messages", "Ready", "Unacked", "Consumers", "Enqueued", "Dequeued", "DeadLettered", "Expired"),
    )


def _browse(client: AdminClient, args: argparse.Namespace) -> None:
    name = queue_name(args.queue)
    found: list[dict[str, Any]] = []
    start = 0
    while len(found) < args.limit:
        answer = client.call("GET", f"/api/v1/queues/{_quote(name)}/messages",
                             **{"from": start, "limit": min(1000, args.limit - len(found)), "preview": args.preview})
        found.extend(answer["messages"])
        if answer["next"] is None:
            break
        start = answer["next"]
    if args.json:
        dump(found)
        return
    headers = ["Id", "Priority", "Persistent", "Redeliveries", "State"]
    rows: list[list[Any]] = [
        [m["id"], m["priority"], "yes" if m["persistent"] else "no", m["redeliveries"],
         "in flight" if m["in_flight"] else "ready"] for m in found
    ]
    # A dead letter's first questions are where it was going and why it failed: the broker says
    # both in headers, shown as columns when any message on the page has them (a virtual topic's
    # consumer queue has originalDestination too: the topic its copies came from).
    for header, column in ((ORIGINAL_DESTINATION, "OriginalDestination"), (DEAD_LETTER_CAUSE, "Cause")):
        if any(header in m["headers"] for m in found):
            headers.append(column)
            for row, m in zip(rows, found):
                row.append(m["headers"].get(header))
    table([[*row, _preview(m)] for row, m in zip(rows, found)], [*headers, "Body"])


def _preview(message: dict[str, Any]) -> str:
    if message["encoding"] != "utf-8":
        return f"({message['size']} bytes, binary)"
    text = str(message["body"]).replace("\n", "\\n")
    return text + ("..." if message.get("truncated") else "")


def _purge(client: AdminClient, args: argparse.Namespace) -> None:
    answer = client.call("POST", f"/api/v1/queues/{_quote(queue_name(args.queue))}/purge")
    if args.json:
        dump(answer)
    else:
        print(f"{answer['destination']}: {answer['purged']} messages purged")


def _send(client: AdminClient, args: argparse.Namespace) -> int:
    kind, name = "queues", args.destination
    for prefix, k in (("/queue/", "queues"), ("queue://", "queues"), ("/topic/", "topics"), ("topic://", "topics")):
        if name.startswith(prefix):
            kind, name = k, name[len(prefix):]
            break
    headers: dict[str, str] = {}
    for item in args.header:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"gateway send: --header {item!r} must be NAME=VALUE", file=sys.stderr)
            return 2
        headers[key] = value
    body = args.body if args.body is not None else sys.stdin.read()
    doc: dict[str, Any] = {"body": body, "headers": headers, "persistent": not args.non_persistent}
    if args.priority is not None:
        doc["priority"] = args.priority
    progress = Progress(args.count, "sending")
    answers = []
    for n in range(args.count):
        answers.append(client.call("POST", f"/api/v1/{kind}/{_quote(name)}/messages", doc))
        progress.update(n + 1, final=n + 1 == args.count)
    if args.json:
        dump(answers if args.count > 1 else answers[0])
    else:
        print(f"{answers[0]['destination']}: {len(answers)} sent" + (f" (id {answers[0]['id']})" if args.count == 1 else ""))
    return 0


def _consume(client: AdminClient, args: argparse.Namespace) -> None:
    name = queue_name(args.queue)
    deadline = time.monotonic() + args.wait
    taken: list[dict[str, Any]] = []
    while len(taken) < args.count:
        doc: dict[str, Any] = {"count": min(1000, args.count - len(taken))}
        if args.selector:
            doc["selector"] = args.selector
        try:
            answer = client.call("POST", f"/api/v1/queues/{_quote(name)}/get", doc)
        except OpsError as exc:
            if exc.status != 404 or time.monotonic() >= deadline:
                raise
            answer = {"messages": []}  # waiting: the queue comes with its first message
        taken.extend(answer["messages"])
        if not answer["messages"]:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.2)
    if args.json:
        dump(taken)
        return
    for message in taken:
        if message["encoding"] == "utf-8":
            print(message["body"])
        else:
            print(f"({message['size']} bytes, base64) {message['body']}")


def _dlq(client: AdminClient, args: argparse.Namespace) -> int:
    return _dlq_list(client, args) if args.action == "list" else _dlq_replay(client, args)


def _dlq_list(client: AdminClient, args: argparse.Namespace) -> int:
    """The queues the broker counts as dead-letter queues (the API's ``dead_letter_queue`` flag).

    The broker decides what is one (its DLQ, and every ``DLQ.<queue>``), so
    the list follows the policy without the command knowing it.  A DLQ the
    broker has not made yet (no message has failed) is not listed.
    """
    queues = [q for q in client.pages("/api/v1/queues", "queues", filter=args.filter or None, sort=args.sort)
              if q.get("dead_letter_queue")]
    if args.json:
        dump(queues)
        return 0
    if not queues:
        print("no dead-letter queues" + (f" matching {args.filter!r}" if args.filter else ""))
        return 0
    table(
        [(q["name"], q["messages"], q["ready"], q["unacknowledged"], q["consumers"], q["enqueued"],
          age(q.get("oldest_message_age_ms"))) for q in queues],
        ("Name", "Messages", "Ready", "Unacked", "Consumers", "Enqueued", "OldestAge"),
    )
    return 0


def _dlq_replay(client: AdminClient, args: argparse.Namespace) -> int:
    """Replays in requests of REPLAY_CHUNK, so a bar moves while 100,000 dead letters go home.

    The first request is always made, even when the queue looks empty or
    absent: the broker says whether the name is a dead-letter queue at all
    (400 for a typo), and a 404 then means only that no message has failed
    yet.  Dead letters that cannot go home stay at the head of the DLQ, so
    each request meets them again: they are counted once, by id.  Any left
    behind (skipped, or ``--id`` not found) make the exit status 1: a script
    must not take a partial replay for a done one.
    """
    name = queue_name(args.queue or client.call("GET", "/api/v1/overview")["dead_letter_queue"])
    destination = f"queue://{name}"
    try:
        total = client.call("GET", f"/api/v1/queues/{_quote(name)}")["ready"]
    except OpsError as exc:
        if exc.status != 404:
            raise
        total = 0  # not there (yet): the replay request below says whether it is a DLQ's name
    if args.limit is not None:
        total = min(total, args.limit)
    progress = Progress(total, f"replaying {name}")
    replayed, last_skipped_count = 0, 0
    skipped: dict[str, str] = {}
    while True:
        doc: dict[str, Any] = {"queue": name}
        if args.selector:
            doc["selector"] = args.selector
        if args.ids:
            doc["ids"] = args.ids
        left = REPLAY_CHUNK if args.limit is None else args.limit - replayed
        if left <= 0:
            break
        doc["limit"] = min(REPLAY_CHUNK, left) + len(skipped)  # the ones met again do not use up the chunk
        try:
            answer = client.call("POST", "/api/v1/dlq/replay", doc)
        except OpsError as exc:
            if exc.status == 404 and not replayed and not skipped:
                total = 0  # a dead-letter queue's name the broker makes with its first dead letter
                break
            raise
        replayed += answer["replayed"]
        skipped.update((item["id"], item["reason"]) for item in answer["skipped"])
        last_skipped_count = answer["skipped_count"]
        progress.update(replayed + len(skipped))
        if answer["replayed"] == 0 or args.ids:
            break
    progress.update(replayed + len(skipped), final=True)
    skipped_count = max(len(skipped), last_skipped_count)
    missing = len(set(args.ids)) - replayed - skipped_count if args.ids else 0
    if args.json:
        dump({"destination": destination, "replayed": replayed, "skipped_count": skipped_count,
              "skipped": [{"id": k, "reason": v} for k, v in skipped.items()]})
    elif total == 0 and not replayed and not skipped_count and not args.ids:
        print(f"{destination}: no dead letters")
    else:
        print(f"{destination}: {replayed} replayed, {skipped_count} skipped")
        for message_id, reason in list(skipped.items())[:20]:
            print(f"  {message_id}: {reason}")
        if skipped_count > 20:
            print(f"  ... and {skipped_count - 20} more (--json lists them)")
    if skipped_count:
        print(f"gateway dlq: {skipped_count} dead letters could not be replayed and are still in {destination}",
              file=sys.stderr)
    if missing > 0:
        print(f"gateway dlq: {missing} of {len(set(args.ids))} ids given not found ready in {destination}",
              file=sys.stderr)
    return 1 if skipped_count or missing > 0 else 0


def _connections(client: AdminClient, args: argparse.Namespace) -> None:
    if args.close:
        answer = client.call("DELETE", f"/api/v1/connections/{_quote(args.close)}", reason=args.reason)
        if args.json:
            dump(answer)
        else:
            print(f"{answer['closed']} closed: {answer['reason']}")
        return
    found = client.pages("/api/v1/connections", "connections", filter=args.filter or None)
    if args.json:
        dump(found)
        return
    table(
        [(c["id"], c["protocol"], c["client_id"], c["user"], c["remote"], c["connected_since"][:19].replace("T", " "),
          c["messages_in"], c["messages_out"], c["subscriptions"]) for c in found],
        ("Id", "Protocol", "ClientId", "User", "Remote", "Since(UTC)", "In", "Out", "Subscriptions"),
    )


def _since(bridge: dict[str, Any]) -> str:
    return str(bridge["since_iso"])[:19].replace("T", " ")


def _bridges(client: AdminClient, args: argparse.Namespace) -> None:
    """All bridges as a table; one (``NAME``) as a list of its fields, so its patterns and rarer counters fit.

    An unknown name is the broker's 404 (exit status 1), not an empty table.
    """
    if args.name:
        bridge = client.call("GET", f"/api/v1/bridges/{_quote(args.name)}")
        if args.json:
            dump(bridge)
            return
        out, inn = bridge["out"], bridge["in"]
        table([
            ("name", bridge["name"]),
            ("state", f"{bridge['state']} since {_since(bridge)} UTC"),
            ("url", f"{bridge['url']} ({bridge['protocol']} {bridge['version']}, client id {bridge['client_id']})"),
            ("remote broker", bridge["remote_broker"]),
            ("last error", bridge["last_error"]),
            ("connects", bridge["connects"]),
            ("out patterns", out["patterns"]),
            ("out queued", out["queued"]),
            ("out in flight", out["inflight"]),
            ("out forwarded", out["forwarded"]),
            ("out refused", out["refused"]),
            ("in patterns", inn["patterns"]),
            ("in received", inn["received"]),
            ("loops dropped", bridge["loops_dropped"]),
        ], ("Field", "Value"))
        return
    found = client.call("GET", "/api/v1/bridges")["bridges"]
    if args.json:
        dump(found)
        return
    if not found:
        print("no bridges configured")
        return
    table(
        [(b["name"], b["state"], _since(b), b["url"], b["out"]["queued"], b["out"]["inflight"], b["out"]["forwarded"],
          b["in"]["received"], b["last_error"]) for b in found],
        ("Name", "State", "Since(UTC)", "Url", "Queued", "Inflight", "OutForwarded", "InReceived", "LastError"),
    )


def _seconds(value: float) -> str:
    """A lease or an age in seconds as people read it: 45s, 2.5m, 10m, 7d (whole units from an hour on)."""
    if value < 90:
        return f"{value:g}s"
    if value < 3600:
        return f"{round(value / 60, 1):g}m"
    return age(int(value * 1000)) or "-"


def _rate(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _streams(client: AdminClient, args: argparse.Namespace) -> None:
    """All streams as a table; one (``NAME``) as its retention, then its partitions, then its readers.

    A reader is one row per partition it registered an offset for: its position
    there, the partition's end, the lag, and its lease (``EXPIRING`` once less
    than a quarter of it is left: the broker's ``lease_expiring``).  An unknown
    name is the broker's 404 (exit status 1), not an empty table.
    """
    if args.name:
        stream = client.call("GET", f"/api/v1/streams/{_quote(args.name)}")
        if args.json:
            dump(stream)
            return
        table([
            ("name", stream["name"]),
            ("destinations", stream["destinations"]),
            ("max age", _seconds(stream["max_age_seconds"]) if stream["max_age_seconds"] > 0 else "no limit"),
            ("max bytes", stream["max_bytes"] or "no limit"),
            ("reader lease", f"{_seconds(stream['reader_lease_seconds'])} "
                             f"(expiring below {_seconds(stream['lease_expiring_below_seconds'])} left)"),
            ("appended/s", _rate(stream["records_per_second"])),
        ], ("Field", "Value"))
        print()
        table(
            [(p["partition"], p["earliest"], p["latest"], p["records"], p["bytes"], _rate(p["records_per_second"]))
             for p in stream["partitions"]],
            ("Partition", "Earliest", "Latest", "Records", "Bytes", "Appended/s"),
        )
        print()
        readers = sorted(stream["readers"], key=lambda r: r["name"])
        if not readers:
            print("no registered readers")
            return
        latest = {str(p["partition"]): p["latest"] for p in stream["partitions"]}
        table(
            [(r["name"], int(partition), position, latest.get(partition), r["lag"].get(partition),
              r["expires_in_seconds"], "EXPIRING" if r["lease_expiring"] else "ok")
             for r in readers for partition, position in r["offsets"].items()],
            ("Reader", "Partition", "Position", "Latest", "Lag", "ExpiresIn(s)", "Lease"),
        )
        return
    found = client.call("GET", "/api/v1/streams")["streams"]
    if args.json:
        dump(found)
        return
    if not found:
        print("no streams (none configured, or none this user may read)")
        return
    table(
        [(s["name"], s["partitions"], s["records"], s["bytes"], _rate(s["records_per_second"]), s["readers"],
          s["max_lag"], s["readers_expiring"]) for s in found],
        ("Name", "Partitions", "Records", "Bytes", "Appended/s", "Readers", "MaxLag", "Expiring"),
    )


_COMMANDS: dict[str, Any] = {
    "stat": _stat, "browse": _browse, "purge": _purge, "send": _send, "consume": _consume, "dlq": _dlq,
    "connections": _connections, "bridges": _bridges, "streams": _streams,
}
