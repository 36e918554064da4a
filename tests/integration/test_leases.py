"""Leases and stale-while-revalidate through the meta protocol: mg N/R hand out one win (W) and tell
everyone else a fill is under way (Z); md I / ms I serve stale values (X) while one client
refills. This is the thundering-herd protection the product exists for."""

import threading

from mcraw import McRaw


# --- N: vivify on miss ------------------------------------------------------------------------------

def test_first_miss_wins_lease(raw):
    r = raw.meta("mg k v c N30")
    assert r.code == "VA" and r.size == 0 and r.value == b"", \
        "a miss with N creates an empty placeholder and returns it as a hit"
    assert "W" in r.flags and "Z" not in r.flags, f"the first caller wins: {r.line}"


def test_followers_get_Z_not_EN(server):
    first, second, third = server.raw(), server.raw(), server.raw()
    win = first.meta("mg k v c N30")
    assert "W" in win.flags
    for c in (second, third, first):
        r = c.meta("mg k v c N30")
        assert r.code == "VA", f"followers see the placeholder, never EN: {r.line}"
        assert "Z" in r.flags and "W" not in r.flags, f"followers get Z only: {r.line}"
        assert r.cas == win.cas, "everyone sees the placeholder's CAS"


def test_lease_flags_exact_lines(raw):
    # Exact memcached 1.6.18 replies: W is appended after the requested flags.
    r = raw.meta("mg k v c N30")
    cas = r.cas
    assert r.line == f"VA 0 c{cas} W"
    assert raw.meta("mg k v c N30").line == f"VA 0 c{cas} Z"
    assert raw.meta("mg k v c N30 t").line in (f"VA 0 c{cas} t30 Z", f"VA 0 c{cas} t29 Z")


def test_lease_without_v_is_HD_W(raw):
    assert raw.meta("mg k N30").line == "HD W"
    assert raw.meta("mg k N30").line == "HD Z"


def test_mg_without_N_after_lease_sees_Z(raw):
    raw.meta("mg k v N30")
    assert raw.meta("mg k").line == "HD Z", "the win flag is on the item, seen by any mg"


def test_lease_placeholder_ttl_is_N(raw):
    r = raw.meta("mg k v N30 t")
    assert r.flags["t"] in ("30", "29"), "the placeholder lives for the N TTL"
    assert raw.meta("mg k t").flags["t"] in ("30", "29")


def test_lease_t_before_N_reports_no_ttl(raw):
    # Surprising: memcached applies flags in request order, so with t BEFORE N the vivify reply
    # says t-1 although the placeholder does get the N TTL.
    assert raw.meta("mg k v t N30").line == "VA 0 t-1 W"
    assert raw.meta("mg k t").flags["t"] in ("30", "29")


def test_vivified_placeholder_reports_all_requested_flags(raw):
    r = raw.meta("mg k v N30 h l t f s")
    assert r.line in ("VA 0 h0 l0 t30 f0 s0 W", "VA 0 h0 l0 t29 f0 s0 W"), r.line


def test_quiet_lease_miss_is_not_suppressed(raw):
    # With q, a miss would be silent, but the vivified placeholder is a hit and is answered.
    raw.send("mg k N30 q v\r\nmg k N30 q v\r\nmn\r\n")
    assert raw.read_meta().line == "VA 0 W"
    assert raw.read_meta().line == "VA 0 Z"
    assert raw.read_line() == "MN"


def test_winner_fill_with_cas_succeeds(server):
    winner, reader = server.raw(), server.raw()
    win = winner.meta("mg k v c N30")
    reader.meta("mg k v c N30")
    fill = winner.meta(f"ms k 5 C{win.cas} c", b"value")
    assert fill.code == "HD", f"the winner's fill with the lease CAS must be stored: {fill.line}"
    r = reader.meta("mg k v c N30")
    assert r.value == b"value"
    assert "W" not in r.flags and "Z" not in r.flags, f"after the fill nobody is told W/Z: {r.line}"
    assert r.cas == fill.cas


def test_fill_replaces_placeholder_ttl(raw):
    win = raw.meta("mg k v c N30")
    raw.meta(f"ms k 1 C{win.cas} T100", b"x")
    assert raw.meta("mg k t").flags["t"] in ("100", "99")


