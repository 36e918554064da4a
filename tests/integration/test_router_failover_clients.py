"""shoal-router's failover paths against misbehaving clients: requests held while a failed
copies-2 primary's replica catches up (catchup.h) or parked by a moved-retry (failover.h), and
what a client that pipelines, disconnects, half-sends or quits meanwhile does to the router.

The replica is a real shoal-node stopped (SIGSTOP) while the catch-up batch is in flight, so
the hold lasts as long as the test wants; the primary is the catch-up tests' SilentPrimary.
Skipped when SHOAL_TEST_SERVER=memcached."""

import os
import signal
import socket
import time

import pytest

from conftest import pause_server, resume_server
from mcraw import McRaw, rss_bytes, sanitized, wait_until
from test_router_catchup import SilentPrimary
from test_router_failover_replica import (control, doc, follower, held, metric,  # noqa: F401
                                          seed)

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


def test_clients_pipelining_large_sets_during_a_hold_are_paused_not_buffered(holding):
    """Four clients sending 1 MB sets as fast as the router reads them while the catch-up
    holds them: each is paused once its held requests reach its share (a quarter of --out-max),
    as for replies it does not read; before, the router read them all (900 MiB in 3 s)."""
    start, resume, r, g = holding
    router, admin, c = start("--buffers-max", "32m")
    pid = router.proc.pid
    base = rss_bytes(pid)
    value = b"v" * (1000 * 1000)
    clients = [router.raw() for _ in range(4)]
    peak = 0
    stop_at = time.monotonic() + 3
    sent = 0
    for cl in clients:
        cl.sock.setblocking(False)
    bufs = {id(cl): b"" for cl in clients}
    while time.monotonic() < stop_at:
        progressed = False
        for cl in clients:
            if not bufs[id(cl)]:
                bufs[id(cl)] = b"set big%d 0 0 %d\r\n%s\r\n" % (sent, len(value), value)
                sent += 1
            try:
                n = cl.sock.send(bufs[id(cl)])
                bufs[id(cl)] = bufs[id(cl)][n:]
                progressed = True
            except BlockingIOError:
                pass
            except OSError:
                pass
        peak = max(peak, rss_bytes(pid))
        if peak - base > 600 * MIB:  # enough to fail: spare the machine
            break
        if not progressed:
            time.sleep(0.01)
    print(f"sent {sent} sets; RSS grew {(peak - base) / MIB:.0f} MiB")
    resume()
    assert peak - base < (400 if sanitized(pid) else 200) * MIB, \
        f"RSS grew {(peak - base) / MIB:.0f} MiB with {sent} sets held"
