"""Hostile and careless peers on shoal-node's replication surfaces (issue 15): the replication
handshake and frames spoken on the DATA port (docs/protocol.md "Replication between nodes") and
the admin port's /v1/replication and POST /v1/replication/handoff (docs/admin-api.md).

The rule each test checks: whatever bytes a peer sends, it gets a clear error or a closed
connection; the node does not crash, hang, grow without bound or answer a well-behaved client
wrongly. A pymemcache client doing set/get of mixed value sizes runs during every probe
(`Steady`) and its answers are checked at the end."""

import json
import os
import random
import signal
import socket
import struct
import threading
import time

import pytest

from conftest import key_slot
from fakecontrol import FakeControl
from mcraw import McRaw, http, rss_bytes, sanitized, wait_until
from test_node_repl import caught_up, doc, metric, pair, repl, start_node, value_of


@pytest.fixture
def control():
    c = FakeControl(hold=2.0)
    yield c
    c.stop()


class Steady:
    """A well-behaved client: set then get of values of mixed sizes, in a thread, against one
    node, checking every answer. `check()` stops it and fails the test on any wrong answer."""

    SIZES = (1, 100, 5000, 70_000, 300_000)

    def __init__(self, node, prefix="steady"):
        self.node, self.prefix = node, prefix
        self.stop_ev = threading.Event()
        self.errors, self.rounds = [], 0
        self.th = threading.Thread(target=self._run, daemon=True)
        self.th.start()

    def _run(self):
        rnd = random.Random(11)
        c = self.node.client()
        try:
            while not self.stop_ev.is_set():
                i = self.rounds
                key = f"{self.prefix}:{i % 50}"
                val = bytes([97 + i % 26]) * rnd.choice(self.SIZES)
                if not c.set(key, val):
                    self.errors.append(f"set {key} not stored")
                got = c.get(key)
                if got != val:
                    self.errors.append(f"get {key}: {len(got or b'')} bytes, want {len(val)}")
                self.rounds += 1
        except Exception as e:  # a hang or a closed connection is a failure too
            self.errors.append(f"{type(e).__name__}: {e}")

    def check(self):
        self.stop_ev.set()
        self.th.join(10)
        assert not self.th.is_alive(), "the well-behaved client hung"
        assert self.errors == [], self.errors[:5]
        assert self.rounds > 0, "the well-behaved client made no progress"


def handshake(node, name, replid="0123456789abcdef", timeout=5):
    """Open the replication handshake in `name`'s name; the replica's first line."""
    with socket.create_connection((node.host, node.port), timeout=timeout) as s:
        s.sendall(f"shoal_repl 1 {name} {replid}\r\n".encode())
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(200)
            if not chunk:
                break
            data += chunk
        return data.decode(errors="replace")


def test_made_up_primary_names_do_not_fill_the_peer_table(start_server, control):
    """1,100 handshakes in made-up names (refused: not a primary) used to be added to the
    node's append-only table of 1,024 peer names each; once full, a replica a later document
    gave this node had no index and never received a stream."""
    a = start_node(start_server, control)
    control.publish(doc(1, a, None, nodes=[a]))
    wait_until(lambda: handshake(a, "127.0.0.1:1").startswith("REPL REFUSED"),
               message="the node follows the document")
    steady = Steady(a, "default")
    for i in range(1100):
        assert handshake(a, f"10.{i // 250}.{i % 250}.1:11211").startswith("REPL REFUSED")
    steady.check()
    c = start_node(start_server, control)
    control.publish(doc(2, a, c))
    with McRaw(a.host, a.port) as m:
        assert m.store("set", "rep:after", "v") == "STORED"
    wait_until(lambda: value_of(c, "rep:after") == b"v", timeout=5,
               message="the new replica receives the stream")


