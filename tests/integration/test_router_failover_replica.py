"""shoal-router and issue 15's replicated slots (FAILOVER.md C4, C6), against a stand-in control
plane (fakecontrol.py) that publishes hand-written documents whose ranges carry a "replica":

- a dead primary's keys are read from the slot's replica (hit ratio intact, no client error);
  deletes reach the replica (and the gutter); the fills that follow misses (and every other
  write) go to the replica too, not the gutter, so the next read hits; a primary back without a
  promotion has those keys deleted before it is read again;
- the router reports its nodes' states (POST /v1/reports) within --report-ms of a change;
- a document that promotes slots makes the router send their recent deletes again to the new
  primary, and leaves other slots alone;
- a node answering `SERVER_ERROR slot lease expired` costs the client nothing when a newer
  topology arrives within --moved-wait-ms; otherwise reads fall back as for a node down and
  writes go to the owner once more (its second refusal reaches the client);
- a set over 16 KB meeting a handoff fence (`SERVER_ERROR slot moving`) keeps its bytes within
  --moved-keep-max and reaches the new owner; past that bound its refusal reaches the client.

The nodes are real shoal-nodes without --control (they keep every key), seeded by hand on both
the primary and the replica: the replication stream is shoal-node's part, not tested here.
Skipped when SHOAL_TEST_SERVER=memcached."""

import json
import re
import socket
import threading
import time

import pytest

from conftest import (_check_survived, _register, key_slot, pause_server, restart_server,
                      resume_server)
from fakecontrol import FakeControl
from fakenode import FakeNode
from mcraw import McRaw, accepts, free_port, http, wait_until
from test_router_control_follow import spawn_follower

pytestmark = pytest.mark.shoal_only

RANGES = [(0, 5460), (5461, 10921), (10922, 16383)]


def addr(n):
    return n if isinstance(n, str) else f"127.0.0.1:{n.port}"


def doc(version, nodes, owners, gutter=None, copies=2, ranges=RANGES):
    """Pool "main" of `nodes` whose ranges are owned by owners[i] = (node, replica or None)."""
    slots = []
    for (lo, hi), (node, rep) in zip(ranges, owners):
        r = {"from": lo, "to": hi, "node": addr(node)}
        if rep is not None:
            r["replica"] = addr(rep)
        slots.append(r)
    d = {"version": version,
         "pools": {"main": {"nodes": [addr(n) for n in nodes], "slots": slots}},
         "namespaces": {"default": {"pool": "main", "copies": copies}}}
    if gutter is not None:
        d["pools"]["gutter"] = {"nodes": [addr(gutter)]}
        d["gutter_pool"] = "gutter"
        d["gutter_ttl"] = 30
    return d


def range_of(key):
    s = key_slot(key)
    return next(i for i, (lo, hi) in enumerate(RANGES) if lo <= s <= hi)


def metric(admin, name):
    status, body = http(admin, "GET", "/metrics")
    assert status == 200
    m = re.search(rf"^{name} (\S+)$", body, re.M)
    assert m, f"/metrics has {name}"
    return float(m.group(1))


def seed(node, items):
    """Store every (key, value) on `node` directly (behind the router's back)."""
    with McRaw("127.0.0.1", node.port) as c:
        for k, v in items.items():
            assert c.store("set", k, v) == "STORED"


def held(node, key):
    with McRaw("127.0.0.1", node.port) as c:
        got = c.meta(f"mg {key} v")
        return got.value if got.code == "VA" else None


def sizes(i):
    """Mixed value sizes: a few bytes to 100 KB."""
    return (b"%d-" % i) * ((7, 300, 5000, 34000)[i % 4])


@pytest.fixture
def control():
    c = FakeControl(hold=2.0)
    yield c
    c.stop()


@pytest.fixture
def follower(request, tmp_path):
    started = []

    def start(url, *extra):
        r, admin = spawn_follower(tmp_path, url, "--client-id", "r1", *extra, name=len(started))
        started.append(r)
        _register(request.node, r)
        return r, admin

    yield start
    _check_survived(started)


@pytest.fixture
def trio(start_server, control):
    """Three nodes A, B, C (A's ranges replicated on B, B's on C, C's on A), a gutter node, and
    version 1 of that document published."""
    a, b, c, g = (start_server() for _ in range(4))
    owners = [(a, b), (b, c), (c, a)]
    control.publish(doc(1, [a, b, c], owners, gutter=g))
    return a, b, c, g, owners


FAST = ("--timeout-ms", "300", "--retry-ms", "50", "--probe-ms", "100", "--down-after", "1",
        "--report-ms", "300")


