"""Replicated pools when a replica misses writes: shoal-router logs the keys of the writes a
replica skipped (marked down) or failed (error, timeout), and deletes them on it before it reads
from it again; a log that overflowed becomes a flush_all. Reads meanwhile go to another replica,
never to the gutter. A stalled replica keeps its data, as a real one would: it is stopped with
SIGSTOP and resumed with SIGCONT (a restarted shoal-node would be empty). Skipped when
SHOAL_TEST_SERVER=memcached."""

import itertools
import time

import pytest

from conftest import (crc16_xmodem, default_owner, key_slot, topology, pause_server as stop,
                      resume_server as resume, held_value as direct)
from mcraw import McRaw, wait_until

pytestmark = pytest.mark.shoal_only


def client_id_reading(index, n):
    """A --client-id whose router reads replica `index` of an n-node replicated pool: the router
    reads node CRC16-XMODEM(client id) mod n."""
    return next(cid for cid in (f"app-{i}" for i in itertools.count())
                if crc16_xmodem(cid.encode()) % n == index)


def read(r, key):
    """A get through the router: the value or None. A reply other than VALUE/END fails."""
    got = r.get(key)
    return got[0][2] if got else None


class Replicas:
    def __init__(self, nodes, gutter, router):
        self.nodes, self.gutter, self.router = nodes, gutter, router
        self.r = router.raw()
        self.mark_nodes()

    def mark_nodes(self):
        """Write hot:who = n<i> on each node directly (never through the router, so no repair
        touches it): a read of it through the router tells which replica answered."""
        for i, n in enumerate(self.nodes):
            with McRaw(n.host, n.port) as c:
                assert c.store("set", "hot:who", f"n{i}") == "STORED"

    def reads_from(self):
        got = self.r.get("hot:who")
        return int(got[0][2][1:]) if got else None

    def stats(self):
        return {k: int(v) for k, v in self.r.stats().items() if v.isdigit()}


@pytest.fixture
def replicas(start_server, start_router):
    """Factory: three nodes in a replicated pool "hot" (and, shared, in the sharded pool "main"),
    a gutter pool, and a one-thread router reading replica `reader`, quick to mark a node down
    (2 failures of 200 ms) and to probe it (every 100 ms)."""
    def make(*flags, reader=1):
        nodes = [start_server() for _ in range(3)]
        gutter = start_server()
        doc = topology(nodes)
        doc["pools"]["hot"] = {"mode": "replicated",
                               "nodes": [f"127.0.0.1:{n.port}" for n in nodes]}
        doc["pools"]["gutter"] = {"nodes": [f"127.0.0.1:{gutter.port}"]}
        doc["gutter_pool"] = "gutter"
        doc["namespaces"]["hot"] = {"pool": "hot"}
        router, _, _ = start_router(doc, "-t", "1", "--client-id", client_id_reading(reader, 3),
                                    "--timeout-ms", "200", "--down-after", "2", "--probe-ms", "100",
                                    "--retry-ms", "50", *flags)
        c = Replicas(nodes, gutter, router)
        assert c.reads_from() == reader
        return c
    return make


def stall_until_marked_down(c, victim):
    """SIGSTOP the victim, then write hot:k0 = v1 until the router has marked it down: the
    copies of those writes sent to it time out (they may still be applied when it resumes)."""
    stop(victim)

    def down():
        c.r.store("set", "hot:k0", "v1")  # STORED by the others, or the victim's timeout
        return c.stats()["nodes_marked_down"] >= 1
    wait_until(down, timeout=10, message="the stalled replica marked down")


def check_reads(c, latest):
    """Every read through the router returns the last value written, or a miss (the cache may
    lose any item), never an older value."""
    for k, v in latest.items():
        got = read(c.r, k)
        assert got in (v, None), f"{k}: read {got!r}, but the last write was {v!r}"


