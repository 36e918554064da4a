"""shoal-router against a node that misbehaves: a reply that does not parse, or that announces
a value larger than the router takes (-I), or more values than the request can be answered
with, is answered SERVER_ERROR naming the node as soon as the header that shows it is read (the
router never buffers towards a size it would refuse), the connection to that node is dropped,
and the router keeps serving. So is a reply that parses but cannot be the answer to its request
(the wrong kind, or a stray extra reply that would shift another client's request onto it).
Skipped when SHOAL_TEST_SERVER=memcached."""


import re
import threading

import pytest

import conftest
from fakenode import FakeNode
from mcraw import McRaw, http, wait_until

pytestmark = pytest.mark.shoal_only


class BadNode(FakeNode):
    """Answers every `get` with `reply` and keeps the connection open (a node stalled in the
    middle of a reply); `version` (the router's probe) gets a proper answer."""

    def __init__(self, reply):
        self.reply = reply
        super().__init__()

    def answer(self, line, rest):
        return self.answer_line(line), rest

    def answer_line(self, line):
        """The bytes to send for one request line (data blocks are read as lines too)."""
        if line.startswith(b"version"):
            return b"VERSION bad\r\n"
        return self.reply if line.startswith(b"get") else b""



BAD_REPLIES = {
    # 2 MB announced, 64 KiB sent, then silence: over the router's -I of 1 MB
    "value_over_item_max": b"VALUE k 0 2000000\r\n" + b"x" * 65536,
    "value_length_not_a_number": b"VALUE k 0 12ab\r\nabc\r\nEND\r\n",
    "line_without_end": b"y" * (70 * 1024),
    "value_block_not_terminated": b"VALUE k 0 3\r\nabcdEND\r\n",
    # values within -I each, but more of them than a one-key get can be answered with, no END
    "endless_values": b"".join(b"VALUE k 0 1000\r\n" + b"x" * 1000 + b"\r\n" for _ in range(1200)),
}


@pytest.mark.parametrize("case", sorted(BAD_REPLIES))
def test_a_bad_reply_fails_fast_and_the_router_keeps_serving(start_server, start_router, case):
    good = start_server()
    bad = BadNode(BAD_REPLIES[case])
    try:
        doc = {"version": 1,
               "pools": {"good": {"nodes": [f"{good.host}:{good.port}"]}, "bad": {"nodes": [bad.addr]}},
               "namespaces": {"default": {"pool": "good"}, "b": {"pool": "bad"}}}
        router, _, _ = start_router(doc, "-I", "1m", "--timeout-ms", "10000")
        with McRaw(router.host, router.port, timeout=3) as r:
            # well inside the 10 s timeout: the router must not wait for the rest
            r.send(b"get b:k\r\n")
            line = r.read_line()
            assert line.startswith("SERVER_ERROR") and bad.addr in line, line
            assert r.store("set", "plain", "v") == "STORED"
            r.send(b"get plain\r\n")
            assert r.read_get_reply() == [("plain", 0, b"v", None)]
        assert router.alive()
    finally:
        bad.close()


class StrayReplyNode(BadNode):
    """Holds its answer to the first `get` until a second one arrives, then answers the first
    twice (one stray reply) and the second properly: without a check of each reply against its
    request, the second get would be answered with the first one's value."""

    def __init__(self, values):
        super().__init__(b"")
        self.values = values
        self.held = []

    def _value(self, line):
        key = line.split()[1]
        if key not in self.values:
            return b"END\r\n"
        v = self.values[key]
        return b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (key, len(v), v)

    def answer_line(self, line):
        if not line.startswith(b"get "):
            return super().answer_line(line)
        self.held.append(line)
        if len(self.held) < 2:
            return b""
        first, second = self.held
        self.held = []
        return self._value(first) * 2 + self._value(second)


def _bad_pool_router(start_server, start_router, bad):
    """A router (one worker, so every client shares its one connection to `bad`) whose
    namespace b: lives on `bad` and everything else on a real node."""
    good = start_server()
    doc = {"version": 1,
           "pools": {"good": {"nodes": [f"{good.host}:{good.port}"]}, "bad": {"nodes": [bad.addr]}},
           "namespaces": {"default": {"pool": "good"}, "b": {"pool": "bad"}}}
    router, admin, _ = start_router(doc, "-t", "1", "--timeout-ms", "10000")
    router.admin = admin
    return router


def _protocol_errors(router):
    """The router's count, from /metrics: its `stats` would ask the bad node too."""
    status, body = http(router.admin, "GET", "/metrics")
    assert status == 200, body
    return int(re.search(r"^shoal_router_upstream_protocol_errors\S* (\d+)$", body, re.M).group(1))


def _still_serves(r):
    assert r.store("set", "plain", "v") == "STORED"
    r.send(b"get plain\r\n")
    assert r.read_get_reply() == [("plain", 0, b"v", None)]


