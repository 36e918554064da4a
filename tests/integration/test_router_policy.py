"""Namespace TTL rules enforced by shoal-router: a namespace's default_ttl replaces a TTL of 0 and
its max_ttl clamps longer ones ("never" included), for text storage commands, touch, and ms/mg T.
Checked on the nodes directly. Skipped when SHOAL_TEST_SERVER=memcached."""

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
