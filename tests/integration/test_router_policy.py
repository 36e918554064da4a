"""Namespace policies enforced by shoal-router: a namespace's default_ttl replaces a TTL of 0 and
its max_ttl clamps longer ones ("never" included), on every command that carries a TTL (text
storage commands, touch, gat/gats on every fragment of a split, ms T, mg T and N, ma N and T, md I
with T), and the gutter pool caps the same (checked on the nodes directly); max_value_bytes,
ops_per_sec and bytes_per_sec refuse requests with an error naming the namespace and the limit.
Skipped when SHOAL_TEST_SERVER=memcached."""

import threading
import time

import pytest

from conftest import RouterCluster, restart_server, topology
from mcraw import McRaw, wait_until

pytestmark = pytest.mark.shoal_only


@pytest.fixture
def pcluster(start_server, start_router):
    nodes = [start_server() for _ in range(3)]
    doc = topology(nodes)
    doc["namespaces"]["catalog"] = {"pool": "main", "default_ttl": 600, "max_ttl": 3600}
    doc["namespaces"]["short"] = {"pool": "main", "max_ttl": 60}
    doc["namespaces"]["lasting"] = {"pool": "main", "default_ttl": 600}  # no max_ttl
    router, admin, path = start_router(doc)
    return RouterCluster(nodes, router, path, admin)


def ttl_on(node, key):
    with McRaw(node.host, node.port) as c:
        r = c.meta(f"mg {key} t")
        assert r.code == "HD", f"{key} is on its node: {r.line}"
        return int(r.flags["t"])


def ttl_on_node(cluster, key):
    return ttl_on(cluster.owner(key), key)


def near(value, want):
    return want - 2 <= value <= want


def test_default_ttl_replaces_zero(pcluster):
    r = pcluster.raw()
    assert r.store("set", "catalog:a", "v") == "STORED"
    assert near(ttl_on_node(pcluster, "catalog:a"), 600)
    assert r.meta("ms catalog:m 1", b"v").line == "HD"
    assert near(ttl_on_node(pcluster, "catalog:m"), 600), "ms without T gets the default too"


def test_max_ttl_clamps(pcluster):
    r = pcluster.raw()
    assert r.store("set", "catalog:b", "v", exptime=99999) == "STORED"
    assert near(ttl_on_node(pcluster, "catalog:b"), 3600)
    assert r.store("add", "catalog:c", "v", exptime=int(time.time()) + 86400) == "STORED"
    assert near(ttl_on_node(pcluster, "catalog:c"), 3600), "absolute times are clamped too"
    r.send(b"ms catalog:d 1 T100000 q\r\nv\r\nmn\r\n")  # quiet: only MN comes back
    assert r.read_line() == "MN"
    assert near(ttl_on_node(pcluster, "catalog:d"), 3600)
    assert r.store("set", "catalog:a", "v", exptime=10) == "STORED"
    assert r.cmd("touch catalog:a 0") == "TOUCHED"
    assert near(ttl_on_node(pcluster, "catalog:a"), 600)
    assert r.meta("mg catalog:a T50000").line == "HD"
    assert near(ttl_on_node(pcluster, "catalog:a"), 3600)


def test_short_ttls_and_other_namespaces_stand(pcluster):
    r = pcluster.raw()
    r.send(b"set catalog:e 0 100 1 noreply\r\nv\r\n")
    assert r.store("set", "plain", "v") == "STORED"
    assert near(ttl_on_node(pcluster, "catalog:e"), 100)
    assert ttl_on_node(pcluster, "plain") == -1, "default namespace has no rules here"
    assert int(r.stats()["ttl_rewrites"]) == 0


DAY = 86400


def about(value, want):
    """An absolute time's TTL as the node reports it: its clock's second may differ from ours."""
    return abs(value - want) <= 2


