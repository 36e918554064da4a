"""shoal-router's catch-up (src/router/catchup.h, docs/router.md "Catch-up before reading the
replica"): when a copies-2 primary fails, the deletes it acknowledged but may not have streamed
reach its slots' replica before the router reads the primary's keys there.

The primary is a fake (SilentPrimary) that answers as memcached does and never streams, in
front of a replica holding the key's old value: a delete acknowledged by the primary, then the
primary gone, then a read of the key must miss, never serve the old value. Against a stand-in
control plane (fakecontrol.py), as test_router_failover_replica.py. Skipped when
SHOAL_TEST_SERVER=memcached."""

import threading
import time

import pytest

from fakenode import FakeNode, Reset
from mcraw import McRaw, wait_until
from test_router_failover_replica import (control, doc, follower, held, metric,  # noqa: F401
                                          seed)

pytestmark = pytest.mark.shoal_only

WHOLE = [(0, 16383)]
FAST = ("--timeout-ms", "1000", "--retry-ms", "50", "--probe-ms", "100", "--down-after", "1",
        "--report-ms", "300")
# tests that count no catch-up timeout: a loaded CI machine may take more than the default 1 s
# to run every worker's part; the hold ends when the batches are answered, not at the bound
SLOW_OK = ("--catchup-wait-ms", "5000")


def _value_block(key, value):
    return b"VALUE %s 0 %d\r\n%s\r\n" % (key, len(value), value)


class SilentPrimary(FakeNode):
    """A primary that answers get, set and delete as memcached does but streams nothing to its
    replica. Records each request with the thread that served it: one per connection, and the
    router opens one connection per worker (--upstream-conns 1), so it names the worker."""

    def __init__(self, items=None):
        self.items = dict(items or {})
        self.seen = []  # (thread ident, request line)
        super().__init__()

    def answer(self, line, rest):
        self.seen.append((threading.get_ident(), line))
        w = line.split()
        if w[0] == b"set":
            n = int(w[4])
            if len(rest) < n + 2:
                return None
            self.items[w[1]] = rest[:n]
            return b"STORED\r\n", rest[n + 2:]
        if w[0] == b"delete":
            gone = self.items.pop(w[1], None) is not None
            return (b"DELETED\r\n" if gone else b"NOT_FOUND\r\n"), rest
        if w[0] == b"get":
            out = b"".join(_value_block(k, self.items[k]) for k in w[1:] if k in self.items)
            return out + b"END\r\n", rest
        if w[0] == b"version":
            return b"VERSION fake\r\n", rest
        return b"ERROR\r\n", rest

    def worker_of(self, key):
        """The connection (router worker) that last sent a request naming `key`."""
        return next(t for t, line in reversed(self.seen) if key.encode() in line.split()[1:])


class SlowReplica(FakeNode):
    """A replica that takes `delay` seconds to answer the `mn` closing a batch of quiet
    deletes; records the keys it is sent deletes of and the time of each request."""

    def __init__(self, items, delay):
        self.items, self.delay = dict(items), delay
        self.deleted, self.log = [], []
        self.mn_answered = None  # when the batch's MN was sent
        super().__init__()

    def answer(self, line, rest):
        self.log.append((time.monotonic(), line))
        w = line.split()
        if w[0] == b"md":
            self.deleted.append(w[1].decode())
            self.items.pop(w[1], None)
            return (b"" if w[-1] == b"q" else b"HD\r\n"), rest
        if w[0] == b"mn":
            time.sleep(self.delay)
            self.mn_answered = time.monotonic()
            return b"MN\r\n", rest
        if w[0] == b"get":
            out = b"".join(_value_block(k, self.items[k]) for k in w[1:] if k in self.items)
            return out + b"END\r\n", rest
        if w[0] == b"version":
            return b"VERSION fake\r\n", rest
        return b"ERROR\r\n", rest


def two_workers(router, p):
    """Two clients of `router` (--threads 2) served by different workers. The primary's
    connection a request arrives on names the worker that routed it (one connection per
    worker); clients land on either worker, as the kernel wakes them: connections are opened in
    bursts, kept, until both workers have one."""
    by_worker, n = {}, 0
    for _ in range(50):
        burst = [router.raw() for _ in range(8)]
        for c in burst:
            assert c.get(f"a{n}") == []
            by_worker.setdefault(p.worker_of(f"a{n}"), c)
            n += 1
        if len(by_worker) == 2:
            return list(by_worker.values())
    raise AssertionError(f"all {n} clients landed on one worker")


