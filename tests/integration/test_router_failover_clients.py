"""shoal-router's failover paths against misbehaving clients and nodes: requests held while a
failed copies-2 primary's replica catches up (catchup.h) or parked by a moved-retry
(failover.h), and what clients that pipeline (large values too), disconnect, half-close,
half-send, quit, or come by the hundred do meanwhile; topology changes, SIGHUP and SIGTERM
during a hold; a replica that fails the catch-up batch; primaries that flap or fail one after
another (each held request waits at most --catchup-wait-ms).

In the `holding` fixture the replica is a real shoal-node stopped (SIGSTOP) while the catch-up
batch is in flight, so the hold lasts as long as the test wants; the primary is the catch-up
tests' SilentPrimary. The `fence` fixture's owner refuses everything with `slot moving`.
Leaks show on the sanitizer build (ASAN's check at the router's exit). Skipped when
SHOAL_TEST_SERVER=memcached."""

import json
import os
import signal
import socket
import time

import pytest

from conftest import _check_survived, _register, pause_server, resume_server
from fakenode import FakeNode, Reset
from mcraw import McRaw, rss_bytes, sanitized, wait_until
from test_router_control_follow import spawn_follower
from test_router_catchup import FlappingPrimary, SilentPrimary, SlowReplica
from test_router_failover_replica import (Fenceable, control, doc, follower,  # noqa: F401
                                          metric, range_of, seed)

pytestmark = pytest.mark.shoal_only

WHOLE = [(0, 16383)]
MIB = 1 << 20
HOLD = ("--timeout-ms", "20000", "--retry-ms", "50", "--probe-ms", "100", "--down-after", "1",
        "--report-ms", "300", "--catchup-wait-ms", "20000", "--threads", "1")


@pytest.fixture
def holding(start_server, control, follower):
    """A router whose reads of the failed primary P's keys are held: P acknowledged `delete k`
    and closed; the replica R (a real node, holding k=old, j=kept) is stopped with the catch-up
    batch unanswered. Yields (router, admin, R, start_hold) where start_hold() makes it so and
    returns a client whose `get k` is held; R is resumed at teardown."""
    p = SilentPrimary({b"k": b"old", b"j": b"kept"})
    r, g = start_server(), start_server()
    seed(r, {"k": b"old", "j": b"kept"})
    control.publish(doc(1, [p.addr, r], [(p.addr, r)], gutter=g, ranges=WHOLE))
    state = {}

    def start(*extra):
        router, admin = follower(control.url, *HOLD, *extra)
        state["router"] = router
        c = router.raw()
        assert c.cmd("delete k") == "DELETED"
        pause_server(r)
        state["paused"] = True
        p.close()
        c.send(b"get k\r\n")
        wait_until(lambda: metric(admin, "shoal_router_catchup_held_total") >= 1,
                   message="the read held")
        return router, admin, c

    def resume():
        if state.pop("paused", None):
            resume_server(r)

    yield start, resume, r, g
    resume()
    p.close()


def test_pipelined_mixed_requests_behind_a_held_read_keep_their_order(holding):
    start, resume, r, g = holding
    router, admin, c = start()
    c.send(b"set n 0 0 1 noreply\r\nx\r\n"
           b"mg j v q\r\n"
           b"mg nokey v q\r\n"
           b"mn\r\n"
           b"get n j\r\n"
           b"incr nokey 1\r\n"
           b"touch j 100\r\n"
           b"version\r\n"
           b"quit\r\n")
    time.sleep(0.3)
    resume()
    assert c.read_get_reply() == []
    assert c.read_line() == "VA 4"
    assert c.read_line() == "kept"
    assert c.read_line() == "MN"
    assert c.read_get_reply() == [("n", 0, b"x", None), ("j", 0, b"kept", None)]
    assert c.read_line() == "NOT_FOUND"
    assert c.read_line() == "TOUCHED"
    assert c.read_line().startswith("VERSION")
    assert c.sock.recv(100) == b""


