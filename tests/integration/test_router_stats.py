"""test_router_stats.py — stats and key dumps through shoal-router.

The router asks every node of its topology and answers as one memcached would: `stats`,
`stats items`, `stats slabs` and `stats detail dump` summed over the nodes (the process's own
figures being the router's), key dumps (`lru_crawler metadump`, `stats cachedump`) listing
every key of every node with one END. Each test runs with memcached 1.6.18 nodes and with
shoal-node nodes; a command shoal-node does not answer yet skips the shoal case.
"""

import shutil
import socket
import subprocess
import urllib.parse

import pytest

import conftest
import test_stats_fields as fields
from conftest import RouterCluster, pause_server, resume_server, topology
from mcraw import free_port, wait_until

NODE_KINDS = ["memcached", "shoal"]

# memcached's `stats` counters that are the cache's, so the router's equals the nodes' sum
SUMMED = ("get_hits", "get_misses", "get_expired", "get_flushed", "curr_items", "total_items",
          "bytes", "limit_maxbytes", "evictions", "cmd_get", "cmd_set", "cmd_touch", "cmd_flush",
          "delete_hits", "delete_misses", "incr_hits", "incr_misses", "decr_hits", "decr_misses",
          "cas_hits", "cas_misses", "cas_badval", "touch_hits", "touch_misses", "reclaimed",
          "expired_unfetched", "evicted_unfetched")

KEYS = [f"k{i}" for i in range(40)] + ["ns:a", "ns:b", "user:1:cart"]


@pytest.fixture(params=NODE_KINDS)
def node_kind(request):
    return request.param


def make_cluster(kind, monkeypatch, start_server, start_router, *node_args):
    """Three nodes of `kind` and a router (300 ms timeout) in front of them."""
    monkeypatch.setattr(conftest, "SERVER_KIND", kind)
    nodes = [start_server(*node_args) for _ in range(3)]
    router, admin, path = start_router(topology(nodes), "--timeout-ms", "300", "--retry-ms", "50")
    c = RouterCluster(nodes, router, path, admin)
    c.kind = kind
    return c


@pytest.fixture
def rcluster(node_kind, monkeypatch, start_server, start_router):
    return make_cluster(node_kind, monkeypatch, start_server, start_router)


@pytest.fixture
def dcluster(node_kind, monkeypatch, start_server, start_router):
    """rcluster for the cachedump tests: memcached's cachedump lists a class's HOT LRU only,
    which its LRU maintainer empties into COLD as it goes, so what it lists changes from one
    moment to the next; without the maintainer (one LRU per class) it lists every item."""
    args = ("-o", "no_lru_maintainer") if node_kind == "memcached" else ()
    return make_cluster(node_kind, monkeypatch, start_server, start_router, *args)


def fill(r, touch=True):
    """Store KEYS through the router, read them and some misses: counters to sum. (memcached's
    metadump may miss an item touched a moment before: not for the dump tests.)"""
    for k in KEYS:
        assert r.store("set", k, b"v" * (len(k) + 3)) == "STORED"
    assert len(r.get(*KEYS)) == len(KEYS)
    assert r.get("missing1", "missing2", "missing3") == []
    assert r.cmd("delete k0") == "DELETED" and r.cmd("delete k0") == "NOT_FOUND"
    assert r.cmd("incr k1 1") == "CLIENT_ERROR cannot increment or decrement non-numeric value"
    if touch:
        assert r.cmd("touch k2 100") == "TOUCHED"
    return set(KEYS) - {"k0"}


def read_lines(r, timeout=10):
    """The reply's lines up to END (or a first line that is an error), without their line ends
    (memcached ends metadump's lines with a bare \\n)."""
    lines = []
    while True:
        line = r.read_until(b"\n", timeout=timeout).rstrip(b"\r\n").decode()
        if line == "END":
            return lines
        if not lines and not line.startswith(("STAT ", "ITEM ", "key=", "PREFIX ")):
            return [line]
        lines.append(line)


def node_answers(node, cmd):
    with node.raw() as n:
        n.send(cmd + "\r\n")
        return read_lines(n)


def skip_unless_nodes_answer(c, cmd):
    first = node_answers(c.nodes[0], cmd)
    if first and first[0].split(" ")[0] in ("ERROR", "CLIENT_ERROR"):
        pytest.skip(f"{c.kind} nodes answer {cmd!r} with {first[0]!r}")


