"""shoal-router in front of three real shoal-nodes: keys land on their slot's node, multi-gets are
split and merged in order, text and meta commands (noreply, q, O, leases) pass through with the
node's semantics, replies keep request order under pipelining, and pymemcache works unchanged.
Skipped when SHOAL_TEST_SERVER=memcached (the nodes must be shoal-nodes)."""

import json
import re
import socket
import subprocess
import threading
import time

import pytest

from conftest import ROUTER_BIN, key_slot, topology
from fakenode import FakeNode
from mcraw import McRaw, free_port, http, wait_until

pytestmark = pytest.mark.shoal_only


def node_has(node, key):
    with McRaw(node.host, node.port) as c:
        return c.meta(f"mg {key} v").code == "VA"


# --- routing ----------------------------------------------------------------------------------------

def test_every_key_lands_on_its_slot_node(cluster):
    r = cluster.raw()
    keys = [f"user:{i}" for i in range(300)] + [f"k{i}" for i in range(100)]
    for k in keys:
        assert r.store("set", k, k) == "STORED"
    per_node = [0, 0, 0]
    for k in keys:
        owner = cluster.owner(k)
        holders = [i for i, n in enumerate(cluster.nodes) if node_has(n, k)]
        assert holders == [cluster.nodes.index(owner)], \
            f"{k} (slot {key_slot(k)}) must be on node {cluster.nodes.index(owner)} only, found on {holders}"
        per_node[holders[0]] += 1
    assert all(n > 50 for n in per_node), f"keys spread over all three nodes: {per_node}"


def test_hash_tag_keys_share_a_node(cluster):
    r = cluster.raw()
    for part in ("cart", "profile", "feed", "x"):
        assert r.store("set", f"{{u:42}}:{part}", part) == "STORED"
    owner = cluster.owner("u:42")
    for part in ("cart", "profile", "feed", "x"):
        assert node_has(owner, f"{{u:42}}:{part}"), "keys with one hash tag live on its node"


# --- fan-out ----------------------------------------------------------------------------------------

def test_multiget_across_nodes_returns_values_in_key_order(cluster):
    r = cluster.raw()
    keys = [f"m{i}" for i in range(40)]
    assert len({cluster.nodes.index(cluster.owner(k)) for k in keys}) == 3
    for i, k in enumerate(keys):
        if i % 3 != 1:  # every third key stays a miss
            r.store("set", k, f"value-{i}", flags=i)
    got = r.get(*keys)
    want = [(k, i, f"value-{i}".encode(), None) for i, k in enumerate(keys) if i % 3 != 1]
    assert got == want, "hits come back in the order asked, misses left out"


def test_multiget_gets_and_duplicates(cluster):
    r = cluster.raw()
    keys = ["a", "b", "c", "d", "e", "f"]
    for k in keys:
        r.store("set", k, k * 3)
    got = r.get("f", "a", "f", "zz", "c", cmd="gets")
    assert [g[0] for g in got] == ["f", "a", "f", "c"]
    assert all(g[3] is not None for g in got), "gets returns a CAS for every hit"
    assert got[0][3] == got[2][3]


def test_gat_multi_node(cluster):
    r = cluster.raw()
    for k in ("g1", "g2", "g3", "g4", "g5"):
        r.store("set", k, "v")
    got = r.get("100", "g1", "g2", "g3", "g4", "g5", cmd="gat")
    assert [g[0] for g in got] == ["g1", "g2", "g3", "g4", "g5"]
    assert r.meta("mg g3 t").flags["t"] in ("100", "99"), "gat set the new TTL on the node"