def test_client_that_disconnects_while_its_requests_are_held_costs_nothing(holding):
    start, resume, r, g = holding
    router, admin, c = start()
    c.send(b"get j\r\nset big 0 0 100000\r\n" + b"v" * 100000 + b"\r\nget j\r\n")
    c.sock.close()
    d = router.raw()
    d.send(b"get j\r\n")
    time.sleep(0.3)
    resume()
    assert d.read_get_reply() == [("j", 0, b"kept", None)]
    assert d.cmd("version").startswith("VERSION")


def test_half_closed_client_gets_its_held_replies_in_order(holding):
    start, resume, r, g = holding
    router, admin, c = start()
    c.send(b"get j\r\n")
    c.sock.shutdown(socket.SHUT_WR)
    time.sleep(0.3)
    resume()
    assert c.read_get_reply() == []
    assert c.read_get_reply() == [("j", 0, b"kept", None)]


def test_client_stopping_half_way_through_a_request_behind_held_ones_costs_nothing(holding):
    start, resume, r, g = holding
    router, admin, c = start()
    c.send(b"get j\r\nset half 0 0 10\r\nabc")
    time.sleep(0.3)
    resume()
    assert c.read_get_reply() == []
    assert c.read_get_reply() == [("j", 0, b"kept", None)]
    c.sock.close()
    d = router.raw()
    assert d.cmd("version").startswith("VERSION")


def test_sigterm_while_requests_are_held_exits_cleanly(holding):
    start, resume, r, g = holding
    router, admin, c = start()
    c.send(b"get j\r\n")
    router.killed = True
    router.proc.terminate()
    router.proc.wait(15)
    assert router.proc.returncode == 0, router.stderr_text()
    resume()


def test_stats_and_metadump_behind_a_hold_are_answered_once_it_ends(holding):
    start, resume, r, g = holding
    router, admin, c = start()
    c.send(b"stats\r\nlru_crawler metadump all\r\nversion\r\n")
    time.sleep(0.3)
    resume()
    assert c.read_get_reply() == []
    line = c.read_line()
    while line != "END":
        assert line.startswith("STAT "), line
        line = c.read_line()
    dump = c.read_line()  # metadump's key= lines end in \n alone, as memcached's
    assert dump.split("\n")[-1] == "END" and "key=j " in dump, dump
    assert c.read_line().startswith("VERSION")


def test_held_requests_are_answered_after_a_topology_without_the_replica(holding, control):
    start, resume, r, g = holding
    router, admin, c = start()
    c.send(b"get j\r\n")
    # the pool now has a new primary (the gutter node), no replica
    control.publish(doc(2, [g], [(g, None)], gutter=None, ranges=WHOLE))
    time.sleep(1.0)
    resume()
    # routed by version 1: sent where it routed them once the catch-up is answered
    assert c.read_get_reply() == []
    assert c.read_get_reply() == [("j", 0, b"kept", None)]
    assert c.cmd("version").startswith("VERSION")


def test_held_requests_are_answered_after_their_pool_is_deleted(holding, control):
    start, resume, r, g = holding
    router, admin, c = start()
    c.send(b"get j\r\n")
    d = {"version": 2, "pools": {"other": {"nodes": [f"127.0.0.1:{g.port}"]}},
         "namespaces": {"default": {"pool": "other"}}}
    control.publish(d)
    time.sleep(1.0)
    resume()
    # routed by version 1: sent where it routed them once the catch-up is answered
    assert c.read_get_reply() == []
    assert c.read_get_reply() == [("j", 0, b"kept", None)]
    assert c.cmd("version").startswith("VERSION")


