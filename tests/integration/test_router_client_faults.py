"""shoal-router: whatever a client sends, the node's reply to it is passed to that client or fails
that client's request alone. It never resets the upstream connection the client shares with
others, never counts towards marking the node down, and never has the node repaired or flushed:
only the node's own faults (timeouts, lost connections, replies no request explains) do
(docs/router.md, "Whose fault a reply is").

Each odd request below is sent through a router in front of one node and straight to another
node in the same state; the two must answer alike, and the router's fault counters must not
move."""

import re
import threading
import time

import pytest

from conftest import SERVER_KIND, held_value, topology
from fakenode import FakeNode
from mcraw import McRaw, accepts, http, wait_until


def router_counters(admin):
    """The router's unlabelled /metrics counters, name (without shoal_router_) -> int."""
    status, body = http(admin, "GET", "/metrics")
    assert status == 200, body
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"^shoal_router_(\w+?)(?:_total)? (\d+)$", body, re.M)}


FAULTS = ("nodes_marked_down", "upstream_protocol_errors", "upstream_errors",
          "upstream_timeouts", "repair_keys_logged", "repair_log_overflows", "repair_flushes")


def assert_no_node_fault(before, after):
    moved = {k: (before.get(k, 0), after.get(k, 0)) for k in FAULTS
             if after.get(k, 0) != before.get(k, 0)}
    assert not moved, f"a client's requests counted against the node: {moved}"


def assert_big_writes_refused(c, verb="set", **kw):
    """Three writes (`verb`) of values within the router's -I (1 MB of value) but over the
    node's once its item header counts: each refused as too large."""
    for i in range(3):
        line = c.store(verb, f"big{i}", b"x" * (1048576 - 10), **kw)
        assert line == "SERVER_ERROR object too large for cache", line


def assert_nothing_repaired(admin, before):
    """No node fault counted since `before` (router_counters), repairs included."""
    time.sleep(0.3)  # several probe intervals: a repair would have been sent by now
    assert_no_node_fault(before, router_counters(admin))


def exchange(port, data, timeout=3.0):
    """Send `data` then an `mn` on a fresh connection; everything up to that MN."""
    with McRaw("127.0.0.1", port, timeout=timeout) as c:
        c.send(data + b"mn\r\n")
        got = c.read_until(b"MN\r\n")
        while not (got == b"MN\r\n" or got.endswith(b"\r\nMN\r\n")):
            got += c.read_until(b"MN\r\n")  # an MN inside a value or a key
        return got


# Requests whose bytes make a node answer something other than the plain reply: CR and
# control bytes in keys and tokens (the CR last on the line is the one that matters), quiet
# mode, noreply, base64 keys, odd flags, data blocks of the wrong length, NUL bytes.
ODD_REQUESTS = {
    "bare_cr_in_opaque": b"mg v3 O1\r v\r\n",
    "opaque_ending_in_cr_last": b"mg v3 O1\r\r\n",
    "key_ending_in_cr_echoed_last": b"mg v3\r k v\r\n",
    "key_ending_in_cr_opaque_first": b"mg a\r O1 k\r\n",
    "cr_token_then_space": b"mg k v O5\r \r\n",
    "ms_key_ending_in_cr": b"ms v3\r 1 k O5\r\nx\r\nmg v3\r k v O6\r\r\n",
    "text_key_with_cr": b"set a\rb 0 0 1\r\nx\r\nget a\rb\r\ngets a\rb a\r\r\n",
    "quiet_hit_echoing_cr": b"ms q1 1\r\nx\r\nmg q1 q v k O7\r\r\nmg q1 q k O\r\r\n",
    "quiet_ma_with_cr_opaque": b"ma c1 N0 J5 q O1\r k\r\nma c1 q O2\r\r\nma c1 v O3\r\r\n",
    "md_quiet_cr": b"ms d1 1\r\nx\r\nmd d1 q O\r k\r\nmd d1 q O\r\r\n",
    "control_and_high_bytes": b"mg \x01\x02\x7f\xff k v O\x80\r\n",
    "tab_in_tokens": b"mg k\tv v O\t1\r\n",
    "base64_key_echo": b"ms a2V5 1 b k O1\r\nz\r\nmg a2V5 b v k O2\r\r\nmg key k v\r\n",
    "base64_key_with_cr": b"mg a2V5\r b k\r\n",
    "duplicate_and_unknown_flags": b"mg k O1 O2\r\nmg k Q v\r\nmg k v v\r\n",
    "empty_opaque_last": b"mg k O\r\nmg k k O\r\r\n",
    "flag_letter_q_with_token": b"mg k qfoo v O9\r\n",
    "noreply_text": b"set n 0 0 1 noreply\r\nx\r\nincr n 1 noreply\r\nget n\r\n",
    "noreply_not_last": b"set k 0 0 1 noreply junk\r\nx\r\n",
    "data_block_too_long": b"set k 0 0 3\r\nabcde\r\nms k 3\r\nabcde\r\n",
    "data_block_bad_end": b"set k 0 0 3\r\nabc\n\rget k\r\n",
    "nul_in_line": b"mg k v \x00junk\r\nset k 0 0 1 \x00x\r\nx\r\n",
    "garbage_line": b"\x00\x01\x02\r\n\x1b[2J\r\n\xfe\xff\r\n",
    "negative_and_junk_numbers": b"set k 0 0 -1\r\nincr k -1\r\ntouch k x\r\nmg k T-1 v\r\n",
    "long_meta_line": b"mg " + b"x" * 250 + b" O" + b"a" * 31 + b" k v\r\n",
    "many_get_keys": b"get " + b" ".join(b"k%d\r" % i for i in range(300)) + b"\r\n",
}


