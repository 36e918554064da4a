"""shoal-router when a node dies under load: a request whose node refuses the connection, resets
it or times out is retried once on the gutter pool before its client is answered (the paper's
§3.3, mcrouter's failover routes), so killing a node with SIGKILL under a steady pipelined load
of gets and sets costs the clients no errors at all; and a node marked down by one worker thread
is marked down for every worker. Skipped when SHOAL_TEST_SERVER=memcached."""

import random
import re
import socket
import threading

import pytest

from conftest import (default_owner, held_value, key_slot, pause_server, restart_server,
                      resume_server, topology)
from fakenode import FakeNode, Reset
from mcraw import McRaw, free_port, http, wait_until

pytestmark = pytest.mark.shoal_only

DEPTH = 16  # requests each load client pipelines before it reads their replies


class Loader(threading.Thread):
    """One client connection pipelining DEPTH gets and sets of its own keys at a time and
    checking every reply against its request: a set is STORED; a get misses or returns a value
    this client wrote for that very key (a reply out of order, or another client's, would name
    another key or carry another value). Anything else is an error."""

    def __init__(self, host, port, cid, nkeys, stop):
        super().__init__(daemon=True)
        self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rf = self.sock.makefile("rb")
        self.keys = [f"c{cid}k{i}" for i in range(nkeys)]
        self.stop = stop
        self.done = 0
        self.errors = []
        self.seq = 0
        self.last = {}  # key -> the value of the last set sent for it
        self.rnd = random.Random(cid)

    def run(self):
        try:
            while not self.stop.is_set():
                self.batch()
        except Exception as e:  # a lost connection or a timeout is an error too
            self.errors.append(repr(e))

    def batch(self):
        sent = []
        out = []
        for _ in range(DEPTH):
            key = self.rnd.choice(self.keys)
            if self.rnd.random() < 0.3:
                self.seq += 1
                value = f"{key}={self.seq}".encode()
                self.last[key] = value
                out.append(b"set %s 0 60 %d\r\n%s\r\n" % (key.encode(), len(value), value))
                sent.append(("set", key))
            else:
                out.append(f"get {key}\r\n".encode())
                sent.append(("get", key))
        self.sock.sendall(b"".join(out))
        for verb, key in sent:
            line = self.rf.readline().rstrip(b"\r\n").decode(errors="replace")
            if verb == "set":
                if line != "STORED":
                    self.errors.append(f"set {key}: {line}")
                continue
            if line.startswith("VALUE "):
                parts = line.split()
                data = self.rf.read(int(parts[3]) + 2)[:-2].decode(errors="replace")
                end = self.rf.readline().rstrip(b"\r\n").decode(errors="replace")
                if parts[1] != key or not data.startswith(key + "=") or end != "END":
                    self.errors.append(f"get {key}: {line} {data!r} {end}")
                elif int(data.split("=")[1]) > self.seq:
                    self.errors.append(f"get {key}: a value never written: {data!r}")
            elif line != "END":
                self.errors.append(f"get {key}: {line}")
        self.done += len(sent)


class Load:
    """n Loaders of nkeys keys each through the router, from start() until stop()."""

    def __init__(self, router, n=4, nkeys=300):
        self.stop_event = threading.Event()
        self.loaders = [Loader(router.host, router.port, cid, nkeys, self.stop_event)
                        for cid in range(n)]

    def start(self):
        for ld in self.loaders:
            ld.start()
        return self

    def stop(self):
        self.stop_event.set()
        for ld in self.loaders:
            ld.join(timeout=15)

    def total(self):
        """Requests answered so far."""
        return sum(ld.done for ld in self.loaders)

    def errors(self):
        return [e for ld in self.loaders for e in ld.errors]

    def assert_no_errors(self):
        errs = self.errors()
        assert errs == [], f"{len(errs)} of {self.total()} requests failed, e.g. {errs[:5]}"

    def running(self, cond):
        """`cond` as a wait_until condition that fails at once when a loader has stopped."""
        def check():
            assert all(ld.is_alive() for ld in self.loaders), \
                f"a loader stopped: {self.errors()[-3:]}"
            return cond()
        return check


