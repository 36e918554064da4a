"""Eviction policies of a namespace on shoal-node (lru, lfu, s3fifo): what each keeps when a
one-pass scan floods a full namespace, that expired items go before live ones, and that s3fifo
keeps small items over large ones asked for as often. shoal only."""

import random

import pytest

from mcraw import wait_until
from test_quota import MB, fill, node, ns_stats, present, put  # noqa: F401 (node: a fixture)

pytestmark = pytest.mark.shoal_only


def survivors_after_scan(node, policy):
    """Fill a 4 MB namespace with a hot set read twice, flood it with 4x its size of keys read
    never, and return the share of the hot set still cached."""
    put(node, "p", {"memory": 4 * MB, "eviction": policy})
    r = node.raw()
    value = b"h" * 1000
    hot = [f"p:hot:{i:05d}" for i in range(600)]  # ~15% of what fits
    fill(r, hot, value)
    for _ in range(2):
        assert present(r, hot) == len(hot)
    scan = [f"p:scan:{i:05d}" for i in range(16000)]
    fill(r, scan, value)
    assert int(ns_stats(r, "p")["evictions"]) > 10000
    return present(r, hot) / len(hot)


def test_lru_lets_a_scan_flush_the_hot_set(node):
    assert survivors_after_scan(node, "lru") < 0.3


@pytest.mark.parametrize("policy", ["lfu", "s3fifo"])
def test_frequency_policies_keep_the_hot_set_through_a_scan(node, policy):
    kept = survivors_after_scan(node, policy)
    assert kept >= 0.8, f"{policy} kept only {kept:.0%} of the hot set"


@pytest.mark.parametrize("policy", ["lru", "lfu", "s3fifo"])
def test_policy_round_trips_and_can_change_at_runtime(node, policy):
    assert put(node, "q", {"eviction": policy})["eviction"] == policy
    r = node.raw()
    fill(r, [f"q:{i}" for i in range(50)], b"x" * 10)
    assert put(node, "q", {"eviction": "lru"})["eviction"] == "lru"
    assert present(r, [f"q:{i}" for i in range(50)]) == 50


@pytest.mark.parametrize("policy", ["lru", "lfu", "s3fifo"])
def test_expired_items_are_reclaimed_within_about_a_second(node, policy):
    put(node, "t", {"memory": 2 * MB, "eviction": policy})
    r = node.raw()
    live = [f"t:live:{i:04d}" for i in range(800)]
    fill(r, live, b"l" * 1000)
    short = [f"t:short:{i:04d}" for i in range(1000)]
    for i in range(0, len(short), 100):
        r.send(b"".join(b"set %s 0 1 1000\r\n%s\r\n" % (k.encode(), b"s" * 1000)
                        for k in short[i:i + 100]))
        for _ in range(100):
            assert r.read_line() == "STORED"
    # Nobody reads the short-lived items: the sweeper must find them by itself.
    wait_until(lambda: int(ns_stats(r, "t")["items"]) == len(live), timeout=4,
               message="expired items to be reclaimed without a read")
    assert int(ns_stats(r, "t")["expired"]) >= len(short) - 10
    # The room they left is used before any live item is evicted.
    fill(r, [f"t:new:{i:04d}" for i in range(700)], b"n" * 1000)
    assert present(r, live) == len(live)
    assert ns_stats(r, "t")["evictions"] == "0"


def test_transient_items_go_within_about_a_second_without_a_sweep(start_server):
    """The transient item cache frees short-TTL items even when the full sweep is a minute away
    (as on a node with far more memory than one tick walks)."""
    srv = start_server("-m", "64", "--sweep-interval-ms", "60000")
    r = srv.raw()
    short = [f"tr:{i:05d}" for i in range(2000)]
    for i in range(0, len(short), 200):
        r.send(b"".join(b"set %s 0 1 100\r\n%s\r\n" % (k.encode(), b"t" * 100)
                        for k in short[i:i + 200]))
        for _ in range(200):
            assert r.read_line() == "STORED"
    assert r.store("set", "tr:long", b"l", exptime=120) == "STORED"
    wait_until(lambda: r.stats()["curr_items"] == "1", timeout=4,
               message="short-TTL items to be freed without a read or a sweep")
    assert int(r.stats()["transient_reclaimed"]) >= 1000
    assert r.get("tr:long")


def test_s3fifo_keeps_small_items_over_large_ones_asked_for_as_often(start_server):
    """Cache-aside at -m 8 over 6,000 keys of 100 B and 6,000 of 2,000 B asked for uniformly
    (about twice what fits): the default policy (s3fifo) keeps small items more, since a cache is
    judged by its hits and one large item takes the room of many small ones. Before, both hit
    about 62% of the time; memcached's per-class pages favour small items in the same way."""
    srv = start_server("-m", "8")
    r = srv.raw()
    rng = random.Random(7)
    keys = [(f"s:{i:05d}", 100) for i in range(6000)] + [(f"l:{i:05d}", 2000) for i in range(6000)]
    hits = {"s": [0, 0], "l": [0, 0]}
    for rnd in range(120):
        batch = [keys[rng.randrange(len(keys))] for _ in range(500)]
        got = {it[0] for it in r.get(*[k for k, _ in batch])}
        miss = [(k, n) for k, n in batch if k not in got]
        r.send(b"".join(b"set %s 0 0 %d\r\n%s\r\n" % (k.encode(), n, b"v" * n) for k, n in miss))
        for k, _ in miss:
            assert r.read_line() == "STORED", k
        if rnd >= 60:  # the first half fills the cache
            for k, _ in batch:
                hits[k[0]][0] += k in got
                hits[k[0]][1] += 1
    small, large = (hits[c][0] / hits[c][1] for c in "sl")
    assert small > large + 0.15, f"hit ratio of small keys {small:.3f}, of large keys {large:.3f}"