def test_handoff_to_made_up_names_does_not_fill_the_peer_table(start_server, control):
    """Same table, filled through the admin port: a handoff `to` a name no document gave is
    refused 409 and leaves no trace."""
    a = start_node(start_server, control)
    control.publish(doc(1, a, None, nodes=[a]))
    wait_until(lambda: repl(a)["replid"], message="replication on")
    for i in range(1030):
        status, body = http(a.admin_port, "POST", "/v1/replication/handoff",
                            {"to": f"10.9.{i // 250}.{i % 250}:1", "slots": [[0, 0]]})
        assert status == 409, body
    c = start_node(start_server, control)
    control.publish(doc(2, a, c))
    with McRaw(a.host, a.port) as m:
        assert m.store("set", "rep:after", "v") == "STORED"
    wait_until(lambda: value_of(c, "rep:after") == b"v", timeout=5,
               message="the new replica receives the stream")


def key_in(lo, hi, prefix="rep:k"):
    """A key of the namespace `rep` whose slot lies in [lo, hi]."""
    return next(k for k in (f"{prefix}{i}" for i in range(100_000)) if lo <= key_slot(k) <= hi)


def handoff(node, to, slots, timeout_ms):
    return http(node.admin_port, "POST", "/v1/replication/handoff",
                {"to": to.addr, "slots": slots, "timeout_ms": timeout_ms})


def test_a_timed_out_handoff_lifts_its_own_fence_only(start_server, control):
    """A drain hands a node's ranges off one replica after another: when the second times out,
    the first one's fence (answered 200, its swap on the way) must stand, or writes accepted
    until the swap arrives may never reach the new primary."""
    a, b, c = (start_node(start_server, control) for _ in range(3))
    control.publish({"version": 1, "pools": {"main": {"nodes": [a.addr, b.addr, c.addr], "slots": [
        {"from": 0, "to": 8191, "node": a.addr, "replica": b.addr},
        {"from": 8192, "to": 16383, "node": a.addr, "replica": c.addr}]}},
        "namespaces": {"rep": {"pool": "main", "copies": 2}}})
    wait_until(lambda: [r["state"] for r in repl(a)["replicas"]] == ["online"] * 2, timeout=10,
               message="both replicas online")
    status, body = handoff(a, b, [[0, 8191]], 2000)
    assert status == 200, body
    c.proc.send_signal(signal.SIGSTOP)
    try:
        with McRaw(a.host, a.port) as m:
            assert m.store("set", key_in(8192, 16383), "x") == "STORED"
        status, body = handoff(a, c, [[8192, 16383]], 200)
        assert status == 504, body
        with McRaw(a.host, a.port) as m:
            assert m.store("set", key_in(0, 8191), "y") == "SERVER_ERROR slot moving", \
                "the first handoff's fence still stands"
            assert m.store("set", key_in(8192, 16383), "z") == "STORED", "its own one lifted"
    finally:
        c.proc.send_signal(signal.SIGCONT)


def test_a_handoff_whose_fence_was_lifted_while_it_waited_is_not_answered_200(
        start_server, control):
    """Two handoffs of the same slots: the second times out and lifts the fence, writes come
    in; the first must not then answer 200 (the control plane would swap as if nothing were
    written since its offset)."""
    a, b = pair(start_server, control)
    b.proc.send_signal(signal.SIGSTOP)
    result = {}
    try:
        with McRaw(a.host, a.port) as m:
            assert m.store("set", key_in(0, 100), "x") == "STORED"
        th = threading.Thread(target=lambda: result.update(r=handoff(a, b, [[0, 100]], 10000)))
        th.start()
        wait_until(lambda: metric(a, "fenced_slots") == 101, message="the first fence")
        status, body = handoff(a, b, [[0, 100]], 100)
        assert status == 504, body
        with McRaw(a.host, a.port) as m:
            assert m.store("set", key_in(0, 100, "rep:w"), "y") == "STORED", "lifted"
    finally:
        b.proc.send_signal(signal.SIGCONT)
    th.join(10)
    status, body = result["r"]
    assert status == 409, body
    assert "lifted" in json.loads(body)["error"]