def test_absolute_exptimes(pcluster):
    """memcached reads an exptime over 30 days as a unix time. One no rule clamps reaches the
    node as sent (it must not become a relative TTL over 30 days, read there as a 1970 time:
    expired at once); one past max_ttl becomes max_ttl; a past one stays expired."""
    r = pcluster.raw()
    far = int(time.time()) + 60 * DAY
    assert r.store("set", "lasting:a", "va", exptime=far) == "STORED"
    assert r.get("lasting:a") == [("lasting:a", 0, b"va", None)], "60 days ahead: a hit"
    assert about(ttl_on_node(pcluster, "lasting:a"), 60 * DAY)
    assert r.store("set", "lasting:b", "vb") == "STORED"
    assert r.cmd(f"touch lasting:b {far}") == "TOUCHED"
    assert about(ttl_on_node(pcluster, "lasting:b"), 60 * DAY), "touch"
    assert r.get(str(far), "lasting:a", "lasting:b", cmd="gat") == [
        ("lasting:a", 0, b"va", None), ("lasting:b", 0, b"vb", None)]
    assert about(ttl_on_node(pcluster, "lasting:b"), 60 * DAY), "gat"
    assert r.meta(f"ms lasting:m 1 T{far}", b"m").line == "HD"
    assert about(ttl_on_node(pcluster, "lasting:m"), 60 * DAY), "ms T"
    assert r.meta(f"mg lasting:v N{far} v").line == "VA 0 W"
    assert about(ttl_on_node(pcluster, "lasting:v"), 60 * DAY), "mg N"
    assert r.meta(f"mg lasting:m T{far + DAY} v").value == b"m"
    assert about(ttl_on_node(pcluster, "lasting:m"), 61 * DAY), "mg T"
    assert r.meta(f"ma lasting:n N{far} J5 v").value == b"5"
    assert about(ttl_on_node(pcluster, "lasting:n"), 60 * DAY), "ma N"
    assert r.meta(f"ma lasting:n T{far + DAY} v").value == b"6"
    assert about(ttl_on_node(pcluster, "lasting:n"), 61 * DAY), "ma T"
    assert r.store("set", "lasting:z", "v", exptime=0) == "STORED"
    assert near(ttl_on_node(pcluster, "lasting:z"), 600), "0 still becomes default_ttl"

    assert r.store("set", "catalog:far", "v", exptime=far) == "STORED"
    assert near(ttl_on_node(pcluster, "catalog:far"), 3600), "past max_ttl: clamped"
    assert r.store("set", "catalog:near", "v", exptime=int(time.time()) + 100) == "STORED"
    assert about(ttl_on_node(pcluster, "catalog:near"), 100), "within max_ttl: stands"

    for key in ("lasting:p", "catalog:p", "plain:p"):
        assert r.store("set", key, "v", exptime=int(time.time()) - 5) == "STORED"
        assert r.get(key) == [], f"{key}: a time in the past is expired"


def rewrites(r):
    return int(r.stats()["ttl_rewrites"])


def test_gat_and_gats_exptime(pcluster):
    r = pcluster.raw()
    assert r.store("set", "catalog:a", "va", exptime=10) == "STORED"
    assert r.get("99999", "catalog:a", cmd="gat") == [("catalog:a", 0, b"va", None)]
    assert near(ttl_on(pcluster.owner("catalog:a"), "catalog:a"), 3600), "clamped to max_ttl"
    got = r.get("0", "catalog:a", cmd="gats")
    assert len(got) == 1 and got[0][3] is not None
    assert near(ttl_on(pcluster.owner("catalog:a"), "catalog:a"), 600), "0 becomes default_ttl"
    assert r.get("100", "catalog:a", cmd="gat")
    assert near(ttl_on(pcluster.owner("catalog:a"), "catalog:a"), 100), "a short TTL stands"
    before = rewrites(r)
    assert r.get("-1", "catalog:a", cmd="gat") == [("catalog:a", 0, b"va", None)]
    assert r.get("catalog:a") == [], "a negative exptime is left alone: expired at once"
    assert rewrites(r) == before


def test_gat_split_over_nodes_and_namespaces(pcluster):
    r = pcluster.raw()
    keys = [f"{ns}k{i}" for i in range(12) for ns in ("catalog:", "short:", "")]
    for k in keys:
        assert r.store("set", k, f"v-{k}") == "STORED"
    nodes_with_both = [n for n in pcluster.nodes
                       if {k.split(":")[0] for k in keys if pcluster.owner(k) is n} >= {"catalog", "short"}]
    assert nodes_with_both, "some node holds keys of several namespaces"
    before = int(r.stats()["multiget_split"])
    got = r.get("7200", *keys, cmd="gat")
    assert [g[0] for g in got] == keys and all(g[2] == f"v-{g[0]}".encode() for g in got)
    assert int(r.stats()["multiget_split"]) == before + 1
    for k in keys:
        want = 3600 if k.startswith("catalog:") else 60 if k.startswith("short:") else 7200
        assert near(ttl_on(pcluster.owner(k), k), want), f"{k}: every fragment has its exptime"
    one_node = [k for k in keys if pcluster.owner(k) is nodes_with_both[0]]
    got = r.get("0", *one_node, cmd="gats")  # one node, two exptimes: still split
    assert [g[0] for g in got] == one_node
    for k in one_node:
        ttl = ttl_on(nodes_with_both[0], k)
        if k.startswith("catalog:"):
            assert near(ttl, 600), "0 is catalog's default_ttl"
        elif k.startswith("short:"):
            assert near(ttl, 60), "0 (never) is clamped to short's max_ttl"
        else:
            assert ttl == -1, "no rules: 0 stays never"


