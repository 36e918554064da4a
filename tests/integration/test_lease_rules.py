"""Namespace lease rules on shoal-node: lease_period (one win per key per period, even across
deletes), one win in flight per key (lease_ttl), and stale_ttl serving *expired* values marked
stale to lease-aware readers (mg N/R) while one of them refills. shoal only: memcached has no
namespaces. The memcached-compatible lease basics are in test_leases.py; the herd under fire is
test_lease_storm.py."""

import time

import pytest

from mcraw import accepts, free_port, http, wait_until

pytestmark = pytest.mark.shoal_only


@pytest.fixture
def node(start_server):
    port = free_port()
    srv = start_server("--admin-port", str(port), "--sweep-interval-ms", "10")
    wait_until(lambda: accepts(port), timeout=5, message="the admin port to accept connections")
    srv.admin = port
    return srv


def put_ns(node, name, **settings):
    st, body = http(node.admin, "PUT", f"/v1/namespaces/{name}", settings)
    assert st in (200, 201), body


# --- lease_period -------------------------------------------------------------------------------

def test_period_refuses_a_second_win_after_delete(node):
    put_ns(node, "lp", lease_period=2)
    a, b = node.raw(), node.raw()
    t0 = time.monotonic()
    assert "W" in a.meta("mg lp:k v c N30").flags
    assert a.meta("md lp:k").code == "HD"
    r = b.meta("mg lp:k v c N30")
    assert r.line == "VA 0 c0 Z", f"within the period a miss waits, with no placeholder: {r.line}"
    assert b.meta("mg lp:k v").code == "EN", "the refused miss stored nothing"
    wait_until(lambda: "W" in b.meta("mg lp:k v c N30").flags, timeout=5,
               message="a new win once lease_period has passed")
    assert time.monotonic() - t0 >= 1.99, "the second win came before lease_period"


def test_period_serves_stale_value_with_Z(node):
    put_ns(node, "lp", lease_period=30, stale_ttl=60)
    a, b = node.raw(), node.raw()
    a.meta("ms lp:k 2", b"v1")
    a.meta("md lp:k I")
    win = a.meta("mg lp:k v c")
    assert ("X" in win.flags, "W" in win.flags) == (True, True), win.line
    assert a.meta(f"ms lp:k 2 C{win.cas}", b"v2").code == "HD"
    a.meta("md lp:k I")  # invalidated again within the period
    for c in (a, b):
        r = c.meta("mg lp:k v c")
        assert r.value == b"v2" and r.flag_list[1:] == ["Z", "X"], \
            f"within lease_period: the stale value, Z and X, no W: {r.line}"


def test_period_also_caps_recache_wins(node):
    put_ns(node, "lp", lease_period=30)
    r = node.raw()
    r.meta("ms lp:k 1 T5", b"x")
    win = r.meta("mg lp:k v c R30")
    assert "W" in win.flags
    r.meta(f"ms lp:k 1 C{win.cas} T5", b"y")
    again = r.meta("mg lp:k v R30")
    assert (again.value, again.flag_list) == (b"y", ["Z"]), again.line


def test_period_ghost_reply_reports_requested_flags(node):
    put_ns(node, "lp", lease_period=30)
    r = node.raw()
    r.meta("mg lp:k N30")
    r.meta("md lp:k")
    assert r.meta("mg lp:k v c t s f h N30 k").line == "VA 0 c0 t-1 s0 f0 h0 klp:k Z"
    assert r.meta("mg lp:k N30").line == "HD Z"


def test_default_namespace_keeps_memcached_rules(node):
    r = node.raw()
    r.meta("mg k v N30")
    r.meta("md k")
    assert "W" in r.meta("mg k v N30").flags, "no lease rules: a delete frees the next win"


# --- one win in flight (lease_ttl) --------------------------------------------------------------

def test_no_second_win_while_the_first_is_in_flight(node):
    put_ns(node, "lt", lease_ttl=30)
    a, b = node.raw(), node.raw()
    win = a.meta("mg lt:k v c N30")
    assert "W" in win.flags
    a.meta("md lt:k")  # voids a's fill, but a is still loading
    assert b.meta("mg lt:k v c N30").line == "VA 0 c0 Z", "no second load beside the first"
    assert a.meta(f"ms lt:k 3 C{win.cas}", b"old").code == "NF", "the voided fill is refused"
    r = b.meta("mg lt:k v c N30")
    assert "W" in r.flags, f"the refused fill ended the first win: the next reader wins: {r.line}"


def test_win_in_flight_ends_after_lease_ttl(node):
    put_ns(node, "lt", lease_ttl=1)
    a, b = node.raw(), node.raw()
    t0 = time.monotonic()
    assert "W" in a.meta("mg lt:k v c N300").flags  # a never fills
    a.meta("md lt:k")
    assert "Z" in b.meta("mg lt:k v c N300").flags
    wait_until(lambda: "W" in b.meta("mg lt:k v c N300").flags, timeout=5,
               message="a new win once the silent holder's lease_ttl passed")
    assert time.monotonic() - t0 >= 0.99


def test_fill_with_other_cas_does_not_end_the_win(node):
    put_ns(node, "lt", lease_ttl=30)
    a, b = node.raw(), node.raw()
    win = a.meta("mg lt:k v c N30")
    a.meta("md lt:k")
    assert b.meta(f"ms lt:k 1 C{win.cas + 1000}", b"x").code == "NF"
    assert "Z" in b.meta("mg lt:k v N30").flags, "only the holder's own CAS ends its win"


