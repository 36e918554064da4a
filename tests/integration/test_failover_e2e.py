"""Issue 15 point 3 end to end, with the real binaries together (failoverharness.py): shoal-control,
three shoal-nodes following it, a gutter node, a shoal-router following control, a copies-2
namespace; clients write through the router while the test drains, kills, restarts or stops a
primary.

- test_drain_under_writes_loses_no_acknowledged_write: `shoal node drain` while clients set
  (100 B .. 200 KB) and delete: afterwards every key reads as its last acknowledged write, no
  client saw an error, and the drained node is the replica of its former ranges.
- test_kill9_primary_promotes_replica_and_keeps_acknowledged_writes: kill -9 a primary under
  load: the promotion is published within PROMOTION_BOUND_S (issue target 3 s; the bound is
  looser for a loaded 2-vCPU machine, the measured time is printed), every key acknowledged
  more than 1 s before the kill reads as that write after it (or, for a key deleted and set
  again within the replay window, as a miss: the router's replay deletes it once more), never
  as an older value, and keys deleted after the kill are never served again.
- test_restarted_node_comes_back_as_replica_and_resyncs: the killed node restarted on its
  address owns nothing, becomes a replica again and resyncs (its /v1/replication online, its
  copy equal to what the router serves) while reads through the router never go back past an
  acknowledged write.
- test_stop_shorter_than_failure_timeout_changes_nothing: SIGSTOP a primary under load for less
  than --failure-timeout-ms, then SIGCONT: no new topology version, no promotion.
- test_write_refused_by_a_fenced_live_primary_is_not_acknowledged_then_lost: control stopped,
  a primary's lease runs out and it fences: a write to it is refused, not acknowledged from the
  gutter and then shadowed by the primary's older value.
"""

import os
import signal
import time

import pytest

from conftest import key_slot
from failoverharness import (NS, TopologySampler, Writer, failover_cluster,  # noqa: F401
                             router_get, seq_of)
from mcraw import McRaw, scrape_metrics, wait_until

pytestmark = pytest.mark.shoal_only

PROMOTION_TARGET_S = 3.0  # the target
PROMOTION_BOUND_S = 6.0   # asserted: holds on a loaded 2-vCPU machine
KEEP_MAX = 16384 - 200    # src/router/failover.h FAILOVER_KEEP_MAX, less a request line


def keys(prefix, n):
    return [f"{NS}:{prefix}{k}" for k in range(n)]


def wait_ops(writers, n, timeout=20):
    """Until every writer has done n more operations than now."""
    base = [w.ops for w in writers]
    wait_until(lambda: all(w.ops - b >= n for w, b in zip(writers, base)), timeout=timeout,
               message=f"{n} more operations per writer")


def expected(w, key, before=None):
    """What a get should return for key after w's acknowledged operations (before `before`):
    ("value", seq) or ("absent",), or None when the key's state is unknown (an operation on it
    failed, or none was acknowledged)."""
    if key in w.unknown:
        return None
    last = w.last(key, before)
    if last is None:
        return None
    return ("absent",) if last[1] is None else ("value", last[1])


def served(conn, key):
    got = router_get(conn, key)
    return ("absent",) if got is None else ("value", seq_of(got))


def mismatches(conn, w, keyset, before=None):
    out = []
    for k in keyset:
        want = expected(w, k, before)
        if want is not None:
            got = served(conn, k)
            if got != want:
                out.append((k, key_slot(k), want, got))
    return out


def primary_of(doc, c, slot):
    return c.role_of_slot(doc, slot)[0]


# --- 1. planned drain -------------------------------------------------------------------------

