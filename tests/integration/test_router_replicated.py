"""Replicated pools through shoal-router: every key on every node; writes (text and meta, quiet
mode included) go to all replicas, reads go to one replica picked by a stable hash of the router's
--client-id, and a replica marked down is skipped. Skipped when SHOAL_TEST_SERVER=memcached."""

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