def test_dead_primarys_keys_are_read_from_the_replica(trio, control, follower):
    a, b, c, g, _ = trio
    keys = {f"k{i}": sizes(i) for i in range(120)}
    mine = {k: v for k, v in keys.items() if range_of(k) == 0}
    assert len(mine) >= 20
    seed(a, mine)
    seed(b, mine)  # what replication would have put there
    router, admin = follower(control.url, *FAST)
    r = router.raw()
    for k, v in keys.items():
        if k not in mine:
            assert r.store("set", k, v) == "STORED"
    for k, v in mine.items():
        assert r.get(k) == [(k, 0, v, None)]
    a.proc.kill()
    a.proc.wait()
    # a client beside, stuck half way through a request: nobody waits for it
    stuck = socket.create_connection(("127.0.0.1", router.port))
    stuck.sendall(b"get k1 k2")
    # the first request after the kill finds the node gone: its part for the dead node is
    # retried on the replica, the other nodes' parts answered by them, merged in key order
    got = r.get(*keys)
    assert got == [(k, 0, v, None) for k, v in keys.items()]
    hits = 0
    for k, v in mine.items():
        got = r.get(k)
        assert got in ([], [(k, 0, v, None)]), f"{k}: {got!r}"
        hits += bool(got)
    assert hits == len(mine), f"only {hits} of {len(mine)} read from the replica"
    assert metric(admin, "shoal_router_replica_reads_total") >= len(mine)
    # mg too, and a multi-get mixing the dead node's keys with others'
    k0 = next(iter(mine))
    got = r.meta(f"mg {k0} v")
    assert got.code == "VA" and got.value == mine[k0]
    stuck.close()
    restart_server(a)


def test_primary_killed_under_pipelined_load_costs_readers_no_error_and_no_miss(trio, control,
                                                                               follower):
    """Four clients pipelining multi-gets of every node's keys while A is killed with SIGKILL
    and then promoted over: every reply is every value (the requests in flight on A, and those
    before it is marked down, are retried on the replica)."""
    a, b, c, g, owners = trio
    keys = {f"L{i}": sizes(i) for i in range(90)}
    mine = {k: v for k, v in keys.items() if range_of(k) == 0}
    router, admin = follower(control.url, "--timeout-ms", "300", "--retry-ms", "50",
                             "--probe-ms", "100")
    r = router.raw()
    for k, v in keys.items():
        assert r.store("set", k, v) == "STORED"
    seed(b, mine)
    names = list(keys)
    want = [(k, 0, keys[k], None) for k in names]
    stop = threading.Event()
    bad, rounds = [], [0]

    def reader(i):
        with McRaw("127.0.0.1", router.port, timeout=10) as cl:
            while not stop.is_set():
                batch = names[i::4]
                for _ in range(4):
                    cl.send(f"get {' '.join(batch)}\r\n".encode())
                for _ in range(4):
                    try:
                        got = cl.read_get_reply()
                    except AssertionError as e:
                        bad.append(str(e))
                        return
                    if got != [w for w in want if w[0] in batch]:
                        bad.append(f"{len(got)} of {len(batch)} values")
                rounds[0] += 1
    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: rounds[0] >= 8, message="readers running")
    a.proc.kill()
    a.proc.wait()
    wait_until(lambda: metric(admin, "shoal_router_nodes_marked_down_total") >= 1,
               message="the dead primary marked down")
    n = rounds[0]
    wait_until(lambda: rounds[0] >= n + 8, message="reads going on")
    control.publish(doc(2, [a, b, c], [(b, c), (b, c), (c, b)], gutter=g))
    n = rounds[0]
    wait_until(lambda: rounds[0] >= n + 8, message="reads going on after the promotion")
    stop.set()
    for t in threads:
        t.join()
    assert not bad, bad[:5]
    restart_server(a)


def test_keys_of_a_one_copy_namespace_go_to_the_gutter_not_the_replica(start_server, control,
                                                                      follower):
    """Only copies-2 namespaces are replicated: the replica of a slot has no copy of a copies-1
    key, so while its primary is down that key is the gutter's, as before."""
    a, b, c, g = (start_server() for _ in range(4))
    d = doc(1, [a, b, c], [(a, b), (b, c), (c, a)], gutter=g)
    d["namespaces"]["one"] = {"pool": "main", "copies": 1}
    control.publish(d)
    two = next(k for k in (f"t{i}" for i in range(100)) if range_of(k) == 0)
    one = next(k for k in (f"one:t{i}" for i in range(100)) if range_of(k) == 0)
    seed(b, {two: b"replica", one: b"replica"})
    seed(g, {two: b"gutter", one: b"gutter"})
    router, admin = follower(control.url, *FAST)
    r = router.raw()
    a.proc.kill()
    a.proc.wait()
    assert r.get(two) == [(two, 0, b"replica", None)]
    assert r.get(one) == [(one, 0, b"gutter", None)]
    restart_server(a)


def test_delete_of_a_dead_primarys_key_reaches_the_replica_and_the_gutter(trio, control,
                                                                         follower):
    a, b, c, g, _ = trio
    mine = [k for k in (f"d{i}" for i in range(60)) if range_of(k) == 0][:4]
    items = {k: sizes(i) for i, k in enumerate(mine)}
    seed(a, items)
    seed(b, items)
    seed(g, items)  # copies written through the gutter in an earlier outage
    router, admin = follower(control.url, *FAST)
    r = router.raw()
    assert r.get(mine[0]) == [(mine[0], 0, items[mine[0]], None)]
    a.proc.kill()
    a.proc.wait()
    wait_until(lambda: r.get(mine[0]) and metric(admin, "shoal_router_nodes_marked_down_total") >= 1,
               message="the dead primary marked down")
    assert r.cmd(f"delete {mine[1]}") == "DELETED"
    assert r.meta(f"md {mine[2]}").code == "HD"
    r.send(f"md {mine[3]} q\r\nmn\r\n".encode())
    assert r.read_line() == "MN"
    for k in mine[1:]:
        assert held(b, k) is None, f"{k} still on the replica"
        wait_until(lambda: held(g, k) is None, message=f"{k} deleted in the gutter too")
        assert r.get(k) == []
    assert held(b, mine[0]) == items[mine[0]], "a key nobody deleted is untouched"
    restart_server(a)