def test_drain_under_writes_loses_no_acknowledged_write(failover_cluster):
    c = failover_cluster()
    victim = c.addr(0)
    before = c.topology()
    mine = [r for r in c.ranges(before) if r["node"] == victim]
    assert mine
    writers = [Writer(c.router.port, keys(f"d{i}:", 250), seed=i) for i in range(2)]
    for w in writers:
        w.start()
    try:
        wait_ops(writers, 300)
        t0 = time.monotonic()
        r = c.drain(0)
        t1 = time.monotonic()
        assert r.returncode == 0, r.stdout + r.stderr
        print(f"drain took {t1 - t0:.3f} s: {r.stdout.strip()}")
        wait_ops(writers, 300)  # writes go on to the new primaries
    finally:
        for w in writers:
            w.finish()
    errors = [(round(t - t0, 3), k, what, size) for w in writers for t, k, what, size in w.errors]
    print(f"client errors (s after the drain began, key, reply, value size): {errors}")
    # moved-retry absorbed `slot moving` (requests up to its FAILOVER_KEEP_MAX: see the xfail
    # test below for larger ones)
    assert [e for e in errors if e[3] is None or e[3] < KEEP_MAX] == []
    # writes of the drained node's keys were acknowledged while the drain ran
    during = sum(1 for w in writers for k, h in w.history.items() for t, s in h
                 if t0 <= t <= t1 and primary_of(before, c, key_slot(k)) == victim)
    print(f"{during} writes of the drained ranges acknowledged during the drain")
    with McRaw("127.0.0.1", c.router.port) as conn:
        for w in writers:
            assert mismatches(conn, w, w.history) == []
    after = c.topology()
    assert after["version"] > before["version"]
    moved = c.owner_map(after)
    for r in mine:
        assert moved[(r["from"], r["to"])] == (r["replica"], victim), after
    assert all(r["node"] != victim for r in c.ranges(after))
    # and it follows them as a replica
    new_primaries = {r["replica"] for r in mine}
    wait_until(lambda: {p["node"] for p in c.replication(0)["primaries"]
                        if p["state"] == "online"} >= new_primaries, timeout=10,
               message="the drained node replicating from the new primaries")


def test_drains_of_the_middle_node_then_the_first_lose_no_acknowledged_write(failover_cluster):
    """Node 1 replicates node 0's range; draining it (and then node 0, at once) under writes: the
    control plane's replica re-plan after the swap used to give most of node 1's range another
    replica, routers took it for a promotion and replayed recent deletes over newer sets
    (acknowledged values read back absent), and the second drain's handoff was answered while
    its new replica was still in its full sync."""
    c = failover_cluster()
    writers = [Writer(c.router.port, keys(f"m{i}:", 250), seed=10 + i) for i in range(2)]
    for w in writers:
        w.start()
    try:
        wait_ops(writers, 300)
        for i in (1, 0):
            r = c.drain(i)
            assert r.returncode == 0, r.stdout + r.stderr
        wait_ops(writers, 300)
    finally:
        for w in writers:
            w.finish()
    assert [e for w in writers for e in w.errors if e[3] is None or e[3] < KEEP_MAX] == []
    with McRaw("127.0.0.1", c.router.port) as conn:
        for w in writers:
            assert mismatches(conn, w, w.history) == []


def test_drain_under_large_writes_shows_clients_no_error(failover_cluster):
    c = failover_cluster()
    writers = [Writer(c.router.port, keys(f"L{i}:", 100), seed=10 + i, delete_share=0.05,
                      size=lambda rng: rng.randint(20_000, 200_000)) for i in range(2)]
    for w in writers:
        w.start()
    try:
        wait_ops(writers, 100)
        r = c.drain(0)
        assert r.returncode == 0, r.stdout + r.stderr
        wait_ops(writers, 100)
    finally:
        for w in writers:
            w.finish()
    assert [e for w in writers for e in w.errors] == []


# --- 2. kill -9 a primary under load ----------------------------------------------------------