def stat_lines(lines):
    return dict(line.split(" ", 2)[1:] for line in lines)


def metadump_keys(lines):
    return {urllib.parse.unquote(line.split(" ")[0][4:]) for line in lines}


def test_stats_sums_the_nodes_counters(rcluster):
    r = rcluster.raw()
    fill(r)
    st = r.stats()
    per_node = [n.raw().stats() for n in rcluster.nodes]
    common = [f for f in SUMMED if all(f in s for s in per_node)]
    assert {"get_hits", "get_misses", "curr_items", "cmd_set"} <= set(common)
    for f in common:
        assert int(st[f]) == sum(int(s[f]) for s in per_node), f
    assert int(st["curr_items"]) == len(KEYS) - 1 and int(st["get_misses"]) >= 3
    assert st["nodes_answered"] == "3" and st["nodes_total"] == "3"


def test_stats_keeps_the_routers_own_figures_under_one_name_each(rcluster):
    r = rcluster.raw()
    fill(r)
    r.send("stats\r\n")
    names = [line.split(" ")[1] for line in read_lines(r)]
    assert len(names) == len(set(names)), "no name twice"
    st = r.stats()
    assert st["pid"] == str(rcluster.router.proc.pid), "the process's figures are the router's"
    assert "shoal-router" in st["version"] and st["threads"] == "2"
    assert st["curr_connections"] == "1", "the router's clients, not its upstream connections"
    assert int(st["router_cmd_get"]) == len(KEYS) + 3, "the router's own count, renamed"
    assert "upstream_requests" in st and "topology_version" in st
    assert st["rusage_user"].count(".") == 1, "seconds.microseconds, as memcached"


def test_stats_items_and_slabs_sum_per_class(rcluster):
    r = rcluster.raw()
    fill(r)
    items, slabs = r.stats("items"), r.stats("slabs")
    node_items = [n.raw().stats("items") for n in rcluster.nodes]
    node_slabs = [n.raw().stats("slabs") for n in rcluster.nodes]
    numbers = {k for s in node_items for k in s if k.endswith(":number")}
    assert numbers
    for k in numbers:
        assert int(items[k]) == sum(int(s.get(k, 0)) for s in node_items), k
    assert sum(int(items[k]) for k in numbers) == len(KEYS) - 1
    for k in {k for s in node_slabs for k in s if k.endswith(":used_chunks")}:
        assert int(slabs[k]) == sum(int(s.get(k, 0)) for s in node_slabs), k
        size = k.replace("used_chunks", "chunk_size")
        assert slabs[size] == next(s[size] for s in node_slabs if size in s), "a class's size stays"
    assert int(slabs["total_malloced"]) == sum(int(s["total_malloced"]) for s in node_slabs)
    classes = [int(k.split(":")[1]) for k in items]
    assert classes == sorted(classes), "classes in order, as memcached lists them"


def test_metadump_lists_every_key_of_every_node_once(rcluster):
    skip_unless_nodes_answer(rcluster, "lru_crawler metadump all")
    r = rcluster.raw()
    keys = fill(r, touch=False)
    for arg in ("all", "hash"):
        r.send(f"lru_crawler metadump {arg}\r\n")
        lines = read_lines(r)
        assert sorted(metadump_keys(lines)) == sorted(keys), arg
        assert len(lines) == len(keys), "each key once"
    assert r.cmd("version").startswith("VERSION"), "one END: the connection stays in sync"


def test_metadump_sees_the_writes_pipelined_before_it(rcluster):
    """The dump goes on connections of its own to the nodes; sent right behind a client's set,
    it must still list that key (a review probe saw 6 dumps in 200 miss it)."""
    skip_unless_nodes_answer(rcluster, "lru_crawler metadump all")
    r = rcluster.raw()
    for i in range(100):
        r.send(f"set fresh{i} 0 0 1\r\nx\r\nlru_crawler metadump all\r\n")
        assert r.read_line() == "STORED"
        assert f"fresh{i}" in metadump_keys(read_lines(r)), f"dump {i} missed the set before it"