def pipeline_sets(router, nclients, value, per_write, seconds):
    """nclients clients of `router` each sending sets of `value` (per_write of them per write)
    as fast as the router reads them, for `seconds` or until its RSS has grown 600 MiB (enough
    to fail: spare the machine). Returns (sets sent, MiB the router's RSS grew at its peak)."""
    pid = router.proc.pid
    base = rss_bytes(pid)
    clients = [router.raw() for _ in range(nclients)]
    for cl in clients:
        cl.sock.setblocking(False)
    bufs = {id(cl): b"" for cl in clients}
    sent = peak = 0
    stop = time.monotonic() + seconds
    while time.monotonic() < stop and peak - base < 600 * MIB:
        progressed = False
        for cl in clients:
            if not bufs[id(cl)]:
                bufs[id(cl)] = b"".join(b"set s%d 0 0 %d\r\n%s\r\n" % (sent + i, len(value), value)
                                        for i in range(per_write))
                sent += per_write
            try:
                n = cl.sock.send(bufs[id(cl)])
                bufs[id(cl)] = bufs[id(cl)][n:]
                progressed = True
            except OSError:  # BlockingIOError too: the router is not reading it
                pass
        peak = max(peak, rss_bytes(pid))
        if not progressed:
            time.sleep(0.01)
    grew = (peak - base) / MIB
    print(f"sent {sent} sets; RSS grew {grew:.0f} MiB")
    return sent, grew


def test_clients_pipelining_large_sets_during_a_hold_are_paused_not_buffered(holding):
    """Four clients sending 1 MB sets as fast as the router reads them while the catch-up
    holds them: each is paused once its held requests reach its share (a quarter of --out-max),
    as for replies it does not read; before, the router read them all (900 MiB in 3 s)."""
    start, resume, r, g = holding
    router, admin, c = start("--buffers-max", "32m")
    sent, grew = pipeline_sets(router, 4, b"v" * 1_000_000, 1, 3)
    resume()
    assert grew < (400 if sanitized(router.proc.pid) else 200), \
        f"RSS grew {grew:.0f} MiB with {sent} sets held"


def get_or_error(c):
    """A get's reply: its items, or the error line that answered it."""
    line = c.read_line()
    if line.startswith(("SERVER_ERROR", "CLIENT_ERROR", "ERROR")):
        return line
    items = []
    while line != "END":
        _, key, flags, n = line.split(" ")[:4]
        items.append((key, int(flags), c.read_value(int(n)), None))
        line = c.read_line()
    return items


class BadReplica(FakeNode):
    """A replica that answers the catch-up batch wrongly (`mode`: "garbage" answers its `mn`
    with a line no request explains, "error" with SERVER_ERROR, "close" resets the
    connection), then serves gets of `items` as memcached does."""

    def __init__(self, items, mode):
        self.items, self.mode = dict(items), mode
        self.gets = 0
        super().__init__()

    def answer(self, line, rest):
        w = line.split()
        if w[0] == b"md":
            return b"", rest
        if w[0] == b"mn":
            if self.mode == "close":
                raise Reset()
            return (b"WHAT\r\n" if self.mode == "garbage" else b"SERVER_ERROR busy\r\n"), rest
        if w[0] == b"get":
            self.gets += 1
            out = b"".join(b"VALUE %s 0 %d\r\n%s\r\n" % (k, len(self.items[k]), self.items[k])
                           for k in w[1:] if k in self.items)
            return out + b"END\r\n", rest
        if w[0] == b"version":
            return b"VERSION fake\r\n", rest
        return b"ERROR\r\n", rest


@pytest.mark.parametrize("mode", ["garbage", "error", "close"])
def test_replica_answering_the_catch_up_batch_wrongly_ends_the_hold(start_server, control,
                                                                    follower, mode):
    """The batch counts as answered when the replica fails it (garbage or a reset: at once; an
    error line where its MN should be: once --timeout-ms has passed, as any reply that never
    comes), and the held reads go ahead, to the replica reconnected (one failure does not mark
    it down at --down-after 3)."""
    p = SilentPrimary({b"k": b"old", b"j": b"kept"})
    r = BadReplica({b"j": b"kept"}, mode)
    g = start_server()
    try:
        control.publish(doc(1, [p.addr, r.addr], [(p.addr, r.addr)], gutter=g, ranges=WHOLE))
        router, admin = follower(control.url, "--timeout-ms", "1500", "--retry-ms", "50",
                                 "--probe-ms", "100", "--catchup-wait-ms", "20000",
                                 "--threads", "2")
        c = router.raw()
        assert c.cmd("delete k") == "DELETED"
        p.close()
        t0 = time.monotonic()
        c.send(b"get j\r\nget j\r\n")
        first, second = get_or_error(c), get_or_error(c)
        assert time.monotonic() - t0 < (1.4 if mode != "error" else 5), \
            "held longer than it took the replica to fail the batch"
        assert first == second == [("j", 0, b"kept", None)], (first, second)
        assert metric(admin, "shoal_router_catchup_failures_total") >= 1
        assert metric(admin, "shoal_router_catchup_timeouts_total") == 0
        assert c.cmd("version").startswith("VERSION")
    finally:
        p.close()
        r.close()