class FakeReplica:
    """A listener a document names as a node's replica: the primary connects to it and it
    answers with `behave(fake, sock, rfile, hello_line)`, one thread per connection. `log`
    collects what each connection saw."""

    def __init__(self, behave):
        self.s = socket.socket()
        self.s.bind(("127.0.0.1", 0))
        self.s.listen(16)
        self.addr = f"127.0.0.1:{self.s.getsockname()[1]}"
        self.behave, self.log, self.conns = behave, [], 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.s.accept()
            except OSError:
                return
            self.conns += 1
            threading.Thread(target=self._one, args=(c, self.conns), daemon=True).start()

    def _one(self, c, n):
        with c:
            try:
                c.settimeout(10)
                f = c.makefile("rb")
                self.behave(self, c, f, f.readline(), n)
            except OSError as e:
                self.log.append(("error", n, repr(e)))

    def close(self):
        self.s.close()


def test_a_replica_resuming_from_inside_a_frame_is_synced_in_full(start_server, control):
    """A peer at a replica's address that answers REPL HAVE with the primary's replid and an
    offset inside a frame used to be answered REPL CONTINUE: the sender then read headers out
    of payload bytes, sent nothing more but progress frames and stayed `online` with its lag
    growing. Such an offset is not a frame's start, so the replica is synced in full."""
    a = start_node(start_server, control)
    go, mid = threading.Event(), {}

    def behave(fake, c, f, hello, n):
        replid = hello.split()[3].decode()
        if n == 1:  # the first connection always syncs in full; it waits, then goes
            c.sendall(b"REPL HAVE - 0\r\n")
            fake.log.append(("start", n, f.readline()))
            go.wait(10)
            return
        c.sendall(f"REPL HAVE {replid} {mid['off']}\r\n".encode())
        fake.log.append(("start", n, f.readline()))

    fake = FakeReplica(behave)
    try:
        control.publish(doc(1, a, fake, nodes=[a, fake]))
        steady = Steady(a, "default")
        wait_until(lambda: fake.log, message="the primary's first connection")
        with McRaw(a.host, a.port) as m:
            for i in range(20):
                assert m.store("set", f"rep:m{i}", "v" * 100) == "STORED"
        mid["off"] = repl(a)["offset"] - 7  # inside the last frame
        go.set()
        wait_until(lambda: len(fake.log) >= 2, message="the primary's second connection")
        steady.check()
        assert fake.log[1][2].startswith(b"REPL FULL "), fake.log
    finally:
        fake.close()


def frame(t, payload=b"", offset=0, length=None, reserved=b"\0\0\0"):
    """A replication frame: type, 3 reserved bytes, payload length (u32 LE), offset (u64 LE)."""
    n = len(payload) if length is None else length
    return t.encode() + reserved + struct.pack("<IQ", n, offset) + payload


def item(key, value, iflags=0, ttl=0):
    return struct.pack("<BBIIQ", len(key), iflags, 0, ttl, 1) + key + value


def as_primary(replica, primary, after=b"REPL FULL 0\r\n"):
    """A connection to `replica`'s data port in `primary`'s name, past the handshake."""
    s = socket.create_connection((replica.host, replica.port), timeout=5)
    s.sendall(f"shoal_repl 1 {primary.addr} 0123456789abcdef\r\n".encode())
    have = s.makefile("rb").readline()
    assert have.startswith(b"REPL HAVE "), have
    s.sendall(after)
    return s


def closed(s, timeout=3):
    """Did the peer close `s` within `timeout` (whatever it sent before)?"""
    s.settimeout(timeout)
    try:
        while s.recv(65536):
            pass
        return True
    except socket.timeout:
        return False
    except ConnectionResetError:
        return True