def test_mg_vivify_and_touch(pcluster):
    r = pcluster.raw()
    assert r.meta("mg catalog:v N99999 v").line == "VA 0 W"
    assert near(ttl_on(pcluster.owner("catalog:v"), "catalog:v"), 3600), "N: the placeholder's life"
    assert r.meta("mg catalog:v0 N0 v").line == "VA 0 W"
    assert near(ttl_on(pcluster.owner("catalog:v0"), "catalog:v0"), 600)
    assert r.meta("ms catalog:t 1 T10", b"x").line == "HD"
    assert r.meta("mg catalog:t T0 N99999 v").line == "VA 1"  # a hit: T touches, N does nothing
    assert near(ttl_on(pcluster.owner("catalog:t"), "catalog:t"), 600)
    assert r.meta("mg catalog:t N30 T99999 R5 v q").value == b"x"
    assert near(ttl_on(pcluster.owner("catalog:t"), "catalog:t"), 3600), "both flags rewritten"


def test_ma_autocreate_and_update(pcluster):
    r = pcluster.raw()
    assert r.meta("ma catalog:n N99999 J5 v").value == b"5"
    assert near(ttl_on(pcluster.owner("catalog:n"), "catalog:n"), 3600), "N: the new item's TTL"
    assert r.meta("ma catalog:n T0 v").value == b"6"
    assert near(ttl_on(pcluster.owner("catalog:n"), "catalog:n"), 600), "T: 0 is default_ttl"
    assert r.meta("ma catalog:n2 N0").line == "HD"
    assert near(ttl_on(pcluster.owner("catalog:n2"), "catalog:n2"), 600)


def test_md_invalidate_with_ttl(pcluster):
    r = pcluster.raw()
    assert r.store("set", "catalog:s", "v", exptime=100) == "STORED"
    assert r.meta("md catalog:s I T99999").line == "HD"
    owner = pcluster.owner("catalog:s")
    with McRaw(owner.host, owner.port) as c:
        m = c.meta("mg catalog:s t v")
        assert "X" in m.flags and near(int(m.flags["t"]), 3600), f"stale, TTL clamped: {m.line}"
    before = rewrites(r)
    assert r.store("set", "catalog:s2", "v", exptime=100) == "STORED"
    r.send(b"md catalog:s2 T99999 q\r\nmn\r\n")  # without I, T means nothing: not rewritten
    assert r.read_line() == "MN"
    assert rewrites(r) == before


def test_gutter_caps_every_ttl_carrier(gcluster):
    r = gcluster.raw()
    victim = gcluster.nodes[0]
    keys = [f"gk{i}" for i in range(40)]
    mine = [k for k in keys if gcluster.owner(k) is victim]
    others = [k for k in keys if gcluster.owner(k) is not victim]
    assert len(mine) >= 5 and others
    victim.proc.kill()
    victim.proc.wait()
    wait_until(lambda: r.cmd(f"mg {mine[0]}") in ("EN", "HD"), timeout=5,
               message="the dead node marked down (its keys answered by the gutter)")
    g = gcluster.gutter
    k_gat, k_mgt, k_mgn, k_man, k_mat = mine[:5]
    for k in (k_gat, k_mgt, k_mat):
        assert r.store("set", k, "v", exptime=5) == "STORED"  # in the gutter, short-lived
    assert r.get("3600", k_gat, others[0], cmd="gat") == [(k_gat, 0, b"v", None)]
    assert 0 < ttl_on(g, k_gat) <= 7, "gat's exptime capped in the gutter pool"
    assert r.meta(f"mg {k_mgt} T3600").line == "HD"
    assert 0 < ttl_on(g, k_mgt) <= 7, "mg T capped"
    assert r.meta(f"mg {k_mgn} N3600").line == "HD W"
    assert 0 < ttl_on(g, k_mgn) <= 7, "mg N capped"
    assert r.meta(f"ma {k_man} N0 J1").line == "HD"
    assert 0 < ttl_on(g, k_man) <= 7, "ma N capped (0, never, included)"
    assert r.store("set", k_mat, "1") == "STORED"
    assert r.meta(f"ma {k_mat} T3600").line == "HD"
    assert 0 < ttl_on(g, k_mat) <= 7, "ma T capped"
    # a gat over a live node and the gutter: each fragment gets its own exptime
    assert r.store("set", others[1], "o") == "STORED"
    got = r.get("3600", k_gat, others[1], cmd="gat")
    assert [x[0] for x in got] == [k_gat, others[1]]
    assert 0 < ttl_on(g, k_gat) <= 7
    assert near(ttl_on(gcluster.owner(others[1]), others[1]), 3600), "not capped off the gutter"
    restart_server(victim)