def test_primary_flapping_many_times_a_second_never_strands_a_client(start_server, control,
                                                                     follower):
    p = FlappingPrimary({b"k": b"old"})
    r = SlowReplica({b"j": b"kept"}, delay=0.05)
    g = start_server()
    try:
        control.publish(doc(1, [p.addr, r.addr], [(p.addr, r.addr)], gutter=g, ranges=WHOLE))
        router, admin = follower(control.url, "--timeout-ms", "1000", "--retry-ms", "10",
                                 "--probe-ms", "10", "--down-after", "1",
                                 "--catchup-wait-ms", "5000", "--threads", "2")
        clients = [router.raw() for _ in range(4)]
        t0 = time.monotonic()
        for i in range(40):
            for n, c in enumerate(clients):
                c.send(b"delete d%d\r\nget boom%d j\r\nget up%d\r\n" % (i, i, i))
            for c in clients:
                c.read_line()  # the primary's answer, or the replica's (a fake: ERROR)
                got = c.read_get_reply()
                assert got in ([], [("j", 0, b"kept", None)]), got
                c.read_get_reply()
        assert time.monotonic() - t0 < 60
        assert metric(admin, "shoal_router_catchups_total") >= 2
    finally:
        p.close()
        r.close()


# ---- moved-retry: requests a fenced owner refused, parked until a newer topology


@pytest.fixture
def fence(start_server, control):
    """A Fenceable primary F (fenced: refuses everything with `slot moving`) whose one range
    names a real node A as replica (holding j), and a gutter node; version 1 published."""
    f = Fenceable(b"SERVER_ERROR slot moving\r\n")
    a, g = start_server(), start_server()
    seed(a, {"j": b"kept"})
    nodes = [f.addr, a]
    control.publish(doc(1, nodes, [(f.addr, a)], gutter=g, ranges=WHOLE))
    yield f, a, g, nodes
    f.close()


def test_pipelined_requests_parked_by_a_fence_keep_their_order_after_the_new_owner(
        fence, control, follower):
    f, a, g, nodes = fence
    router, admin = follower(control.url, "--moved-wait-ms", "10000", "--threads", "1")
    c = router.raw()
    c.send(b"get j\r\n"
           b"set n 0 0 1 noreply\r\nx\r\n"
           b"mg j v q\r\n"
           b"mg nokey v q\r\n"
           b"mn\r\n"
           b"delete gone noreply\r\n"
           b"get n j\r\n"
           b"incr nokey 1\r\n"
           b"version\r\n"
           b"quit\r\n")
    wait_until(lambda: len(f.seen) >= 6, message="the requests refused by the fenced owner")
    control.publish(doc(2, nodes, [(a, None)], gutter=g, ranges=WHOLE))
    assert c.read_get_reply() == [("j", 0, b"kept", None)]
    assert c.read_line() == "VA 4"
    assert c.read_line() == "kept"
    assert c.read_line() == "MN"
    assert c.read_get_reply() == [("n", 0, b"x", None), ("j", 0, b"kept", None)]
    assert c.read_line() == "NOT_FOUND"
    assert c.read_line().startswith("VERSION")
    assert c.sock.recv(100) == b""