def gutter_cluster(start_server, start_router, *flags):
    """Three nodes in the pool "main" and one in the gutter pool, behind a router started with
    `flags`. Returns (nodes, gutter, router, admin)."""
    nodes = [start_server() for _ in range(3)]
    gutter = start_server()
    doc = topology(nodes)
    doc["pools"]["gutter"] = {"nodes": [f"127.0.0.1:{gutter.port}"]}
    doc["gutter_pool"] = "gutter"
    router, admin, _ = start_router(doc, *flags)
    return nodes, gutter, router, admin


def metric(admin, name):
    status, body = http(admin, "GET", "/metrics")
    assert status == 200, body
    m = re.search(rf"^{re.escape(name)} (\d+)$", body, re.M)
    return int(m[1]) if m else 0


def node_stat(server, name):
    with McRaw(server.host, server.port) as c:
        return int(c.stats()[name])


def test_kill_under_pipelined_load_costs_clients_no_errors(start_server, start_router):
    nodes, gutter, router, admin = gutter_cluster(start_server, start_router, "-t", "2",
                                                  "--timeout-ms", "1000", "--probe-ms", "100",
                                                  "--retry-ms", "100")
    victim = nodes[1]
    vaddr = f"127.0.0.1:{victim.port}"
    load = Load(router)
    victim_keys = [k for ld in load.loaders for k in ld.keys
                   if default_owner(key_slot(k), 3) == 1]
    assert victim_keys
    total, running = load.total, load.running
    load.start()
    try:
        wait_until(running(lambda: total() >= 4000), timeout=10, message="the load running")
        victim.proc.kill()
        victim.proc.wait()
        at_kill = total()
        # marked down in every worker, the victim's keys served and filled by the gutter
        wait_until(lambda: f'shoal_router_node_down{{node="{vaddr}"}} 2' in
                   http(admin, "GET", "/metrics")[1], timeout=10,
                   message="the dead node marked down by both workers")
        sets0, hits0 = node_stat(gutter, "cmd_set"), node_stat(gutter, "get_hits")
        wait_until(running(lambda: total() >= at_kill + 20000 and node_stat(gutter, "cmd_set") > sets0
                   and node_stat(gutter, "get_hits") > hits0), timeout=10,
                   message="the dead node's keys filled and read in the gutter")
        restart_server(victim)
        # back in use: the load reads and writes its keys on it again
        wait_until(lambda: node_stat(victim, "get_hits") > 0 and node_stat(victim, "cmd_set") > 0,
                   timeout=10, message="the restarted node back in use")
        at_back = total()
        wait_until(running(lambda: total() >= at_back + 10000), timeout=10, message="more load")
    finally:
        load.stop()
    load.assert_no_errors()
    assert metric(admin, "shoal_router_gutter_retries_total") > 0
    assert total() > 30000


class ResetNode(FakeNode):
    """Answers the router's probe (`version`); resets the connection (RST) as soon as any other
    request has arrived, as a node that dies with the request in hand."""

    def answer(self, line, rest):
        if line == b"version":
            return b"VERSION fake\r\n", rest
        raise Reset


class SilentNode(FakeNode):
    """Takes every request and never answers (a stalled node)."""

    def answer(self, line, rest):
        return b"", rest


def retry_router(start_server, start_router, owners, *flags, gutters=1, pools=None):
    """A router whose pool "main" is `owners` (addresses) and whose gutter pool has `gutters`
    real nodes, with one worker that never marks a node down (--down-after 1000): each request
    goes to its owner, and only a retry can take it to the gutter. `pools` adds pools (name ->
    addresses), each with a namespace of its name."""
    gnodes = [start_server() for _ in range(gutters)]
    doc = topology(owners)
    doc["pools"]["gutter"] = {"nodes": [f"127.0.0.1:{g.port}" for g in gnodes]}
    doc["gutter_pool"] = "gutter"
    for name, addrs in (pools or {}).items():
        doc["pools"][name] = {"nodes": addrs}
        doc["namespaces"][name] = {"pool": name}
    router, admin, _ = start_router(doc, "-t", "1", "--down-after", "1000", "--retry-ms", "50",
                                    *flags)
    return router, admin, gnodes


def put(server, key, value):
    with McRaw(server.host, server.port) as c:
        assert c.store("set", key, value, exptime=600) == "STORED"