@pytest.fixture
def limited(start_server, start_router):
    nodes = [start_server() for _ in range(2)]
    doc = topology(nodes)
    doc["namespaces"]["big"] = {"pool": "main", "max_value_bytes": 1000}
    doc["namespaces"]["slow"] = {"pool": "main", "ops_per_sec": 20}
    doc["namespaces"]["thin"] = {"pool": "main", "bytes_per_sec": 5000}
    doc["namespaces"]["both"] = {"pool": "main", "ops_per_sec": 2, "bytes_per_sec": 1000}
    router, admin, path = start_router(doc)
    return RouterCluster(nodes, router, path, admin)


def test_max_value_bytes(limited):
    r = limited.raw()
    assert r.store("set", "big:ok", b"x" * 1000) == "STORED"
    line = r.store("set", "big:no", b"x" * 1001)
    assert line == ("SERVER_ERROR shoal-router: namespace big: value of 1001 bytes is over "
                    "max_value_bytes 1000"), line
    assert r.meta("ms big:no 1001", b"y" * 1001).line.startswith("SERVER_ERROR"), "ms too"
    r.send(b"set big:no 0 0 1001 noreply\r\n" + b"z" * 1001 + b"\r\n")
    assert r.get("big:no", "big:ok")[0][0] == "big:ok", "noreply refusals are silent; data skipped"
    assert r.store("set", "other", b"x" * 5000) == "STORED", "other namespaces have no limit"


def test_ops_per_sec(limited):
    r = limited.raw()
    r.send(b"".join(f"mg slow:{i}\r\n".encode() for i in range(40)) + b"mn\r\n")
    lines = []
    while True:
        line = r.read_line()
        if line == "MN":
            break
        lines.append(line)
    refused = [x for x in lines if x.startswith("SERVER_ERROR")]
    assert 15 <= len(lines) - len(refused) <= 25, f"about 20 admitted in the burst: {lines}"
    assert refused and refused[0] == "SERVER_ERROR shoal-router: namespace slow: over ops_per_sec 20"
    time.sleep(0.5)
    assert r.meta("mg slow:again").line == "EN", "tokens come back with time"
    assert int(r.stats()["policy_refusals"]) == len(refused)


def test_bytes_per_sec(limited):
    r = limited.raw()
    assert r.store("set", "thin:a", b"x" * 4000) == "STORED"
    assert r.store("set", "thin:b", b"x" * 4000) == \
        "SERVER_ERROR shoal-router: namespace thin: over bytes_per_sec 5000"
    assert r.get("thin:a")[0][2] == b"x" * 4000, "reads are not charged bytes"
    time.sleep(0.9)
    assert r.store("set", "thin:b", b"x" * 4000) == "STORED"


def test_multiget_over_the_limit_is_refused_whole(limited):
    r = limited.raw()
    keys = " ".join(f"slow:{i}" for i in range(30))
    assert r.cmd(f"get {keys}").startswith("SERVER_ERROR shoal-router: namespace slow")
    assert r.cmd("version").startswith("VERSION"), "no stray reply of the refused get follows"


# --- a rewrite must not push a line past the nodes' limit ------------------------------------------

LINE_MAX = 65536  # the default --line-max of shoal-router and of shoal-node


def long_line(verb, total, ns="catalog"):
    """`verb` and keys of namespace `ns` sharing one slot ({t}), `total` bytes up to and
    including the \\r (the length both limits count)."""
    line, i = verb, 0
    while len(line) + 1 + 200 + 1 < total:
        line += f" {ns}:{{t}}k{i}"
        i += 1
    pad = total - 1 - len(line) - 1 - len(f"{ns}:{{t}}z")
    return f"{line} {ns}:{{t}}z{'p' * pad}"


