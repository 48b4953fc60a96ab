"""Message groups (JMSXGroupID/JMSXGroupSeq) and exclusive consumers over STOMP with stomp.py."""
from __future__ import annotations

from collections import defaultdict

from tests.support import bodies, drop, leave, sync, wait_until

# -- helpers -----------------------------------------------------------------


def consumers(client, n, destination, ack="auto", **headers):
    out = []
    for i in range(n):
        conn, got = client()
        conn.subscribe(destination, id=f"c{i}", ack=ack, headers=dict(headers))
        sync(conn, got)  # subscribed, in this order, before anything is sent
        out.append((conn, got))
    return out


def wait_total(collectors, total, timeout=5.0):
    wait_until(lambda: sum(len(g.messages) for g in collectors) >= total, timeout,
               lambda: f"{total} messages, got {[len(g.messages) for g in collectors]}")
    for g in collectors:
        g.settle(0.2)
    assert sum(len(g.messages) for g in collectors) == total, "more messages than were sent"


def send_group(conn, destination, group, body, **headers):
    conn.send(destination, body, headers={"JMSXGroupID": group, **headers})


# -- groups ------------------------------------------------------------------


def test_each_group_goes_to_one_consumer_and_groups_spread(broker, client):
    workers = consumers(client, 3, "/queue/groups")
    producer, gotp = client()
    groups = [f"G{g}" for g in range(6)]
    for i in range(5):
        for g in groups:
            send_group(producer, "/queue/groups", g, f"{g}-{i}")
    sync(producer, gotp)
    collectors = [g for _, g in workers]
    wait_total(collectors, 30)

    owners = defaultdict(set)
    for index, got in enumerate(collectors):
        per_group = defaultdict(list)
        for m in got.messages:
            assert m.headers["JMSXGroupID"] == m.body.split("-")[0]
            owners[m.headers["JMSXGroupID"]].add(index)
            per_group[m.headers["JMSXGroupID"]].append(m.body)
        for g, seen in per_group.items():
            assert seen == [f"{g}-{i}" for i in range(5)], "a group arrived out of order or split"
    assert set(owners) == set(groups)
    assert all(len(who) == 1 for who in owners.values()), dict(owners)
    assert {next(iter(who)) for who in owners.values()} == {0, 1, 2}, "groups did not spread over the consumers"


def test_group_waits_for_its_busy_owner(broker, client):
    workers = consumers(client, 2, "/queue/busy-owner", ack="client-individual", **{"activemq.prefetchSize": "1"})
    producer, gotp = client()
    send_group(producer, "/queue/busy-owner", "G", "g1")
    sync(producer, gotp)
    wait_total([g for _, g in workers], 1)
    owner = 0 if workers[0][1].messages else 1
    other = 1 - owner
    send_group(producer, "/queue/busy-owner", "G", "g2")
    producer.send("/queue/busy-owner", "free")
    sync(producer, gotp)
    # The owner has no credit: g2 waits for it, while an ungrouped message may go to the other.
    assert bodies(workers[other][1].settle()) == ["free"]
    assert broker.queue_bodies("queue://busy-owner") == [b"g2"]
    conn, got = workers[owner]
    conn.ack(got.messages[0].headers["ack"])
    assert bodies(got.wait_for(2)) == ["g1", "g2"]


def test_closed_group_moves_to_another_consumer(broker, client):
    workers = consumers(client, 2, "/queue/close", ack="client-individual", **{"activemq.prefetchSize": "1"})
    producer, gotp = client()
    send_group(producer, "/queue/close", "G", "g1")
    sync(producer, gotp)
    wait_total([g for _, g in workers], 1)
    owner = 0 if workers[0][1].messages else 1
    other = 1 - owner
    oconn, ogot = workers[owner]
    oconn.ack(ogot.messages[0].headers["ack"])
    sync(oconn, ogot)
    send_group(producer, "/queue/close", "G", "g2-last", JMSXGroupSeq="-1")
    sync(producer, gotp)
    assert bodies(ogot.wait_for(2)) == ["g1", "g2-last"]
    assert ogot.messages[1].headers["JMSXGroupSeq"] == "-1"
    # The group is closed and its old owner is busy: the next message of G starts afresh elsewhere.
    send_group(producer, "/queue/close", "G", "g3")
    sync(producer, gotp)
    assert bodies(workers[other][1].wait_for(1)) == ["g3"]
    assert bodies(ogot.settle()) == ["g1", "g2-last"]