def test_client_gone_while_its_requests_are_parked_costs_nothing(fence, control, follower):
    f, a, g, nodes = fence
    router, admin = follower(control.url, "--moved-wait-ms", "10000", "--threads", "1")
    c = router.raw()
    big = b"v" * 200_000
    c.send(b"get j\r\nset big 0 0 %d\r\n%s\r\nget j\r\n" % (len(big), big))
    wait_until(lambda: metric(admin, "shoal_router_moved_kept_bytes") >= len(big),
               message="the large set parked with its bytes")
    c.sock.close()
    d = router.raw()
    assert d.cmd("version").startswith("VERSION")
    control.publish(doc(2, nodes, [(a, None)], gutter=g, ranges=WHOLE))
    wait_until(lambda: metric(admin, "shoal_router_moved_kept_bytes") == 0,
               message="the kept bytes given back")
    assert d.get("j") == [("j", 0, b"kept", None)]


def test_sigterm_while_requests_are_parked_exits_cleanly(fence, control, follower):
    f, a, g, nodes = fence
    router, admin = follower(control.url, "--moved-wait-ms", "10000", "--threads", "1")
    c = router.raw()
    big = b"v" * 200_000
    c.send(b"get j\r\nset big 0 0 %d\r\n%s\r\n" % (len(big), big))
    wait_until(lambda: metric(admin, "shoal_router_moved_kept_bytes") >= len(big),
               message="the large set parked with its bytes")
    router.killed = True
    router.proc.terminate()
    router.proc.wait(15)
    assert router.proc.returncode == 0, router.stderr_text()
    assert "ERROR: AddressSanitizer" not in router.stderr_text()


def test_parked_requests_fall_back_when_their_pool_is_deleted(fence, control, follower):
    f, a, g, nodes = fence
    router, admin = follower(control.url, "--moved-wait-ms", "10000", "--threads", "1")
    c = router.raw()
    c.send(b"get j\r\nset s 0 0 1\r\nx\r\n")
    wait_until(lambda: len(f.seen) >= 2, message="refused by the fenced owner")
    control.publish({"version": 2, "pools": {"other": {"nodes": [f"127.0.0.1:{g.port}"]}},
                     "namespaces": {"default": {"pool": "other"}}})
    assert get_or_error(c) in ([], [("j", 0, b"kept", None)])
    assert c.read_line() in ("STORED", "SERVER_ERROR slot moving")
    assert c.cmd("version").startswith("VERSION")


def test_multi_key_get_over_a_held_replica_a_healthy_node_and_the_gutter_keeps_key_order(
        start_server, control, follower):
    """P owns ranges 0 (replica R) and 2 (no replica: the gutter G serves it while P is out), H
    owns range 1. With P gone and R's catch-up unanswered, one get of keys in all three, and
    gat, gats, touch, cas, append and incr of range 0's keys behind it, are answered in order
    once R answers."""
    p = SilentPrimary()
    r, h, g = start_server(), start_server(), start_server()
    keys = {rng: [k for k in (f"x{i}" for i in range(300)) if range_of(k) == rng][:3]
            for rng in range(3)}
    k0, k1, k2 = keys[0][0], keys[1][0], keys[2][0]
    c0, a0, n0 = keys[0][1], keys[0][2], "cnt"
    seed(r, {k0: b"r0", c0: b"c", a0: b"a", "d0": b"x"})
    seed(h, {k1: b"h1"})
    seed(g, {k2: b"g2"})
    pause = None
    try:
        control.publish(doc(1, [p.addr, h, r],
                            [(p.addr, r), (h, None), (p.addr, None)], gutter=g))
        router, admin = follower(control.url, *HOLD)
        c = router.raw()
        d0 = next(k for k in (f"d{i}" for i in range(300)) if range_of(k) == 0)
        assert c.cmd(f"delete {d0}") == "NOT_FOUND"  # through P: logged for the catch-up
        with McRaw("127.0.0.1", r.port) as rc:
            cas = rc.get(c0, cmd="gets")[0][3]
        pause_server(r)
        pause = r
        p.close()
        # a cas or append that may have reached P is answered with P's failure, not retried
        assert c.get(k2) == [(k2, 0, b"g2", None)]  # P fails it: retried on the gutter
        wait_until(lambda: metric(admin, "shoal_router_nodes_marked_down_total") >= 1,
                   message="P marked down")
        c.send(f"get {k0} {k1} {k2} nokey\r\n"
               f"gat 100 {k0}\r\n"
               f"gats 100 {k0} {k1}\r\n"
               f"touch {k0} 100\r\n"
               f"cas {c0} 0 0 2 {cas}\r\nc2\r\n"
               f"append {a0} 0 0 2\r\na2\r\n"
               f"incr {n0} 1\r\n"
               f"get {c0} {a0}\r\n".encode())
        wait_until(lambda: metric(admin, "shoal_router_catchup_held_total") >= 1,
                   message="the reads of P's keys held")
        time.sleep(0.3)
        resume_server(r)
        pause = None
        assert c.read_get_reply() == [(k0, 0, b"r0", None), (k1, 0, b"h1", None),
                                      (k2, 0, b"g2", None)]
        assert c.read_get_reply() == [(k0, 0, b"r0", None)]
        got = c.read_get_reply()
        assert [(k, v) for k, _, v, _ in got] == [(k0, b"r0"), (k1, b"h1")]
        assert c.read_line() == "TOUCHED"
        assert c.read_line() == "STORED"
        assert c.read_line() == "STORED"
        assert c.read_line() in ("NOT_FOUND",)
        assert c.read_get_reply() == [(c0, 0, b"c2", None), (a0, 0, b"aa2", None)]
    finally:
        if pause:
            resume_server(pause)
        p.close()