@pytest.fixture
def silent(start_server, control):
    """A fake primary P (holding k=old) whose one range names a real shoal-node R as replica
    (holding k=old too: what the stream brought before the delete), and a gutter node."""
    p = SilentPrimary({b"k": b"old"})
    r, g = start_server(), start_server()
    seed(r, {"k": b"old"})
    control.publish(doc(1, [p.addr, r], [(p.addr, r)], gutter=g, ranges=WHOLE))
    yield p, r, g
    p.close()


def test_delete_the_dead_primary_acknowledged_is_on_the_replica_before_it_is_read(
        silent, control, follower):
    p, r, g = silent
    router, admin = follower(control.url, *FAST, "--threads", "1")
    c = router.raw()
    assert c.get("k") == [("k", 0, b"old", None)]
    assert c.cmd("delete k") == "DELETED"  # acknowledged by P, never streamed to R
    assert held(r, "k") == b"old"
    p.close()
    assert c.get("k") == [], "the replica served a value its primary had deleted"
    assert held(r, "k") is None
    assert metric(admin, "shoal_router_catchup_deletes_total") == 1
    assert metric(admin, "shoal_router_catchups_total") >= 1
    assert "sent to its slots' replicas" in router.stderr_text()


def test_delete_routed_by_another_worker_is_on_the_replica_before_it_is_read(
        silent, control, follower):
    """--threads 2: the delete goes through one worker, the read after the failure through the
    other; the reading worker waits for the other's catch-up."""
    p, r, g = silent
    router, admin = follower(control.url, *FAST, "--threads", "2")
    deleter, reader = two_workers(router, p)
    assert deleter.cmd("delete k") == "DELETED"
    assert reader.get("a-reader") == []
    assert p.worker_of("k") != p.worker_of("a-reader"), "the delete and the read on two workers"
    p.close()
    assert reader.get("k") == [], "the replica served a value deleted through another worker"
    assert held(r, "k") is None
    assert metric(admin, "shoal_router_catchup_deletes_total") == 1
    log = router.stderr_text()
    assert "1 of its recent deletes" in log and "0 of its recent deletes" in log, log


def test_reads_wait_for_the_catch_up_neither_failed_nor_sent_to_the_gutter(start_server, control,
                                                                          follower):
    p = SilentPrimary({b"k": b"old", b"j": b"kept"})
    r = SlowReplica({b"k": b"old", b"j": b"kept"}, delay=0.4)
    g = start_server()
    seed(g, {"k": b"gutter", "j": b"gutter"})  # a copy an earlier outage may have left there
    try:
        control.publish(doc(1, [p.addr, r.addr], [(p.addr, r.addr)], gutter=g, ranges=WHOLE))
        router, admin = follower(control.url, *FAST, "--threads", "1",
                                 *SLOW_OK)
        c = router.raw()
        assert c.cmd("delete k") == "DELETED"
        p.close()  # the router may see it fail (and start the catch-up) before the reads come
        c.send(b"get k\r\nget j\r\n")
        assert c.read_get_reply() == [], "a miss, from the replica once it has the delete"
        assert c.read_get_reply() == [("j", 0, b"kept", None)]
        assert r.deleted == ["k"]
        gets = [t for t, line in r.log if line.startswith(b"get")]
        assert gets and r.mn_answered and min(gets) >= r.mn_answered, \
            "a read reached the replica before the batch was answered"
        # (a retry counts in gutter_retries wherever it goes: the replica here)
        assert metric(admin, "shoal_router_gutter_requests_total") == 0
        with McRaw("127.0.0.1", g.port) as gc:
            assert int(gc.stats()["cmd_get"]) == 0, "no read went to the gutter"
        assert metric(admin, "shoal_router_catchup_timeouts_total") == 0
        assert metric(admin, "shoal_router_catchup_held_total") >= 1
    finally:
        p.close()
        r.close()