@pytest.mark.parametrize("conns", ["1", "2"])
def test_replica_back_from_a_stall_serves_no_stale_value(replicas, conns):
    c = replicas("--upstream-conns", conns)
    victim = c.nodes[1]  # the replica this router reads
    keys = [f"hot:k{i}" for i in range(10)]
    for k in keys:
        assert c.r.store("set", k, "v0") == "STORED"
    assert [direct(victim, k) for k in keys] == [b"v0"] * 10
    latest = {k: b"v0" for k in keys}
    try:
        stall_until_marked_down(c, victim)
        latest["hot:k0"] = b"v1"
        # while it is down writes skip it, and reads go to another replica: never an error,
        # never the gutter
        for i, k in enumerate(keys[:5]):
            assert c.r.store("set", k, f"v2-{i}") == "STORED"
            latest[k] = f"v2-{i}".encode()
        for k in keys[5:8]:
            assert c.r.cmd(f"delete {k}") == "DELETED"
            latest[k] = None
        assert c.r.store("set", "hot:new", "n") == "STORED"
        latest["hot:new"] = b"n"
        for k, v in latest.items():
            assert read(c.r, k) == v
    finally:
        resume(victim)
    # It answers again: the probe marks it up, it is repaired, then read. At no point may a
    # read return a value older than the last write.
    def read_again():
        check_reads(c, latest)
        return c.reads_from() == 1
    wait_until(read_again, timeout=10, interval=0.005, message="the replica read again")
    for _ in range(20):
        check_reads(c, latest)
    st = c.stats()
    assert st["nodes_marked_up"] >= 1
    assert st["repair_keys_logged"] >= 9 and st["repair_deletes"] >= 9, st
    assert st["repair_log_overflows"] == 0 and st["repair_flushes"] == 0
    assert st["gutter_requests"] == 0
    with McRaw(c.gutter.host, c.gutter.port) as g:
        gs = g.stats()
        assert gs["cmd_get"] == "0" and gs["cmd_set"] == "0", "the gutter pool was never used"
    for k in keys[:5] + ["hot:new"]:
        assert direct(victim, k) in (latest[k], None)
    for k in keys[5:8]:
        assert direct(victim, k) is None, f"{k} was deleted while the replica was down"
    assert [direct(victim, k) for k in keys[8:]] == [b"v0"] * 2, "untouched keys stay"


def test_cas_follow_up_that_fails_is_repaired(replicas):
    c = replicas(reader=0)
    lagging = c.nodes[2]
    assert c.r.store("set", "hot:c", "v1") == "STORED"
    [(_, _, _, cas)] = c.r.get("hot:c", cmd="gets")
    try:
        stop(lagging)
        started = time.monotonic()
        assert c.r.store("cas", "hot:c", "v2", extra=str(cas)) == "STORED", \
            "the client gets the compare's answer"
        assert time.monotonic() - started >= 0.15, "the reply waited for the follow-ups"
        assert [direct(n, "hot:c") for n in c.nodes[:2]] == [b"v2"] * 2
        assert c.stats()["repair_keys_logged"] >= 1
    finally:
        resume(lagging)
    # the lagging replica may have applied the write late, or not at all: it is deleted there
    wait_until(lambda: direct(lagging, "hot:c") is None, timeout=10,
               message="the lagging replica repaired")
    assert c.stats()["repair_deletes"] >= 1
    assert read(c.r, "hot:c") == b"v2"


def test_overflowed_repair_log_flushes_the_replica(replicas):
    c = replicas("--repair-log", "4")
    victim = c.nodes[1]
    # the victim is in the sharded pool "main" too: a key of it there is lost with the flush
    shared = next(k for k in (f"main{i}" for i in itertools.count())
                  if default_owner(key_slot(k), 3) == 1)
    assert c.r.store("set", shared, "s") == "STORED"
    assert direct(victim, shared) == b"s"
    keys = [f"hot:k{i}" for i in range(10)]
    for k in keys:
        assert c.r.store("set", k, "v0") == "STORED"
    latest = {k: b"v0" for k in keys}
    try:
        stall_until_marked_down(c, victim)
        latest["hot:k0"] = b"v1"
        for i, k in enumerate(keys):  # more distinct keys than the log holds
            assert c.r.store("set", k, f"v2-{i}") == "STORED"
            latest[k] = f"v2-{i}".encode()
        assert c.stats()["repair_log_overflows"] >= 1
    finally:
        resume(victim)

    def flushed():
        check_reads(c, latest)
        return direct(victim, shared) is None
    wait_until(flushed, timeout=10, interval=0.005, message="the replica flushed")
    assert all(direct(victim, k) in (latest[k], None) for k in keys)
    c.mark_nodes()  # the flush dropped hot:who too

    def read_again():
        check_reads(c, latest)
        return c.reads_from() == 1
    wait_until(read_again, timeout=10, interval=0.005, message="the replica read again")
    st = c.stats()
    # (a key whose write timed out may have been deleted before the stall marked it down)
    assert st["repair_flushes"] >= 1 and st["repair_deletes"] < len(keys), st


def test_flush_all_missed_by_a_replica_is_sent_again(replicas):
    c = replicas()
    victim = c.nodes[1]
    keys = [f"hot:k{i}" for i in range(5)]
    for k in keys:
        assert c.r.store("set", k, "v0") == "STORED"
    try:
        stall_until_marked_down(c, victim)
        assert c.r.cmd("flush_all").startswith("SERVER_ERROR"), "one node missed it"
    finally:
        resume(victim)
    latest = {k: None for k in keys}

    def flushed():
        check_reads(c, latest)
        return all(direct(victim, k) is None for k in keys)
    wait_until(flushed, timeout=10, interval=0.005, message="the replica flushed")
    c.mark_nodes()

    def read_again():
        check_reads(c, latest)
        return c.reads_from() == 1
    wait_until(read_again, timeout=10, interval=0.005, message="the replica read again")
    assert c.stats()["repair_flushes"] >= 1