def test_read_retried_on_a_replica_that_fails_during_the_hold_is_answered_by_the_gutter(
        start_server, control, follower):
    """P resets a get (retried on the slot's replica R: held for R's catch-up); R resets the
    catch-up batch and is marked down (--down-after 1). The read, never sent to R, goes on to
    the gutter as a read R fails does (docs: "A replica that fails the read ... has it retried
    on the gutter pool as any read"); before, it was answered `node R is down`."""
    p = FlappingPrimary({b"k": b"old"})
    r = BadReplica({}, "close")
    g = start_server()
    seed(g, {"boom": b"from-gutter"})
    try:
        control.publish(doc(1, [p.addr, r.addr], [(p.addr, r.addr)], gutter=g, ranges=WHOLE))
        router, admin = follower(control.url, "--timeout-ms", "3000", "--retry-ms", "50",
                                 "--probe-ms", "100", "--down-after", "1",
                                 "--catchup-wait-ms", "5000", "--threads", "1")
        c = router.raw()
        assert c.cmd("delete k") == "DELETED"  # logged: the catch-up has a batch to send
        assert get_or_error(c.send(b"get boom\r\n") or c) == [("boom", 0, b"from-gutter", None)]
        assert metric(admin, "shoal_router_catchup_failures_total") == 1
        assert r.gets == 0
    finally:
        p.close()
        r.close()


def test_five_hundred_clients_with_held_reads_are_all_answered(holding):
    start, resume, r, g = holding
    router, admin, c = start()
    many = [router.raw() for _ in range(500)]
    for m in many:
        m.send(b"get j\r\n")
    wait_until(lambda: metric(admin, "shoal_router_catchup_held_total") >= 400,
               message="their reads held")
    resume()
    assert c.read_get_reply() == []
    for m in many:
        assert m.read_get_reply() == [("j", 0, b"kept", None)]


def test_get_line_over_line_max_held_in_parts_is_answered_whole(holding):
    start, resume, r, g = holding
    router, admin, c = start()
    keys = [f"key-{i:06d}" for i in range(8000)] + ["j"]  # 96 KB: routed in parts
    c.send(("get " + " ".join(keys) + "\r\n").encode())
    time.sleep(0.3)
    resume()
    assert c.read_get_reply() == []
    assert c.read_get_reply() == [("j", 0, b"kept", None)]


