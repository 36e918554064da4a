"""Warm-up routes through shoal-router: a pool with warm_from answers a get, gat or mg it misses
(mg: EN, or a lease won on a placeholder the miss vivified) from the warm pool and adds the value
into itself with the warm item's flags, CAS and remaining TTL (gat/gats and mg T: the TTL asked
for, after the namespace's rules); an mg gets the answer in its own flags (quiet mode, opaque,
key, value or not). A delete to it carries a 2-second hold-off so a racing add of an old value
fails (the paper's §4.3). Checked on the nodes directly. Skipped when
SHOAL_TEST_SERVER=memcached."""

import base64
import time

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
    doc["namespaces"]["catalog"] = {"pool": "main", "default_ttl": 600, "max_ttl": 3600}
    router, _, _ = start_router(doc)
    return cold, hot, router


def owner(nodes, key):
    return nodes[default_owner(key_slot(key), len(nodes))]


def direct(node):
    return McRaw(node.host, node.port)


def put_warm(hot, key, value, flags=0, exptime=0):
    """Store in the warm pool directly; returns the warm item's CAS."""
    with direct(owner(hot, key)) as h:
        assert h.store("set", key, value, flags=flags, exptime=exptime) == "STORED"
        return h.get(key, cmd="gets")[0][3]


def cold_item(cold, key, flags="v f t c"):
    """Wait for the fill (sent after the client's answer) and return the cold node's item: a
    value, not a placeholder awaiting its fill (Z)."""
    def filled():
        m = c.meta(f"mg {key} v")
        return m.code == "VA" and "Z" not in m.flags

    with direct(owner(cold, key)) as c:
        wait_until(filled, timeout=5, message=f"{key} filled into the cold pool")
        return c.meta(f"mg {key} {flags}")


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


def test_mg_warm_hit_answers_in_the_clients_flags(warm):
    cold, hot, router = warm
    cas = put_warm(hot, "w1", "warm-value", flags=5, exptime=500)
    r = router.raw()
    got = r.meta("mg w1 s v f t c k Oop1")
    assert got.code == "VA" and got.value == b"warm-value", got
    assert got.flag_list[:3] == ["s10", "f5", got.flag_list[2]]
    assert 498 <= int(got.flags["t"]) <= 500
    assert got.flag_list[3:] == [f"c{cas}", "kw1", "Oop1"], "request order, as the node answers"
    m = cold_item(cold, "w1")
    assert m.value == b"warm-value" and m.flags["f"] == "5" and m.cas == cas
    assert 498 <= int(m.flags["t"]) <= 500, "the warm item's remaining TTL, within a second"
    s = r.stats()
    assert (s["warm_lookups"], s["warm_hits"], s["warm_fills"]) == ("1", "1", "1")
    again = r.meta("mg w1 s v f t c k Oop1")
    assert again.line.split(" ")[:4] == got.line.split(" ")[:4] and again.value == b"warm-value"
    assert r.stats()["warm_lookups"] == "1", "a cold hit needs no warm lookup"


def test_mg_without_v_still_fills(warm):
    cold, hot, router = warm
    put_warm(hot, "w2", "abc", flags=9, exptime=300)
    r = router.raw()
    got = r.meta("mg w2 t s")
    assert got.code == "HD" and got.value is None, got
    assert got.flag_list[1] == "s3" and 298 <= int(got.flags["t"]) <= 300
    m = cold_item(cold, "w2")
    assert m.value == b"abc" and m.flags["f"] == "9"
    assert r.meta("mg w2").line == "HD", "no flags asked, none answered"


def test_mg_quiet_and_opaque(warm):
    cold, hot, router = warm
    put_warm(hot, "w3", "quiet-hit")
    r = router.raw()
    r.send(b"mg w3 v q Oa\r\nmg nowhere v q Ob\r\nmg nowhere k Oc\r\nmn\r\n")
    hit = r.read_meta()
    assert hit.line == "VA 9 Oa" and hit.value == b"quiet-hit", "a warm hit is not hidden by q"
    assert r.read_line() == "EN knowhere Oc", "a miss in both pools echoes k and O like the node"
    assert r.read_line() == "MN", "the quiet miss (Ob) is dropped"
    assert cold_item(cold, "w3").value == b"quiet-hit"


def test_mg_touch_sets_the_fill_ttl_after_the_namespace_rules(warm):
    cold, hot, router = warm
    put_warm(hot, "w4", "x", exptime=1000)
    put_warm(hot, "w4b", "x", exptime=1000)
    r = router.raw()
    assert r.meta("mg w4 T100 t v").flags["t"] == "100", "t after T reports the new TTL"
    assert 98 <= int(cold_item(cold, "w4").flags["t"]) <= 100, "the fill uses T's TTL"
    got = r.meta("mg w4b t T100 v")
    assert 998 <= int(got.flags["t"]) <= 1000, "t before T reports the TTL the item had, as the node"
    assert 98 <= int(cold_item(cold, "w4b").flags["t"]) <= 100
    put_warm(hot, "catalog:w4", "y", exptime=99999)  # longer than catalog's max_ttl
    got = r.meta("mg catalog:w4 v t")
    assert 3598 <= int(got.flags["t"]) <= 3600, "t reports the TTL the cold pool gives it"
    assert 3598 <= int(cold_item(cold, "catalog:w4").flags["t"]) <= 3600, "max_ttl holds for fills"
    put_warm(hot, "catalog:w4n", "y")  # no TTL: "never", which catalog's default_ttl replaces
    assert 598 <= int(r.meta("mg catalog:w4n v t").flags["t"]) <= 600
    assert 598 <= int(cold_item(cold, "catalog:w4n").flags["t"]) <= 600


