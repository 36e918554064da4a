"""Replicated pools through shoal-router: every key on every node; writes (text and meta, quiet
mode included) go to all replicas, reads go to one replica picked by a stable hash of the router's
--client-id, and a replica marked down is skipped. Compare-and-swap (cas, ms/md/ma with C) is
compared on the replica reads go to and then applied to the others. Skipped when
SHOAL_TEST_SERVER=memcached. Replicas that miss writes: test_router_replica_repair.py."""

import pytest

from conftest import restart_server, topology
from mcraw import McRaw, wait_until

pytestmark = pytest.mark.shoal_only


@pytest.fixture
def rep(start_server, start_router):
    nodes = [start_server() for _ in range(3)]
    doc = topology(nodes)
    doc["pools"]["hot"] = {"mode": "replicated", "nodes": [f"127.0.0.1:{n.port}" for n in nodes]}
    doc["namespaces"]["hot"] = {"pool": "hot"}
    doc["namespaces"]["hotcap"] = {"pool": "hot", "max_ttl": 100}
    router, _, _ = start_router(doc, "--client-id", "app-host-1", "-t", "1", "--probe-ms", "10000",
                                "--retry-ms", "50")
    return nodes, router


def on_nodes(nodes, key):
    out = []
    for n in nodes:
        with McRaw(n.host, n.port) as c:
            r = c.meta(f"mg {key} v")
            out.append(r.value if r.code == "VA" else None)
    return out


def test_writes_reach_every_replica(rep):
    nodes, router = rep
    r = router.raw()
    assert r.store("set", "hot:a", "1") == "STORED"
    assert on_nodes(nodes, "hot:a") == [b"1"] * 3
    assert r.cmd("incr hot:a 4") == "5"
    assert on_nodes(nodes, "hot:a") == [b"5"] * 3
    r.send(b"ms hot:b 2 q\r\nhi\r\nmd hot:a q\r\nmn\r\n")
    assert r.read_line() == "MN", "quiet writes to all replicas stay quiet"
    assert on_nodes(nodes, "hot:b") == [b"hi"] * 3
    assert on_nodes(nodes, "hot:a") == [None] * 3
    assert r.cmd("delete hot:b") == "DELETED"
    assert on_nodes(nodes, "hot:b") == [None] * 3
    assert r.store("set", "plain", "x") == "STORED"
    assert on_nodes(nodes, "plain").count(b"x") == 1, "sharded pools keep one copy"


def test_reads_come_from_one_stable_replica(rep):
    nodes, router = rep
    for i, n in enumerate(nodes):  # a different value on each replica, written directly
        with McRaw(n.host, n.port) as c:
            c.store("set", "hot:r", f"from{i}")
    r = router.raw()
    first = r.get("hot:r")[0][2]
    assert first in (b"from0", b"from1", b"from2")
    for _ in range(20):
        assert r.get("hot:r")[0][2] == first, "the same replica answers every read"
        assert r.meta("mg hot:r v").value == first
    assert [g[2] for g in r.get("hot:r", "hot:r")] == [first, first]


def test_replica_down_is_skipped(rep):
    nodes, router = rep
    r = router.raw()
    r.store("set", "hot:d", "v")
    for i, n in enumerate(nodes):
        with McRaw(n.host, n.port) as c:
            c.store("set", "hot:who", f"n{i}")
    reader = int(r.get("hot:who")[0][2][1:])
    nodes[reader].proc.kill()
    nodes[reader].proc.wait()
    wait_until(lambda: r.cmd("mg hot:d v").startswith("VA") and r.read_value(1) == b"v",
               timeout=5, message="reads served by another replica")
    assert r.store("set", "hot:e", "w") == "STORED", "writes go to the live replicas"
    live = [n for i, n in enumerate(nodes) if i != reader]
    assert on_nodes(live, "hot:e") == [b"w"] * 2
    restart_server(nodes[reader])  # the fixture expects every node alive at the end


def meta_on_nodes(nodes, cmd):
    out = []
    for n in nodes:
        with McRaw(n.host, n.port) as c:
            out.append(c.meta(cmd))
    return out