def test_sighup_reload_during_a_hold_answers_every_held_request(start_server, tmp_path,
                                                                 request):
    p = SilentPrimary({b"k": b"old", b"j": b"kept"})
    r, g = start_server(), start_server()
    seed(r, {"k": b"old", "j": b"kept"})
    d1 = doc(1, [p.addr, r], [(p.addr, r)], gutter=g, ranges=WHOLE)
    router, admin = spawn_follower(tmp_path, None, *HOLD, config=d1)
    _register(request.node, router)
    paused = False
    try:
        c = router.raw()
        assert c.cmd("delete k") == "DELETED"
        pause_server(r)
        paused = True
        p.close()
        c.send(b"get k\r\nget j\r\n")
        wait_until(lambda: metric(admin, "shoal_router_catchup_held_total") >= 1,
                   message="the reads held")
        path = router.args[router.args.index("--config") + 1]
        with open(path, "w") as f:
            json.dump(doc(2, [p.addr, r], [(p.addr, r)], gutter=g, ranges=WHOLE), f)
        os.kill(router.proc.pid, signal.SIGHUP)
        wait_until(lambda: "version 2" in router.stderr_text(), message="the reload")
        resume_server(r)
        paused = False
        assert c.read_get_reply() == []
        assert c.read_get_reply() == [("j", 0, b"kept", None)]
    finally:
        if paused:
            resume_server(r)
        p.close()
        _check_survived([router])


def test_clients_pipelining_to_a_fenced_owner_are_paused_not_buffered(fence, control, follower):
    """Sixty clients pipelining 15 KB sets to a fenced owner for 2.5 s, --moved-wait-ms 3000:
    every parked set keeps its bytes (up to 16 KiB, for its resend), and they count in their
    client's share, which pauses it, as replies it does not read would; before, the router
    read on (about 6 MiB of kept requests per client, --buffers-max 32m)."""
    f, a, g, nodes = fence
    router, admin = follower(control.url, "--moved-wait-ms", "3000", "--threads", "1",
                             "--buffers-max", "32m")
    sent, grew = pipeline_sets(router, 60, b"v" * 15000, 50, 2.5)
    assert grew < (160 if sanitized(router.proc.pid) else 80), \
        f"RSS grew {grew:.0f} MiB ({sent} sets sent)"


def test_a_request_held_through_overlapping_catch_ups_waits_at_most_catchup_wait_ms(
        start_server, control, follower):
    """A primary failing a request every 0.15 s, with deletes between, while its replica takes
    0.3 s to answer each catch-up batch: every failure starts a new catch-up before the last
    one's batch is answered. The requests held must still go ahead within --catchup-wait-ms
    (1 s) of the first being held (catchup_timeouts), not once the failures stop: each new
    catch-up pushed the bound back."""
    p = FlappingPrimary({})
    r = SlowReplica({}, delay=0.3)
    g = start_server()
    try:
        control.publish(doc(1, [p.addr, r.addr], [(p.addr, r.addr)], gutter=g, ranges=WHOLE))
        router, admin = follower(control.url, "--timeout-ms", "10000", "--retry-ms", "10",
                                 "--probe-ms", "50", "--catchup-wait-ms", "1000",
                                 "--threads", "1")
        held_at = released_at = None
        t_end = time.monotonic() + 3.5
        clients = []
        i = 0
        while time.monotonic() < t_end:
            c = router.raw()
            clients.append(c)
            assert c.cmd(f"delete d{i}") in ("DELETED", "NOT_FOUND")
            wait_until(lambda: c.get(f"up{i}") == [] and
                       any(f"up{i}".encode() in line for _, line in p.seen),
                       message="the primary answering again")
            c.send(f"get boom{i}\r\n".encode())
            if held_at is None:
                wait_until(lambda: metric(admin, "shoal_router_catchup_held_total") >= 1,
                           message="the first read held")
                held_at = time.monotonic()
            if released_at is None and metric(admin,
                                              "shoal_router_catchup_timeouts_total") >= 1:
                released_at = time.monotonic()
            i += 1
            time.sleep(0.15)
        assert metric(admin, "shoal_router_catchups_total") >= 10, "catch-ups overlapping"
        assert released_at is not None and released_at - held_at < 1.8, \
            "held past --catchup-wait-ms while the primary kept failing"
        for c in clients:  # each read answered (behind the replica's slow batches)
            assert c.read_get_reply() == []
    finally:
        p.close()
        r.close()