def test_rewrite_over_line_max_is_refused_locally(start_server, start_router):
    """A gat of the longest line the router takes, whose exptime 0 becomes catalog's 600 (two
    bytes longer), is answered CLIENT_ERROR line too long by the router and never reaches the
    node, which would close the shared connection and fail every request on it: a bystander
    pipelining gets to that node through the same worker sees no error."""
    nodes = [start_server()]
    doc = topology(nodes)
    doc["namespaces"]["catalog"] = {"pool": "main", "default_ttl": 600}
    doc["namespaces"]["month"] = {"pool": "main", "default_ttl": 2592000}
    router, admin, _ = start_router(doc, "-t", "1")
    cl = RouterCluster(nodes, router, None, admin)
    r = cl.raw()
    assert r.store("set", "catalog:{t}k0", "v0") == "STORED"
    stop, errors, rounds = threading.Event(), [], [0]

    def bystander():
        with cl.raw() as b:
            batch = b"".join(b"get catalog:{t}k0\r\n" for _ in range(50))
            while not stop.is_set():
                b.send(batch)
                for _ in range(50):
                    line = b.read_line()
                    if line.startswith("VALUE"):
                        b.read_value(2)
                        line = b.read_line()
                    if line != "END":
                        errors.append(line)
                rounds[0] += 1

    t = threading.Thread(target=bystander)
    t.start()
    try:
        wait_until(lambda: rounds[0] >= 3, message="the bystander's gets flowing")
        connects = int(r.stats()["upstream_connects"])
        big = long_line("gat 0", LINE_MAX)
        assert len(big) + 1 == LINE_MAX
        assert r.cmd(big) == "CLIENT_ERROR line too long"
        assert r.cmd("gat 0 catalog:{t}k0") == "VALUE catalog:{t}k0 0 2", "in sync, still served"
        assert r.read_value(2) == b"v0" and r.read_line() == "END"
        # split by exptime (x keeps 0, month's keys get 2592000): one part is 4 bytes longer
        split = "gat 0 x " + long_line("", LINE_MAX - len("gat 0 x"), ns="month")[1:]
        assert len(split) + 1 == LINE_MAX
        assert r.cmd(split) == "CLIENT_ERROR line too long"
        assert r.cmd("version").startswith("VERSION"), "no part of it answered"
        # a line the rules leave alone, at the limit, still goes through
        r.send(long_line("gat 60", LINE_MAX).encode() + b"\r\n")
        assert r.read_get_reply() == [("catalog:{t}k0", 0, b"v0", None)]
        at = rounds[0]
        wait_until(lambda: rounds[0] >= at + 3, message="more of the bystander's gets")
    finally:
        stop.set()
        t.join()
    assert errors == [], f"the bystander's requests failed: {errors[:3]}"
    assert int(r.stats()["upstream_connects"]) == connects, "the node's connection stayed open"
    with McRaw(nodes[0].host, nodes[0].port) as n:
        assert n.stats()["conn_closed_line_too_long"] == "0", "the node never saw it"


def test_line_ending_in_bare_newline_at_the_limit(start_server, start_router):
    """A line ended by \\n alone is sent on with \\r\\n, one byte longer: refused the same way."""
    node = start_server()
    router, _, _ = start_router([node], "-t", "1")
    r = router.raw()
    line = long_line("get", LINE_MAX + 1)  # LINE_MAX bytes before the \n
    r.send(line.encode() + b"\n")
    assert r.read_line() == "CLIENT_ERROR line too long"
    assert r.cmd("version").startswith("VERSION")
    with McRaw(node.host, node.port) as n:
        assert n.stats()["conn_closed_line_too_long"] == "0"


def test_refused_requests_cost_no_tokens(limited):
    """A request refused whole spends none of its namespace's tokens: a multi-get refused at its
    21st key gives back the 20 its first keys took, and a set refused for bytes_per_sec gives
    back its ops_per_sec token. Each batch goes out in one write, so no refill (one token per
    50 ms for slow, per 500 ms for both) can stand in for the refund."""
    r = limited.raw()
    keys = " ".join(f"slow:{i}" for i in range(30))
    r.send(f"get {keys}\r\n".encode() + b"".join(f"mg slow:{i}\r\n".encode() for i in range(20))
           + b"mn\r\n")
    lines = []
    while (line := r.read_line()) != "MN":
        lines.append(line)
    assert lines[0].startswith("SERVER_ERROR shoal-router: namespace slow: over ops_per_sec")
    assert lines[1:].count("EN") >= 19, f"the refused get's tokens came back: {lines}"

    r.send(b"set both:a 0 0 800\r\n" + b"x" * 800 + b"\r\n"
           + b"set both:b 0 0 800\r\n" + b"x" * 800 + b"\r\n"
           + b"mg both:c\r\nmg both:d\r\nmn\r\n")
    lines = []
    while (line := r.read_line()) != "MN":
        lines.append(line)
    assert lines == ["STORED", "SERVER_ERROR shoal-router: namespace both: over bytes_per_sec 1000",
                     "EN", "SERVER_ERROR shoal-router: namespace both: over ops_per_sec 2"], lines