def test_stale_win_in_flight_blocks_after_reinvalidation(node):
    put_ns(node, "lt", lease_ttl=30, stale_ttl=60)
    a, b = node.raw(), node.raw()
    a.meta("ms lt:k 2", b"v1")
    a.meta("md lt:k I")
    win = a.meta("mg lt:k v c")
    assert "W" in win.flags
    a.meta("md lt:k I")  # a second invalidation while a loads
    r = b.meta("mg lt:k v c")
    assert r.value == b"v1" and "W" not in r.flags and "Z" in r.flags, r.line
    assert a.meta(f"ms lt:k 2 C{win.cas}", b"v2").code == "EX"
    assert "W" in b.meta("mg lt:k v c").flags, "after the refused fill the next reader wins"


# --- stale_ttl on expiry ------------------------------------------------------------------------

def expire(node, key, value=b"old"):
    """Store `key` with a 1 s TTL and wait until a plain mg misses."""
    r = node.raw()
    assert r.meta(f"ms {key} {len(value)} T1", value).code == "HD"
    wait_until(lambda: r.meta(f"mg {key} v").code == "EN", timeout=5,
               message=f"{key} to expire for plain readers")
    return time.monotonic()


def test_expired_value_served_stale_to_lease_readers(node):
    put_ns(node, "st", stale_ttl=2)
    a, b, plain = node.raw(), node.raw(), node.raw()
    expired_at = expire(node, "st:k")
    win = a.meta("mg st:k v c N30 t")
    assert win.value == b"old" and win.flag_list[2:] == ["X", "W"], \
        f"first lease-aware reader: old value, X and W: {win.line}"
    assert int(win.flags["t"]) in (0, 1, 2), "t says how long the stale value is still served"
    r = b.meta("mg st:k v c N30")
    assert r.value == b"old" and r.flag_list[1:] == ["Z", "X"], f"others: X and Z: {r.line}"
    assert b.meta("mg st:k v c R5").flag_list[1:] == ["Z", "X"], "R readers are lease-aware too"
    assert plain.meta("mg st:k v").code == "EN", "a reader without N/R misses, as in memcached"
    assert plain.get("st:k") == [], "text get misses too"
    assert "X" in b.meta("mg st:k v N30").flags, "plain misses left the stale value in place"
    def fresh_lease():
        got = b.meta("mg st:k v c N30")
        return got if "X" not in got.flags else None
    r = wait_until(fresh_lease, timeout=6, message="the stale value to go once stale_ttl passed")
    assert time.monotonic() - expired_at >= 1.0, "the stale value went before stale_ttl"
    assert r.value == b"" and r.flag_list[1:] == ["W"], \
        f"after stale_ttl a plain miss: a new empty placeholder and its win: {r.line}"


def test_fill_of_expired_stale_value(node):
    put_ns(node, "st", stale_ttl=30)
    a, b = node.raw(), node.raw()
    expire(node, "st:k")
    win = a.meta("mg st:k v c N30")
    assert "W" in win.flags
    fill = a.meta(f"ms st:k 3 C{win.cas} T100 c", b"new")
    assert fill.code == "HD", f"the winner's fill replaces the stale value: {fill.line}"
    r = b.meta("mg st:k v c")
    assert (r.value, r.flag_list) == (b"new", [f"c{fill.cas}"])


def test_stores_treat_expired_stale_value_as_absent(node):
    put_ns(node, "st", stale_ttl=30)
    r = node.raw()
    expire(node, "st:k")
    win = r.meta("mg st:k v c N30")
    assert r.meta(f"ms st:k 1 C{win.cas + 1}", b"x").code == "NF"
    assert r.meta("ms st:k 1 MR", b"x").code == "NS", "replace of an expired value fails"
    assert "X" in r.meta("mg st:k v N30").flags, "...and leaves the stale value"
    assert r.meta("ms st:k 1 ME", b"a").code == "HD", "add of an expired value stores"
    assert r.meta("mg st:k v").value == b"a"


def test_plain_delete_drops_expired_stale_value(node):
    put_ns(node, "st", stale_ttl=30)
    r = node.raw()
    expire(node, "st:k")
    assert r.meta("md st:k").code == "NF", "expired: NF, as for any expired item"
    got = r.meta("mg st:k v N30")
    assert got.value == b"" and "W" in got.flags and "X" not in got.flags, got.line


def test_md_I_on_expired_stale_value_revalidates(node):
    put_ns(node, "st", stale_ttl=30)
    a = node.raw()
    expire(node, "st:k")
    win = a.meta("mg st:k v c N30")
    assert a.meta("md st:k I").code == "HD"
    r = a.meta("mg st:k v c N30")
    assert r.value == b"old" and r.flag_list[1:] == ["X", "W"] and r.cas != win.cas, \
        f"md I voids the win and hands a new one: {r.line}"


def test_expired_stale_value_outlives_the_sweeper(node):
    # The node sweeps every 10 ms. A control item of the default namespace, stored after the
    # stale one (so it expires no earlier), is reclaimed by the sweeper unread: once it is gone
    # a sweep has passed the stale item after its expiry, and the stale item must still be there.
    put_ns(node, "st", stale_ttl=60)
    r = node.raw()
    assert r.meta("ms st:k 3 T1", b"old").code == "HD"
    assert r.meta("ms control 1 T1", b"c").code == "HD"
    # (the sweeper thread frees a short-TTL item through the transient list, or by its sweep)
    wait_until(lambda: int(r.stats()["sweeper_reclaimed"]) + int(r.stats()["transient_reclaimed"])
               >= 1, timeout=6, message="the sweeper to reclaim the expired control item")
    got = r.meta("mg st:k v N30")
    assert got.value == b"old" and "X" in got.flags, f"kept through the sweep: {got.line}"


def test_no_grace_without_stale_ttl(node):
    put_ns(node, "ns0")
    r = node.raw()
    expire(node, "ns0:k")
    got = r.meta("mg ns0:k v N30")
    assert got.value == b"" and got.flag_list == ["W"], got.line