class MuteReplica(FakeNode):
    """A replica that never answers a catch-up batch's `mn` (nor anything else): records when
    each request line arrives."""

    def __init__(self):
        self.log = []
        super().__init__()

    def answer(self, line, rest):
        self.log.append((time.monotonic(), line))
        return b"", rest


def test_a_request_held_while_primaries_fail_one_after_another_waits_at_most_catchup_wait_ms(
        control, follower):
    """P1 fails (its replica R1 never answers the catch-up), then P2 0.8 s later (R2 neither):
    the read of P1's key held from P1's failure goes ahead --catchup-wait-ms (1 s) after it was
    held, while P2's catch-up still runs; before, it waited for P2's too (and for any other
    primary's failing before that one ended)."""
    p1, p2 = SilentPrimary(), SilentPrimary()
    r1, r2 = MuteReplica(), MuteReplica()
    k1 = next(k for k in (f"a{i}" for i in range(300)) if range_of(k) == 0)
    k2 = next(k for k in (f"b{i}" for i in range(300)) if range_of(k) == 1)
    try:
        control.publish(doc(1, [p1.addr, p2.addr, r1.addr, r2.addr],
                            [(p1.addr, r1.addr), (p2.addr, r2.addr), (p1.addr, r1.addr)]))
        router, admin = follower(control.url, "--timeout-ms", "10000", "--retry-ms", "50",
                                 "--probe-ms", "100", "--down-after", "1",
                                 "--catchup-wait-ms", "1000", "--threads", "1")
        c = router.raw()
        assert c.cmd(f"delete {k1}") == "NOT_FOUND"  # logged: each catch-up has a batch
        assert c.cmd(f"delete {k2}") == "NOT_FOUND"
        p1.close()
        c.send(f"get {k1}\r\n".encode())
        wait_until(lambda: metric(admin, "shoal_router_catchup_held_total") >= 1,
                   message=f"the read of {k1} held")
        held_at = time.monotonic()
        time.sleep(0.8)
        p2.close()
        d = router.raw()
        d.send(f"get {k2}\r\n".encode())
        wait_until(lambda: any(line == f"get {k1}".encode() for _, line in r1.log),
                   timeout=5, message=f"the read of {k1} sent to R1")
        sent_at = next(t for t, line in r1.log if line == f"get {k1}".encode())
        assert sent_at - held_at < 1.6, f"held {sent_at - held_at:.2f} s"
    finally:
        for n in (p1, p2, r1, r2):
            n.close()


def test_clients_pipelining_large_sets_to_a_stalled_node_are_paused_not_buffered(
        start_server, control, follower):
    """A node stalled (SIGSTOP) before any timeout marks it down, its requests waiting to be
    retried on the gutter: four clients pipelining 1 MB sets to it for 2.5 s. Each request's
    bytes count in its client's share until answered, so each is paused at a quarter of
    --out-max; before, only about 3 KB per request counted and the router read on (600 MiB in
    2.5 s, --buffers-max 32m: up to --client-pending requests per client)."""
    a, g = start_server(), start_server()
    control.publish(doc(1, [a], [(a, None)], gutter=g, ranges=WHOLE, copies=1))
    router, admin = follower(control.url, "--timeout-ms", "3000", "--threads", "1",
                             "--buffers-max", "32m")
    assert router.raw().cmd("version").startswith("VERSION")
    pause_server(a)
    try:
        sent, grew = pipeline_sets(router, 4, b"v" * 1_000_000, 1, 2.5)
        assert grew < (300 if sanitized(router.proc.pid) else 150), \
            f"RSS grew {grew:.0f} MiB ({sent} sets)"
    finally:
        resume_server(a)


def test_client_that_never_reads_its_held_replies_holds_up_no_one_else(holding):
    start, resume, r, g = holding
    router, admin, c = start()
    lazy = router.raw()
    lazy.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    lazy.send(b"get j\r\n" * 2000)
    time.sleep(0.3)
    resume()
    assert c.read_get_reply() == []
    other = router.raw()
    for _ in range(20):
        assert other.get("j") == [("j", 0, b"kept", None)]
    lazy.sock.close()
    assert other.cmd("version").startswith("VERSION")