def test_reads_go_ahead_after_catchup_wait_ms_and_are_counted(start_server, control, follower):
    p = SilentPrimary({b"k": b"old"})
    r = SlowReplica({b"k": b"old"}, delay=1.5)
    g = start_server()
    try:
        control.publish(doc(1, [p.addr, r.addr], [(p.addr, r.addr)], gutter=g, ranges=WHOLE))
        router, admin = follower(control.url, *FAST, "--threads", "1", "--catchup-wait-ms",
                                 "200", "--timeout-ms", "3000")
        c = router.raw()
        assert c.cmd("delete k") == "DELETED"
        p.close()
        assert c.get("k") == []  # behind the batch on the replica's one connection
        wait_until(lambda: metric(admin, "shoal_router_catchup_timeouts_total") == 1,
                   message="the wait past --catchup-wait-ms counted")
        assert "--catchup-wait-ms" in router.stderr_text()
    finally:
        p.close()
        r.close()


def test_a_worker_reads_the_replica_only_after_another_workers_catch_up_is_answered(
        start_server, control, follower):
    """--threads 2: the worker that routed the delete sends it to a replica that takes 0.4 s
    to answer the batch; the other worker's read waits for that answer, though it goes on a
    connection of its own (which the replica serves at once)."""
    p = SilentPrimary({b"k": b"old"})
    r = SlowReplica({b"k": b"old"}, delay=0.4)
    g = start_server()
    try:
        control.publish(doc(1, [p.addr, r.addr], [(p.addr, r.addr)], gutter=g, ranges=WHOLE))
        router, admin = follower(control.url, *FAST, "--threads", "2",
                                 *SLOW_OK)
        deleter, reader = two_workers(router, p)
        assert deleter.cmd("delete k") == "DELETED"
        assert reader.get("a-reader") == []
        assert p.worker_of("k") != p.worker_of("a-reader"), "the delete and the read on two workers"
        p.close()
        assert reader.get("k") == [], "the replica served a value deleted through another worker"
        got = [t for t, line in r.log if line == b"get k"]
        assert got and r.mn_answered and got[0] >= r.mn_answered, \
            "the read reached the replica before the other worker's batch was answered"

        assert r.deleted == ["k"]
        assert metric(admin, "shoal_router_catchup_timeouts_total") == 0
    finally:
        p.close()
        r.close()


class FlappingPrimary(SilentPrimary):
    """A SilentPrimary that resets the connection of any `get` of a key starting with "boom"
    (a primary failing one request, then answering again)."""

    def answer(self, line, rest):
        w = line.split()
        if w[0] == b"get" and any(k.startswith(b"boom") for k in w[1:]):
            raise Reset()
        return super().answer(line, rest)


def test_a_primary_failing_again_soon_has_only_the_newer_deletes_caught_up(control, follower,
                                                                           start_server):
    """A primary that fails, answers again and fails once more within --replay-margin-ms: the
    second catch-up sends only the deletes logged since the first (those are on the replica
    already; sending them again would cost each of those keys a miss more)."""
    p = FlappingPrimary({b"k1": b"a", b"k2": b"b"})
    r = SlowReplica({}, delay=0)
    g = start_server()
    try:
        control.publish(doc(1, [p.addr, r.addr], [(p.addr, r.addr)], gutter=g, ranges=WHOLE))
        router, admin = follower(control.url, *FAST, "--threads", "1")
        c = router.raw()
        n = [0]

        def primary_answers():
            n[0] += 1
            key = f"up{n[0]}"
            assert c.get(key) == []
            return any(key.encode() in line.split()[1:] for _, line in p.seen)
        assert c.cmd("delete k1") == "DELETED"
        assert c.get("boom1") == []  # reset by P, answered by the replica after its catch-up
        wait_until(primary_answers, message="the primary back in use")
        assert c.cmd("delete k2") == "DELETED"
        assert c.get("boom2") == []
        assert r.deleted == ["k1", "k2"], "the second catch-up sent the first one's deletes again"
        assert metric(admin, "shoal_router_catchups_total") == 2
        assert metric(admin, "shoal_router_catchup_deletes_total") == 2
    finally:
        p.close()
        r.close()