def test_a_reply_of_the_wrong_kind_fails_its_request(start_server, start_router):
    bad = BadNode(b"STORED\r\n")
    try:
        router = _bad_pool_router(start_server, start_router, bad)
        with McRaw(router.host, router.port, timeout=3) as r:
            before = _protocol_errors(router)
            r.send(b"get b:k\r\n")
            line = r.read_line()
            assert line.startswith("SERVER_ERROR") and bad.addr in line, line
            assert "does not match its request" in line, line
            assert _protocol_errors(router) == before + 1
            _still_serves(r)
        assert router.alive()
    finally:
        bad.close()


def test_a_stray_reply_never_gives_a_client_another_keys_value(start_server, start_router):
    bad = StrayReplyNode({b"b:alice:token": b"s3cret"})
    try:
        router = _bad_pool_router(start_server, start_router, bad)
        with McRaw(router.host, router.port, timeout=3) as a, \
                McRaw(router.host, router.port, timeout=3) as b:
            before = _protocol_errors(router)
            a.send(b"get b:alice:token\r\n")
            # the node holds A's answer until B's get is on the same connection behind it
            wait_until(lambda: len(bad.held) == 1, message="A's get reached the node")
            b.send(b"get b:bob:x\r\n")
            assert a.read_get_reply() == [("b:alice:token", 0, b"s3cret", None)]
            line = b.read_line()
            assert line.startswith("SERVER_ERROR") and bad.addr in line, line
            assert "alice" not in line and "s3cret" not in line
            assert _protocol_errors(router) == before + 1
            _still_serves(b)
        assert router.alive()
    finally:
        bad.close()


class BadStatsNode(BadNode):
    """Answers `stats` with a STAT line and then a line no stats reply has, and a metadump with
    a key line and then a STAT line; everything else as BadNode."""

    def answer_line(self, line):
        if line == b"stats":
            return b"STAT curr_items 5\r\nSTORED\r\n"
        if line.startswith(b"lru_crawler metadump"):
            return b"key=a exp=-1 la=1 cas=1 fetch=no cls=1 size=60\nSTAT a 1\r\nEND\r\n"
        return super().answer_line(line)


def test_a_stats_or_dump_reply_of_the_wrong_kind_leaves_the_node_out(start_server, start_router,
                                                                      monkeypatch):
    monkeypatch.setattr(conftest, "SERVER_KIND", "memcached")  # a good node that dumps
    bad = BadStatsNode(b"END\r\n")
    try:
        router = _bad_pool_router(start_server, start_router, bad)
        with McRaw(router.host, router.port, timeout=3) as r:
            assert r.store("set", "plain", "v") == "STORED"
            before = _protocol_errors(router)
            st = r.stats()
            assert st["nodes_answered"] == "1" and st["nodes_total"] == "2"
            assert st["curr_items"] == "1", "the good node's figure only"
            assert _protocol_errors(router) == before + 1
            r.send(b"lru_crawler metadump all\r\n")
            dump = r.read_until(b"END\r\n")
            assert b"key=plain " in dump and b"key=a " in dump, dump  # a's line came before
            assert b"STAT" not in dump
            assert _protocol_errors(router) == before + 2
            _still_serves(r)
        assert router.alive()
    finally:
        bad.close()


class EndlessStatsNode(BadNode):
    """Answers `stats` with well-formed STAT lines that never end (a thread sends them until
    the node is closed); everything else as BadNode."""

    def _serve(self, conn):
        self._conn = conn
        super()._serve(conn)

    def answer_line(self, line):
        if line == b"stats":
            threading.Thread(target=self._spew, args=(self._conn,), daemon=True).start()
            return b""
        return super().answer_line(line)

    def _spew(self, conn):
        i = 0
        try:
            while not self.stop.is_set():
                conn.sendall(b"".join(b"STAT f%d 1\r\n" % (i + k) for k in range(100)))
                i += 100
                self.stop.wait(0.001)
        except OSError:
            pass


def test_a_stats_reply_that_never_ends_times_out(start_server, start_router):
    """Each line of a dump pushes its deadline back (a long dump is not a slow node), but a
    stats reply is held whole and summed: one that never ends must not hold the client's
    `stats` past --timeout-ms."""
    bad = EndlessStatsNode(b"END\r\n")
    try:
        good = start_server()
        doc = {"version": 1,
               "pools": {"good": {"nodes": [f"{good.host}:{good.port}"]},
                         "bad": {"nodes": [bad.addr]}},
               "namespaces": {"default": {"pool": "good"}, "b": {"pool": "bad"}}}
        router, _, _ = start_router(doc, "-t", "1", "--timeout-ms", "300")
        with McRaw(router.host, router.port, timeout=3) as r:
            st = r.stats()
            assert st["nodes_answered"] == "1" and st["nodes_total"] == "2", st
            _still_serves(r)
        assert router.alive()
    finally:
        bad.close()