def kill_under_load(c, victim_i, writers, sampler):
    """Writers on keys set A until 1.2 s before the kill, then on set B through it; kill -9
    node victim_i; wait for the promotion. Returns (t_switch, t_kill, promotion (t, v, doc))."""
    victim = c.addr(victim_i)
    before = c.topology()
    wait_ops(writers, 200)
    t_switch = time.monotonic()
    for i, w in enumerate(writers):
        w.use_keys(keys(f"B{i}:", 200))
    wait_ops(writers, 2)  # the operation on A in flight at the switch is acknowledged
    t_switch = time.monotonic()
    # A's last writes must be more than 1 s old at the kill: a bounded wait by definition
    wait_until(lambda: time.monotonic() - t_switch > 1.2, timeout=5, interval=0.01,
               message="1.2 s of writes to B")
    t_kill = time.monotonic()
    c.kill9(victim_i)
    mine = {(r["from"], r["to"]): r["replica"] for r in c.ranges(before) if r["node"] == victim}

    def promoted(doc):
        owners = c.owner_map(doc)
        return (all(r["node"] != victim for r in c.ranges(doc)) and
                all(any(f <= a <= t and n == rep for (f, t), (n, _) in owners.items())
                    for (a, _), rep in mine.items()))
    promo = wait_until(lambda: sampler.first(promoted, after=t_kill), timeout=15, interval=0.01,
                       message="the promotion")
    return t_switch, t_kill, promo


def test_kill9_primary_promotes_replica_and_keeps_acknowledged_writes(failover_cluster):
    c = failover_cluster()
    victim = c.addr(0)
    doc0 = c.topology()
    sampler = TopologySampler(c.control)
    sampler.start()
    writers = [Writer(c.router.port, keys(f"A{i}:", 200), seed=20 + i) for i in range(2)]
    for w in writers:
        w.start()
    deleted, served_after_delete = [], []
    try:
        t_switch, t_kill, (t_promo, v_promo, _) = kill_under_load(c, 0, writers, sampler)
        promotion_s = t_promo - t_kill
        print(f"promotion published {promotion_s:.3f} s after the kill (version {v_promo}; "
              f"control's shoal_control_promotion_seconds "
              f"{c.control.metrics().get('shoal_control_promotion_seconds')})")
        # delete, after the kill, keys of the dead node's slots that hold a value
        with McRaw("127.0.0.1", c.router.port) as conn:
            for w in writers:
                for k in [k for k in w.history if ":A" in k]:  # no longer written
                    e = expected(w, k, before=t_switch)
                    if (e and e[0] == "value" and len(deleted) < 40 and
                            primary_of(doc0, c, key_slot(k)) == victim):
                        reply = conn.cmd(f"delete {k}")
                        assert reply in ("DELETED", "NOT_FOUND"), (k, reply)
                        deleted.append(k)
            c.wait_router_version(v_promo)
            wait_ops(writers, 100)
            for k in deleted:  # never served afterwards, also after the router's replay
                if router_get(conn, k) is not None:
                    served_after_delete.append(k)
    finally:
        for w in writers:
            w.finish()
        sampler.finish()
    assert deleted
    assert served_after_delete == []
    assert promotion_s < PROMOTION_BOUND_S, promotion_s
    # every key acknowledged more than 1 s before the kill reads as that write
    with McRaw("127.0.0.1", c.router.port) as conn:
        bad = []
        for w in writers:
            bad += mismatches(conn, w, [k for k in w.history if k not in deleted and ":A" in k],
                              before=t_switch)
            for k in [k for k in w.history if ":A" in k]:
                assert w.last(k) == w.last(k, before=t_switch)
    errors = [(round(t - t_kill, 3), k, what) for w in writers for t, k, what, _ in w.errors]
    print(f"client errors around the kill (s after it, key, reply): {errors}")
    assert [e for e in errors if e[0] < 0] == []
    # never an older value than the last acknowledged write: a miss at worst
    older = [b for b in bad if b[3] != ("absent",)]
    assert older == []
    def deleted_before(k):
        return any(s is None for t, s in writers[int(k.split(":")[1][1])].history[k])
    # a key never deleted is never lost
    assert [b for b in bad if not deleted_before(b[0])] == []
    # a key deleted and set again within the replay window is deleted once more by the
    # router's replay (docs/router.md, "Replay on a promotion": a miss, never a stale value)
    print(f"{len(bad)} keys deleted then set again before the kill read as misses after the "
          f"replay: {[(k, slot, want) for k, slot, want, got in bad]}")


