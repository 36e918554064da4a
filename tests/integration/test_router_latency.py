"""Latency summaries per pool and per namespace on shoal-router's /metrics, against a deliberately
slow node: a fake memcached in this file that answers every request after a fixed delay, in a
pool of its own next to a real shoal-node. The slow pool and namespace must show the delay, the
fast ones not; a multi-key get counts once, under its first key's namespace; warm-up lookups are
part of the client's latency; gutter fail-over counts under the gutter pool; a reload that keeps
the layout keeps the series. Skipped when SHOAL_TEST_SERVER=memcached."""

import time

import pytest

from conftest import topology
from fakenode import FakeNode
from mcraw import free_port, http, wait_until

pytestmark = [pytest.mark.shoal_only, pytest.mark.wallclock]

DELAY = 0.08
DELAY_US = int(DELAY * 1_000_000)


class SlowNode(FakeNode):
    """Just enough of the memcached text protocol for the router, each reply sent DELAY seconds
    after its request was read (requests on one connection are answered in order, one at a
    time): get/gets -> END, mg -> EN (with its k and O), set/add -> STORED, version -> VERSION."""

    def answer(self, line, rest):
        words = line.split()
        verb = words[0] if words else b""
        if verb in (b"set", b"add"):
            need = int(words[4]) + 2
            if len(rest) < need:
                return None  # the data block is still arriving
            rest = rest[need:]
            reply = b"STORED\r\n"
        elif verb == b"mg":  # a miss, echoing k and O as memcached does
            reply = b"EN" + b"".join(b" k" + words[1] if w == b"k" else b" " + w
                                     for w in words[2:]
                                     if w == b"k" or w.startswith(b"O")) + b"\r\n"
        else:
            reply = {b"get": b"END\r\n", b"gets": b"END\r\n",
                     b"version": b"VERSION slow\r\n"}.get(verb, b"ERROR\r\n")
        time.sleep(DELAY)
        return reply, rest


@pytest.fixture
def slow_node():
    node = SlowNode()
    yield node
    node.close()


def scrape(admin):
    """Every sample of /metrics: {'name{labels}': value}."""
    status, body = http(admin, "GET", "/metrics")
    assert status == 200, body
    return {k: int(v) for k, v in (line.rsplit(" ", 1) for line in body.splitlines()
                                   if line and not line.startswith("#"))}


def lat(m, scope, name, q):
    """shoal_router_{scope}_latency_us quantile q of the pool or namespace `name`."""
    return m[f'shoal_router_{scope}_latency_us{{{scope}="{name}",quantile="{q}"}}']


def lat_count(m, scope, name):
    return m[f'shoal_router_{scope}_latency_us_count{{{scope}="{name}"}}']


def test_slow_pool_and_namespace_show_the_delay(start_server, start_router, slow_node):
    fast = start_server()
    doc = topology([fast])
    doc["pools"]["slow"] = {"nodes": [slow_node.addr]}
    doc["namespaces"]["fast"] = {"pool": "main"}
    doc["namespaces"]["slow"] = {"pool": "slow"}
    router, admin, _ = start_router(doc)
    r = router.raw()
    for i in range(4):
        assert r.store("set", f"slow:k{i}", "v") == "STORED"
        assert r.get(f"slow:k{i}") == []
    for i in range(20):
        assert r.store("set", f"fast:k{i}", "v") == "STORED"
        assert r.get(f"fast:k{i}") == [(f"fast:k{i}", 0, b"v", None)]
    # Split over both pools: one request each, under its first key's namespace.
    assert r.get("slow:x", "fast:k0") == [("fast:k0", 0, b"v", None)]
    assert r.get("fast:k1", "slow:y") == [("fast:k1", 0, b"v", None)]

    m = scrape(admin)
    assert lat_count(m, "namespace", "slow") == 8 + 1
    assert lat_count(m, "namespace", "fast") == 40 + 1
    assert lat_count(m, "namespace", "default") == 0
    assert lat_count(m, "pool", "slow") == 8 + 2, "a fragment of each split get"
    assert lat_count(m, "pool", "main") == 40 + 2
    assert m['shoal_router_pool_requests{pool="slow"}'] == lat_count(m, "pool", "slow")
    assert m['shoal_router_pool_requests{pool="main"}'] == lat_count(m, "pool", "main")
    for scope, name in (("pool", "slow"), ("namespace", "slow")):
        assert lat(m, scope, name, "0.5") >= DELAY_US, f"{scope} {name}: p50 shows the delay"
    for scope, name in (("pool", "main"), ("namespace", "fast")):
        assert lat(m, scope, name, "0.5") < DELAY_US // 4, f"{scope} {name}: p50 well below it"
    assert lat(m, "namespace", "fast", "0.99") >= DELAY_US, \
        "the fast namespace's split get waited for the slow pool"
    # (quantiles are power-of-two bucket tops: a request that waited DELAY shows as 131072, and
    # a loaded machine has been seen to take 33-65 ms for a local node, shown as 65536)
    assert lat(m, "pool", "main", "0.99") < DELAY_US, "no request to main waited for the slow one"
    assert m['shoal_router_namespace_latency_us_sum{namespace="slow"}'] >= 9 * DELAY_US
    assert m['shoal_router_pool_latency_us_sum{pool="slow"}'] >= 10 * DELAY_US

    # A reload that keeps pools and namespaces in place (a new limit) keeps the series.
    doc["version"] = 2
    doc["namespaces"]["fast"]["max_value_bytes"] = 1000
    assert http(admin, "PUT", "/v1/topology", doc)[0] == 200
    assert r.get("slow:after") == []
    m2 = scrape(admin)
    assert lat_count(m2, "namespace", "slow") == 10
    assert lat_count(m2, "pool", "slow") == 11
    assert lat_count(m2, "namespace", "fast") == 41
    assert lat(m2, "namespace", "slow", "0.5") >= DELAY_US


