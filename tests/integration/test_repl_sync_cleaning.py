"""A replication full sync misses nothing segment cleaning moves during its walk (docs/protocol.md,
"Replication between nodes"): the primary's snapshot walks item memory segment by segment while
cleaning moves live items into other segments; an item moved from a segment the walk has not
reached into one it has passed (or out of the segment under the walk) was skipped, and the
replica lacked that key. Here a small -m primary holds many mixed-size items that are never
written again, a writer overwrites others so cleaning runs all through the sync, and after each
sync every key the primary holds must be on the replica with the same value."""

import json
import os
import random
import re
import threading

import pytest

from conftest import start_following_node
from fakecontrol import FakeControl
from mcraw import McRaw, http, wait_until

COLD = 12000  # written once before the sync: only cleaning moves them
HOT = 6000    # written between them, overwritten during the sync: the dead bytes that make
              # cleaning move the cold items sharing their segments
ROUNDS = 4   # each a fresh replica and a full sync


@pytest.fixture
def control():
    c = FakeControl(hold=2.0)
    yield c
    c.stop()


def start_node(start_server, ctl, *extra):
    return start_following_node(start_server, ctl.url, *extra)


def doc(version, primary, replica, nodes):
    rng = {"from": 0, "to": 16383, "node": primary.addr}
    if replica is not None:
        rng["replica"] = replica.addr
    return {"version": version,
            "pools": {"main": {"nodes": [n.addr for n in nodes], "slots": [rng]}},
            "namespaces": {"rep": {"pool": "main", "copies": 2}}}


def replicas(node):
    status, body = http(node.admin_port, "GET", "/v1/replication")
    assert status == 200, body
    return json.loads(body)["replicas"]


def stat(node, name):
    with McRaw(node.host, node.port) as c:
        return int(c.stats()[name])


def has_rep_namespace(node):
    return http(node.admin_port, "GET", "/v1/namespaces/rep")[0] == 200


def cold_value(i):
    # mixed sizes, so that items of every bucket share segments and cleaning slides them
    size = random.Random(i).choice((40, 200, 700, 1500, 3000))
    return (b"%07d" % i) * (size // 7)


def values(node, keys):
    out = {}
    with McRaw(node.host, node.port) as c:
        for i in range(0, len(keys), 100):
            for k, _, v, _ in c.get(*keys[i:i + 100]):
                out[k] = v
    return out


def test_full_sync_under_segment_cleaning_leaves_no_key_behind(start_server, control):
    a = start_node(start_server, control, "-m", "24")
    nodes = [a]
    control.publish(doc(1, a, None, nodes))  # the namespace of copies 2 first: keys join it
    wait_until(lambda: has_rep_namespace(a), timeout=10, message="the namespace defined")
    keys = [f"rep:cold{i}" for i in range(COLD)]
    with McRaw(a.host, a.port) as c:
        for i, k in enumerate(keys):
            v = cold_value(i)
            c.send(f"set {k} 0 0 {len(v)} noreply\r\n".encode() + v + b"\r\n")
            h = os.urandom(random.Random(-i).choice((30, 300, 900, 2000)))
            c.send(f"set rep:hot{i % HOT} 0 0 {len(h)} noreply\r\n".encode() + h + b"\r\n")
            if i % 200 == 0:
                c.cmd("mn")
        c.cmd("mn")
    held = values(a, keys)
    assert len(held) > COLD * 0.95, "the cold items fit in -m"
    stop = threading.Event()

    def churn():
        rnd = random.Random(7)
        with McRaw(a.host, a.port) as c:
            i = 0
            while not stop.is_set():
                v = os.urandom(rnd.choice((30, 300, 900, 2000)))
                c.send(f"set rep:hot{i % HOT} 0 0 {len(v)} noreply\r\n".encode() + v + b"\r\n")
                if i % 100 == 0:
                    c.cmd("mn")
                i += 1
            c.cmd("mn")
    failures = []
    for rnd in range(ROUNDS):
        b = start_node(start_server, control, "-m", "64")
        nodes.append(b)
        moved0 = stat(a, "slab_pages_moved")
        t = threading.Thread(target=churn)
        stop.clear()
        t.start()
        try:
            control.publish(doc(rnd + 2, a, b, nodes))
            wait_until(lambda: (r := replicas(a)) and r[0]["node"] == b.addr
                       and r[0]["state"] == "online", timeout=30,
                       message="the new replica synced")
        finally:
            stop.set()
            t.join()
        assert stat(a, "slab_pages_moved") > moved0, "cleaning ran during the sync"
        wait_until(lambda: (r := replicas(a)) and r[0]["lag_bytes"] == 0, timeout=10,
                   message="the replica caught up")
        pa = values(a, keys)
        pb = values(b, list(pa))
        missing = [k for k in pa if pb.get(k) != pa[k]]
        if missing:
            failures.append((rnd, len(pa), len(missing), [(k, len(pa[k]), pb.get(k) is None) for k in missing[:5]]))
    assert failures == [], f"replicas lacked keys their primary held: {failures}"
    status, body = http(a.admin_port, "GET", "/metrics")
    moves = re.search(r"^shoal_node_repl_snapshot_moves(?:_total)? (\S+)$", body, re.M)
    assert moves and float(moves.group(1)) > 0, "moves during the syncs were logged"
    offset = re.search(r"^shoal_node_repl_offset (\S+)$", body, re.M)
    print(f"{moves.group(1)} moves logged over {ROUNDS} syncs; stream offset {offset.group(1)}")