# --- 3. the killed node restarts ---------------------------------------------------------------

def test_restarted_node_comes_back_as_replica_and_resyncs(failover_cluster):
    c = failover_cluster()
    victim = c.addr(0)
    sampler = TopologySampler(c.control)
    sampler.start()
    writers = [Writer(c.router.port, keys(f"A{i}:", 200), seed=30 + i) for i in range(2)]
    for w in writers:
        w.start()
    reads = []  # (t sent, key, ("value", seq) / ("absent",))
    try:
        t_switch, t_kill, (t_promo, v_promo, _) = kill_under_load(c, 0, writers, sampler)
        c.wait_router_version(v_promo)
        # from here on fresh keys: the check below is about the restart, not the gap before
        for i, w in enumerate(writers):
            w.use_keys(keys(f"C{i}:", 150))
        wait_ops(writers, 2)
        t_c = time.monotonic()
        c.restart(0)
        t_restart = time.monotonic()
        back = wait_until(lambda: sampler.first(
            lambda d: any(r.get("replica") == victim for r in c.ranges(d)), after=t_restart),
            timeout=15, message="the restarted node made a replica again")
        wait_until(lambda: (p := c.replication(0)["primaries"]) and
                   all(x["state"] == "online" for x in p), timeout=15,
                   message="its replication from its primaries online")
        t_online = time.monotonic()
        with McRaw("127.0.0.1", c.router.port) as conn:
            rng = __import__("random").Random(3)
            while time.monotonic() < t_online + 1.0 or len(reads) < 300:
                i = rng.randrange(2)
                k = rng.choice(writers[i].keys)
                t = time.monotonic()
                reads.append((t, i, k, served(conn, k)))
        print(f"promotion {t_promo - t_kill:.3f} s after the kill; made replica again "
              f"{back[0] - t_restart:.3f} s after the restart (version {back[1]}), replication "
              f"online {t_online - t_restart:.3f} s after it")
    finally:
        for w in writers:
            w.finish()
        sampler.finish()
    # it owns nothing in any version since the kill
    assert all(r["node"] != victim for t, v, d in sampler.seen if t >= t_promo
               for r in c.ranges(d))
    # reads through the router never went back past an acknowledged write
    older = []
    for t, i, k, got in reads:
        w = writers[i]
        if k in w.unknown:
            continue
        allowed = {("absent",) if s is None else ("value", s) for tt, s in w.history[k] if tt >= t}
        last = w.last(k, before=t)
        allowed.add(("absent",) if last is None or last[1] is None else ("value", last[1]))
        if got not in allowed:
            older.append((k, got, last))
    assert older == []
    # resynced: what it holds of the ranges it replicates is what the router serves
    doc = c.topology()
    unsynced = []
    with McRaw("127.0.0.1", c.router.port) as conn, McRaw("127.0.0.1", c.nodes[0].port) as d:
        checked = 0
        for w in writers:
            for k in w.history:
                if c.role_of_slot(doc, key_slot(k))[1] != victim or k in w.unknown:
                    continue
                via = served(conn, k)
                got = d.meta(f"mg {k} v")
                held = ("value", seq_of(got.value)) if got.code == "VA" else ("absent",)
                if held != via:
                    unsynced.append((k, key_slot(k), c.role_of_slot(doc, key_slot(k)), via, held,
                                     [(round(t - t_kill, 3), s) for t, s in w.history[k]]))
                checked += 1
    assert checked > 50
    # was seen in about 1 run of 23 before branch walk: the restarted replica lacked a few items
    # its full resync should have brought, the snapshot walk having missed items segment
    # cleaning moved. Moves are now logged while a full sync walks (test_repl_sync_cleaning.py,
    # test_dump_moves.c); 41 runs since (16 of them at the merge, 8 on the SAN build) never
    # took this branch, so it is a failure again. Not the router's outage repair: a node back
    # as a replica only is not repaired for keys of its live primaries. The figures say which.
    if unsynced:
        m = scrape_metrics(c.admins[0])
        figures = {k: v for k, v in m.items() if "skipped" in k or "items_dropped" in k or
                   "full_syncs" in k or "evictions" in k or "snapshot_moves" in k}
        pytest.fail(f"the restarted replica lacks {len(unsynced)} of {checked} items the router "
                    "serves from its primary after its full resync reported done (key, slot, "
                    f"(primary, replica), served, held, history): {unsynced[:5]}; its figures: "
                    f"{figures}")