def test_owner_leaving_moves_its_groups_and_redelivers_in_order(broker, client):
    workers = consumers(client, 3, "/queue/failover", ack="client-individual")
    producer, gotp = client()
    groups = "ABCD"  # four groups over three consumers: someone owns at least two
    for i in range(3):
        for g in groups:
            send_group(producer, "/queue/failover", g, f"{g}{i}")
    sync(producer, gotp)
    wait_total([g for _, g in workers], 12)

    def owner_map():
        owners = defaultdict(set)
        for index, (_, got) in enumerate(workers):
            for m in got.messages:
                owners[m.body[0]].add(index)
        return owners

    owners = owner_map()
    assert all(len(who) == 1 for who in owners.values()), dict(owners)
    owner_of = {g: next(iter(who)) for g, who in owners.items()}
    leaving = max(range(3), key=lambda i: sum(1 for o in owner_of.values() if o == i))
    moved = sorted(g for g, o in owner_of.items() if o == leaving)
    assert len(moved) >= 2
    before = {i: len(g.messages) for i, (_, g) in enumerate(workers)}

    drop(*workers[leaving])
    for g in groups:
        send_group(producer, "/queue/failover", g, f"{g}3")
    sync(producer, gotp)
    rest = [i for i in range(3) if i != leaving]
    wait_total([workers[i][1] for i in rest], sum(before[i] for i in rest) + 3 * len(moved) + len(groups))

    after = {i: workers[i][1].messages[before[i]:] for i in rest}
    for g in groups:
        receivers = [i for i in rest if any(m.body[0] == g for m in after[i])]
        assert len(receivers) == 1, f"group {g} split over {receivers} after a consumer left"
        new = [m for m in after[receivers[0]] if m.body[0] == g]
        if g in moved:
            assert bodies(new) == [f"{g}0", f"{g}1", f"{g}2", f"{g}3"]
            assert [m.headers.get("redelivered") for m in new] == ["true", "true", "true", None]
            assert [m.headers.get("redelivery-count") for m in new] == ["1", "1", "1", None]
        else:
            assert receivers == [owner_of[g]], f"group {g} moved although its owner stayed"
            assert bodies(new) == [f"{g}3"]


def test_nacked_group_message_returns_to_its_owner_first(broker, client):
    workers = consumers(client, 2, "/queue/group-nack", ack="client-individual")
    producer, gotp = client()
    for i in range(3):
        send_group(producer, "/queue/group-nack", "G", f"g{i}")
    sync(producer, gotp)
    wait_total([g for _, g in workers], 3)
    owner = 0 if workers[0][1].messages else 1
    conn, got = workers[owner]
    conn.nack(got.messages[0].headers["ack"])
    again = got.wait_for(4)[3]
    assert again.body == "g0" and again.headers["redelivered"] == "true"
    assert workers[1 - owner][1].settle() == []


# -- exclusive consumers -----------------------------------------------------


def test_exclusive_consumer_gets_everything_and_standbys_take_over_in_order(broker, client):
    workers = consumers(client, 3, "/queue/exclusive", ack="client-individual", **{"activemq.exclusive": "true"})
    (a, got_a), (b, got_b), (c, got_c) = workers
    producer, gotp = client()
    for i in range(1, 5):
        producer.send("/queue/exclusive", str(i))
    sync(producer, gotp)
    assert bodies(got_a.wait_for(4)) == ["1", "2", "3", "4"]
    assert got_b.settle(0.2) == [] and got_c.messages == []
    a.ack(got_a.messages[0].headers["ack"])
    sync(a, got_a)

    drop(a, got_a)
    back = got_b.wait_for(3)
    assert bodies(back) == ["2", "3", "4"]
    assert all(m.headers["redelivered"] == "true" for m in back)
    producer.send("/queue/exclusive", "5")
    assert bodies(got_b.wait_for(4))[3] == "5"
    assert got_c.settle(0.2) == [], "the third standby got messages while the second was active"

    b.ack(got_b.messages[0].headers["ack"])  # "2" is done
    sync(b, got_b)
    leave(b)
    moved = got_c.wait_for(3)
    assert bodies(moved) == ["3", "4", "5"]
    assert [m.headers.get("redelivered") for m in moved] == ["true", "true", "true"]
    assert [m.headers.get("redelivery-count") for m in moved] == ["2", "2", "1"]


def test_exclusive_consumer_preempts_ordinary_consumers(broker, client):
    plain, got_plain = client()
    plain.subscribe("/queue/preempt", id="plain")
    sync(plain, got_plain)
    excl, got_excl = client()
    excl.subscribe("/queue/preempt", id="excl", headers={"activemq.exclusive": "true"})
    sync(excl, got_excl)
    producer, gotp = client()
    for i in range(4):
        producer.send("/queue/preempt", str(i))
    sync(producer, gotp)
    assert bodies(got_excl.wait_for(4)) == ["0", "1", "2", "3"]
    assert got_plain.settle(0.2) == []
    leave(excl)
    producer.send("/queue/preempt", "after")
    assert bodies(got_plain.wait_for(1)) == ["after"]