def cachedump_keys(conn):
    """Every key a cachedump of each class lists (memcached's lists a class's HOT LRU only)."""
    got = set()
    for cls in {k.split(":")[1] for k in conn.stats("items")}:
        conn.send(f"stats cachedump {cls} 1000\r\n")
        got |= {line.split(" ")[1] for line in read_lines(conn)}
    return got


def test_cachedump_lists_the_keys_of_every_node(dcluster):
    skip_unless_nodes_answer(dcluster, "stats cachedump 1 1")
    keys = fill(dcluster.raw(), touch=False)
    assert set().union(*(cachedump_keys(n.raw()) for n in dcluster.nodes)) == keys
    assert cachedump_keys(dcluster.raw()) == keys


def test_a_dump_larger_than_a_read_passes_through_whole(rcluster):
    skip_unless_nodes_answer(rcluster, "lru_crawler metadump all")
    r = rcluster.raw(timeout=20)
    keys = {f"bulk:{i:06d}:" + "x" * 150 for i in range(6000)}  # ~1.3 MB of dump lines
    r.send("".join(f"set {k} 0 0 1 noreply\r\nx\r\n" for k in keys))
    assert r.cmd("version").startswith("VERSION")
    r.send("lru_crawler metadump all\r\n")
    assert metadump_keys(read_lines(r, timeout=20)) == keys


def test_detail_dump_sums_each_prefix(rcluster):
    skip_unless_nodes_answer(rcluster, "stats detail dump")
    r = rcluster.raw()
    assert r.cmd("stats detail on") == "OK"
    fill(r)
    r.send("stats detail dump\r\n")
    mine = {line.split(" ")[1]: line for line in read_lines(r)}
    per_node = [node_answers(n, "stats detail dump") for n in rcluster.nodes]
    sums = {}
    for lines in per_node:
        for line in lines:
            t = line.split(" ")
            s = sums.setdefault(t[1], [0, 0, 0, 0])
            for i in range(4):
                s[i] += int(t[3 + 2 * i])
    assert set(mine) == set(sums) and "ns" in sums and "user" in sums
    for p, (g, h, s, d) in sums.items():
        assert mine[p] == f"PREFIX {p} get {g} hit {h} set {s} del {d}"
    assert r.cmd("stats detail off") == "OK"


def test_a_paused_node_leaves_an_answer_from_the_rest(rcluster):
    r = rcluster.raw()
    fill(r, touch=False)
    paused, rest = rcluster.nodes[0], rcluster.nodes[1:]
    rest_items = sum(int(n.raw().stats()["curr_items"]) for n in rest)
    dumps = node_answers(rest[0], "lru_crawler metadump all")
    can_dump = not dumps or dumps[0].startswith("key=")
    rest_keys = set().union(*(metadump_keys(node_answers(n, "lru_crawler metadump all"))
                              for n in rest)) if can_dump else set()
    pause_server(paused)
    try:
        st = r.stats()
        assert st["nodes_answered"] == "2" and st["nodes_total"] == "3"
        assert int(st["curr_items"]) == rest_items, "the nodes that answered, summed"
        items = r.stats("items")
        assert sum(int(v) for k, v in items.items() if k.endswith(":number")) == rest_items
        if can_dump:
            r.send("lru_crawler metadump all\r\n")
            assert metadump_keys(read_lines(r)) == rest_keys
    finally:
        resume_server(paused)


def test_every_node_down_answers_the_error_but_stats_still_answers(start_router):
    router, _, _ = start_router(topology([f"127.0.0.1:{free_port()}"]), "--timeout-ms", "300")
    r = router.raw()
    st = r.stats()
    assert st["nodes_answered"] == "0" and st["pid"] == str(router.proc.pid)
    for cmd in ("stats items", "stats slabs", "lru_crawler metadump all", "stats cachedump 1 1"):
        assert r.cmd(cmd).startswith("SERVER_ERROR shoal-router: node "), cmd