def gutter_sets(g):
    """Storage commands the gutter node has taken (text and meta)."""
    with McRaw("127.0.0.1", g.port) as c:
        return int(c.stats()["cmd_set"])


def mine_of(prefix, n, rng=0):
    return [k for k in (f"{prefix}{i}" for i in range(40 * n)) if range_of(k) == rng][:n]


def test_fills_during_the_gap_land_on_the_replica_and_the_next_read_hits(trio, control,
                                                                          follower):
    """Cache-aside during the gap before a promotion: a miss, its fill (set, add, ms), and the
    next read hits, served by the replica (which is promoted: what it took is kept); a delete
    then a read misses; the gutter takes none of the copies-2 keys' writes."""
    a, b, c, g, _ = trio
    keys = mine_of("f", 6)
    router, admin = follower(control.url, *FAST)
    r = router.raw()
    assert r.get(keys[0]) == []  # A in use
    a.proc.kill()
    a.proc.wait()
    # the first write after the kill finds A gone (refused): retried on the replica
    assert r.store("set", keys[0], "first") == "STORED"
    assert held(b, keys[0]) == b"first"
    wait_until(lambda: metric(admin, "shoal_router_nodes_marked_down_total") >= 1,
               message="the dead primary marked down")
    for i, k in enumerate(keys[1:4]):
        assert r.get(k) == [], "not on the replica: a miss"
        fill = [lambda: r.store("set", k, f"v{i}"), lambda: r.store("add", k, f"v{i}"),
                lambda: "STORED" if r.meta(f"ms {k} 2", f"v{i}".encode()).code == "HD"
                else "no"][i]
        assert fill() == "STORED"
        assert r.get(k) == [(k, 0, f"v{i}".encode(), None)], "the read after the fill hits"
        assert held(b, k) == f"v{i}".encode()
    assert r.cmd(f"touch {keys[1]} 100") == "TOUCHED"
    assert r.store("replace", keys[2], "r2") == "STORED"
    assert r.get(keys[2]) == [(keys[2], 0, b"r2", None)]
    assert r.cmd(f"incr {keys[4]} 1") == "NOT_FOUND"
    assert r.store("add", keys[4], "41") == "STORED"
    assert r.cmd(f"incr {keys[4]} 1") == "42", "incr counts on the copy reads see"
    # a delete, then a read: a miss, nowhere a value left behind
    assert r.cmd(f"delete {keys[1]}") == "DELETED"
    assert r.get(keys[1]) == []
    assert held(b, keys[1]) is None
    assert r.meta(f"md {keys[3]}").code == "HD"
    assert r.get(keys[3]) == []
    for k in keys:
        assert held(g, k) is None
    assert gutter_sets(g) == 0, "no copies-2 write reached the gutter"
    assert metric(admin, "shoal_router_replica_writes_total") >= 11
    assert metric(admin, "shoal_router_gutter_requests_total") == 2, "only the deletes' copies"
    restart_server(a)


def test_writes_of_a_one_copy_namespace_still_go_to_the_gutter(start_server, control,
                                                               follower):
    a, b, c, g = (start_server() for _ in range(4))
    d = doc(1, [a, b, c], [(a, b), (b, c), (c, a)], gutter=g)
    d["namespaces"]["one"] = {"pool": "main", "copies": 1}
    control.publish(d)
    one = next(k for k in (f"one:w{i}" for i in range(100)) if range_of(k) == 0)
    two = next(k for k in (f"w{i}" for i in range(100)) if range_of(k) == 0)
    router, admin = follower(control.url, *FAST)
    r = router.raw()
    a.proc.kill()
    a.proc.wait()
    r.get(two)
    wait_until(lambda: metric(admin, "shoal_router_nodes_marked_down_total") >= 1,
               message="the dead primary marked down")
    assert r.store("set", one, "o") == "STORED"
    assert r.store("set", two, "t") == "STORED"
    assert held(g, one) == b"o" and held(b, one) is None
    assert held(b, two) == b"t" and held(g, two) is None
    assert r.get(one) == [(one, 0, b"o", None)]
    restart_server(a)