def test_a_refused_request_is_retried_on_the_gutter_whatever_it_is(start_server, start_router):
    """A node that refuses the connection never saw the request: any request may be retried,
    incr and append too, and a write so retried is logged for the owner's repair."""
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    router, admin, (gutter,) = retry_router(start_server, start_router, [dead])
    put(gutter, "n", "5")
    put(gutter, "k", "gv")
    with router.raw() as r:
        assert r.get("k") == [("k", 0, b"gv", None)]
        assert r.cmd("incr n 2") == "7"
        assert r.store("append", "k", "x") == "STORED"
        assert r.store("add", "a", "1") == "STORED"
        assert r.meta("ma n D3 v").value == b"10"
        assert r.cmd("delete a") == "DELETED"
    assert held_value(gutter, "k") == b"gvx"
    assert metric(admin, "shoal_router_gutter_retries_total") == 6
    assert metric(admin, "shoal_router_repair_keys_logged_total") >= 3  # n, k, a


def test_a_request_the_node_may_have_run_is_retried_only_if_a_repeat_is_harmless(
        start_server, start_router):
    """A node that resets the connection after the request reached it may have applied it: a
    get, set, delete or touch is retried on the gutter; an incr, add or append is answered with
    the failure (a retry could answer the opposite of what happened), and so is a request too
    large to keep for a retry; its key is logged for the owner's repair either way."""
    node = ResetNode()
    try:
        router, admin, (gutter,) = retry_router(start_server, start_router, [node.addr])
        put(gutter, "n", "5")
        put(gutter, "k", "gv")
        with router.raw() as r:
            assert r.get("k") == [("k", 0, b"gv", None)]
            assert r.store("set", "s", "v") == "STORED"
            assert r.cmd("touch k 100") == "TOUCHED"
            assert r.meta("ms m 1 T0", "w").code == "HD"
            # ...and so is a set too large to keep for a retry (FAILOVER_KEEP_MAX)
            for line, data in (("incr n 1", None), ("add a 0 0 1", "x"),
                               ("append k 0 0 1", "x"), ("ma n", None),
                               ("set big 0 0 20000", "x" * 20000)):
                got = r.cmd(line, data)
                assert got.startswith("SERVER_ERROR") and node.addr in got, (line, got)
            assert r.cmd("delete s") == "DELETED"
        assert held_value(gutter, "n") == b"5" and held_value(gutter, "k") == b"gv"
        assert held_value(gutter, "s") is None and held_value(gutter, "m") == b"w"
        assert metric(admin, "shoal_router_gutter_retries_total") == 5
        # s, k, m, n, a, big: every write that may have reached the owner (then again, as the
        # repair's deletes fail on it too)
        assert metric(admin, "shoal_router_repair_keys_logged_total") >= 6
    finally:
        node.close()


def test_a_timed_out_pipeline_is_retried_in_order_on_the_gutter(start_server, start_router):
    """Requests pipelined to a node that stops answering are retried, after the first times
    out, in the order they were sent: the get behind a set sees it, and the client's replies
    keep their order."""
    node = SilentNode()
    try:
        router, admin, (gutter,) = retry_router(start_server, start_router, [node.addr],
                                                "--timeout-ms", "200")
        put(gutter, "k", "old")
        with router.raw() as r:
            r.send(b"get k\r\nset k 0 0 3\r\nnew\r\nget k\r\ndelete k\r\nget k\r\nincr n 1\r\n")
            assert r.read_get_reply() == [("k", 0, b"old", None)]
            assert r.read_line() == "STORED"
            assert r.read_get_reply() == [("k", 0, b"new", None)]
            assert r.read_line() == "DELETED"
            assert r.read_get_reply() == []
            line = r.read_line()
            assert line.startswith("SERVER_ERROR") and "timeout" in line, line
        assert metric(admin, "shoal_router_gutter_retries_total") == 5
    finally:
        node.close()