BAD_FRAMES = {
    "huge declared length": frame("S", b"", 1, length=0xFFFFFFFF),
    "just over the largest item": frame("S", b"", 1, length=(1 << 20) + 255 + 18 + 1),
    "unknown type": frame("Z", b"", 1),
    "nonzero reserved byte": frame("S", item(b"rep:k", b"v"), 100, reserved=b"\0\1\0"),
    "item with an empty key": frame("S", item(b"", b"v"), 100),
    "item shorter than its key": frame("S", struct.pack("<BBIIQ", 200, 0, 0, 0, 1) + b"k", 100),
    "key over 250 bytes": frame("S", item(b"k" * 251, b"v"), 400),
    "delete of a wrong length": frame("D", b"\x05rep:kk", 100),
    "touch too short": frame("T", b"\x01\0\0", 100),
    "flush_all of 3 bytes": frame("F", b"\0\0\0", 100),
    "reset of a wrong length": frame("R", b"\0" * 100, 0),
    "progress with 3 bytes": frame("P", b"abc", 100),
    "snapshot end with a payload": frame("E", b"x", 100),
    "an ack from the primary": frame("A", b"", 100),
    "offset going back": frame("S", item(b"rep:a", b"v"), 500) + frame("S", item(b"rep:b", b"v"), 400),
    "text key with a space": frame("S", item(b"rep:a b", b"v"), 100),
    "text key with a newline": frame("s", item(b"rep:a\r\nEND", b"v"), 0),
    "garbage": bytes(random.Random(3).randrange(256) for _ in range(5000)),
}


def test_malformed_frames_from_a_primary_close_that_stream_only(start_server, control):
    """Each malformed frame (docs/protocol.md "Bounds") closes the connection that sent it and
    counts a protocol error; the node serves clients meanwhile and the real stream resumes."""
    a, b = pair(start_server, control)
    a.proc.send_signal(signal.SIGSTOP)  # its reconnects would replace ours
    try:
        steady = Steady(b, "default")
        rss0 = rss_bytes(b.proc.pid)
        for name, junk in BAD_FRAMES.items():
            errors0 = metric(b, "protocol_errors")
            s = as_primary(b, a)
            s.sendall(junk)
            assert closed(s), f"{name}: the connection stays open"
            s.close()
            wait_until(lambda: metric(b, "protocol_errors") == errors0 + 1,
                       message=f"{name}: counted as a protocol error")
        # a binary key (ms with b) may hold any byte
        applied0 = metric(b, "applied_records")
        s = as_primary(b, a)
        s.sendall(frame("S", item(b"rep:\n b", b"bin", iflags=64), 100) + frame("E", b"", 100))
        wait_until(lambda: metric(b, "applied_records") == applied0 + 1,
                   message="the binary key applied")
        s.close()
        # a frame cut short, then the peer goes: nothing applied, nothing held
        s = as_primary(b, a)
        s.sendall(frame("S", item(b"rep:cut", b"v" * 1000), 2000)[:500])
        s.close()
        steady.check()
        if not sanitized(b.proc.pid):  # ASAN's quarantine keeps each applier's buffer resident
            assert rss_bytes(b.proc.pid) - rss0 < 64 << 20
    finally:
        a.proc.send_signal(signal.SIGCONT)
    assert value_of(b, "rep:cut") is None
    with McRaw(a.host, a.port) as m:
        assert m.store("set", "rep:after", "ok") == "STORED"
    wait_until(lambda: value_of(b, "rep:after") == b"ok", timeout=10,
               message="the real stream resumes")


