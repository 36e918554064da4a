"""Namespace policies enforced by shoal-router: a namespace's default_ttl replaces a TTL of 0 and
its max_ttl clamps longer ones ("never" included), for text storage commands, touch, and ms/mg T
(checked on the nodes directly); max_value_bytes, ops_per_sec and bytes_per_sec refuse requests
with an error naming the namespace and the limit. Skipped when SHOAL_TEST_SERVER=memcached."""

import time

import pytest

from conftest import RouterCluster, topology
from mcraw import McRaw

pytestmark = pytest.mark.shoal_only


@pytest.fixture
def pcluster(start_server, start_router):
    nodes = [start_server() for _ in range(3)]
    doc = topology(nodes)
    doc["namespaces"]["catalog"] = {"pool": "main", "default_ttl": 600, "max_ttl": 3600}
    router, admin, path = start_router(doc)
    return RouterCluster(nodes, router, path, admin)


def ttl_on_node(cluster, key):
    owner = cluster.owner(key)
    with McRaw(owner.host, owner.port) as c:
        r = c.meta(f"mg {key} t")
        assert r.code == "HD", f"{key} is on its node: {r.line}"
        return int(r.flags["t"])


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


@pytest.fixture
def limited(start_server, start_router):
    nodes = [start_server() for _ in range(2)]
    doc = topology(nodes)
    doc["namespaces"]["big"] = {"pool": "main", "max_value_bytes": 1000}
    doc["namespaces"]["slow"] = {"pool": "main", "ops_per_sec": 20}
    doc["namespaces"]["thin"] = {"pool": "main", "bytes_per_sec": 5000}
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