def test_writes_go_to_the_gutter_when_the_replica_is_down_too(trio, control, follower):
    a, b, c, g, _ = trio
    k = mine_of("z", 1)[0]
    router, admin = follower(control.url, *FAST)
    r = router.raw()
    for n in (a, b):
        n.proc.kill()
        n.proc.wait()
    r.cmd(f"get {k}")  # misses or errors: A, then B, found down
    r.cmd(f"get {mine_of('z', 1, rng=1)[0]}")
    wait_until(lambda: metric(admin, "shoal_router_nodes_marked_down_total") >= 2,
               message="both marked down")
    assert r.store("set", k, "g") == "STORED"
    assert held(g, k) == b"g"
    assert r.get(k) == [(k, 0, b"g", None)]
    assert metric(admin, "shoal_router_replica_writes_total") == 0
    restart_server(a)
    restart_server(b)


def test_replica_that_missed_a_delete_while_down_too_is_repaired_before_it_is_read(
        trio, control, follower):
    """A dead, its replica B stalled (keeps its data) too: a delete of A's key goes to the
    gutter alone; B answers again: it is read for A's keys only once that key is deleted on it
    (B missed the delete as surely as A did)."""
    a, b, c, g, _ = trio
    k, kept = mine_of("x", 2)
    own = mine_of("xb", 1, rng=1)[0]  # a key of B's own range
    seed(b, {k: b"old", kept: b"kept"})  # what replication put there
    router, admin = follower(control.url, *FAST)
    r = router.raw()
    r.cmd(f"get {own}")
    a.proc.kill()
    a.proc.wait()
    assert r.get(k) == [(k, 0, b"old", None)]  # retried on the replica
    wait_until(lambda: metric(admin, "shoal_router_nodes_marked_down_total") >= 2,
               message="A marked down by both workers")
    try:
        pause_server(b)
        r.cmd(f"get {own}")  # times out: B marked down
        wait_until(lambda: metric(admin, "shoal_router_nodes_marked_down_total") >= 4,
                   message="B marked down by both workers")
        assert r.cmd(f"delete {k}") == "NOT_FOUND"  # the gutter's answer
        assert r.get(kept) == []  # from the gutter meanwhile
    finally:
        resume_server(b)
    wait_until(lambda: held(b, k) is None, timeout=10,
               message="the delete B missed made on it when it is back")
    assert r.get(k) == [], "never the value deleted while B was down"
    wait_until(lambda: r.get(kept) == [(kept, 0, b"kept", None)], timeout=10,
               message="B read again for A's keys")
    assert held(b, kept) == b"kept"
    restart_server(a)


def test_primary_back_without_promotion_has_the_gap_fills_deleted(trio, control, follower):
    """A stalls (keeps its data) and is marked down; a fill of a key it holds an older value of
    lands on the replica; A answers again, no promotion: the router deletes the key on A before
    it reads A again, so A never serves the value older than the replica's."""
    a, b, c, g, _ = trio
    k, untouched = mine_of("s", 2)
    seed(a, {k: b"old", untouched: b"kept"})
    router, admin = follower(control.url, *FAST)
    r = router.raw()
    assert r.get(k) == [(k, 0, b"old", None)]
    try:
        pause_server(a)
        wait_until(lambda: r.get(k) == [] and
                   metric(admin, "shoal_router_nodes_marked_down_total") >= 1,
                   message="the stalled primary marked down, its keys read from the replica")
        assert r.store("set", k, "new") == "STORED"  # the fill after the replica's miss
        assert held(b, k) == b"new"
        assert held(g, k) is None
    finally:
        resume_server(a)
    # the worker that logged the fill repairs A; another one (nothing logged) has it back in
    # use at once, which says nothing of the repair
    repaired = (r"worker (\d+): node \S+ missed writes while down"
                r"(?s:.*)worker \1: node \S+ back in use")
    wait_until(lambda: re.search(repaired, router.stderr_text()), timeout=10,
               message="the primary repaired and back in use")
    assert held(a, k) is None, "the key filled on the replica was deleted on the primary"
    assert held(a, untouched) == b"kept"
    assert r.get(k) == [], "a miss, never the old value"
    assert r.get(untouched) == [(untouched, 0, b"kept", None)]
    assert metric(admin, "shoal_router_repair_deletes_total") >= 1


def test_reports_show_a_node_down_then_up(trio, control, follower):
    a, b, c, g, _ = trio
    router, admin = follower(control.url, *FAST)
    first = control.wait_post("/v1/reports")
    assert first["nodes"] == {}, "nodes this router never talked to are not its to judge"
    r = router.raw()
    for i in range(60):  # every node used: each has a state
        r.store("set", f"u{i}", "x")
    ident = f"127.0.0.1:{a.port}"
    body = control.wait_post("/v1/reports", lambda b: b["nodes"].get(ident) == "up")
    assert body["router"] == "r1"
    assert set(body["nodes"]) == {addr(n) for n in (a, b, c)}, "the gutter is not reported"
    a.proc.kill()
    a.proc.wait()
    t0 = time.monotonic()
    mine = next(k for k in (f"u{i}" for i in range(60)) if range_of(k) == 0)
    r.get(mine)
    wait_until(lambda: metric(admin, "shoal_router_nodes_marked_down_total") >= 1,
               message="marked down")
    control.wait_post("/v1/reports", lambda b: b["nodes"].get(ident) == "down", timeout=0.3 + 1)
    assert time.monotonic() - t0 < 1.5
    n_down = len(control.posts("/v1/reports"))
    restart_server(a)
    wait_until(lambda: any(p["nodes"].get(ident) == "up"
                           for p in control.posts("/v1/reports")[n_down:]),
               timeout=3, message="a report of the node up again")
    # periodic: more reports keep coming at about --report-ms
    n = len(control.posts("/v1/reports"))
    wait_until(lambda: len(control.posts("/v1/reports")) >= n + 2, timeout=2,
               message="reports every --report-ms")


