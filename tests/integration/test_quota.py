"""Namespace memory quotas on shoal-node: a namespace never holds more than its quota, filling one
namespace never evicts another's items while the quotas fit in -m, a lowered quota shrinks, and a
store that fits never fails. shoal only."""

import json

import pytest

from mcraw import accepts, free_port, http, wait_until

pytestmark = pytest.mark.shoal_only

MB = 1 << 20


@pytest.fixture
def node(start_server):
    port = free_port()
    srv = start_server("-m", "64", "--admin-port", str(port))
    wait_until(lambda: accepts(port), timeout=5, message="the admin port to accept connections")
    srv.admin = port
    return srv


def put(node, name, settings):
    st, body = http(node.admin, "PUT", f"/v1/namespaces/{name}", settings)
    assert st in (200, 201), body
    return json.loads(body)


def fill(raw, keys, value, batch=200):
    """Store every key with `value`, pipelined; every reply must be STORED."""
    for i in range(0, len(keys), batch):
        chunk = keys[i:i + batch]
        raw.send(b"".join(b"set %s 0 0 %d\r\n%s\r\n" % (k.encode(), len(value), value)
                          for k in chunk))
        for k in chunk:
            line = raw.read_line()
            assert line == "STORED", f"set {k}: {line}"


def present(raw, keys, batch=100):
    """How many of `keys` are found by get."""
    found = 0
    for i in range(0, len(keys), batch):
        found += len(raw.get(*keys[i:i + batch]))
    return found


def ns_stats(raw, name):
    st = raw.stats("namespaces")
    return {k.split(":", 2)[2]: v for k, v in st.items() if k.startswith(f"ns:{name}:")}


def test_filling_one_namespace_never_evicts_another(node):
    put(node, "a", {"memory": 16 * MB})
    put(node, "b", {"memory": 16 * MB})
    r = node.raw()
    value = b"v" * 1000
    b_keys = [f"b:{i}" for i in range(8000)]  # about 8.6 MB: fits b's quota
    fill(r, b_keys, value)
    a_keys = [f"a:{i}" for i in range(60000)]  # about 65 MB: four times a's quota
    fill(r, a_keys, value)
    d_keys = [f"plain{i}" for i in range(60000)]  # default: no quota, shares the other 32 MB
    fill(r, d_keys, value)

    assert present(r, b_keys) == len(b_keys), "b lost items while a and default filled"
    a = ns_stats(r, "a")
    assert int(a["memory"]) <= 16 * MB, a
    assert int(a["bytes"]) <= 16 * MB, a
    assert int(a["evictions"]) > 0, "a store into a full namespace evicts from that namespace"
    assert present(r, a_keys[-1000:]) > 900, "a keeps its most recent items"
    b = ns_stats(r, "b")
    assert b["evictions"] == "0", b
    d = ns_stats(r, "default")
    assert int(d["memory"]) <= 64 * MB - 32 * MB, "default uses only what the quotas leave"
    assert int(d["evictions"]) > 0


def test_lowering_a_quota_shrinks_the_namespace(node):
    put(node, "a", {"memory": 32 * MB})
    r = node.raw()
    keys = [f"a:{i}" for i in range(40000)]
    fill(r, keys, b"x" * 1000)
    assert int(ns_stats(r, "a")["memory"]) > 24 * MB
    put(node, "a", {"memory": 8 * MB})
    wait_until(lambda: int(ns_stats(r, "a")["memory"]) <= 8 * MB, timeout=10,
               message="namespace a to give back pages down to its new quota")
    assert int(ns_stats(r, "a")["bytes"]) <= 8 * MB
    fill(r, keys[:100], b"y" * 1000)  # and it keeps working at the new size
    assert present(r, keys[:100]) == 100