def test_subcommands_end_as_memcached_frames_them(start_server, start_router, monkeypatch):
    """Each reply the router gives a stats subcommand, an lru_crawler metadump or their malformed
    forms is memcached's own (or, where it lists something the router has not, an empty list),
    so a client waiting for its end never hangs; pipelined, they stay in order (a metadump too,
    which memcached refuses behind other commands: the router sends it on a connection of its
    own)."""
    monkeypatch.setattr(conftest, "SERVER_KIND", "memcached")
    nodes = [start_server() for _ in range(2)]
    router, _, _ = start_router(topology(nodes))
    same_as_memcached = ["stats detail on", "stats detail off", "stats detail", "stats detail x",
                         "stats cachedump", "stats cachedump 1", "stats cachedump x y",
                         "stats sizes", "lru_crawler metadump", "lru_crawler metadump 999",
                         "lru_crawler", "stats bogus"]
    r, m = router.raw(), nodes[0].raw()
    mine = {}
    for c in same_as_memcached:  # one at a time: memcached refuses a metadump pipelined
        m.send(c + "\r\n")
        mine[c] = read_lines(m)
    batch = "".join(c + "\r\n" for c in same_as_memcached) + "stats extstore\r\n"
    r.send(batch + "version\r\n")  # the router takes them pipelined
    for c in same_as_memcached:
        assert read_lines(r) == mine[c], c
    assert read_lines(r) == [], "stats extstore: END"
    assert r.read_line().startswith("VERSION")


def run_tool(*argv):
    if shutil.which(argv[0]) is None:
        pytest.skip(f"{argv[0]} is not installed (libmemcached-tools)")
    return subprocess.run(argv, capture_output=True, text=True, timeout=20)


def test_memcstat_through_the_router_sees_the_sums(rcluster):
    r = rcluster.raw()
    fill(r)
    out = run_tool("memcstat", f"--servers=127.0.0.1:{rcluster.router.port}")
    assert out.returncode == 0, out.stderr
    fields = dict(l.strip().split(": ", 1) for l in out.stdout.splitlines() if ": " in l)
    assert fields["curr_items"] == str(len(KEYS) - 1)
    assert fields["pid"] == str(rcluster.router.proc.pid)


def memcdump(port):
    out = run_tool("memcdump", f"--servers=127.0.0.1:{port}")
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_memcdump_through_the_router_lists_every_key(dcluster):
    skip_unless_nodes_answer(dcluster, "stats cachedump 1 1")
    keys = fill(dcluster.raw(), touch=False)
    assert set().union(*(memcdump(n.port) for n in dcluster.nodes)) == keys
    assert memcdump(dcluster.router.port) == keys


def test_a_dump_the_client_does_not_read_is_bounded_by_out_max(start_server, start_router,
                                                                  monkeypatch):
    """A client that does not read its dump costs the router at most --out-max: the rest is
    dropped and the reply ends with the router's error instead of END; the router carries on."""
    monkeypatch.setattr(conftest, "SERVER_KIND", "memcached")
    nodes = [start_server("-m", "128") for _ in range(2)]
    router, _, _ = start_router(topology(nodes), "--out-max", "65536")
    # ~12 MB of dump lines: more than the sockets' buffers between router and client take
    keys = [f"bulk:{i:06d}:" + "x" * 230 for i in range(40000)]
    with router.raw(timeout=20) as w:
        w.send("".join(f"set {k} 0 0 1 noreply\r\nx\r\n" for k in keys))
        assert w.cmd("version").startswith("VERSION")
    # memcached's own crawler, started in the background after many stores, would answer BUSY
    for n in nodes:
        wait_until(lambda: n.raw().stats()["lru_crawler_running"] == "0", timeout=10,
                   message="the node's LRU crawler idle")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", router.port))
    s.sendall(b"lru_crawler metadump all\r\n")
    r = router.raw()
    wait_until(lambda: int(r.stats()["replies_dropped"]) >= 1, timeout=10,
               message="the dump's rest dropped")
    s.settimeout(20)
    got = b""
    while not got.endswith(b"\r\n") or b"SERVER_ERROR" not in got[-200:]:
        chunk = s.recv(65536)
        assert chunk, "the router closed the connection"
        got += chunk
    s.close()
    assert got.endswith(b"SERVER_ERROR shoal-router: reply dropped: over --out-max bytes of "
                        b"replies are waiting for this client to read them\r\n")
    assert len(got) < 8 * 1024 * 1024, "--out-max and what the sockets' buffers took"
    assert b"END\r\n" not in got
    assert r.cmd("version").startswith("VERSION")


# -- stats settings, stats reset, stats conns and the exporter's scrape through the router -----