def test_a_control_plane_without_reports_is_told_once(trio, control, follower):
    control.answer("/v1/reports", lambda body: (404, {"error": "no such resource"}))
    router, admin = follower(control.url, "--report-ms", "50")
    wait_until(lambda: "has no /v1/reports" in router.stderr_text(), message="the 404 logged")
    time.sleep(0.5)  # ten report periods: none asked again
    assert len(control.posts("/v1/reports")) == 1
    assert router.stderr_text().count("has no /v1/reports") == 1
    r = router.raw()
    assert r.store("set", "still", "serving") == "STORED"


def test_promotion_replays_recent_deletes_to_the_new_primary(trio, control, follower):
    a, b, c, g, owners = trio
    router, admin = follower(control.url, *FAST)
    r = router.raw()
    keys = [f"p{i}" for i in range(200)]
    gone = [k for k in keys if range_of(k) == 0][:3]      # deleted, slot promoted
    kept = [k for k in keys if range_of(k) == 0][3:5]     # not deleted, slot promoted
    other = [k for k in keys if range_of(k) == 1][:2]     # deleted, slot not promoted
    for i, k in enumerate(gone + kept + other):
        assert r.store("set", k, sizes(i)) == "STORED"
    for k in gone + other:
        assert r.cmd(f"delete {k}") == "DELETED"
    # the replication of the deletes was lost: B (A's replica) and C still hold the values
    seed(b, {k: b"stale" for k in gone + kept})
    seed(b, {k: b"stale" for k in other})  # B owns `other`: set again after the delete
    # A dies; control promotes B over A's range (its replica becomes C)
    control.publish(doc(2, [a, b, c], [(b, c), (b, c), (c, b)], gutter=g))
    wait_until(lambda: all(held(b, k) is None for k in gone), timeout=3,
               message="the promoted slots' recent deletes sent to the new primary")
    assert metric(admin, "shoal_router_replayed_deletes_total") == len(gone) * 1.0
    assert all(held(b, k) == b"stale" for k in kept), "a key nobody deleted is left alone"
    assert all(held(b, k) == b"stale" for k in other), "a slot not promoted is left alone"
    assert "promoted" in router.stderr_text()


class LeaseLapsed(FakeNode):
    """A primary whose lease ran out: every request is refused as the node fences it."""

    def answer(self, line, rest):
        if line.startswith((b"set ", b"ms ")):
            n = int(line.split()[4] if line.startswith(b"set") else line.split()[2])
            if len(rest) < n + 2:
                return None
            rest = rest[n + 2:]
        if line.startswith(b"version"):
            return b"VERSION fake\r\n", rest
        return b"SERVER_ERROR slot lease expired\r\n", rest


@pytest.fixture
def fenced(start_server, control):
    f = LeaseLapsed()
    a, g = start_server(), start_server()
    whole = [(0, 16383)]
    control.publish(doc(1, [f.addr, a], [(f.addr, a)], gutter=g, ranges=whole))
    yield f, a, g, whole
    f.stop.set()


def test_slot_lease_expired_waits_for_the_new_owner(fenced, control, follower):
    f, a, g, whole = fenced
    items = {f"m{i}": sizes(i) for i in range(6)}
    seed(a, items)
    router, admin = follower(control.url, "--moved-wait-ms", "3000")
    r = router.raw()
    stuck = socket.create_connection(("127.0.0.1", router.port))
    stuck.sendall(b"set half 0 0 10\r\nabc")  # a client beside, half way through a request
    k = "m1"
    r.send(f"get {k}\r\n".encode())
    r.send(f"mg m2 v\r\n".encode())
    time.sleep(0.3)  # both refused and parked by now; the promotion comes later
    control.publish(doc(2, [f.addr, a], [(a, None)], gutter=g, ranges=whole))
    assert r.read_get_reply() == [(k, 0, items[k], None)]
    got = r.read_meta()
    assert got.code == "VA" and got.value == items["m2"]
    assert metric(admin, "shoal_router_moved_retries_total") == 2
    stuck.close()


def test_slot_lease_expired_without_a_new_topology_reads_fall_back_writes_retry_the_owner(
        fenced, control, follower):
    """No newer document within --moved-wait-ms: reads go to the slot's replica as they would
    with the node marked down; writes go to the owner once more and get its second refusal (in
    the gutter nothing would repair them on the owner, which is alive and would serve its older
    value once its lease is back)."""
    f, a, g, whole = fenced
    seed(a, {"gk": b"from-replica"})
    router, admin = follower(control.url, "--moved-wait-ms", "200")
    r = router.raw()
    t0 = time.monotonic()
    assert r.get("gk") == [("gk", 0, b"from-replica", None)]
    assert time.monotonic() - t0 >= 0.2
    assert r.store("set", "gw", "x") == "SERVER_ERROR slot lease expired"
    assert held(g, "gw") is None
    assert r.cmd("delete gk") == "SERVER_ERROR slot lease expired"
    assert metric(admin, "shoal_router_moved_retries_total") == 2  # the set and the delete


