"""Namespace settings and memory shares pushed by shoal-control to real shoal-nodes (issue
13.1): a namespace's quota is split evenly over its pool's nodes and PUT on each node's admin
port; a node that joins or leaves changes every share; a removed namespace is removed from the
nodes; a node that cannot be reached is retried in the background, counted in /metrics, and
never slows the API."""

import json
import time

import pytest

from mcraw import free_port, http, wait_until

MiB = 1 << 20


def node_ns(node, name):
    """A node's own view of namespace `name` (its admin API), or None."""
    status, body = http(node.admin_port, "GET", f"/v1/namespaces/{name}")
    return json.loads(body) if status == 200 else None


@pytest.fixture
def start_node(start_server):
    def start(admin_port=None):
        admin_port = admin_port or free_port()
        node = start_server("--admin-port", str(admin_port))
        node.admin_port = admin_port
        node.addr = f"127.0.0.1:{node.port}"
        node.admin = f"127.0.0.1:{admin_port}"
        return node
    return start


def entry(node):
    return {"node": node.addr, "admin": node.admin}


def test_quota_share_and_settings_reach_every_node(start_control, start_node):
    nodes = [start_node(), start_node()]
    ctl = start_control()
    ctl.post("/v1/pools", {"name": "main", "nodes": [entry(n) for n in nodes]})
    status, body = ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main",
                                               "memory": 16 * MiB, "default_ttl": 60,
                                               "max_ttl": 600, "eviction": "lfu",
                                               "stale_ttl": 5, "lease_ttl": 3,
                                               "lease_period": 1})
    assert status == 201, body
    for n in nodes:
        got = wait_until(lambda n=n: node_ns(n, "catalog"), message=f"catalog on {n.addr}")
        assert (got["memory"], got["default_ttl"], got["max_ttl"], got["eviction"],
                got["stale_ttl"], got["lease_ttl"], got["lease_period"]) == \
            (8 * MiB, 60, 600, "lfu", 5, 3, 1)
    status, one = ctl.get("/v1/namespaces/catalog")
    assert {a: s["share"] for a, s in one["nodes"].items()} == {n.addr: 8 * MiB for n in nodes}
    wait_until(lambda: all(s["in_place"] for s in ctl.get("/v1/namespaces/catalog")[1]["nodes"].values()),
               message="every push in place")
    assert ctl.metrics()["shoal_control_push_pending"] == 0


def test_changed_quota_is_pushed_again(start_control, start_node):
    nodes = [start_node(), start_node()]
    ctl = start_control()
    ctl.post("/v1/pools", {"name": "main", "nodes": [entry(n) for n in nodes]})
    ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main", "memory": 16 * MiB})
    ctl.put("/v1/namespaces/catalog", {"memory": 8 * MiB})
    for n in nodes:
        wait_until(lambda n=n: (node_ns(n, "catalog") or {}).get("memory") == 4 * MiB,
                   message=f"4 MiB share on {n.addr}")


def test_a_joining_node_shrinks_every_share(start_control, start_node):
    nodes = [start_node(), start_node()]
    ctl = start_control()
    ctl.post("/v1/pools", {"name": "main", "nodes": [entry(n) for n in nodes]})
    ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main", "memory": 24 * MiB})
    nodes.append(start_node())
    assert ctl.post("/v1/pools/main/nodes", entry(nodes[2]))[0] == 200
    for n in nodes:
        wait_until(lambda n=n: (node_ns(n, "catalog") or {}).get("memory") == 8 * MiB,
                   message=f"8 MiB share on {n.addr}")


def test_a_leaving_node_loses_the_pools_namespaces_and_the_rest_grow(start_control, start_node):
    nodes = [start_node(), start_node(), start_node()]
    ctl = start_control()
    ctl.post("/v1/pools", {"name": "main", "nodes": [entry(n) for n in nodes]})
    ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main", "memory": 24 * MiB})
    wait_until(lambda: node_ns(nodes[2], "catalog"), message="catalog on the third node")
    assert ctl.delete(f"/v1/pools/main/nodes/{nodes[2].addr}")[0] == 200
    wait_until(lambda: node_ns(nodes[2], "catalog") is None, message="catalog gone from it")
    for n in nodes[:2]:
        wait_until(lambda n=n: (node_ns(n, "catalog") or {}).get("memory") == 12 * MiB,
                   message=f"12 MiB share on {n.addr}")


def test_deleted_namespace_is_removed_from_nodes(start_control, start_node):
    node = start_node()
    ctl = start_control()
    ctl.post("/v1/pools", {"name": "main", "nodes": [entry(node)]})
    ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main", "memory": 4 * MiB})
    wait_until(lambda: node_ns(node, "catalog"), message="catalog on the node")
    ctl.delete("/v1/namespaces/catalog")
    wait_until(lambda: node_ns(node, "catalog") is None, message="catalog removed from the node")


def test_unreachable_node_is_retried_counted_and_never_slows_the_api(start_control):
    dead = free_port()  # nothing listens there
    ctl = start_control("--push-retry-ms", "200")
    ctl.post("/v1/pools", {"name": "main", "nodes": [{"node": "127.0.0.1:22001",
                                                      "admin": f"127.0.0.1:{dead}"}]})
    ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main", "memory": 4 * MiB})
    wait_until(lambda: ctl.metrics()["shoal_control_push_failures_total"] >= 3,
               message="repeated push failures")
    t0 = time.monotonic()
    for i in range(20):
        assert ctl.put("/v1/namespaces/catalog", {"max_ttl": 100 + i})[0] == 200
    assert time.monotonic() - t0 < 5.0  # blocked, it would take 20 push timeouts
    # a change starts the node's count afresh: await the latest settings' first failure
    def failing():
        state = ctl.get("/v1/namespaces/catalog")[1]["nodes"]["127.0.0.1:22001"]
        assert state["in_place"] is False
        return state["failures"] >= 1 and state["error"]
    wait_until(failing, message="the latest settings' push failing")
    assert ctl.metrics()["shoal_control_push_pending"] >= 1


def test_push_reaches_a_node_that_comes_up_later(start_control, start_node):
    admin = free_port()
    ctl = start_control("--push-retry-ms", "200")
    ctl.post("/v1/pools", {"name": "main", "nodes": [{"node": "127.0.0.1:22001",
                                                      "admin": f"127.0.0.1:{admin}"}]})
    ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main", "memory": 4 * MiB})
    wait_until(lambda: ctl.metrics()["shoal_control_push_failures_total"] >= 1,
               message="a failed push")
    node = start_node(admin_port=admin)
    got = wait_until(lambda: node_ns(node, "catalog"), message="catalog on the late node")
    assert got["memory"] == 4 * MiB


def test_restarted_control_pushes_its_state_again(start_control, start_node):
    node = start_node()
    ctl = start_control()
    ctl.post("/v1/pools", {"name": "main", "nodes": [entry(node)]})
    ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main", "memory": 4 * MiB})
    wait_until(lambda: node_ns(node, "catalog"), message="catalog on the node")
    ctl.kill9()
    assert http(node.admin_port, "DELETE", "/v1/namespaces/catalog")[0] == 200
    start_control(data_dir=ctl.data_dir)
    got = wait_until(lambda: node_ns(node, "catalog"), message="catalog pushed again")
    assert got["memory"] == 4 * MiB