def test_a_multiget_retried_over_two_gutter_nodes_keeps_key_order(start_server, start_router):
    """A get whose keys the gutter pool spreads over two nodes is split there, and merged in
    the order asked, whether it went to the failed node whole or as part of a get split over
    nodes; a gat's TTL is capped by gutter_ttl there."""
    dead = f"127.0.0.1:{free_port()}"
    live = start_server()
    router, admin, gnodes = retry_router(start_server, start_router, [dead], gutters=2,
                                         pools={"live": [f"127.0.0.1:{live.port}"]})
    keys = [f"d{i}" for i in range(12)]
    where = [gnodes[default_owner(key_slot(k), 2)] for k in keys]
    assert gnodes[0] in where and gnodes[1] in where
    for k, g in zip(keys, where):
        if k != "d3":  # a miss among the hits
            put(g, k, f"v{k}")
    put(live, "live:a", "la")
    want = [(k, 0, f"v{k}".encode(), None) for k in keys if k != "d3"]
    with router.raw() as r:
        assert r.get(*keys) == want
        mixed = ["live:a", *keys[:6], "live:a", *keys[6:]]
        assert r.get(*mixed) == [(k, 0, b"la" if k == "live:a" else f"v{k}".encode(), None)
                                 for k in mixed if k != "d3"]
        assert r.get(*keys, cmd="gat 3600") == want
    for k, g in zip(keys, where):
        if k != "d3":
            with McRaw(g.host, g.port) as c:
                assert 0 < int(c.meta(f"mg {k} t").flags["t"]) <= 10, "gutter_ttl caps a gat"
    assert metric(admin, "shoal_router_gutter_retries_total") == 3


def test_a_node_one_worker_marks_down_is_down_for_every_worker(start_server, start_router):
    """Two workers; one client, served by one of them, makes it mark a dead node down: the
    other worker, which sent the node nothing, marks it down too, and both mark it up once it
    is back."""
    nodes, _, router, admin = gutter_cluster(start_server, start_router, "-t", "2",
                                             "--probe-ms", "50", "--retry-ms", "20")
    victim = nodes[0]
    down = f'shoal_router_node_down{{node="127.0.0.1:{victim.port}"}}'
    key = next(k for k in (f"w{i}" for i in range(100)) if default_owner(key_slot(k), 3) == 0)
    with router.raw() as r:
        assert r.store("set", key, "v") == "STORED"
        victim.proc.kill()
        victim.proc.wait()

        def both_down():
            assert r.get(key) in ([], [(key, 0, b"v", None)])
            return metric(admin, down) == 2
        wait_until(both_down, message="the node marked down by both workers")
        assert metric(admin, "shoal_router_nodes_marked_down_total") == 2
        restart_server(victim)
        wait_until(lambda: metric(admin, down) == 0, message="the node marked up by both")
        assert r.store("set", key, "back") == "STORED"
    assert held_value(victim, key) == b"back"


def test_a_stall_under_load_costs_no_errors_and_the_node_is_repaired(start_server, start_router):
    """A node stopped (SIGSTOP: it keeps its data) under the same load: the requests it holds
    time out and are retried on the gutter, none fails; once both workers have it marked down
    the load's writes of its keys go to the gutter and are logged for it; resumed, it is repaired
    before its keys are read from it again, so once the load stops every key reads as a miss
    or as the last value its client wrote, never an older one the node kept."""
    nodes, gutter, router, admin = gutter_cluster(start_server, start_router, "-t", "2",
                                                  "--timeout-ms", "300", "--probe-ms", "100")
    victim = nodes[2]
    vaddr = f"127.0.0.1:{victim.port}"
    down = f'shoal_router_node_down{{node="{vaddr}"}}'
    load = Load(router).start()
    total, running = load.total, load.running
    try:
        wait_until(running(lambda: total() >= 4000), timeout=10, message="the load running")
        pause_server(victim)
        try:
            wait_until(running(lambda: metric(admin, down) == 2), timeout=10,
                       message="the stalled node marked down by both workers")
            sets = node_stat(gutter, "cmd_set")
            wait_until(running(lambda: node_stat(gutter, "cmd_set") >= sets + 500), timeout=10,
                       message="the load writing its keys to the gutter")
            assert metric(admin, "shoal_router_repair_keys_logged_total") > 0
        finally:
            resume_server(victim)
        wait_until(running(lambda: router.stderr_text().count(f"node {vaddr} back in use") >= 2),
                   timeout=10, message="the node repaired and back in use in both workers")
        at_back = total()
        wait_until(running(lambda: total() >= at_back + 5000), timeout=10, message="more load")
    finally:
        load.stop()
    load.assert_no_errors()
    stale = []
    with router.raw() as r:
        for ld in load.loaders:
            for key in ld.keys:
                got = r.get(key)
                if got and got[0][2] != ld.last.get(key):
                    stale.append((key, got[0][2], ld.last.get(key)))
    assert stale == [], f"{len(stale)} keys read older values, e.g. {stale[:5]}"
    assert metric(admin, "shoal_router_gutter_retries_total") > 0
    assert metric(admin, "shoal_router_repair_deletes_total") > 0