def test_lowering_a_quota_above_the_live_bytes_evicts_nothing(node):
    """A namespace whose live items fit its lowered quota gives pages back by moving them
    together, not by evicting (before, the trim dropped whole pages, live items with them)."""
    put(node, "a", {"memory": 32 * MB})
    r = node.raw()
    keys = [f"a:{i}" for i in range(20000)]  # about 21 MB
    fill(r, keys, b"x" * 1000)
    kept = keys[::10]  # one in ten stays: about 2 MB live, spread over every page
    kept_set = set(kept)
    for i in range(0, len(keys), 200):
        r.send(b"".join(b"delete %s\r\n" % k.encode() for k in keys[i:i + 200]
                        if k not in kept_set))
        for k in keys[i:i + 200]:
            if k not in kept_set:
                assert r.read_line() == "DELETED"
    before = int(ns_stats(r, "a")["evictions"])
    put(node, "a", {"memory": 8 * MB})
    wait_until(lambda: int(ns_stats(r, "a")["memory"]) <= 8 * MB, timeout=10,
               message="namespace a to give back pages down to its new quota")
    assert present(r, kept) == len(kept), "live items that fit the new quota were evicted"
    assert int(ns_stats(r, "a")["evictions"]) == before


def test_a_quota_set_after_default_filled_memory_is_honoured(node):
    r = node.raw()
    fill(r, [f"d{i}" for i in range(70000)], b"z" * 1000)  # default takes all 64 MB
    put(node, "late", {"memory": 16 * MB})
    late = [f"late:{i}" for i in range(12000)]  # about 13 MB
    fill(r, late, b"l" * 1000)
    assert present(r, late) == len(late), "the late namespace got its quota back from default"
    assert ns_stats(r, "late")["evictions"] == "0"


def test_mixed_sizes_in_a_small_quota_never_fail(node):
    put(node, "tiny", {"memory": 2 * MB})
    r = node.raw()
    for size in (100, 3000, 50000, 200, 900000, 10, 120000):
        fill(r, [f"tiny:{size}:{i}" for i in range(40)], b"s" * size, batch=10)
    assert int(ns_stats(r, "tiny")["memory"]) <= 2 * MB


@pytest.mark.parametrize("policy", ["lru", "lfu", "s3fifo"])
def test_a_one_segment_quota_evicts_within_itself_once_memory_is_full(node, policy):
    """The smallest quota allowed, one segment, is all head: with no free segment left, its
    stores must evict from it (before, every one failed with out of memory)."""
    r = node.raw()
    seg = int(r.stats()["slab_page_size"])
    put(node, "one", {"memory": seg, "eviction": policy})
    fill(r, [f"d{i}" for i in range(70000)], b"z" * 1000)  # default takes all the rest
    keys = [f"one:{i}" for i in range(3 * seg // 1000)]  # three times the quota
    fill(r, keys, b"o" * 1000)
    one = ns_stats(r, "one")
    assert int(one["evictions"]) > 0 and int(one["memory"]) <= seg, one
    # one segment is one FIFO step: evicting it empties it, so only the latest item is sure
    assert present(r, keys[-1:]) == 1, "the latest store is held"


@pytest.mark.parametrize("body, needle", [
    ({"memory": 4096}, "memory"),
    ({"memory": 65 * MB}, "memory"),
])
def test_impossible_quotas_are_refused_and_change_nothing(node, body, needle):
    put(node, "q", {"memory": 4 * MB})
    st, text = http(node.admin, "PUT", "/v1/namespaces/q", body)
    assert st == 400, text
    assert needle in json.loads(text)["error"]
    assert json.loads(http(node.admin, "GET", "/v1/namespaces/q")[1])["memory"] == 4 * MB


def test_quota_and_memory_in_metrics(node):
    put(node, "mq", {"memory": 8 * MB})
    r = node.raw()
    fill(r, [f"mq:{i:03d}" for i in range(100)], b"m" * 100)  # 15 KB: one segment of the log
    r.get("mq:001", "mq:nope")
    seg = int(r.stats()["slab_page_size"])
    st, text = http(node.admin, "GET", "/metrics")
    assert st == 200
    assert f'shoal_node_ns_quota_bytes{{namespace="mq"}} {8 * MB}' in text
    assert f'shoal_node_ns_memory_bytes{{namespace="mq"}} {seg}\n' in text
    assert 'shoal_node_ns_hit_ratio{namespace="mq"} 0.5000' in text
    assert 'shoal_node_ns_items{namespace="mq"} 100' in text