def test_pipeline_replies_keep_request_order(cluster):
    r = cluster.raw()
    n = 500
    batch = b""
    for i in range(n):
        batch += f"set p{i} 0 0 {len(str(i))}\r\n{i}\r\n".encode()
        batch += f"get p{i} p{(i * 7) % n}\r\n".encode() if i % 2 else f"mg p{i} v\r\n".encode()
    batch += b"mn\r\n"
    r.send(batch)
    for i in range(n):
        assert r.read_line() == "STORED"
        if i % 2:
            items = r.read_get_reply()
            assert items[0][0] == f"p{i}" and items[0][2] == str(i).encode()
        else:
            m = r.read_meta()
            assert m.code == "VA" and m.value == str(i).encode(), f"reply {i} in order: {m}"
    assert r.read_line() == "MN"


def test_many_clients_in_parallel(cluster):
    errors = []

    def run(t):
        try:
            c = cluster.raw()
            for i in range(200):
                k = f"t{t}:{i}"
                assert c.store("set", k, f"{t}-{i}") == "STORED"
                assert c.get(k) == [(k, 0, f"{t}-{i}".encode(), None)]
        except Exception as e:  # collected for the main thread
            errors.append(repr(e))

    threads = [threading.Thread(target=run, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# --- text commands ----------------------------------------------------------------------------------

def test_text_storage_and_arith_commands(cluster):
    r = cluster.raw()
    assert r.store("add", "t", "1") == "STORED"
    assert r.store("add", "t", "1") == "NOT_STORED"
    assert r.store("replace", "t", "5") == "STORED"
    assert r.store("append", "t", "0") == "STORED"
    assert r.store("prepend", "t", "1") == "STORED"
    assert r.get("t") == [("t", 0, b"150", None)]
    assert r.cmd("incr t 7") == "157"
    assert r.cmd("decr t 100") == "57"
    cas = r.get("t", cmd="gets")[0][3]
    assert r.store("cas", "t", "x", extra=str(cas + 1)) == "EXISTS"
    assert r.store("cas", "t", "y", extra=str(cas)) == "STORED"
    assert r.cmd("touch t 100") == "TOUCHED"
    assert r.cmd("delete t") == "DELETED"
    assert r.cmd("delete t") == "NOT_FOUND"
    assert r.cmd("incr t 1") == "NOT_FOUND"
    assert r.cmd("version").startswith("VERSION 1.6.18-shoal-router")


def test_noreply_is_silent_and_in_order(cluster):
    r = cluster.raw()
    r.send(b"set nr 0 0 1 noreply\r\na\r\nappend nr 0 0 1 noreply\r\nb\r\n"
           b"delete nothere noreply\r\nincr nr 1 noreply\r\nget nr\r\n")
    assert r.read_get_reply() == [("nr", 0, b"ab", None)], "noreply commands sent nothing back"


def test_flush_all_reaches_every_node(cluster):
    r = cluster.raw()
    keys = [f"f{i}" for i in range(30)]
    for k in keys:
        r.store("set", k, "v")
    assert r.cmd("flush_all") == "OK"
    assert r.get(*keys) == []
    for n in cluster.nodes:
        assert all(not node_has(n, k) for k in keys)


def ns_nodes(start_server, tmp_path, n, names=("catalog", "users")):
    """n shoal-nodes that each have the namespaces `names`."""
    f = tmp_path / "ns.json"
    f.write_text(json.dumps({"namespaces": {k: {} for k in names}}))
    return [start_server("--namespaces", str(f)) for _ in range(n)]


def two_pool_router(start_router, nodes):
    """catalog on pool a (nodes 0, 1), users and default on pool b (node 2)."""
    doc = {"version": 1,
           "pools": {"a": {"nodes": [f"127.0.0.1:{n.port}" for n in nodes[:2]]},
                     "b": {"nodes": [f"127.0.0.1:{nodes[2].port}"]}},
           "namespaces": {"default": {"pool": "b"}, "catalog": {"pool": "a"},
                          "users": {"pool": "b"}}}
    return start_router(doc)[0]


def test_flush_ns_reaches_every_node_of_the_namespaces_pool_only(start_server, start_router,
                                                                  tmp_path):
    nodes = ns_nodes(start_server, tmp_path, 3)
    router = two_pool_router(start_router, nodes)
    r = router.raw()
    keys = [f"catalog:{i}" for i in range(40)]
    others = [f"users:{i}" for i in range(20)]
    for k in keys + others:
        assert r.store("set", k, "v") == "STORED"
    assert {i for i in (0, 1) for k in keys if node_has(nodes[i], k)} == {0, 1}, \
        "the namespace's keys are spread over both nodes of its pool"
    # a users key stored on pool a's nodes directly: flush_ns users must not reach them
    with McRaw(nodes[0].host, nodes[0].port) as c:
        assert c.store("set", "users:direct", "v") == "STORED"
    assert r.cmd("flush_ns catalog") == "OK"
    assert r.get(*keys) == []
    assert all(not node_has(n, k) for n in nodes[:2] for k in keys)
    assert sorted(k for k, *_ in r.get(*others)) == sorted(others)
    assert r.cmd("flush_ns users") == "OK"
    assert r.get(*others) == []
    assert node_has(nodes[0], "users:direct"), "flush_ns users went to a node outside its pool"


def test_flush_ns_through_the_router_noreply_and_errors(start_server, start_router, tmp_path):
    nodes = ns_nodes(start_server, tmp_path, 3)
    router = two_pool_router(start_router, nodes)
    r = router.raw()
    assert r.store("set", "catalog:1", "v") == "STORED"
    assert r.cmd("flush_ns nosuch") == "CLIENT_ERROR unknown namespace"
    assert r.cmd("flush_ns catalog extra") == "CLIENT_ERROR bad command line format"
    assert [k for k, *_ in r.get("catalog:1")] == ["catalog:1"]
    r.send(b"flush_ns catalog noreply\r\nget catalog:1\r\n")
    assert r.read_get_reply() == []


def test_protocol_errors_are_answered_by_the_router(cluster):
    r = cluster.raw()
    assert r.cmd("bogus") == "ERROR"
    assert r.cmd("get " + "k" * 251) == "CLIENT_ERROR bad command line format"
    assert r.store("set", "big", b"x" * (1024 * 1024 + 1)) == "SERVER_ERROR object too large for cache"
    assert r.cmd("version").startswith("VERSION"), "the connection survives and stays in sync"


def test_stats_without_arguments_has_the_routers_own_figures(cluster):
    st = cluster.raw().stats()
    assert st["version"].endswith("shoal-router-" + st["version"].split("-")[-1])
    assert st["pid"] == str(cluster.router.proc.pid)
    for name in ("uptime", "curr_connections", "topology_version", "router_cmd_get",
                 "upstream_requests", "nodes_answered"):
        assert name in st, name


def router_option_names():
    """Every option `shoal-router --help` lists, as the table names it (dashes as underscores),
    but --config (the topology file), --options (the options file) and --help/--version."""
    out = subprocess.run([str(ROUTER_BIN), "--help"], capture_output=True, text=True).stdout
    names = {m.replace("-", "_") for m in re.findall(r"--([a-z][a-z0-9-]*)", out)}
    return names - {"config", "options", "help", "version"}


def test_stats_settings_lists_every_router_option(start_server, start_router):
    node = start_server()
    router, admin, _ = start_router([node], "-t", "1", "--timeout-ms", "1234", "--line-max", "2k")
    st = router.raw().stats("settings")
    assert router_option_names() <= set(st), "one STAT line per option, from the options table"
    assert st["maxconns"] == st["conn_limit"] and st["tcpport"] == str(router.port), \
        "memcached's names too (docs/router.md)"
    assert st["port"] == str(router.port) and st["admin_port"] == str(admin)
    assert st["threads"] == "1" and st["timeout_ms"] == "1234"
    assert st["line_max"] == "2048" and st["item_max"] == str(1 << 20), "sizes in bytes"
    assert st["listen"] == "127.0.0.1" and st["verbose"] == "0"
    assert st["port_file"] == "NULL", "a text option not given"


def test_options_file(start_server, start_router, tmp_path):
    """--options FILE sets any option from `name = value` lines; the command line wins; a bad
    line stops the router at start with a message naming the file, the line and the option."""
    node = start_server()
    opts = tmp_path / "router.conf"
    opts.write_text("# a sidecar's settings\nupstream_conns = 2\ntimeout_ms = 777\nline_max = 2k\n")
    router, _, path = start_router([node], "--options", str(opts), "--line-max", "4k")
    st = router.raw().stats("settings")
    assert st["upstream_conns"] == "2" and st["timeout_ms"] == "777", "taken from the file"
    assert st["line_max"] == "4096", "the command line wins over the file"
    assert router.client().set("k", b"v") and router.client().get("k") == b"v"

    bad = tmp_path / "bad.conf"
    bad.write_text("threads = 1\nthreadz = 2\n")
    run = subprocess.run([str(ROUTER_BIN), f"--options={bad}", "--config", str(path), "-p", "0"],
                         capture_output=True, text=True, timeout=10)
    assert run.returncode == 2
    assert str(bad) in run.stderr and "line 2" in run.stderr and "threadz" in run.stderr, run.stderr


def test_stats_about_a_nodes_own_settings_is_refused_naming_it(cluster):
    r = cluster.raw()
    assert r.store("set", "k", b"v") == "STORED"
    for arg in ("sizes_enable", "sizes_disable", "namespaces"):
        line = r.cmd(f"stats {arg}")
        assert line.startswith("CLIENT_ERROR "), f"stats {arg}: {line}"
        assert f"stats {arg.split()[0]}" in line, f"names what was asked: {line}"
        assert "node" in line, f"says where to ask: {line}"
    assert r.cmd("stats bogus") == "ERROR", "an unknown subcommand: ERROR, as memcached 1.6.18"
    assert r.cmd("stats settingsx") == "ERROR"
    r.send(b"stats reset\r\nstats settings\r\nstats\r\nstats items\r\nversion\r\n")
    assert r.read_line() == "RESET", "stats reset goes to every node (test_router_stats.py)"
    assert r.read_until(b"END\r\n").count(b"STAT ") > len(router_option_names())
    assert b"STAT pid " in r.read_until(b"END\r\n")
    assert b"STAT items:" in r.read_until(b"END\r\n")
    assert r.read_line().startswith("VERSION"), "pipelined: in order, in sync"


def test_quit_after_pending_replies(cluster):
    r = cluster.raw()
    r.store("set", "qk", "v")
    r.send(b"get qk\r\nquit\r\n")
    assert r.read_get_reply() == [("qk", 0, b"v", None)]
    assert r.is_closed()


# --- meta commands ----------------------------------------------------------------------------------

def test_meta_commands_pass_through(cluster):
    r = cluster.raw()
    assert r.meta("ms mk 2 T100 F7", b"hi").line == "HD"
    m = r.meta("mg mk v f t k O99")
    assert m.code == "VA" and m.value == b"hi"
    assert m.flags["f"] == "7" and m.flags["k"] == "mk" and m.flags["O"] == "99"
    assert r.meta("ma mk").code == "CLIENT_ERROR"  # non-numeric
    assert r.meta("ms n 1", b"5").line == "HD"
    assert r.meta("ma n D3 v").value == b"8"
    assert r.meta("md mk").line == "HD"
    assert r.meta("mg mk v").line == "EN"
    assert r.meta("me n").code in ("ME", "EN")


def test_meta_quiet_mode_and_mn(cluster):
    r = cluster.raw()
    r.send(b"mg q1 v q O1\r\nms q2 1 q\r\nx\r\nmg q2 v q O2\r\nmd q3 q O3\r\nmd q2 q\r\n"
           b"mg q2 v q k\r\nmn\r\n")
    # Only the hit and the delete miss (NF is not hidden) come back, then MN.
    assert r.read_meta().line == "VA 1 O2" and True
    assert r.read_line() == "NF O3"
    assert r.read_line() == "MN"


def test_quiet_ma_answers_a_created_counter_and_hides_a_hit(cluster):
    # memcached answers ma under q when N creates the counter, and hides a hit (HD or VA); only
    # the node can tell the two apart, so the router must not decide by the reply code
    r = cluster.raw()
    r.send(b"ma qa N0 J5 q O1\r\nma qa q O2\r\nma qa q v O3\r\nma qb q O4\r\n"
           b"ma qc N0 J7 q v\r\nmn\r\n")
    assert r.read_line() == "HD O1", "a counter N created is answered under q"
    assert r.read_line() == "NF O4", "a miss is not hidden; the hits before it are"
    created = r.read_meta()
    assert created.line == "VA 1" and created.value == b"7"
    assert r.read_line() == "MN"
    assert r.meta("mg qa v").value == b"7", "the hidden hits were applied"


def test_lease_through_router(cluster):
    a, b = cluster.raw(), cluster.raw()
    win = a.meta("mg lk v c N30")
    assert "W" in win.flags, f"the first miss wins the lease: {win.line}"
    wait = b.meta("mg lk v c N30")
    assert "Z" in wait.flags and "W" not in wait.flags, f"the second sees Z: {wait.line}"
    assert a.meta(f"ms lk 3 C{win.cas}", b"new").line == "HD"
    assert b.meta("mg lk v").value == b"new"


def test_base64_key_routes_by_decoded_key(cluster):
    import base64
    r = cluster.raw()
    key = "b64:key"
    enc = base64.b64encode(key.encode()).decode()
    assert r.meta(f"ms {enc} 1 b", b"z").line == "HD"
    assert node_has(cluster.owner(key), key)


# --- clients ----------------------------------------------------------------------------------------

def test_pymemcache_through_router(cluster):
    mc = cluster.client()
    assert mc.set("py:a", b"1")
    mc.set_many({f"py:{i}": str(i).encode() for i in range(50)})
    got = mc.get_many([f"py:{i}" for i in range(50)] + ["py:none"])
    assert got == {f"py:{i}": str(i).encode() for i in range(50)}
    assert mc.incr("py:7", 3) == 10
    v, cas = mc.gets("py:8")
    assert mc.cas("py:8", b"x", cas)
    assert mc.get("py:8") == b"x"
    assert mc.delete("py:8")
    assert mc.get("py:8") is None
    assert mc.touch("py:9", 100)
    assert mc.add("py:9", b"no") is False


# --- admin and failures -----------------------------------------------------------------------------

def test_admin_healthz_metrics_topology(cluster):
    assert http(cluster.admin_port, "GET", "/healthz")[0] == 200
    cluster.raw().get("x", "y", "z")
    status, body = http(cluster.admin_port, "GET", "/metrics")
    assert status == 200
    assert "shoal_router_topology_version 1" in body
    assert "shoal_router_upstream_requests" in body
    assert "_total_total" not in body, "a counter named ..._total gets no second suffix"
    assert any(line.startswith("shoal_router_conns_total ") and int(line.split()[1]) >= 1
               for line in body.splitlines())
    assert cluster.version() == 1
    for n in cluster.nodes:  # per-node figures, for every node of the topology
        label = f'node="127.0.0.1:{n.port}"'
        assert f"shoal_router_node_down{{{label}}} 0" in body
        assert f'shoal_router_node_latency_us{{{label},quantile="0.99"}}' in body
    assert sum(int(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line.startswith("shoal_router_node_requests{")) >= 1


def metric(body, name, label):
    """The value of series name{label} in Prometheus text (None when absent)."""
    for line in body.splitlines():
        if line.startswith(f"{name}{{{label}}} "):
            return int(line.rsplit(" ", 1)[1])
    return None


def test_metrics_per_pool_and_namespace(start_server, start_router):
    live = start_server()
    dead_port = free_port()  # nothing listens there
    doc = topology([live])
    doc["pools"]["cold"] = {"nodes": [f"127.0.0.1:{dead_port}"]}
    doc["namespaces"]["a"] = {"pool": "main", "max_value_bytes": 10}
    doc["namespaces"]["b"] = {"pool": "cold"}
    router, admin, _ = start_router(doc, "--down-after", "1")
    r = router.raw()
    for i in range(5):
        assert r.store("set", f"a:k{i}", "v") == "STORED"
    assert r.store("set", "a:big", "x" * 11).startswith("SERVER_ERROR"), "over max_value_bytes"
    assert r.get("a:k1") == [("a:k1", 0, b"v", None)]
    for i in range(3):
        assert r.cmd(f"get b:k{i}").startswith("SERVER_ERROR"), "the cold pool's node is dead"
    status, body = http(admin, "GET", "/metrics")
    assert status == 200
    ns_a, ns_b = 'namespace="a"', 'namespace="b"'
    assert metric(body, "shoal_router_namespace_requests", ns_a) == 7, "refused one included"
    assert metric(body, "shoal_router_namespace_limit_refusals", ns_a) == 1
    assert metric(body, "shoal_router_namespace_errors", ns_a) == 0
    assert metric(body, "shoal_router_namespace_requests", ns_b) == 3
    assert metric(body, "shoal_router_namespace_errors", ns_b) == 3
    assert metric(body, "shoal_router_namespace_limit_refusals", ns_b) == 0
    assert metric(body, "shoal_router_namespace_timeouts", ns_b) == 0
    assert metric(body, "shoal_router_namespace_requests", 'namespace="default"') == 0
    main, cold = 'pool="main"', 'pool="cold"'
    assert metric(body, "shoal_router_pool_requests", main) == 6, "the refused set never left"
    assert metric(body, "shoal_router_pool_errors", main) == 0
    assert metric(body, "shoal_router_pool_nodes_up", main) == 1
    assert metric(body, "shoal_router_pool_nodes_down", main) == 0
    assert metric(body, "shoal_router_pool_requests", cold) == 3
    assert metric(body, "shoal_router_pool_errors", cold) == 3
    assert metric(body, "shoal_router_pool_timeouts", cold) == 0
    assert metric(body, "shoal_router_pool_nodes_down", cold) == 1, "--down-after 1"
    assert metric(body, "shoal_router_pool_nodes_up", cold) == 0
    # A reload that keeps pools and namespaces in place (a new limit) keeps their series.
    doc["version"] = 2
    doc["namespaces"]["a"]["max_value_bytes"] = 20
    assert http(admin, "PUT", "/v1/topology", doc)[0] == 200
    assert r.store("set", "a:k9", "v") == "STORED"
    body = http(admin, "GET", "/metrics")[1]
    assert metric(body, "shoal_router_namespace_requests", ns_a) == 8
    assert metric(body, "shoal_router_pool_requests", main) == 7
    assert metric(body, "shoal_router_namespace_errors", ns_b) == 3


def test_unreachable_node_answers_server_error(start_router):
    port = free_port()  # nothing listens there
    router, _, _ = start_router([f"127.0.0.1:{port}"])
    r = router.raw()
    line = r.cmd("get k")
    assert line.startswith("SERVER_ERROR") and f"127.0.0.1:{port}" in line, line
    assert r.cmd("version").startswith("VERSION")


def test_silent_node_times_out_with_server_error(start_router):
    lst = socket.socket()
    lst.bind(("127.0.0.1", free_port()))
    lst.listen(16)  # accepts (kernel backlog) but never answers
    try:
        router, _, _ = start_router([f"127.0.0.1:{lst.getsockname()[1]}"], "--timeout-ms", "200")
        r = router.raw()
        r.send(b"get k1\r\nmg k2 v\r\nversion\r\n")
        first = r.read_line(timeout=3)
        assert first.startswith("SERVER_ERROR") and "timed out after 200 ms" in first, first
        assert r.read_line(timeout=3).startswith("SERVER_ERROR")
        assert r.read_line().startswith("VERSION"), "the router answers in order after a timeout"
        assert int(r.stats()["window_shrinks"]) >= 1, "a timeout halves the node's window"
    finally:
        lst.close()


def test_large_values_and_multiget(cluster):
    r = cluster.raw()
    big = {f"big{i}": bytes([65 + i]) * (300_000 + i) for i in range(6)}
    for k, v in big.items():
        assert r.store("set", k, v) == "STORED"
    got = r.get(*big)
    assert [(g[0], g[2]) for g in got] == list(big.items())


def test_window_of_one_still_answers_a_deep_pipeline(start_server, start_router):
    nodes = [start_server() for _ in range(2)]
    router, _, _ = start_router(nodes, "--upstream-window", "1", "--upstream-conns", "2")
    r = router.raw()
    n = 300
    r.send(b"".join(f"set w{i} 0 0 1 noreply\r\nx\r\nget w{i} w{i + 1}\r\n".encode()
                    for i in range(n)))
    for i in range(n):
        got = r.read_get_reply()
        assert [g[0] for g in got] == [f"w{i}"], f"request {i}: {got}"


def test_client_leaving_with_requests_in_flight(cluster):
    for _ in range(20):
        c = McRaw(cluster.router.host, cluster.router.port)
        c.send(b"".join(f"set gone{i} 0 0 1\r\nx\r\nget gone{i} a b c d e\r\n".encode()
                        for i in range(200)))
        c.close()
    r = cluster.raw()
    assert r.store("set", "after", "1") == "STORED", "the router serves on"
    assert r.get("after") == [("after", 0, b"1", None)]


def test_garbage_never_crashes_the_router(cluster):
    import random
    rnd = random.Random(4)
    pieces = [b"get ", b"set ", b"mg ", b"ms ", b"md ", b"ma ", b"mn", b"gat ", b"k", b" ", b"q",
              b"O1", b"noreply", b"\r\n", b"\n", b"0", b"5", b"-1", b"{", b"}", b":", b"\x00",
              b"\xff", b"b", b"v", b"N30", b"flush_all", b"incr", b"cas ", b"T", b"9" * 30]
    for _ in range(30):
        c = McRaw(cluster.router.host, cluster.router.port, timeout=2)
        blob = b"".join(rnd.choice(pieces) for _ in range(rnd.randint(1, 400)))
        try:
            c.send(blob + b"\r\n")
        except OSError:
            pass
        c.close()
    r = cluster.raw()
    assert r.cmd("version").startswith("VERSION")
    keys = [f"many{i}" for i in range(3000)]
    r.send(b"".join(f"set {k} 0 0 1 noreply\r\nx\r\n".encode() for k in keys))
    got = r.get(*keys)
    assert [g[0] for g in got] == keys, "a 3000-key get across nodes comes back whole and in order"


def test_clients_resetting_while_their_node_is_down(start_router):
    """Requests to a refused node fail at once, inside the same event-loop batch that reads
    them; a client that resets its connection meanwhile must be freed exactly once."""
    import struct
    port = free_port()  # nothing listens there
    router, _, _ = start_router([f"127.0.0.1:{port}"], "--retry-ms", "10000")
    for _ in range(100):
        s = socket.create_connection((router.host, router.port))
        s.sendall(b"get k\r\n" * 200)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # RST
    for _ in range(50):  # half-close: answered, then closed by the router
        s = socket.create_connection((router.host, router.port))
        s.sendall(b"get k\r\n" * 20)
        s.shutdown(socket.SHUT_WR)
        s.settimeout(5)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.close()
        assert data.count(b"SERVER_ERROR") == 20
    r = router.raw()
    assert r.cmd("get k").startswith("SERVER_ERROR")


def test_a_clients_pipeline_keeps_its_order_over_several_node_connections(start_server,
                                                                           start_router):
    """With --upstream-conns 4 a client's requests to a node all travel on one connection: a
    node runs a connection's requests in order but not across connections, so a get pipelined
    behind a set of the same key must see that set. (Spread by least load, almost every get
    overtook its set.)"""
    node = start_server()
    router, _, _ = start_router([node], "--upstream-conns", "4", "-t", "1")
    stale = []
    with McRaw(router.host, router.port) as r, McRaw(router.host, router.port) as other:
        other.send(b"".join(f"get o{i}\r\n".encode() for i in range(200)))  # load on the others
        for b in range(20):
            vals = range(b * 100, b * 100 + 100)
            r.send(b"".join(f"set k 0 0 {len(str(i))}\r\n{i}\r\nget k\r\n".encode() for i in vals))
            for i in vals:
                assert r.read_line() == "STORED"
                got = r.read_get_reply()
                if got[0][2] != str(i).encode():
                    stale.append((i, got[0][2]))
        for _ in range(200):
            assert other.read_get_reply() == []
    assert not stale, f"{len(stale)} of 2000 gets saw an older value, e.g. {stale[:3]}"


class OneKeyStoreNode(FakeNode):
    """A node that, like shoal-node, runs each connection's requests in order but connections
    independently: `set KEY <ms> 0 N` stores its value <ms> milliseconds (its flags) after it
    arrives, and answers; `get` answers at once. It remembers the connection each get came on."""

    def __init__(self):
        self.data, self.conn_of, self.local = {}, {}, threading.local()
        super().__init__()

    def _serve(self, conn):
        self.local.conn = conn
        super()._serve(conn)

    def answer(self, line, rest):
        w = line.split()
        if w[0] == b"set":
            n = int(w[4])
            if len(rest) < n + 2:
                return None
            time.sleep(int(w[2]) / 1000)
            self.data[w[1]] = rest[:n]
            return b"STORED\r\n", rest[n + 2:]
        if w[0] == b"get":
            self.conn_of[w[1]] = self.local.conn
            return b"".join(b"VALUE %s 0 %d\r\n%s\r\n" % (k, len(self.data[k]), self.data[k])
                            for k in w[1:] if k in self.data) + b"END\r\n", rest
        return (b"VERSION one\r\n" if w[0] == b"version" else b"ERROR\r\n"), rest


def test_a_clients_pipeline_keeps_its_order_while_its_connection_is_down(start_router):
    """With --upstream-conns 3, while a client's own connection to a node cannot be reopened
    (its connect was refused; --retry-ms), another connection stands in for it, and when it is
    back the client returns to it. Neither may let a get overtake the set before it: all of the
    client's requests in flight on the node must be on one connection."""
    node = OneKeyStoreNode()
    try:
        router, _, _ = start_router([node.addr], "-t", "1", "--upstream-conns", "3",
                                    "--retry-ms", "800", "--down-after", "1000",
                                    "--timeout-ms", "5000")
        with McRaw(router.host, router.port) as r:
            assert r.get("own") == []  # opens the three connections; the client's own takes it
            # Closing the listener resets connections the node has not accepted yet: wait until
            # all three are, or the stand-ins die with it (seen on the SAN build).
            wait_until(lambda: len(node.conns) == 3, message="the node accepted 3 connections")
            node.stop_listening()
            node.conn_of[b"own"].shutdown(socket.SHUT_RDWR)
            # its own connection failed and cannot be reopened (each reply is one line here)
            wait_until(lambda: "Connection refused" in r.cmd("get x"), message="a refused connect")
            # while another stands in: a set (stored 300 ms after it arrives), then its get; and
            # a set still in flight on the stand-in when the client's own connection is back
            r.send(b"set a 300 0 1\r\n1\r\nget a\r\nset b 2000 0 1\r\n1\r\n")
            node.listen_again()
            time.sleep(0.9)  # past --retry-ms: the next request may reopen the own connection
            r.send(b"get b\r\n")
            assert r.read_line() == "STORED"
            assert r.read_get_reply() == [("a", 0, b"1", None)]
            assert r.read_line() == "STORED"
            assert r.read_get_reply() == [("b", 0, b"1", None)]
    finally:
        node.close()