def test_namespace_latency_includes_warm_up_lookups(start_server, start_router, slow_node):
    cold = start_server()
    doc = topology([cold])
    doc["pools"]["main"]["warm_from"] = "warm"
    doc["pools"]["warm"] = {"nodes": [slow_node.addr]}
    router, admin, _ = start_router(doc)
    r = router.raw()
    for i in range(3):
        assert r.get(f"miss{i}") == [], "missed in the cold pool and in the (slow) warm one"
    for i in range(3):
        assert r.store("set", f"hit{i}", "v") == "STORED"
        assert r.get(f"hit{i}") == [(f"hit{i}", 0, b"v", None)], "a cold hit: no warm lookup"
    m = scrape(admin)
    assert lat_count(m, "pool", "warm") == m['shoal_router_pool_requests{pool="warm"}'] == 3
    assert lat(m, "pool", "warm", "0.5") >= DELAY_US
    assert lat_count(m, "pool", "main") == 9
    # no main-pool request waited for the warm lookup (bucket tops: see the test above)
    assert lat(m, "pool", "main", "0.99") < DELAY_US
    assert lat_count(m, "namespace", "default") == 9
    assert lat(m, "namespace", "default", "0.9") >= DELAY_US, "the warmed gets waited for it"
    assert m['shoal_router_namespace_latency_us_sum{namespace="default"}'] >= 3 * DELAY_US


def test_gutter_traffic_counts_under_the_gutter_pool(start_server, start_router):
    gutter = start_server()
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    doc = topology([dead])
    doc["pools"]["gutter"] = {"nodes": [f"127.0.0.1:{gutter.port}"]}
    doc["gutter_pool"] = "gutter"
    router, admin, _ = start_router(doc, "-t", "1", "--down-after", "1", "--retry-ms", "50")
    r = router.raw()
    wait_until(lambda: r.cmd("get g") == "END", message="the dead node's keys sent to the gutter")
    for i in range(10):
        assert r.store("set", f"g{i}", "v") == "STORED"
        assert r.get(f"g{i}") == [(f"g{i}", 0, b"v", None)]
    m = scrape(admin)
    sent_main = m['shoal_router_pool_requests{pool="main"}']
    sent_gutter = m['shoal_router_pool_requests{pool="gutter"}']
    # what was sent to the dead node was retried on the gutter (failover.h), not failed
    assert sent_main >= 1 and m['shoal_router_pool_errors{pool="main"}'] == 0
    assert m["shoal_router_gutter_retries_total"] == sent_main
    assert lat_count(m, "pool", "main") == 0, "the dead node never replied"
    assert sent_gutter >= 21 and lat_count(m, "pool", "gutter") == sent_gutter
    assert lat_count(m, "namespace", "default") == sent_gutter, \
        "each request once: answered by the gutter, directly or retried there"