def test_fill_refused_after_delete(raw):
    win = raw.meta("mg k v c N30")
    assert raw.meta("md k").line == "HD"
    assert raw.meta(f"ms k 3 C{win.cas}", b"old").line == "NF", \
        "a fill racing a delete is refused with NF (the key is gone)"
    assert raw.meta("mg k v").line == "EN", "the racing fill must not have cached anything"


def test_fill_refused_after_overwrite(raw):
    win = raw.meta("mg k v c N30")
    raw.meta("ms k 3", b"new")
    assert raw.meta(f"ms k 3 C{win.cas}", b"old").line == "EX", \
        "a fill whose CAS no longer matches is refused with EX"
    assert raw.meta("mg k v").value == b"new"


def test_fill_refused_after_md_I(raw):
    win = raw.meta("mg k v c N30")
    raw.meta("md k I")
    assert raw.meta(f"ms k 3 C{win.cas}", b"old").line == "EX"


def test_new_lease_after_delete(raw):
    raw.meta("mg k v N30")
    raw.meta("md k")
    assert "W" in raw.meta("mg k v N30").flags, "after a delete the next miss wins again"


def test_N_on_existing_item_gives_no_flags(raw):
    raw.meta("ms k 1", b"x")
    r = raw.meta("mg k v N30")
    assert (r.value, r.flag_list) == (b"x", [])


def test_append_to_placeholder_clears_lease(raw):
    raw.meta("mg k N30")
    assert raw.meta("ms k 1 MA", b"x").line == "HD"
    r = raw.meta("mg k v")
    assert (r.value, r.flag_list) == (b"x", []), "any store replaces the item and its win flag"


# --- R: early recache -------------------------------------------------------------------------------

def test_R_wins_when_ttl_below_threshold(server):
    a, b = server.raw(), server.raw()
    a.meta("ms k 1 T10", b"x")
    r = a.meta("mg k v R30 t")
    assert "W" in r.flags and r.value == b"x", f"TTL 10 < 30: recache win, with the value: {r.line}"
    r = b.meta("mg k v R30 t")
    assert "Z" in r.flags and "W" not in r.flags and r.value == b"x", \
        f"a second reader sees Z and still gets the value: {r.line}"


def test_R_no_win_when_ttl_above_threshold(raw):
    raw.meta("ms k 1 T100", b"x")
    r = raw.meta("mg k v R30")
    assert r.flag_list == [], f"TTL 100 > 30: no recache: {r.line}"


def test_R_no_win_for_item_without_ttl(raw):
    raw.meta("ms k 1 T0", b"x")
    assert raw.meta("mg k v R30").flag_list == []


def test_R_recache_fill_clears_flags(raw):
    raw.meta("ms k 1 T10", b"x")
    win = raw.meta("mg k v c R30")
    assert "W" in win.flags
    assert raw.meta(f"ms k 1 C{win.cas} T100", b"y").code == "HD"
    r = raw.meta("mg k v R30")
    assert (r.value, r.flag_list) == (b"y", [])


# --- stale-while-revalidate -------------------------------------------------------------------------

def test_md_I_first_reader_gets_X_and_W(server):
    a, b = server.raw(), server.raw()
    a.meta("ms k 3 T100", b"old")
    assert a.meta("md k I T30").line == "HD"
    r = a.meta("mg k v c")
    assert r.value == b"old" and "X" in r.flags and "W" in r.flags, \
        f"first reader of a stale item: old value, X and W: {r.line}"
    r2 = b.meta("mg k v c")
    assert r2.value == b"old" and "X" in r2.flags and "Z" in r2.flags and "W" not in r2.flags, \
        f"other readers: old value, X and Z: {r2.line}"


def test_stale_flag_order_exact(raw):
    # Exact memcached 1.6.18 lines: the winner gets "X W", the others "Z X" (note the order).
    cas = raw.meta("ms k 3 c", b"old").cas
    raw.meta("md k I")
    assert raw.meta("mg k v c").line == f"VA 3 c{cas + 1} X W"
    assert raw.meta("mg k v c").line == f"VA 3 c{cas + 1} Z X"


def test_stale_revalidation_fill(raw):
    raw.meta("ms k 3 T100", b"old")
    raw.meta("md k I T30")
    win = raw.meta("mg k v c")
    assert "W" in win.flags
    fill = raw.meta(f"ms k 3 C{win.cas} c", b"new")
    assert fill.code == "HD", "the winner refills with the stale item's current CAS"
    r = raw.meta("mg k v c t")
    assert (r.value, "X" in r.flags, "W" in r.flags, "Z" in r.flags) == (b"new", False, False, False)
    assert r.flags["t"] == "-1", "the fill sets its own TTL (none here)"