def test_a_full_sync_cut_midway_leaves_no_offset_to_resume_from(start_server, control):
    """A primary that goes after its reset and some snapshot items, before the snapshot's end:
    the replica keeps no replid for it, so the next connection is a full sync, never a resume
    on top of half a snapshot."""
    a, b = pair(start_server, control)
    full0 = metric(a, "full_resyncs")
    a.proc.send_signal(signal.SIGSTOP)
    try:
        s = as_primary(b, a, b"REPL FULL 1000\r\n")
        s.sendall(frame("R", b"\xff" * 2048, 1000) +
                  b"".join(frame("s", item(f"rep:half{i}".encode(), b"h" * 100)) for i in range(50)))
        wait_until(lambda: value_of(b, "rep:half49") == b"h" * 100, message="half a snapshot in")
        s.close()
        wait_until(lambda: repl(b)["primaries"][0]["state"] == "down", message="stream gone")
        assert repl(b)["primaries"][0]["replid"] == "-"
    finally:
        a.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: metric(a, "full_resyncs") == full0 + 1, timeout=10,
               message="the real primary syncs it in full")
    wait_until(lambda: caught_up(a), timeout=10, message="caught up")
    assert value_of(b, "rep:half0") is None, "the half snapshot's items dropped by the reset"


def test_a_thousand_replication_handshakes_held_open_cost_bounded_threads(start_server, control):
    """1,000 connections that open the handshake and never finish its line: at most 32 get an
    applier (the rest are closed at once), each for at most 3 s; clients are served and the
    real stream goes on."""
    a, b = pair(start_server, control)
    steady = Steady(b, "default")
    rss0 = rss_bytes(b.proc.pid)
    socks = []
    try:
        for _ in range(1000):
            s = socket.create_connection((b.host, b.port), timeout=5)
            s.sendall(b"shoal_repl 1 ")
            socks.append(s)
        with open(f"/proc/{b.proc.pid}/status") as f:
            threads = int(next(l for l in f if l.startswith("Threads:")).split()[1])
        assert threads < 32 + 40, threads
        with McRaw(a.host, a.port) as m:
            assert m.store("set", "rep:during", "ok") == "STORED"
        wait_until(lambda: value_of(b, "rep:during") == b"ok", message="the real stream goes on")
        assert rss_bytes(b.proc.pid) - rss0 < 128 << 20
        wait_until(lambda: sum(closed(s, 0.01) for s in socks) == 1000, timeout=8,
                   message="every held handshake closed")
    finally:
        for s in socks:
            s.close()
    steady.check()


HANDOFF_BAD = [
    ("", 400), ("{", 400), ("[]", 400), ("null", 400), ('{"to": 5, "slots": [[0, 1]]}', 400),
    ('{"slots": [[0, 1]]}', 400), ('{"to": "%s", "slots": "all"}', 400),
    ('{"to": "%s", "slots": [[5, 1]]}', 400), ('{"to": "%s", "slots": [[0, 16384]]}', 400),
    ('{"to": "%s", "slots": [[-1, 3]]}', 400), ('{"to": "%s", "slots": [[0]]}', 400),
    ('{"to": "%s", "slots": [[0, 1, 2]]}', 400), ('{"to": "%s", "slots": [["0", 1]]}', 400),
    ('{"to": "%s", "slots": [[0, 1]], "timeout_ms": -1}', 400),
    ('{"to": "%s", "slots": [[0, 1]], "timeout_ms": 60001}', 400),
    ('{"to": "%s", "slots": [[0, 1]], "timeout_ms": "5"}', 400),
    ('{"to": "%s", "slots": [[0, 1e300]]}', 400),
    ('{"to": "' + "h" * 400 + ':1", "slots": [[0, 1]]}', 400),
    ("[" * 100_000 + "]" * 100_000, 400),
    ('{"to": "%s", "slots": [[0, 1]]}' + " " * (2 << 20), 413),
    ('{"to": "127.0.0.1:1", "slots": [[0, 1]]}', 409),
]


def test_malformed_handoffs_are_refused_and_fence_nothing(start_server, control):
    """Each malformed handoff body gets 400 (413 over 1 MiB, 409 for a `to` that is not this
    node's replica), fences nothing and leaves the node serving."""
    a, b = pair(start_server, control)
    steady = Steady(a, "default")
    for body, want in HANDOFF_BAD:
        if "%s" in body:
            body = body.replace("%s", b.addr, 1)
        status, reply = http(a.admin_port, "POST", "/v1/replication/handoff", body.encode())
        assert status == want, (body[:80], reply)
        assert "error" in json.loads(reply), reply
    status, reply = http(a.admin_port, "GET", "/v1/replication/handoff")
    assert status == 405, reply
    status, reply = http(a.admin_port, "POST", "/v1/replication", b"{}")
    assert status == 405, reply
    assert metric(a, "fenced_slots") == 0
    steady.check()
    with McRaw(a.host, a.port) as m:
        assert m.store("set", "rep:after", "ok") == "STORED"