def test_slot_lease_expired_without_gutter_or_new_topology_is_passed_on(start_server, control,
                                                                        follower):
    """A write the fenced owner refused stays off the replica (the owner is not marked down: it
    may serve the key again, unrepaired, once its lease is back): with no gutter, the refusal
    is the answer."""
    f = LeaseLapsed()
    a = start_server()
    control.publish(doc(1, [f.addr, a], [(f.addr, a)], ranges=[(0, 16383)]))
    router, admin = follower(control.url, "--moved-wait-ms", "100")
    r = router.raw()
    assert r.cmd("incr n 1") == "SERVER_ERROR slot lease expired"
    assert r.store("set", "x", "1") == "SERVER_ERROR slot lease expired"
    assert held(a, "x") is None
    f.stop.set()


# ---- large writes meeting a handoff fence (docs/router.md, "Moved-retry": --moved-keep-max)


class Moving(FakeNode):
    """A primary handing its slots over (`shoal node drain`): it fences every write."""

    def answer(self, line, rest):
        if line.startswith(b"set "):
            n = int(line.split()[4])
            if len(rest) < n + 2:
                return None
            return b"SERVER_ERROR slot moving\r\n", rest[n + 2:]
        if line.startswith(b"version"):
            return b"VERSION fake\r\n", rest
        return b"SERVER_ERROR slot moving\r\n", rest


@pytest.fixture
def moving(start_server, control):
    """The Moving node owning every slot (replica: a real node `a`), version 1 published."""
    f = Moving()
    a = start_server()
    whole = [(0, 16383)]
    control.publish(doc(1, [f.addr, a], [(f.addr, a)], ranges=whole))
    yield f, a, whole
    f.stop.set()


BIG = 200_000