def test_cas_through_a_replicated_pool(rep):
    """The replicas hold different CAS values for the same item, yet a cas with the CAS a read
    through the router returned succeeds, and the reply comes once every replica has the value."""
    nodes, router = rep
    for i, n in enumerate(nodes):  # each node's CAS counter at a different place
        with McRaw(n.host, n.port) as c:
            for _ in range(i * 5):
                c.store("set", "pad", "x")
    r = router.raw()
    assert r.store("set", "hot:c", "v1") == "STORED"
    cases = [m.cas for m in meta_on_nodes(nodes, "mg hot:c c")]
    assert len(set(cases)) == 3, "the replicas' CAS values differ (else this proves nothing)"
    [(_, _, _, cas)] = r.get("hot:c", cmd="gets")
    assert r.store("cas", "hot:c", "v2", flags=7, extra=str(cas)) == "STORED"
    assert on_nodes(nodes, "hot:c") == [b"v2"] * 3, "no waiting: the reply waited for them"
    assert [m.flags["f"] for m in meta_on_nodes(nodes, "mg hot:c f")] == ["7"] * 3

    cas = r.meta("mg hot:c c").cas
    assert r.meta(f"ms hot:c 2 C{cas} F3", "v3").code == "HD"
    assert on_nodes(nodes, "hot:c") == [b"v3"] * 3
    assert [m.flags["f"] for m in meta_on_nodes(nodes, "mg hot:c f")] == ["3"] * 3

    assert r.store("set", "hot:n", "10") == "STORED"
    cas = r.meta("mg hot:n c").cas
    got = r.meta(f"ma hot:n C{cas} D5 v")
    assert (got.code, got.value) == ("VA", b"15")
    assert on_nodes(nodes, "hot:n") == [b"15"] * 3

    cas = r.meta("mg hot:c c").cas
    assert r.meta(f"md hot:c C{cas}").code == "HD"
    assert on_nodes(nodes, "hot:c") == [None] * 3

    # an ms with I may store its value marked stale, which a plain write cannot say: the other
    # replicas delete the key instead
    assert r.store("set", "hot:i", "v1") == "STORED"
    cas = r.meta("mg hot:i c").cas
    assert r.meta(f"ms hot:i 2 I C{cas}", "v2").code == "HD"
    assert sorted(on_nodes(nodes, "hot:i"), key=lambda v: v is None) == [b"v2", None, None]
    assert int(r.stats()["replicated_cas"]) == 5


def test_stale_cas_fails_and_changes_nothing(rep):
    nodes, router = rep
    r = router.raw()
    assert r.store("set", "hot:s", "v1") == "STORED"
    assert r.store("set", "hot:m", "10") == "STORED"
    [(_, _, _, old)] = r.get("hot:s", cmd="gets")
    old_m = r.meta("mg hot:m c").cas
    assert r.store("set", "hot:s", "v2") == "STORED"  # someone else's write
    assert r.store("set", "hot:m", "20") == "STORED"
    assert r.store("cas", "hot:s", "v3", extra=str(old)) == "EXISTS"
    assert r.meta(f"ms hot:s 2 C{old}", "v4").code == "EX"
    assert r.meta(f"md hot:s C{old}").code == "EX"
    assert r.meta(f"ma hot:m C{old_m}").code == "EX"
    assert on_nodes(nodes, "hot:s") == [b"v2"] * 3
    assert on_nodes(nodes, "hot:m") == [b"20"] * 3
    assert r.store("cas", "hot:none", "v", extra="1") == "NOT_FOUND"
    assert r.meta("ms hot:none 1 C1", "v").code == "NF"
    assert on_nodes(nodes, "hot:none") == [None] * 3


def test_cas_noreply_quiet_and_ttl_rules(rep):
    nodes, router = rep
    r = router.raw()
    assert r.store("set", "hot:q", "v1") == "STORED"
    [(_, _, _, cas)] = r.get("hot:q", cmd="gets")
    r.send(f"cas hot:q 0 0 2 {cas} noreply\r\nv2\r\n")
    cas = r.meta("mg hot:q c").cas
    r.send(f"ms hot:q 2 C{cas} q\r\nv3\r\nms hot:q 2 C1 q\r\nv4\r\nmn\r\n")
    assert r.read_line() == "EX", "a failed compare is shown in quiet mode"
    assert r.read_line() == "MN", "a successful one is not"
    assert on_nodes(nodes, "hot:q") == [b"v3"] * 3
    # the namespace's max_ttl applies to the compare and to the write that follows it
    assert r.store("set", "hotcap:t", "v1", exptime=50) == "STORED"
    [(_, _, _, cas)] = r.get("hotcap:t", cmd="gets")
    assert r.store("cas", "hotcap:t", "v2", exptime=0, extra=str(cas)) == "STORED"
    for m in meta_on_nodes(nodes, "mg hotcap:t t v"):
        assert m.value == b"v2" and 50 < int(m.flags["t"]) <= 100, m


def test_quiet_ma_on_replicas_answers_a_created_counter_only(rep):
    nodes, router = rep
    r = router.raw()
    r.send(b"ma hot:c N0 J3 q\r\nma hot:c q\r\nmn\r\n")
    assert r.read_line() == "HD", "a counter N created is answered under q"
    assert r.read_line() == "MN", "a hit is hidden"
    assert on_nodes(nodes, "hot:c") == [b"4"] * 3
    cas = r.meta("mg hot:c c").cas
    # a compare goes to one replica first, then to the others when it won
    r.send(f"ma hot:c C{cas} q\r\nma hot:c C1 q\r\nmn\r\n".encode())
    assert r.read_line() == "EX", "a failed compare is shown"
    assert r.read_line() == "MN", "a successful one is hidden"
    assert on_nodes(nodes, "hot:c") == [b"5"] * 3


def test_replicated_pool_refuses_a_slot_map(tmp_path):
    import json
    import subprocess
    from conftest import ROUTER_BIN
    doc = topology(["127.0.0.1:1", "127.0.0.1:2"])
    doc["pools"]["main"]["mode"] = "replicated"
    doc["pools"]["main"]["slots"] = [{"from": 0, "to": 16383, "node": "127.0.0.1:1"}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    res = subprocess.run([str(ROUTER_BIN), "-p", "0", "--config", str(path)], capture_output=True,
                         text=True, timeout=10)
    assert res.returncode == 2 and "pools.main.slots" in res.stderr