# --- 4. a blip ---------------------------------------------------------------------------------

def test_stop_shorter_than_failure_timeout_changes_nothing(failover_cluster):
    failure_ms = 2000
    c = failover_cluster(control_flags=("--failure-timeout-ms", str(failure_ms)),
                         router_flags=("--timeout-ms", "200", "--probe-ms", "100"))
    victim = c.addr(0)
    v0 = c.version()
    sampler = TopologySampler(c.control)
    sampler.start()
    writers = [Writer(c.router.port, keys(f"S{i}:", 200), seed=40 + i) for i in range(2)]
    for w in writers:
        w.start()
    try:
        wait_ops(writers, 200)
        down0 = c.router_metrics().get("shoal_router_nodes_marked_down_total", 0)
        t_stop = time.monotonic()
        c.pause(0)
        # the router sees it fail (its requests time out), then it comes back in time
        wait_until(lambda: c.router_metrics().get("shoal_router_nodes_marked_down_total", 0)
                   > down0, timeout=failure_ms / 1000 * 0.6, interval=0.02,
                   message="the router marking the stopped node down")
        wait_until(lambda: time.monotonic() - t_stop >= failure_ms / 1000 * 0.6, timeout=5,
                   interval=0.01, message="the blip's length")
        c.resume(0)
        t_cont = time.monotonic()
        print(f"stopped {t_cont - t_stop:.3f} s (failure timeout {failure_ms} ms); failure "
              f"state then: {c.failures().get(victim)}")
        wait_until(lambda: c.failures().get(victim, {}).get("state") == "up", timeout=10,
                   message="the node up again for control")
        # past when a promotion would have been published had it stayed down (failure
        # timeout + lease + margin): there is no event to await for "nothing happens"
        wait_until(lambda: time.monotonic() - t_stop > (failure_ms + 2000 + 500) / 1000,
                   timeout=10, interval=0.05, message="the observation window")
        wait_ops(writers, 50)
    finally:
        for w in writers:
            w.finish()
        sampler.finish()
    assert [v for t, v, d in sampler.seen] == [v0]
    assert c.version() == v0
    assert c.control.metrics().get("shoal_control_promotions_total", 0) == 0


# --- a fenced primary that is alive -------------------------------------------------------------

def test_write_refused_by_a_fenced_live_primary_is_not_acknowledged_then_lost(failover_cluster):
    c = failover_cluster()
    doc = c.topology()
    key = c.keys_of(f"{NS}:fence", 1, lambda s: c.role_of_slot(doc, s)[0] == c.addr(0))[0]
    with McRaw("127.0.0.1", c.router.port) as conn:
        assert conn.store("set", key, b"old") == "STORED"
        # control unreachable (stopped): node 0's lease runs out and it fences its slots
        os.kill(c.control.proc.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: scrape_metrics(c.admins[0]).get("shoal_node_lease_fenced") == 1,
                       timeout=10, message="node 0 fencing")
            reply = conn.store("set", key, b"new")
        finally:
            os.kill(c.control.proc.pid, signal.SIGCONT)
        wait_until(lambda: c.lease_held(0, doc["version"]), timeout=10,
                   message="node 0's lease renewed")
        got = router_get(conn, key)
    # either the write was refused, or it is what is served now (before the router's fix it
    # went to the gutter after --moved-wait-ms, was acknowledged, and "old" was served)
    assert reply != "STORED" or got == b"new", (reply, got)
    assert reply == "SERVER_ERROR slot lease expired", reply
