"""Warm-up routes through shoal-router: a pool with warm_from answers a get it misses from the warm
pool and adds the value into itself with the warm item's flags, remaining TTL and CAS; a delete to
it carries a 2-second hold-off so a racing add of an old value fails (the paper's §4.3). Checked
on the nodes directly. Skipped when SHOAL_TEST_SERVER=memcached."""

import pytest

from conftest import default_owner, key_slot, topology
from mcraw import McRaw, wait_until

pytestmark = pytest.mark.shoal_only


@pytest.fixture
def warm(start_server, start_router):
    cold = [start_server() for _ in range(2)]
    hot = [start_server() for _ in range(2)]
    doc = topology(cold)
    doc["pools"]["main"]["warm_from"] = "warm"
    doc["pools"]["warm"] = {"nodes": [f"127.0.0.1:{n.port}" for n in hot]}
    router, _, _ = start_router(doc)
    return cold, hot, router


def owner(nodes, key):
    return nodes[default_owner(key_slot(key), len(nodes))]


def direct(node):
    return McRaw(node.host, node.port)


def test_cold_miss_is_filled_from_the_warm_pool(warm):
    cold, hot, router = warm
    with direct(owner(hot, "w1")) as h:
        assert h.store("set", "w1", "warm-value", flags=5, exptime=500) == "STORED"
        warm_cas = h.get("w1", cmd="gets")[0][3]
    r = router.raw()
    got = r.get("w1", cmd="gets")
    assert got == [("w1", 5, b"warm-value", warm_cas)], "answered from the warm pool, its CAS too"
    with direct(owner(cold, "w1")) as c:
        # the fill is sent after the client's answer, on the cold node's upstream: await it
        wait_until(lambda: c.meta("mg w1 v").value is not None, timeout=5,
                   message="the warm value to be added into the cold pool")
        m = c.meta("mg w1 v f t c")
        assert m.value == b"warm-value" and m.flags["f"] == "5", "added into the cold pool"
        assert 490 <= int(m.flags["t"]) <= 500, "with the warm item's remaining TTL"
        assert int(m.flags["c"]) == warm_cas, "and its CAS, so gets/cas keep working"
    assert int(r.stats()["warm_fills"]) == 1
    assert r.get("w1") == [("w1", 5, b"warm-value", None)]
    assert int(r.stats()["warm_lookups"]) == 1, "a cold hit needs no warm lookup"


def test_multiget_mixes_cold_hits_warm_hits_and_misses(warm):
    cold, hot, router = warm
    r = router.raw()
    for i in range(0, 30, 3):
        assert r.store("set", f"m{i}", f"cold{i}") == "STORED"  # through the router: cold pool
    for i in range(1, 30, 3):
        with direct(owner(hot, f"m{i}")) as h:
            h.store("set", f"m{i}", f"warm{i}")
    keys = [f"m{i}" for i in range(30)]
    got = r.get(*keys)
    want = [(f"m{i}", 0, (f"cold{i}" if i % 3 == 0 else f"warm{i}").encode(), None)
            for i in range(30) if i % 3 != 2]
    assert got == want


def test_delete_holds_off_a_racing_add(warm):
    cold, hot, router = warm
    r = router.raw()
    assert r.store("set", "d1", "new") == "STORED"
    assert r.cmd("delete d1") == "DELETED"
    with direct(owner(hot, "d1")) as h:  # the warm pool still has an old value
        h.store("set", "d1", "old")
    assert r.get("d1") == [("d1", 0, b"old", None)], "the request is answered from the warm pool"
    with direct(owner(cold, "d1")) as c:
        assert c.meta("mg d1 v").code == "EN", "but the add of the old value was held off"
    assert r.meta("md d1").code in ("HD", "NF")
    with direct(owner(cold, "d1")) as c:
        assert c.store("add", "d1", "x") == "NOT_STORED", "md carries the hold-off too"
    wait_until(lambda: r.get("d1") and direct(owner(cold, "d1")).meta("mg d1 v").code == "VA",
               timeout=6, message="the fill succeeding once the hold-off ends")