def test_large_set_meeting_the_handoff_fence_is_sent_to_the_new_owner(moving, control, follower):
    """A 200 KB set (over the 16 KB every request keeps) keeps its bytes within --moved-keep-max:
    refused as its slot moves, it waits for the topology naming the new owner and is stored
    there; the client sees STORED, and the kept bytes are counted (moved_kept_bytes, and in
    client_buffer_bytes) until it is answered, then given back."""
    f, a, whole = moving
    router, admin = follower(control.url, "--moved-wait-ms", "5000")
    value = bytes(range(256)) * (BIG // 256)
    r = router.raw()
    r.send(b"set big 0 0 %d\r\n" % len(value) + value + b"\r\n")
    wait_until(lambda: metric(admin, "shoal_router_moved_kept_bytes") >= len(value),
               message="the refused set parked with its bytes")
    assert metric(admin, "shoal_router_client_buffer_bytes") >= len(value)
    control.publish(doc(2, [f.addr, a], [(a, None)], ranges=whole))
    assert r.read_line() == "STORED"
    assert held(a, "big") == value
    assert metric(admin, "shoal_router_moved_retries_total") == 1
    assert metric(admin, "shoal_router_moved_keep_refused_total") == 0
    wait_until(lambda: metric(admin, "shoal_router_moved_kept_bytes") == 0,
               message="the kept bytes given back once answered")


def test_large_sets_past_moved_keep_max_get_the_fence_error_and_are_counted(moving, control,
                                                                           follower):
    """--moved-keep-max bounds what is kept: with room for one 200 KB set, a second one while the
    first is parked is sent without keeping its bytes (moved_keep_refused) and its refusal
    reaches its client as before; the first is still stored at the new owner."""
    f, a, whole = moving
    router, admin = follower(control.url, "--moved-wait-ms", "5000", "--moved-keep-max", "300k")
    first, second = router.raw(), router.raw()
    value = b"k" * BIG
    first.send(b"set one 0 0 %d\r\n" % len(value) + value + b"\r\n")
    wait_until(lambda: metric(admin, "shoal_router_moved_kept_bytes") >= len(value),
               message="the first set parked with its bytes")
    assert second.store("set", "two", value) == "SERVER_ERROR slot moving"
    assert metric(admin, "shoal_router_moved_keep_refused_total") == 1
    assert metric(admin, "shoal_router_moved_kept_bytes") < 300_000
    control.publish(doc(2, [f.addr, a], [(a, None)], ranges=whole))
    assert first.read_line() == "STORED"
    assert held(a, "one") == value and held(a, "two") is None
    assert metric(admin, "shoal_router_moved_retries_total") == 1


class Fenceable(FakeNode):
    """A node that refuses every request with `refusal` while `fenced` is set, else stores sets and
    serves gets from `items`; it records the request lines it is sent."""

    def __init__(self, refusal, items=None):
        self.refusal, self.items, self.seen, self.fenced = refusal, dict(items or {}), [], True
        super().__init__()

    def answer(self, line, rest):
        if line.startswith(b"version"):
            return b"VERSION fake\r\n", rest
        value = None
        if line.startswith(b"set "):
            n = int(line.split()[4])
            if len(rest) < n + 2:
                return None
            value, rest = rest[:n], rest[n + 2:]
        self.seen.append(line)
        if self.fenced:
            return self.refusal, rest
        if value is not None:
            self.items[line.split()[1]] = value
            return b"STORED\r\n", rest
        if line.startswith(b"get "):
            out = b"".join(b"VALUE %s 0 %d\r\n%s\r\n" % (k, len(self.items[k]), self.items[k])
                           for k in line.split()[1:] if k in self.items)
            return out + b"END\r\n", rest
        return b"ERROR\r\n", rest


def test_a_resend_the_new_owner_refuses_for_a_moment_waits_again_within_the_window(
        start_server, control, follower):
    """A drain's or a promotion's new owner may fence for a moment (its lease names a version it
    has not received yet): a write and a read the old owner refused, resent to the new owner and
    refused again within --moved-wait-ms of the first refusal, wait for the next version once
    more instead of showing the refusal to the client (it did, about 1 drain in 9 under writes
    on the sanitizer build)."""
    a = start_server()
    old = Fenceable(b"SERVER_ERROR slot moving\r\n")
    new = Fenceable(b"SERVER_ERROR slot lease expired\r\n", {b"g": b"from-new"})
    nodes, whole = [old.addr, new.addr, a], [(0, 16383)]
    control.publish(doc(1, nodes, [(old.addr, a)], ranges=whole))
    router, admin = follower(control.url, "--moved-wait-ms", "5000")
    w, r = router.raw(), router.raw()
    w.send(b"set k 0 0 5\r\nhello\r\n")
    r.send(b"get g\r\n")
    wait_until(lambda: len(old.seen) >= 2, message="both refused by the old owner")
    control.publish(doc(2, nodes, [(new.addr, a)], ranges=whole))
    wait_until(lambda: len(new.seen) >= 2, message="both resent to the new owner and refused")
    new.fenced = False  # its version arrived: it serves again
    control.publish(doc(3, nodes, [(new.addr, a)], ranges=whole))
    assert w.read_line() == "STORED"
    assert r.read_get_reply() == [("g", 0, b"from-new", None)]
    assert new.items[b"k"] == b"hello"
    assert metric(admin, "shoal_router_moved_retries_total") == 4
    old.stop.set()
    new.stop.set()


# ---- the replay starts at the new primary's replication stamp (docs/router.md, "Promotions")


class StampedReplica(FakeNode):
    """A new primary that answers `stats repl` with a chosen stamp for the dead primary (None:
    no stamp) and records the keys of the deletes it is sent."""

    def __init__(self, dead, stamp):
        self.dead, self.stamp, self.deleted = dead, stamp, []
        super().__init__()

    def answer(self, line, rest):
        if line == b"stats repl":
            out = b"STAT repl_enabled 1\r\nSTAT primary:0:node %s\r\n" % self.dead.encode()
            if self.stamp is not None:
                out += b"STAT primary:0:applied_wall_ms %d\r\n" % self.stamp
            return out + b"STAT primary:0:state down\r\nEND\r\n", rest
        if line.startswith(b"md "):
            self.deleted.append(line.split()[1].decode())
            return (b"" if line.endswith(b" q") else b"HD\r\n"), rest
        if line.startswith(b"mn"):
            return b"MN\r\n", rest
        if line.startswith(b"version"):
            return b"VERSION fake\r\n", rest
        return b"ERROR\r\n", rest


def test_promotion_replays_only_deletes_after_the_new_primarys_stamp_less_the_margin(
        start_server, control, follower):
    a = start_server()
    whole = [(0, 16383)]
    f = StampedReplica(f"127.0.0.1:{a.port}", None)
    try:
        control.publish(doc(1, [a, f.addr], [(a, f.addr)], ranges=whole))
        router, admin = follower(control.url, *FAST, "--replay-margin-ms", "200")
        r = router.raw()
        old, new = [f"o{i}" for i in range(5)], [f"n{i}" for i in range(5)]
        for k in old:
            assert r.cmd(f"delete {k}") == "NOT_FOUND"
        time.sleep(0.15)  # the clock is the input: a gap on each side of the stamp
        mid = int(time.time() * 1000)
        time.sleep(0.15)
        for k in new:
            assert r.cmd(f"delete {k}") == "NOT_FOUND"
        # the replica applied everything the dead primary appended up to `mid` + the margin
        f.stamp = mid + 200
        control.publish(doc(2, [a, f.addr], [(f.addr, None)], ranges=whole))
        wait_until(lambda: sorted(f.deleted) == sorted(new), timeout=3,
                   message="the deletes after the stamp, less the margin, sent to the new primary")
        wait_until(lambda: "recent deletes sent again" in router.stderr_text(), timeout=3)
        assert not set(f.deleted) & set(old), "deletes the replica applied are not sent again"
        assert metric(admin, "shoal_router_replayed_deletes_total") == len(new) * 1.0
        assert "--replay-margin-ms 200" in router.stderr_text()
    finally:
        f.stop.set()


def test_promotion_without_a_stamp_replays_the_whole_window(start_server, control, follower):
    a = start_server()
    whole = [(0, 16383)]
    f = StampedReplica(f"127.0.0.1:{a.port}", None)  # an older node: no applied_wall_ms
    try:
        control.publish(doc(1, [a, f.addr], [(a, f.addr)], ranges=whole))
        router, admin = follower(control.url, *FAST)
        r = router.raw()
        keys = [f"w{i}" for i in range(5)]
        for k in keys:
            assert r.cmd(f"delete {k}") == "NOT_FOUND"
        control.publish(doc(2, [a, f.addr], [(f.addr, None)], ranges=whole))
        wait_until(lambda: sorted(f.deleted) == sorted(keys), timeout=3,
                   message="every logged delete sent to the new primary")
        assert "replaying the whole window" in router.stderr_text()
    finally:
        f.stop.set()


def test_key_deleted_replicated_then_set_again_survives_the_promotion(start_server, control,
                                                                       follower, tmp_path):
    """Real replication: B applied A's delete and the later set before A died; the promotion
    must not delete the fresh value (nor need anything of the stream once it is gone)."""
    def node():
        adm = free_port()
        n = start_server("--admin-port", str(adm), "--control", control.url,
                         "--control-backoff-max-ms", "200")
        n.admin_port = adm
        wait_until(lambda: accepts(adm), message="the node's admin port")
        return n

    def replication(n):
        status, body = http(n.admin_port, "GET", "/v1/replication")
        assert status == 200, body
        return json.loads(body)

    a, b = node(), node()
    whole = [(0, 16383)]
    control.publish(doc(1, [a, b], [(a, b)], ranges=whole))
    wait_until(lambda: any(x["state"] == "online" for x in replication(a)["replicas"]),
               timeout=10, message="B replicating A")
    router, admin = follower(control.url, *FAST, "--replay-margin-ms", "100")
    r = router.raw()
    assert r.store("set", "k", b"v1") == "STORED"
    assert r.cmd("delete k") == "DELETED"
    after_delete = int(time.time() * 1000)

    def stamp():
        p = [x for x in replication(b)["primaries"] if x["node"] == f"127.0.0.1:{a.port}"]
        return p[0].get("applied_wall_ms", 0) if p else 0
    wait_until(lambda: stamp() > after_delete + 300, timeout=5,
               message="B's stamp for A past the delete and the margin")
    assert r.store("set", "k", b"v2") == "STORED"
    wait_until(lambda: held(b, "k") == b"v2", timeout=3, message="the set replicated to B")
    a.proc.kill()
    a.proc.wait()
    a.killed = True
    wait_until(lambda: replication(b)["primaries"][0]["state"] == "down", timeout=10)
    assert stamp() > after_delete, "the stamp is kept once the primary's stream ended"
    control.publish(doc(2, [a, b], [(b, None)], ranges=whole))
    wait_until(lambda: router.stderr_text().count("recent deletes sent again") >= 2, timeout=5,
               message="both workers replayed")
    assert metric(admin, "shoal_router_replayed_deletes_total") == 0.0
    assert held(b, "k") == b"v2"
    with McRaw("127.0.0.1", b.port) as c:
        assert int(c.stats("repl")["primary:0:applied_wall_ms"]) > after_delete


def test_node_back_as_a_replica_only_is_not_repaired_for_keys_its_live_primaries_resync(
        trio, control, follower):
    """B stalls; the writes of its keys go to its replica C (and into B's repair log); C is
    promoted over B's range. B comes back owning no primary range, so the streams of its live
    primaries (a full resync from C) restore those keys: the router must not delete them on B
    (it would remove what the resync brought)."""
    a, b, c, g, owners = trio
    ks = mine_of("rb", 4, rng=1)  # keys of B's range
    router, admin = follower(control.url, *FAST)
    r = router.raw()
    for k in ks:
        assert r.store("set", k, b"v1") == "STORED"
    try:
        pause_server(b)
        r.cmd(f"get {ks[0]}")  # times out: B marked down
        wait_until(lambda: metric(admin, "shoal_router_nodes_marked_down_total") >= 2,
                   message="B marked down by both workers")
        for k in ks:
            assert r.store("set", k, b"v2") == "STORED"  # to the replica C, logged for B
        assert metric(admin, "shoal_router_repair_keys_logged_total") >= len(ks)
        control.publish(doc(2, [a, b, c], [(a, b), (c, b), (c, a)], gutter=g))
        wait_until(lambda: metric(admin, "shoal_router_topology_version") == 2
                   if "shoal_router_topology_version" in http(admin, "GET", "/metrics")[1]
                   else "version 2 in use" in router.stderr_text(), timeout=5)
    finally:
        resume_server(b)
    wait_until(lambda: router.stderr_text().count(f"{b.port} back in use") >= 2, timeout=10,
               message="B back in use in both workers")
    assert all(held(b, k) == b"v1" for k in ks), "nothing deleted on B (its resync's to restore)"
    assert metric(admin, "shoal_router_repair_deletes_total") == 0.0
    assert "left to its resync" in router.stderr_text()
    assert all(r.get(k) == [(k, 0, b"v2", None)] for k in ks), "C serves the writes of the gap"
