"""shoal-router when a node dies: after a few failures the node is marked down, its keys' requests
go to the gutter pool (TTL capped by gutter_ttl) without waiting on the dead node, other nodes'
keys are unaffected, and a probe brings the node back into use when it answers again. Skipped when
SHOAL_TEST_SERVER=memcached."""

import re
import time

import pytest

from conftest import RouterCluster, default_owner, key_slot, restart_server, topology
from mcraw import McRaw, http, wait_until

pytestmark = pytest.mark.shoal_only


def test_dead_node_goes_to_gutter_and_comes_back(gcluster):
    r = gcluster.raw()
    victim = gcluster.nodes[1]
    keys = [f"fo{i}" for i in range(150)]
    for k in keys:
        assert r.store("set", k, f"v-{k}") == "STORED"
    mine = [k for k in keys if gcluster.owner(k) is victim]
    others = [k for k in keys if gcluster.owner(k) is not victim]
    assert mine and others

    victim.proc.kill()
    victim.proc.wait()
    # None fails: until the worker has seen down_after failures each request is retried on
    # the gutter (failover.h); then they go there directly.
    def marked_down():
        assert r.cmd(f"mg {mine[0]}") == "EN", "answered by the (empty) gutter"
        return int(r.stats()["nodes_marked_down"]) >= 1
    wait_until(marked_down, timeout=5, message="the dead node marked down")
    status, body = http(gcluster.admin_port, "GET", "/metrics")
    assert f'shoal_router_node_down{{node="127.0.0.1:{victim.port}"}} 1' in body
    assert f'shoal_router_node_errors{{node="127.0.0.1:{victim.port}"}} 0' not in body

    started = time.monotonic()
    for k in mine:  # gutter: empty at first, filled by the client, capped TTL
        assert r.get(k) == [], f"{k} misses in the (empty) gutter pool"
        assert r.store("set", k, "g", exptime=3600) == "STORED"
        assert r.get(k) == [(k, 0, b"g", None)]
    assert time.monotonic() - started < 2, "no request waited for a timeout on the dead node"
    with McRaw(gcluster.gutter.host, gcluster.gutter.port) as g:
        ttl = int(g.meta(f"mg {mine[0]} t").flags["t"])
        assert 0 < ttl <= 7, f"gutter items live at most gutter_ttl, got {ttl}"
    for k in others:
        assert r.get(k) == [(k, 0, f"v-{k}".encode(), None)], "other nodes' keys are unaffected"
    got = r.get(*keys)  # a multi-get across the live nodes and the gutter
    assert [g[0] for g in got] == keys

    restart_server(victim)
    def back_in_use():
        assert r.store("set", mine[0], "n") == "STORED"
        with McRaw(victim.host, victim.port) as direct:
            return direct.meta(f"mg {mine[0]} v").code == "VA"
    wait_until(back_in_use, timeout=5, message="the node back in use after a probe")
    assert int(r.stats()["nodes_marked_up"]) >= 1
    assert r.get(mine[0]) == [(mine[0], 0, b"n", None)]


def test_no_gutter_fails_fast_once_down(start_server, start_router):
    nodes = [start_server() for _ in range(2)]
    router, _, _ = start_router(nodes, "-t", "1", "--probe-ms", "10000", "--retry-ms", "50")
    r = router.raw()
    victim = nodes[0]
    key = next(f"n{i}" for i in range(100) if default_owner(key_slot(f"n{i}"), 2) == 0)
    victim.proc.kill()
    victim.proc.wait()
    wait_until(lambda: "is down" in r.cmd(f"get {key}"), timeout=5, message="node marked down")
    started = time.monotonic()
    for _ in range(50):
        assert r.cmd(f"get {key}").endswith(f"node 127.0.0.1:{victim.port} is down")
    assert time.monotonic() - started < 1, "a node marked down fails requests at once"
    restart_server(victim)


