"""A sharded node back from an outage: while a worker has it marked down, shoal-router logs the
keys of the writes and deletes its keys get (sent to the gutter pool, or failed at once), and
when a probe finds it healthy it reads none of its keys from it until it has deleted every logged
key there (or flushed it, when the log overflowed). The node is stalled with SIGSTOP and resumed
with SIGCONT, so it keeps the values it had (a restarted node comes back empty: see
test_router_failover.py). Skipped when SHOAL_TEST_SERVER=memcached."""

import itertools

import pytest

from conftest import (default_owner, held_value, key_slot, pause_server, resume_server,
                      topology)
from mcraw import McRaw, wait_until

pytestmark = pytest.mark.shoal_only

MARK = "mark"  # a key of the victim written on the nodes directly, never through the router


def keys_of(index, prefix, n=3):
    """Keys `prefix`0, `prefix`1, ... that node `index` of n owns under the default map."""
    return (k for k in (f"{prefix}{i}" for i in itertools.count())
            if default_owner(key_slot(k), n) == index)


class Sharded:
    """Three nodes in the sharded pool "main" (the victim owns `sd1`), optionally a gutter pool,
    and a one-thread router that marks a node down after three timeouts of 200 ms and probes
    it every 200 ms."""

    def __init__(self, start_server, start_router, *flags, gutter=True):
        self.nodes = [start_server() for _ in range(3)]
        doc = topology(self.nodes)
        self.gutter = None
        if gutter:
            self.gutter = start_server()
            doc["pools"]["gutter"] = {"nodes": [f"127.0.0.1:{self.gutter.port}"]}
            doc["gutter_pool"] = "gutter"
        self.router, _, _ = start_router(doc, "-t", "1", "--timeout-ms", "200",
                                         "--down-after", "3", "--probe-ms", "200",
                                         "--retry-ms", "50", *flags)
        self.r = self.router.raw()
        self.index = default_owner(key_slot("sd1"), 3)
        self.victim = self.nodes[self.index]
        self.mark = next(keys_of(self.index, MARK))
        self.put_mark()

    def put_mark(self):
        """The mark's value says who answers a read of the victim's keys: `owner` on the victim,
        `gutter` on the gutter node."""
        for node, v in ((self.victim, "owner"), (self.gutter, "gutter")):
            if node is not None:
                with McRaw(node.host, node.port) as c:
                    assert c.store("set", self.mark, v) == "STORED"

    def read(self, key, failing=False):
        """A get through the router: the value, None on a miss, or "error" for a SERVER_ERROR
        (a node down or being repaired, without a gutter pool; any, when `failing`)."""
        self.r.send(f"get {key}\r\n")
        line = self.r.read_line()
        if line.startswith("SERVER_ERROR"):
            assert failing or "is down" in line, line
            return "error"
        if line == "END":
            return None
        value = self.r.read_value(int(line.split()[3]))
        assert self.r.read_line() == "END"
        return value

    def reads_owner(self):
        return self.read(self.mark) == b"owner"

    def stats(self):
        return {k: int(v) for k, v in self.r.stats().items() if v.isdigit()}

    def stall(self):
        """SIGSTOP the victim, then read its mark until the router has marked it down (reads
        are never logged)."""
        pause_server(self.victim)

        def down():
            self.read(self.mark, failing=True)  # times out
            return self.stats()["nodes_marked_down"] >= 1
        wait_until(down, timeout=10, message="the stalled node marked down")

    def check_reads(self, latest):
        """No read through the router returns a value older than the last write: the last
        value, a miss (the cache may lose any item) or, without a gutter, an error."""
        for k, v in latest.items():
            got = self.read(k)
            assert got in (v, None, "error"), f"{k}: read {got!r}, but the last write was {v!r}"

    def back(self, latest):
        """Resume the victim and wait, checking reads all along, until the router reads its
        keys from it again."""
        resume_server(self.victim)

        def owner_again():
            self.check_reads(latest)
            return self.reads_owner()
        wait_until(owner_again, timeout=10, interval=0.005, message="the node read again")
        for _ in range(10):
            self.check_reads(latest)


@pytest.mark.parametrize("gutter", [True, False], ids=["gutter", "no-gutter"])
@pytest.mark.parametrize("action", ["delete", "set"])
def test_write_during_a_stall_is_repaired(start_server, start_router, action, gutter):
    """The review's reproduction: set sd1, stall its node until marked down, delete (or set) sd1,
    resume: a get of sd1 must never return the old value again."""
    c = Sharded(start_server, start_router, gutter=gutter)
    assert c.r.store("set", "sd1", "old") == "STORED"
    assert held_value(c.victim, "sd1") == b"old"
    try:
        c.stall()
        if action == "delete":
            got = c.r.cmd("delete sd1")
            assert got == "NOT_FOUND" if gutter else got.endswith("is down"), got
            latest = None
        else:
            got = c.r.store("set", "sd1", "new")
            assert got == "STORED" if gutter else got.endswith("is down"), got
            latest = b"new" if gutter else None
        assert c.read("sd1") == (latest if gutter else "error")
        assert c.stats()["repair_keys_logged"] == 1
    finally:
        resume_server(c.victim)
    c.back({"sd1": latest})
    assert c.read("sd1") is None, "the owner's copy was deleted; the gutter's is no longer read"
    assert held_value(c.victim, "sd1") is None
    st = c.stats()
    assert st["nodes_marked_up"] >= 1 and st["repair_deletes"] >= 1, st
    assert st["repair_flushes"] == 0 and st["repair_log_overflows"] == 0, st