@pytest.fixture
def pair(start_server, start_router):
    """A router (one worker: every client shares its connection to the node) in front of one
    node, and a second node alone to compare with."""
    behind, alone = start_server(), start_server()
    router, admin, _ = start_router(topology([behind]), "-t", "1", "--down-after", "1")
    router.admin = admin
    wait_until(lambda: accepts(admin), message="the router's admin port")
    return router, alone


# the router parses as shoal-node does; memcached 1.6.18 decodes a base64 key with a \r
MEMCACHED_DIFFERS = {"base64_key_with_cr"}


@pytest.mark.parametrize("case", sorted(ODD_REQUESTS))
def test_an_odd_request_is_answered_as_the_node_answers_it(pair, case):
    if SERVER_KIND == "memcached" and case in MEMCACHED_DIFFERS:
        pytest.skip("the router answers as shoal-node, which differs from memcached here")
    router, alone = pair
    before = router_counters(router.admin)
    want = exchange(alone.port, ODD_REQUESTS[case])
    got = exchange(router.port, ODD_REQUESTS[case])
    assert got == want
    after = router_counters(router.admin)
    assert_no_node_fault(before, after)
    assert after.get("client_caused_reply_errors", 0) == before.get("client_caused_reply_errors", 0)


def test_a_flood_of_bare_cr_opaques_leaves_the_nodes_other_clients_served(pair):
    """The issue's case: four connections sending `mg v3 O1\\r v` while others use the node.
    Before, each such reply reset the shared connection, and three in a row marked the node
    down (here --down-after 1: one would)."""
    router, _ = pair
    with McRaw(router.host, router.port) as c:
        assert c.store("set", "canary", "alive") == "STORED"
    before = router_counters(router.admin)
    stop = threading.Event()
    odd_replies, errors = [], []

    def flood():
        with McRaw(router.host, router.port) as c:
            while not stop.is_set():
                c.send(b"mg v3 O1\r v\r\n" * 8)
                for _ in range(8):
                    odd_replies.append(c.read_line())

    def well_behaved(i):
        with McRaw(router.host, router.port) as c:
            for n in range(150):
                key = f"good{i}:{n}"
                if c.store("set", key, str(n)) != "STORED":
                    errors.append(key)
                    continue
                c.send(f"get {key}\r\n".encode())
                got = c.read_get_reply()
                if got != [(key, 0, str(n).encode(), None)]:
                    errors.append((key, got))

    floods = [threading.Thread(target=flood) for _ in range(4)]
    goods = [threading.Thread(target=well_behaved, args=(i,)) for i in range(2)]
    for t in floods + goods:
        t.start()
    for t in goods:
        t.join(30)
    stop.set()
    for t in floods:
        t.join(10)
    assert not errors, f"{len(errors)} of 300 requests of well-behaved clients failed: {errors[:5]}"
    assert odd_replies and set(odd_replies) == {"EN O1\r"}, set(odd_replies)
    assert_no_node_fault(before, router_counters(router.admin))
    with McRaw(router.host, router.port) as c:
        assert c.get("canary") == [("canary", 0, b"alive", None)]