def test_stale_fill_with_pre_invalidation_cas_refused(raw):
    old_cas = raw.meta("ms k 3 c", b"old").cas
    raw.meta("md k I")
    assert raw.meta(f"ms k 3 C{old_cas}", b"new").line == "EX", \
        "md I bumps the CAS, so a CAS from before the invalidation no longer matches"


def test_ms_I_with_older_cas_stores_stale(raw):
    # protocol.txt: with I, a CAS *lower* than the item's is accepted but the item is marked stale.
    # memcached keeps the win flag already handed out: the winner sees "X W", later readers "Z X".
    old_cas = raw.meta("ms k 3 c", b"old").cas
    raw.meta("md k I")
    assert "W" in raw.meta("mg k v").flags
    r = raw.meta(f"ms k 3 I C{old_cas} c", b"new")
    assert r.code == "HD", f"an older CAS with I is accepted: {r.line}"
    got = raw.meta("mg k v c")
    assert got.value == b"new" and "X" in got.flags and "Z" in got.flags, \
        f"the stored value is marked stale and the earlier win still stands: {got.line}"
    assert got.cas == r.cas


def test_ms_I_with_older_cas_on_fresh_item(raw):
    c1 = raw.meta("ms k 3 c", b"v01").cas
    raw.meta("ms k 3 c", b"v02")
    r = raw.meta(f"ms k 3 I C{c1} c", b"old")
    assert r.code == "HD"
    got = raw.meta("mg k v")
    assert got.value == b"old" and "X" in got.flags and "W" in got.flags, \
        f"the first reader after a stale store wins: {got.line}"


def test_ms_I_with_newer_cas_refused(raw):
    cas = raw.meta("ms k 3 c", b"v01").cas
    assert raw.meta(f"ms k 3 I C{cas + 100}", b"new").line == "EX", \
        "I only accepts an OLDER CAS; a newer (unknown) one is EX"
    assert raw.meta("mg k v").value == b"v01"


def test_ms_I_with_equal_cas_is_normal_store(raw):
    cas = raw.meta("ms k 3 c", b"v01").cas
    assert raw.meta(f"ms k 3 I C{cas}", b"new").line == "HD"
    r = raw.meta("mg k v")
    assert (r.value, r.flag_list) == (b"new", [])


def test_plain_set_clears_stale(raw):
    raw.meta("ms k 3", b"old")
    raw.meta("md k I")
    raw.store("set", "k", "new")
    r = raw.meta("mg k v")
    assert (r.value, r.flag_list) == (b"new", [])


# --- concurrency ------------------------------------------------------------------------------------

def test_lease_race_one_winner_per_round(server):
    clients, rounds = 50, 20
    conns = [McRaw(server.host, server.port, timeout=10) for _ in range(clients)]
    admin = server.raw()
    barrier = threading.Barrier(clients)
    results = [[None] * clients for _ in range(rounds)]
    errors = []
    round_done = [threading.Event() for _ in range(rounds)]
    next_round = [threading.Event() for _ in range(rounds)]

    def worker(i):
        try:
            for rnd in range(rounds):
                if rnd:
                    next_round[rnd].wait(10)
                barrier.wait(10)
                results[rnd][i] = conns[i].meta("mg race v c N30")
                if sum(r is not None for r in results[rnd]) == clients:
                    round_done[rnd].set()
        except Exception as e:  # reported below; a thread must not hang the test
            errors.append(repr(e))
            barrier.abort()
            for ev in round_done:
                ev.set()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    try:
        for rnd in range(rounds):
            assert round_done[rnd].wait(20), f"round {rnd} did not complete"
            assert not errors, errors
            replies = results[rnd]
            wins = [r for r in replies if "W" in r.flags]
            assert len(wins) == 1, f"round {rnd}: expected exactly one W, got {len(wins)}"
            assert all(r.code == "VA" for r in replies), \
                f"round {rnd}: nobody may see EN: {[r.line for r in replies if r.code != 'VA'][:3]}"
            assert all("Z" in r.flags for r in replies if r is not wins[0]), \
                f"round {rnd}: all losers get Z"
            assert admin.meta("md race").line == "HD"
            if rnd + 1 < rounds:
                next_round[rnd + 1].set()
    finally:
        for ev in next_round:
            ev.set()
        for t in threads:
            t.join(10)
        for c in conns:
            c.close()