def test_no_read_returns_the_old_value_after_the_return(start_server, start_router):
    c = Sharded(start_server, start_router)
    mine = list(itertools.islice(keys_of(c.index, "k"), 12))
    other = next(keys_of((c.index + 1) % 3, "o"))
    for k in mine + [other]:
        assert c.r.store("set", k, "v0") == "STORED"
    latest = {k: b"v0" for k in mine + [other]}
    try:
        c.stall()
        for i, k in enumerate(mine[:4]):
            assert c.r.store("set", k, f"v1-{i}") == "STORED"
            latest[k] = f"v1-{i}".encode()
        for k in mine[4:6]:
            assert c.r.cmd(f"delete {k}") in ("DELETED", "NOT_FOUND")
            latest[k] = None
        assert c.r.cmd(f"touch {mine[6]} 100") == "NOT_FOUND"  # a TTL write: logged too
        assert c.r.store("add", mine[7], "a") == "STORED"
        latest[mine[7]] = b"a"
        assert c.r.meta(f"ms {mine[8]} 2 T0", "m2").code == "HD"
        latest[mine[8]] = b"m2"
        assert c.r.store("set", other, "v1") == "STORED"  # its node is up: no log
        latest[other] = b"v1"
        for k in mine[:6] + mine[7:9] + [other]:
            assert c.read(k) == latest[k], "during the outage the gutter answers its keys"
        assert [c.read(k) for k in mine[9:]] == [None] * 3, "the gutter starts empty"
        assert c.stats()["repair_keys_logged"] == 9
    finally:
        resume_server(c.victim)
    # marked up by a probe, it is still not read for one more probe interval
    wait_until(lambda: c.stats()["nodes_marked_up"] >= 1, timeout=10, interval=0.005,
               message="the probe found the node healthy")
    assert c.read(c.mark) == b"gutter", "not read before its repair"
    c.back(latest)
    for k in mine[:9]:
        assert held_value(c.victim, k) is None, f"{k} was written during the outage"
    assert [held_value(c.victim, k) for k in mine[9:]] == [b"v0"] * 3, "untouched keys stay"
    assert held_value(c.nodes[(c.index + 1) % 3], other) == b"v1"
    st = c.stats()
    assert st["repair_deletes"] == 9 and st["repair_flushes"] == 0, st
    # back in use: writes and reads go to it again
    assert c.r.store("set", mine[0], "v2") == "STORED"
    assert held_value(c.victim, mine[0]) == b"v2" and c.read(mine[0]) == b"v2"


def test_overflowed_log_flushes_the_node(start_server, start_router):
    c = Sharded(start_server, start_router, "--repair-log", "2")
    mine = list(itertools.islice(keys_of(c.index, "k"), 6))
    for k in mine:
        assert c.r.store("set", k, "v0") == "STORED"
    latest = {k: b"v0" for k in mine}
    try:
        c.stall()
        for k in mine[:3]:  # one distinct key more than the log holds
            assert c.r.store("set", k, "v1") == "STORED"
            latest[k] = b"v1"
        st = c.stats()
        assert st["repair_log_overflows"] == 1 and st["repair_keys_logged"] == 2, st
    finally:
        resume_server(c.victim)

    def flushed():
        c.check_reads(latest)
        return held_value(c.victim, mine[5]) is None
    wait_until(flushed, timeout=10, interval=0.005, message="the node flushed")
    assert all(held_value(c.victim, k) is None for k in mine)
    c.put_mark()  # the flush dropped the mark too
    c.back(latest)
    st = c.stats()
    assert st["repair_flushes"] == 1 and st["repair_deletes"] == 0, st


def test_node_with_nothing_logged_comes_back_without_repair(start_server, start_router):
    """Reads through the gutter during the outage (misses, hits, gat, mg with T) log nothing:
    the node comes back as soon as the probe finds it healthy, with its data."""
    c = Sharded(start_server, start_router)
    mine = list(itertools.islice(keys_of(c.index, "k"), 4))
    for k in mine:
        assert c.r.store("set", k, "v0") == "STORED"
    with McRaw(c.gutter.host, c.gutter.port) as g:  # a leftover of an earlier outage, say
        assert g.store("set", mine[3], "g", exptime=30) == "STORED"
    try:
        c.stall()
        assert c.read(mine[0]) is None
        assert c.r.get(mine[1], mine[3], cmd="gat 100") == [(mine[3], 0, b"g", None)]
        assert c.r.meta(f"mg {mine[2]} v T100").code == "EN"
        assert c.r.meta(f"mg {mine[3]} v T100").value == b"g"
    finally:
        resume_server(c.victim)
    wait_until(lambda: c.stats()["nodes_marked_up"] >= 1, timeout=10, interval=0.005,
               message="the probe found the node healthy")
    assert c.reads_owner(), "nothing to repair: back in use at once"
    assert [c.read(k) for k in mine] == [b"v0"] * 4
    st = c.stats()
    assert st["repair_keys_logged"] == 0 and st["repair_deletes"] == 0, st
    assert st["repair_flushes"] == 0, st