def test_stats_settings_names_memcacheds_settings_once(rcluster):
    """maxbytes is the nodes' memory summed (as limit_maxbytes in `stats`), item_size_max the
    largest item every node and the router take, the process's settings (maxconns, tcpport, ...)
    the router's; its own options follow under their own names, no name twice."""
    r = rcluster.raw()
    r.send("stats settings\r\n")
    names = [line.split(" ")[1] for line in read_lines(r)]
    assert len(names) == len(set(names)), "no name twice"
    st = r.stats("settings")
    per_node = [n.raw().stats("settings") for n in rcluster.nodes]
    assert int(st["maxbytes"]) == sum(int(s["maxbytes"]) for s in per_node)
    assert int(st["maxbytes"]) == int(r.stats()["limit_maxbytes"])
    assert int(st["item_size_max"]) == min([int(s["item_size_max"]) for s in per_node] + [1 << 20])
    assert st["maxconns"] == "4096" == st["conn_limit"], "the router's -c, under both names"
    assert st["tcpport"] == str(rcluster.router.port) and st["num_threads"] == "2"
    assert st["cas_enabled"] == "yes" and st["evictions"] == "on"
    assert st["upstream_window"] == "512", "the router's own options stay"


def test_stats_reset_resets_every_node_and_the_routers_counters(rcluster):
    r = rcluster.raw()
    fill(r)
    assert int(r.stats()["get_hits"]) > 0
    r.send("stats reset\r\nversion\r\n")
    assert r.read_line() == "RESET", "one RESET for all the nodes"
    assert r.read_line().startswith("VERSION"), "and nothing more"
    for n in rcluster.nodes:
        st = n.raw().stats()
        assert st["get_hits"] == "0" and st["get_misses"] == "0" and st["cmd_get"] == "0", n.port
    st = r.stats()
    assert st["get_hits"] == "0" and st["get_misses"] == "0"
    assert st["router_cmd_get"] == "0", "the router's own counters too"
    assert int(st["curr_items"]) == len(KEYS) - 1, "items stay"
    r.get("k1")
    assert r.stats()["get_hits"] == "1" and r.stats()["router_cmd_get"] == "1"


def test_stats_conns_lists_the_routers_clients(rcluster):
    """The router's own connections (a node's are the router's upstream connections)."""
    r, other = rcluster.raw(), rcluster.raw()
    assert other.cmd("version").startswith("VERSION")
    conns = fields.conns_by_fd(r)
    listen = f"tcp:{rcluster.router.host}:{rcluster.router.port}"
    assert [f["addr"] for f in conns.values() if f.get("state") == "conn_listening"] == [listen]
    clients = {f["addr"]: f for f in conns.values() if f.get("state") != "conn_listening"}
    assert set(clients) == {fields.sock_addr(r.sock), fields.sock_addr(other.sock)}
    assert clients[fields.sock_addr(r.sock)]["state"] == "conn_parse_cmd"
    assert clients[fields.sock_addr(other.sock)]["state"] == "conn_read"
    assert all(f["listen_addr"] == listen and f["secs_since_last_cmd"].isdigit()
               for f in clients.values())
    other.close()
    wait_until(lambda: len(fields.conns_by_fd(r)) == 2, timeout=5,
               message="the closed client gone from stats conns")


def test_the_exporters_scrape_parses_through_the_router(rcluster):
    """Every field the Prometheus exporter reads (docs/exporter.md) is in the router's `stats`,
    `stats settings`, `stats items` and `stats slabs`, in the form its parser takes."""
    r = rcluster.raw()
    fields.traffic(r)
    general, slabs, items = fields.exporter_stats(r)
    for key in fields.GENERAL_FLOAT + fields.SLABS_GLOBAL_FLOAT:
        fields.as_float(general, key)
    for key in fields.GENERAL_TIMEVAL:
        fields.as_timeval(general, key)
    assert general["version"]
    settings = fields.exporter_settings(r)
    for key in fields.SETTINGS_FLOAT:
        fields.as_float(settings, key)
    for key in fields.SETTINGS_BOOL:
        fields.as_bool(settings, key)
    assert items and slabs and set(items) <= set(slabs)
    for f in items.values():
        for key in fields.ITEMS_FLOAT:
            fields.as_float(f, key)
    for f in slabs.values():
        for key in fields.SLABS_FLOAT:
            fields.as_float(f, key)