class EchoNode(FakeNode):
    """A tiny node that answers `mg` like memcached (EN, echoing O and k) except that an
    opaque starting with `odd` is echoed as `other`: a node whose echo the router does not
    foresee. `hold` holds replies until a `get` arrives, so that requests of several clients
    share the connection; `mn` is answered MN, in order; `stray` answers `mg stray` twice."""

    def answer(self, line, rest):
        if line.startswith(b"version"):
            return b"VERSION echo\r\n", rest
        if line == b"mn":
            return b"MN\r\n", rest
        if line.startswith(b"mg "):
            toks = line.split(b" ")
            out = b"EN"
            for t in toks[2:]:
                if t.startswith(b"O"):
                    out += b" O" + (b"other" if t[1:].startswith(b"odd") else t[1:])
                elif t == b"k":
                    out += b" k" + toks[1]
            reply = out + b"\r\n"
            return (reply * 2 if toks[1] == b"stray" else reply), rest
        return b"ERROR\r\n", rest


def _echo_router(start_router, node):
    router, admin, _ = start_router(topology([node.addr]), "-t", "1", "--down-after", "1",
                                    "--timeout-ms", "5000")
    router.admin = admin
    wait_until(lambda: accepts(admin), message="the router's admin port")
    return router


@pytest.mark.shoal_only
def test_an_echo_the_router_did_not_foresee_fails_that_request_alone(start_router):
    node = EchoNode()
    try:
        router = _echo_router(start_router, node)
        with McRaw(router.host, router.port) as a, McRaw(router.host, router.port) as b:
            assert a.meta("mg w O0").line == "EN O0"  # the connection to the node is open
            before = router_counters(router.admin)
            # a's odd request between requests of its own and b's, on the one connection
            a.send(b"mg x O1\r\nmg x Oodd1 k\r\nmg x O2\r\n")
            b.send(b"mg y O3 k\r\n")
            assert a.read_line() == "EN O1"
            line = a.read_line()
            assert line.startswith("SERVER_ERROR") and "does not match its request" in line
            assert a.read_line() == "EN O2"
            assert b.read_line() == "EN O3 ky"
            wait_until(lambda: router_counters(router.admin)["client_caused_reply_errors"]
                       == before["client_caused_reply_errors"] + 1,
                       message="the MN after it showed the connection in step")
            a.send(b"mg x O4\r\n")
            assert a.read_line() == "EN O4"
        after = router_counters(router.admin)
        assert_no_node_fault(before, after)
        assert after["upstream_connects"] == before["upstream_connects"], "reconnected"
    finally:
        node.close()


@pytest.mark.shoal_only
def test_replies_shifted_by_a_stray_one_are_still_the_nodes_fault(start_router):
    """The check that keeps a client's odd request from costing the node anything must not
    hide a node that sends one reply too many: its MN comes one reply late."""
    node = EchoNode()
    try:
        router = _echo_router(start_router, node)
        before = router_counters(router.admin)
        with McRaw(router.host, router.port) as a:
            a.send(b"mg stray O1\r\nmg x O2\r\nmg x O3\r\n")
            assert a.read_line() == "EN O1"
            for _ in range(2):  # each got the reply before its own, and the router saw it
                line = a.read_line()
                assert line.startswith("SERVER_ERROR"), line
        wait_until(lambda: router_counters(router.admin)["upstream_protocol_errors"]
                   == before["upstream_protocol_errors"] + 1, message="the shift found")
        after = router_counters(router.admin)
        assert after.get("client_caused_reply_errors", 0) == before.get("client_caused_reply_errors", 0)
        assert after["nodes_marked_down"] == before["nodes_marked_down"] + 1  # --down-after 1
    finally:
        node.close()