def test_mg_base64_key(warm):
    cold, hot, router = warm
    raw_key = b"bin\x01key"
    b64 = base64.b64encode(raw_key).decode()
    with direct(owner(hot, raw_key)) as h:
        assert h.meta(f"ms {b64} 3 b F2 T200", b"bin").code == "HD"
    r = router.raw()
    got = r.meta(f"mg {b64} b v k f")
    assert got.line == f"VA 3 k{b64} b f2" and got.value == b"bin", got
    with direct(owner(cold, raw_key)) as c:
        wait_until(lambda: c.meta(f"mg {b64} b v").value == b"bin", timeout=5,
                   message="the binary key filled into the cold pool")


def test_mg_lease_win_is_served_from_the_warm_pool(warm):
    cold, hot, router = warm
    cas = put_warm(hot, "w5", "computed", flags=3, exptime=400)
    r = router.raw()
    got = r.meta("mg w5 N30 v t")
    assert got.code == "VA" and got.value == b"computed", got
    assert "W" not in got.flags and "c" not in got.flags, \
        "the client need not recompute, and gets no c it did not ask for"
    m = cold_item(cold, "w5", "v f t c")
    assert m.value == b"computed" and m.flags["f"] == "3" and m.cas == cas, \
        "the placeholder was filled with the warm item"
    assert 398 <= int(m.flags["t"]) <= 400
    assert r.meta("mg w5 N30 v").line == "VA 8", "later readers hit the cold pool: no Z"
    # with c asked by the client, it comes back as the warm item's CAS
    cas6 = put_warm(hot, "w6", "z")
    got = r.meta("mg w6 c N30 v")
    assert got.line == f"VA 1 c{cas6}", got


def test_mg_lease_win_without_warm_value_stays_a_win(warm):
    cold, hot, router = warm
    r = router.raw()
    assert r.meta("mg w7 N30 v").line == "VA 0 W", "the c the router asked for is not shown"
    assert r.meta("mg w7 N30 v").line == "VA 0 Z"
    assert r.meta("mg w8 N30").line == "HD W"
    assert r.meta("ms w7 2", b"ok").line == "HD"
    assert r.meta("mg w7 N30 v f").line == "VA 2 f0", "a cold hit loses the added c too"


def test_mg_recache_and_stale_are_not_warmed(warm):
    cold, hot, router = warm
    put_warm(hot, "w9", "old")
    r = router.raw()
    got = r.meta("mg w9 N30 R10 v")
    assert got.line == "VA 0 W", "N with R: W may be an early recache; the cold pool answers"
    put_warm(hot, "w10", "stale")
    with direct(owner(hot, "w10")) as h:
        assert h.meta("md w10 I").code == "HD"  # invalidated in the warm pool
    assert r.meta("mg w10 v").line == "EN", "a stale warm value is not served"
    assert r.stats()["warm_fills"] == "0", "nor copied into the cold pool"


def test_gat_and_gats_warm_with_the_ttl_asked(warm):
    cold, hot, router = warm
    cas = put_warm(hot, "g1", "gv", flags=4, exptime=50)
    cas2 = put_warm(hot, "catalog:g2", "gw", exptime=50)
    r = router.raw()
    got = r.get("300", "g1", "nowhere", "catalog:g2", cmd="gats")  # gats <exptime> <keys>
    assert got == [("g1", 4, b"gv", cas), ("catalog:g2", 0, b"gw", cas2)]
    m = cold_item(cold, "g1")
    assert m.cas == cas and m.flags["f"] == "4"
    assert 298 <= int(m.flags["t"]) <= 300, "the fill has the gat's TTL, not the warm item's"
    assert 298 <= int(cold_item(cold, "catalog:g2").flags["t"]) <= 300
    put_warm(hot, "catalog:g3", "long")
    assert r.get("99999", "catalog:g3", cmd="gat") == [("catalog:g3", 0, b"long", None)]
    assert 3598 <= int(cold_item(cold, "catalog:g3").flags["t"]) <= 3600, "after max_ttl"
    put_warm(hot, "g4", "gone")
    fills = r.stats()["warm_fills"]
    assert r.get("-1", "g4", cmd="gat") == [("g4", 0, b"gone", None)]
    assert r.stats()["warm_fills"] == fills, "an already expired TTL fills nothing"


def test_deletes_hold_off_mg_and_gat_fills(warm):
    cold, hot, router = warm
    r = router.raw()
    assert r.store("set", "d1", "new") == "STORED"
    assert r.cmd("delete d1") == "DELETED"
    put_warm(hot, "d1", "old")  # the warm pool has not seen the delete
    assert r.meta("mg d1 v").value == b"old", "the racing mg is answered from the warm pool"
    assert r.get("5", "d1", cmd="gat") == [("d1", 0, b"old", None)]
    with direct(owner(cold, "d1")) as c:
        assert c.meta("mg d1 v").code == "EN", "but the fills of the old value were held off"
        assert c.store("add", "d1", "x") == "NOT_STORED"
    assert r.meta("md d1").code in ("HD", "NF")
    with direct(owner(cold, "d1")) as c:
        assert c.store("add", "d1", "x") == "NOT_STORED", "md carries the hold-off too"


def test_fill_keeps_a_warm_ttl_over_30_days(warm):
    """A warm item with more than 30 days left (stored with an absolute time) is filled with
    that much left: a relative TTL over 30 days would be read as a 1970 time, expired at once."""
    cold, hot, router = warm
    far = int(time.time()) + 60 * 86400
    put_warm(hot, "w60", "long-lived", exptime=far)
    assert router.raw().get("w60") == [("w60", 0, b"long-lived", None)]
    left = int(cold_item(cold, "w60").flags["t"])
    assert abs(left - 60 * 86400) <= 3, f"the cold copy has the warm item's {left} s left"