def test_kill_under_load_no_errors_once_marked_down(start_server, start_router):
    """Four clients load the router while a node is killed with SIGKILL and later restarted:
    errors are allowed only around the failure (before the workers mark the node down); once it
    is down every request is answered, and after the restart its keys return to it."""
    import random
    import threading
    nodes = [start_server() for _ in range(3)]
    gutter = start_server()
    doc = topology(nodes)
    doc["pools"]["gutter"] = {"nodes": [f"127.0.0.1:{gutter.port}"]}
    doc["gutter_pool"] = "gutter"
    router, _, path = start_router(doc, "--timeout-ms", "300", "--probe-ms", "100",
                                   "--retry-ms", "50")
    cluster = RouterCluster(nodes, router, path, 0)
    victim = nodes[2]
    stop = threading.Event()
    errors = []  # (monotonic time, what)
    counts = []

    def load(seed):
        rnd = random.Random(seed)
        c = McRaw(router.host, router.port)
        n = 0
        while not stop.is_set():
            k = f"load:{rnd.randrange(500)}"
            try:
                if rnd.random() < 0.3:
                    reply = c.store("set", k, "v", exptime=60)
                    if reply != "STORED":
                        errors.append((time.monotonic(), f"set {k}: {reply}"))
                else:
                    c.send(f"get {k}\r\n")
                    line = c.read_line()
                    while line.startswith("VALUE"):
                        c.read_value(int(line.split()[3]))
                        line = c.read_line()
                    if line != "END":
                        errors.append((time.monotonic(), f"get {k}: {line}"))
            except Exception as e:
                errors.append((time.monotonic(), repr(e)))
                c = McRaw(router.host, router.port)
            n += 1
        counts.append(n)

    threads = [threading.Thread(target=load, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        killed = time.monotonic()
        victim.proc.kill()
        victim.proc.wait()
        time.sleep(2.0)
        restarted = time.monotonic()
        restart_server(victim)
        time.sleep(1.5)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert sum(counts) > 500, f"the load ran: {counts}"
    before = [e for e in errors if e[0] < killed]
    settled = [e for e in errors if killed + 1.0 < e[0] < restarted]
    assert before == [], f"no errors before the kill: {before[:5]}"
    assert settled == [], f"no errors once the node is marked down: {settled[:5]}"
    after = [e for e in errors if e[0] > restarted]
    assert after == [], f"no errors when the node comes back: {after[:5]}"
    # back in use: a key of the victim written now lands on it
    key = next(f"back{i}" for i in range(1000) if cluster.owner(f"back{i}") is victim)
    r = router.raw()
    wait_until(lambda: r.store("set", key, "x") == "STORED" and
               McRaw(victim.host, victim.port).meta(f"mg {key}").code == "HD",
               timeout=5, message="the restarted node back in use")


def test_multiget_over_nodes_all_down_fails_at_once(start_server, start_router):
    nodes = [start_server() for _ in range(2)]
    router, _, _ = start_router(nodes, "-t", "1", "--probe-ms", "10000", "--retry-ms", "50")
    r = router.raw()
    keys = [f"z{i}" for i in range(20)]
    for n in nodes:
        n.proc.kill()
        n.proc.wait()
    wait_until(lambda: r.cmd(f"get {' '.join(keys)}").endswith("is down"), timeout=5,
               message="both nodes marked down")
    for _ in range(20):  # every fragment fails inside the request's own dispatch
        assert r.cmd(f"get {' '.join(keys)}").endswith("is down")
    assert r.cmd("version").startswith("VERSION")
    for n in nodes:
        restart_server(n)


def test_an_idle_router_probes_a_down_node_every_probe_ms(start_server, start_router):
    """With nothing else to do, a worker still probes a node marked down every --probe-ms: it
    must not sleep past the probe (it used to block in epoll_wait for a second when no request
    was in flight, so the node stayed down that long after it answered again)."""
    node = start_server()
    router, admin, _ = start_router([node], "-t", "1", "--probe-ms", "20", "--down-after", "1")

    def connect_failures():
        status, body = http(admin, "GET", "/metrics")
        assert status == 200, body
        return int(re.search(r"^shoal_router_upstream_connect_failures_total (\d+)$", body, re.M)[1])

    with router.raw() as r:
        assert r.cmd("get k") == "END"
        node.proc.kill()
        node.proc.wait()
        wait_until(lambda: "is down" in r.cmd("get k"), message="the node marked down")
    # each probe of the dead node is a refused connect; none is asked for by a client
    start = connect_failures()
    try:
        wait_until(lambda: connect_failures() >= start + 10, timeout=1.5, interval=0.02,
                   message="10 probes 20 ms apart")
    finally:
        restart_server(node)  # the fixture expects every node alive at the end