@pytest.mark.shoal_only  # where a value is over the node's -I depends on its item header
def test_writes_the_node_refuses_are_not_repaired_nor_flushed(start_server, start_router):
    """A node's own answer to a write, a SERVER_ERROR included, is that write's outcome: only
    a write the router gave up on (timed out, connection lost) may land later and is logged
    for repair. Before, each refused write logged its key, and one more distinct key than
    --repair-log had the node flushed."""
    node = start_server()
    router, admin, _ = start_router(topology([node]), "-t", "1", "--repair-log", "2",
                                    "--probe-ms", "50")
    wait_until(lambda: accepts(admin), message="the router's admin port")
    with McRaw(router.host, router.port) as c:
        assert c.store("set", "canary", "alive") == "STORED"
        before = router_counters(admin)
        assert_big_writes_refused(c)
        assert c.store("set", "k", b"x" * 1000) == "STORED"
        line = c.store("append", "k", b"y" * (1048576 - 500))
        assert line.startswith("SERVER_ERROR"), line
        assert_nothing_repaired(admin, before)
        assert c.get("canary") == [("canary", 0, b"alive", None)]


def _replicated(start_server, start_router, *node_flags):
    """Two replicas (each started with its flags of node_flags) of one replicated pool behind a
    one-worker router that repairs from a log of two keys."""
    nodes = [start_server(*flags) for flags in node_flags]
    doc = topology(nodes)
    doc["pools"]["main"]["mode"] = "replicated"
    router, admin, _ = start_router(doc, "-t", "1", "-I", "2m", "--repair-log", "2",
                                    "--probe-ms", "50")
    wait_until(lambda: accepts(admin), message="the router's admin port")
    return nodes, router, admin


@pytest.mark.shoal_only  # where a value is over the node's -I depends on its item header
def test_writes_every_replica_refuses_are_not_repaired_nor_flushed(start_server, start_router):
    """Replicas that all refused a write alike are still alike: nothing to repair."""
    nodes, router, admin = _replicated(start_server, start_router, (), ())
    with McRaw(router.host, router.port) as c:
        assert c.store("set", "canary", "alive") == "STORED"
        before = router_counters(admin)
        assert_big_writes_refused(c)
        assert_nothing_repaired(admin, before)
    for n in nodes:
        with McRaw(n.host, n.port) as c:
            assert c.get("canary") == [("canary", 0, b"alive", None)]


@pytest.mark.shoal_only
def test_a_replica_that_refused_what_another_took_is_repaired(start_server, start_router):
    """The other side of the rule: replicas that answered a write differently (one's -I is
    smaller) no longer agree, and the one that refused is repaired (its old value deleted)."""
    nodes, router, admin = _replicated(start_server, start_router, ("-I", "1m"), ("-I", "2m"))
    with McRaw(router.host, router.port) as c:
        assert c.store("set", "k", "old") == "STORED"
        before = router_counters(admin)
        c.store("set", "k", b"x" * (1536 * 1024))  # the first replica refuses, the second takes it
        wait_until(lambda: router_counters(admin)["repair_keys_logged"]
                   == before["repair_keys_logged"] + 1, message="the refusing replica logged")
    wait_until(lambda: held_value(nodes[0], "k") is None,
               message="the old value deleted on the replica that refused the new one")


@pytest.mark.shoal_only
def test_compare_and_swaps_a_replica_refuses_are_not_repaired(start_server, start_router):
    """A cas the replica that compares refuses (too large) was not applied there, so nothing is
    pending anywhere: the other replicas are not logged for repair."""
    nodes, router, admin = _replicated(start_server, start_router, (), ())
    with McRaw(router.host, router.port) as c:
        assert c.store("set", "canary", "alive") == "STORED"
        before = router_counters(admin)
        assert_big_writes_refused(c, "cas", extra="1")
        assert_nothing_repaired(admin, before)
    for n in nodes:
        with McRaw(n.host, n.port) as c:
            assert c.get("canary") == [("canary", 0, b"alive", None)]