def test_handoff_without_a_token_is_401_and_fences_nothing(start_server, control, tmp_path):
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"tokens": [{"token": "admin-token-0123456789abcdef",
                                            "role": "admin", "name": "ops"}]}))
    auth.chmod(0o600)
    a, b = (start_node(start_server, control, "--auth-file", str(auth)) for _ in range(2))
    control.publish(doc(1, a, b))
    wait_until(lambda: [r["state"] for r in repl(a)["replicas"]] == ["online"], timeout=10,
               message="the replica online")
    status, reply = http(a.admin_port, "POST", "/v1/replication/handoff",
                         {"to": b.addr, "slots": [[0, 16383]]})
    assert status == 401, reply
    assert metric(a, "fenced_slots") == 0
    with McRaw(a.host, a.port) as m:
        assert m.store("set", "rep:x", "1") == "STORED"


def test_a_node_that_has_seen_1024_peer_names_still_streams_to_a_new_replica(
        start_server, control):
    """Peer names (primaries and replicas documents named) were kept for the process's life in
    a table of 1,024: a long-lived node that had seen that many (nodes replaced, new addresses)
    never streamed to a replica with a new name (and took every unindexed name for the same
    peer). Names no longer in use are forgotten when the table is full."""
    a = start_node(start_server, control)
    fakes = [f"10.8.{i // 250}.{i % 250}:11211" for i in range(1024)]  # the table, full
    ranges = [{"from": i * 16, "to": i * 16 + 15, "node": f, "replica": a.addr}
              for i, f in enumerate(fakes)]
    control.publish({"version": 1, "pools": {"main": {"nodes": fakes + [a.addr], "slots": ranges}},
                     "namespaces": {"rep": {"pool": "main", "copies": 2}}})
    wait_until(lambda: handshake(a, fakes[-1]).startswith("REPL HAVE"),
               message="a replicates from them all")
    b = start_node(start_server, control)
    control.publish(doc(2, a, b))
    wait_until(lambda: handshake(a, fakes[-1]).startswith("REPL REFUSED"), message="v2 in use")
    with McRaw(a.host, a.port) as m:
        assert m.store("set", "rep:new", "v") == "STORED"
    wait_until(lambda: value_of(b, "rep:new") == b"v", timeout=5,
               message="the new replica receives the stream")


def test_a_handoff_waits_for_a_replica_still_in_its_full_sync(start_server, control):
    """A replica that has not yet applied (and acknowledged) its full sync must not be handed
    the slots: at the sync's start the link's acked offset is set to the stream's position, so
    a handoff fenced before that answered 200 at once, and the swap made a replica without the
    data primary (two drains in a row lost acknowledged writes this way: the first gave the
    second's node a new replica). It waits for the snapshot's acknowledgement now (504 here)."""
    a = start_node(start_server, control)
    synced = threading.Event()

    def behave(fake, c, f, hello, n):  # takes the full sync, never acknowledges it
        c.sendall(b"REPL HAVE - 0\r\n")
        fake.log.append(("start", n, f.readline()))
        synced.set()
        while c.recv(65536):
            pass

    fake = FakeReplica(behave)
    try:
        control.publish(doc(1, a, None, nodes=[a]))
        wait_until(lambda: repl(a)["replid"], message="replication on")
        with McRaw(a.host, a.port) as m:
            for i in range(20):
                assert m.store("set", f"rep:k{i}", "v" * 1000) == "STORED"
        control.publish(doc(2, a, fake, nodes=[a, fake]))
        assert synced.wait(5)
        status, body = handoff(a, fake, [[0, 16383]], 300)
        assert status == 504, body
        assert repl(a)["replicas"][0]["state"] == "sync"
    finally:
        fake.close()


def test_a_hostile_replica_costs_its_primary_only_that_link(start_server, control):
    """A listener at a replica's address that answers the handshake with junk, a handshake line
    with no end, or acks of offsets never sent: each connection is closed (counted) or the junk
    ignored, the primary's acked figure never passes what it sent, and its clients are served.
    Any ack used to count as the snapshot's (the link's acked offset was set to the resume
    offset when the sync began), so a replica acking 0 or the future went `online`, and a
    handoff to it was answered 200 with nothing applied."""
    a = start_node(start_server, control)
    mode = {"now": "garbage"}

    def behave(fake, c, f, hello, n):
        m = mode["now"]
        fake.log.append((m, n))
        if m == "garbage":
            c.sendall(b"REPL HAVE - 0\r\n" + bytes(random.Random(n).randrange(256) for _ in range(3000)))
        elif m == "endless line":
            c.sendall(b"REPL HAVE " + b"x" * 5000)
        else:  # acks of offsets never sent and of 0, none of the snapshot's end; reads on
            c.sendall(b"REPL HAVE - 0\r\n" + frame("A", b"", 1 << 60) + frame("A", b"", 0))
        c.settimeout(2)
        try:
            while (data := c.recv(65536)):
                fake.got[n] = fake.got.get(n, 0) + len(data)
        except OSError:
            pass

    fake = FakeReplica(behave)
    fake.got = {}
    try:
        steady = Steady(a, "default")
        errors0 = metric(a, "protocol_errors")
        control.publish(doc(1, a, fake, nodes=[a, fake]))
        wait_until(lambda: metric(a, "protocol_errors") >= errors0 + 2, message="junk counted")
        mode["now"] = "endless line"
        errors1 = metric(a, "protocol_errors")
        wait_until(lambda: metric(a, "protocol_errors") >= errors1 + 2, timeout=10,
                   message="an endless handshake line counted")
        mode["now"] = "future acks"
        with McRaw(a.host, a.port) as m:
            for i in range(20):
                assert m.store("set", f"rep:f{i}", "v" * 5000) == "STORED"
        wait_until(lambda: fake.log[-1][0] == "future acks" and
                   fake.got.get(fake.log[-1][1], 0) > 100_000, timeout=10,
                   message="a snapshot sent to a connection acking what it was not sent")
        time.sleep(0.1)  # its acks read by now (the sender reads them between steps)
        r = repl(a)["replicas"][0]
        assert r["acked"] <= repl(a)["offset"] and r["state"] != "online", r
        steady.check()
    finally:
        fake.close()


def test_a_node_stopped_while_a_handoff_waits_answers_it_and_exits_cleanly(start_server,
                                                                           control):
    """SIGTERM while a handoff waited for its replica aborted the node (libmicrohttpd may not
    stop with a request held: "MHD_stop_daemon() called while we have suspended
    connections"). Waiting handoffs are answered 503 first now, and the node exits 0."""
    a, b = pair(start_server, control)
    b.proc.send_signal(signal.SIGSTOP)
    result = {}
    try:
        with McRaw(a.host, a.port) as m:
            assert m.store("set", "rep:x", "1") == "STORED"
        th = threading.Thread(target=lambda: result.update(r=handoff(a, b, [[0, 16383]], 10000)))
        th.start()
        wait_until(lambda: metric(a, "fenced_slots") > 0, message="the handoff waiting")
        a.proc.send_signal(signal.SIGTERM)
        a.killed = True  # stopped here, on purpose
        assert a.proc.wait(10) == 0, a.stderr_text()[-2000:]
        th.join(10)
    finally:
        b.proc.send_signal(signal.SIGCONT)
    status, body = result["r"]
    assert status == 503 and "shutting down" in body, body
