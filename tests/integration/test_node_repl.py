"""shoal-node asynchronous replication (issue 15 point 1, FAILOVER.md C2): two nodes follow a
fake control plane whose document names a primary and a replica for every slot; keys of the
namespace with copies 2 reach the replica, those of copies 1 do not; a replica that restarts
resyncs in full while the primary keeps taking writes; a short disconnect resumes from the
acked offset; garbage on the replication path closes that connection only; a handoff drains
the lag and fences writes."""

import json
import os
import re
import signal
import socket
import threading
import time
from urllib.parse import unquote

import pytest

from conftest import key_slot, launch, start_following_node
from fakecontrol import FakeControl
from mcraw import McRaw, free_port, http, wait_until

FULL = [{"from": 0, "to": 16383}]


@pytest.fixture
def control():
    c = FakeControl(hold=2.0)
    yield c
    c.stop()


def start_node(start_server, ctl, *extra):
    return start_following_node(start_server, ctl.url, *extra)


def doc(version, primary, replica, nodes=None):
    rng = {"from": 0, "to": 16383, "node": primary.addr}
    if replica is not None:
        rng["replica"] = replica.addr
    return {"version": version,
            "pools": {"main": {"nodes": [n.addr for n in (nodes or [primary, replica]) if n],
                               "slots": [rng]}},
            "namespaces": {"rep": {"pool": "main", "copies": 2},
                           "one": {"pool": "main", "copies": 1}}}


def repl(node):
    status, body = http(node.admin_port, "GET", "/v1/replication")
    assert status == 200, body
    return json.loads(body)


def metric(node, name):
    status, body = http(node.admin_port, "GET", "/metrics")
    m = re.search(rf"^shoal_node_repl_{name}(?:_total)? (\S+)$", body, re.M)
    assert m, f"/metrics has shoal_node_repl_{name}"
    return float(m.group(1))


def replica_online(primary):
    r = repl(primary)["replicas"]
    return r and r[0]["state"] == "online"


def caught_up(primary):
    r = repl(primary)["replicas"]
    return r and r[0]["state"] == "online" and r[0]["lag_bytes"] == 0


def pair(start_server, control, version=1):
    a, b = start_node(start_server, control), start_node(start_server, control)
    control.publish(doc(version, a, b))
    wait_until(lambda: replica_online(a), timeout=10, message="the replica online")
    return a, b


def value_of(node, key):
    with McRaw(node.host, node.port) as c:
        got = c.get(key)
    return got[0][2] if got else None


def dump(node, prefix):
    """key -> (flags, value) of every key with `prefix` the node serves (found by metadump)."""
    with McRaw(node.host, node.port) as c:
        c.send("lru_crawler metadump all\r\n")
        body = c.read_until(b"END\r\n", timeout=20)
        keys = [k for k in (unquote(m.group(1).decode())
                            for m in re.finditer(rb"^key=(\S+) ", body, re.M))
                if k.startswith(prefix)]
        out = {}
        for i in range(0, len(keys), 100):
            for k, f, v, _ in c.get(*keys[i:i + 100]):
                out[k] = (f, v)
    return out


def test_stores_deletes_touches_stale_marks_and_flush_ns_reach_the_replica(start_server, control):
    a, b = pair(start_server, control)
    sizes = [100, 1000, 10_000, 100_000, 500_000]
    with McRaw(a.host, a.port) as c:
        for i, n in enumerate(sizes * 4):
            assert c.store("set", f"rep:s{i}", bytes([65 + i % 26]) * n, flags=i) == "STORED"
        assert c.store("add", "rep:add", "a") == "STORED"
        assert c.store("set", "rep:app", "x") == "STORED"
        assert c.store("append", "rep:app", "yz") == "STORED"
        assert c.store("prepend", "rep:app", "w") == "STORED"
        assert c.store("set", "rep:n", "10") == "STORED"
        assert c.cmd("incr rep:n 5") == "15"
        assert c.cmd("decr rep:n 3") == "12"
        assert c.meta("ms rep:meta 2 T100", b"mv").code == "HD"
        assert c.meta("ma rep:ctr N0 J7").code == "HD"
        assert c.store("set", "rep:gone", "x") == "STORED"
        assert c.cmd("delete rep:gone") == "DELETED"
        assert c.store("set", "rep:mdgone", "x") == "STORED"
        assert c.meta("md rep:mdgone").code == "HD"
        assert c.store("set", "rep:touched", "x") == "STORED"
        assert c.cmd("touch rep:touched 1000") == "TOUCHED"
        assert c.store("set", "rep:stale", "old") == "STORED"
        assert c.meta("md rep:stale I").code == "HD"
        assert c.store("set", "one:k", "single") == "STORED"
    wait_until(lambda: caught_up(a), timeout=10, message="lag back to 0")
    with McRaw(b.host, b.port) as c:
        for i, n in enumerate(sizes * 4):
            got = c.get(f"rep:s{i}")
            assert got and got[0][2] == bytes([65 + i % 26]) * n and got[0][1] == i, f"rep:s{i}"
        assert c.get("rep:add")[0][2] == b"a"
        assert c.get("rep:app")[0][2] == b"wxyz"
        assert c.get("rep:n")[0][2].strip() == b"12"
        assert c.get("rep:ctr") != []
        assert c.get("rep:gone") == [] and c.get("rep:mdgone") == []
        ttl = int(c.meta("mg rep:touched t").flags["t"])
        assert 900 < ttl <= 1000, f"touch's TTL replicated, got {ttl}"
        ttl = int(c.meta("mg rep:meta t").flags["t"])
        assert 0 < ttl <= 100
        assert "X" in c.meta("mg rep:stale v").flags, "md I's stale mark replicated"
        assert c.get("one:k") == [], "a copies-1 namespace is not replicated"
    with McRaw(a.host, a.port) as c:
        assert c.cmd("flush_ns rep") == "OK"
        assert c.store("set", "rep:after", "new") == "STORED"
    wait_until(lambda: caught_up(a), timeout=10, message="lag back to 0 after flush_ns")
    with McRaw(b.host, b.port) as c:
        assert c.get("rep:s0") == [], "flush_ns reached the replica"


def test_lag_figures_move_and_return_to_zero(start_server, control):
    a, b = pair(start_server, control)
    assert metric(a, "replicas_online") == 1
    assert metric(a, "lag_bytes") == 0
    before = metric(a, "offset")
    with McRaw(a.host, a.port) as c:
        for i in range(200):
            c.store("set", f"rep:lag{i}", b"v" * 5000, extra="noreply") if False else None
            c.send(f"set rep:lag{i} 0 0 5000 noreply\r\n".encode() + b"v" * 5000 + b"\r\n")
        c.cmd("mn")
    assert metric(a, "offset") >= before + 200 * 5000
    wait_until(lambda: metric(a, "lag_bytes") == 0, timeout=10, message="lag_bytes back to 0")
    st = McRaw(a.host, a.port).stats("repl")
    assert st["replica:0:lag_bytes"] == "0" and st["replica:0:state"] == "online"
    assert int(st["offset"]) >= before + 200 * 5000
    prim = repl(b)["primaries"][0]
    assert prim["node"] == a.addr and prim["state"] == "online"
    assert prim["applied"] == repl(a)["offset"], "the replica's applied offset is the primary's"
    assert prim["replid"] == repl(a)["replid"]


def test_replica_killed_and_restarted_full_resyncs_while_writes_go_on(start_server, control,
                                                                       tmp_path):
    a = start_node(start_server, control)
    admin = free_port()
    b = launch("--admin-port", str(admin), "--control", control.url,
               "--control-backoff-max-ms", "200", tmp_dir=tmp_path)  # ours to kill
    b.admin_port, b.addr = admin, f"127.0.0.1:{b.port}"
    try:
        control.publish(doc(1, a, b))
        wait_until(lambda: replica_online(a), timeout=10, message="the replica online")
        with McRaw(a.host, a.port) as c:
            for i in range(3000):
                c.send(f"set rep:base{i} 0 0 300 noreply\r\n".encode()
                       + os.urandom(150).hex().encode() + b"\r\n")
            c.cmd("mn")
        wait_until(lambda: caught_up(a), timeout=10, message="first sync")
        full0 = metric(a, "full_resyncs")
        b.proc.kill()
        b.proc.wait()
    finally:
        b.stop()
    stop = threading.Event()
    written = [0]

    def writer():
        with McRaw(a.host, a.port) as c:
            i = 0
            while not stop.is_set():
                c.send(f"set rep:live{i % 500} 0 0 8 noreply\r\n".encode() + b"%08d\r\n" % i)
                if i % 50 == 0:
                    c.cmd("mn")
                i += 1
            c.cmd("mn")
            written[0] = i
    t = threading.Thread(target=writer)
    t.start()
    try:
        # the restarted replica comes back under a new address (a free port), as a replaced node
        b2 = start_node(start_server, control)
        control.publish(doc(2, a, b2, nodes=[a, b, b2]))
        wait_until(lambda: replica_online(a) and repl(a)["replicas"][0]["node"] == b2.addr,
                   timeout=20, message="the new replica synced")
        time.sleep(0.3)  # writes keep coming after the sync too
    finally:
        stop.set()
        t.join()
    assert written[0] > 100
    assert metric(a, "full_resyncs") > full0
    wait_until(lambda: caught_up(a), timeout=10, message="lag 0 after the writer stopped")
    pa, pb = dump(a, "rep:"), dump(b2, "rep:")
    assert len(pa) >= 3500
    missing = [k for k in pa if pa[k] != pb.get(k)]
    assert not missing, f"{len(missing)} keys differ, e.g. {missing[:5]}"
    assert set(pb) == set(pa)


def test_short_disconnect_resumes_from_the_acked_offset(start_server, control):
    a, b = pair(start_server, control)
    with McRaw(a.host, a.port) as c:
        assert c.store("set", "rep:before", "1") == "STORED"
    wait_until(lambda: caught_up(a), message="synced")
    full0, part0 = metric(a, "full_resyncs"), metric(a, "partial_resyncs")
    # a second connection in the primary's name takes the replica's place of the live one (the
    # replica keeps one stream per primary), then goes: the real stream was cut
    with socket.create_connection((b.host, b.port)) as s:
        s.settimeout(5)
        s.sendall(f"shoal_repl 1 {a.addr} {repl(a)['replid']}\r\n".encode())
        assert s.recv(100).startswith(b"REPL HAVE " + repl(a)["replid"].encode())
        with McRaw(a.host, a.port) as c:
            for i in range(50):
                assert c.store("set", f"rep:during{i}", str(i)) == "STORED"
    wait_until(lambda: metric(a, "partial_resyncs") == part0 + 1, timeout=10,
               message="the primary reconnected")
    wait_until(lambda: caught_up(a), timeout=10, message="resumed")
    for i in range(50):
        assert value_of(b, f"rep:during{i}") == str(i).encode()
    assert metric(a, "full_resyncs") == full0, "no full resync after a short disconnect"


def test_garbage_on_the_replication_path_closes_that_connection_only(start_server, control):
    a, b = pair(start_server, control)
    refused0 = metric(b, "handshakes_refused")
    # a handshake from a node that is not the primary
    with socket.create_connection((b.host, b.port)) as s:
        s.sendall(b"shoal_repl 1 127.0.0.1:1 0123456789abcdef\r\n")
        s.settimeout(5)
        assert s.recv(100).startswith(b"REPL REFUSED")
        assert s.recv(100) == b""
    assert metric(b, "handshakes_refused") == refused0 + 1
    # a malformed hello, a half handshake, random bytes after a valid-looking start
    for junk in (b"shoal_repl x\r\n", b"shoal_repl 1 " + a.addr.encode(),
                 b"shoal_repl 1 " + a.addr.encode() + b" 0123456789abcdef\r\nREPL FULL 0\r\n"
                 + os.urandom(4000)):
        with socket.create_connection((b.host, b.port)) as s:
            s.settimeout(8)
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR) if junk.endswith(b"0123456789abcdef") else None
            data = b""
            try:
                while True:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
            except (socket.timeout, ConnectionResetError):
                pass
    assert b.alive() and a.alive()
    wait_until(lambda: caught_up(a), timeout=10, message="the real stream still online")
    with McRaw(a.host, a.port) as c:
        assert c.store("set", "rep:afterjunk", "ok") == "STORED"
    wait_until(lambda: value_of(b, "rep:afterjunk") == b"ok", timeout=10,
               message="the real stream goes on")
    with McRaw(b.host, b.port) as c:
        assert c.cmd("version").startswith("VERSION")


def test_handoff_returns_lag_zero_and_fences_writes(start_server, control):
    a, b = pair(start_server, control)
    with McRaw(a.host, a.port) as c:
        for i in range(100):
            c.send(f"set rep:h{i} 0 0 1000 noreply\r\n".encode() + b"h" * 1000 + b"\r\n")
        c.cmd("mn")
    status, body = http(a.admin_port, "POST", "/v1/replication/handoff",
                        {"to": b.addr, "slots": [[0, 16383]]})
    assert status == 200, body
    got = json.loads(body)
    assert got["lag_bytes"] == 0 and got["offset"] == repl(a)["offset"]
    assert value_of(b, "rep:h99") == b"h" * 1000
    with McRaw(a.host, a.port) as c:
        assert c.store("set", "rep:x", "1") == "SERVER_ERROR slot moving"
        assert c.meta("md rep:h1").code == "SERVER_ERROR"
        assert c.get("rep:h1") != [], "reads are not fenced"
    assert metric(a, "fence_refusals") >= 2
    # the swap arrives: the fence lifts, b is primary now
    control.publish(doc(2, b, a))
    wait_until(lambda: metric(a, "fenced_slots") == 0, message="fence lifted")
    with McRaw(b.host, b.port) as c:
        assert c.store("set", "rep:onb", "1") == "STORED"
    wait_until(lambda: value_of(a, "rep:onb") == b"1", timeout=10,
               message="the new primary streams to the old one")
    assert value_of(a, "rep:h5") == b"h" * 1000, "the switch dropped nothing"


def test_handoff_times_out_with_504_and_lifts_the_fence_when_the_replica_does_not_ack(
        start_server, control):
    a, b = pair(start_server, control)
    b.proc.send_signal(signal.SIGSTOP)
    try:
        with McRaw(a.host, a.port) as c:
            assert c.store("set", "rep:unacked", "1") == "STORED"
        wait_until(lambda: metric(a, "lag_bytes") > 0 and metric(a, "lag_ms") > 0,
                   message="lag figures move while the replica does not ack")
        assert repl(a)["replicas"][0]["lag_seconds"] > 0
        t0 = time.monotonic()
        status, body = http(a.admin_port, "POST", "/v1/replication/handoff",
                            {"to": b.addr, "slots": [[0, 16383]], "timeout_ms": 300})
        assert status == 504, body
        assert 0.25 < time.monotonic() - t0 < 3
        with McRaw(a.host, a.port) as c:
            assert c.store("set", "rep:after", "1") == "STORED", "the fence lifted"
        assert metric(a, "fenced_slots") == 0
    finally:
        b.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: caught_up(a), timeout=15, message="the replica catches up")
    assert value_of(b, "rep:after") == b"1"


def test_handoff_refuses_slots_this_node_is_not_primary_of(start_server, control):
    a, b = pair(start_server, control)
    status, body = http(b.admin_port, "POST", "/v1/replication/handoff",
                        {"to": a.addr, "slots": [[0, 10]]})
    assert status == 409, body
    status, body = http(a.admin_port, "POST", "/v1/replication/handoff", {"to": b.addr})
    assert status == 400, body
    with McRaw(b.host, b.port) as c:
        assert c.store("set", "rep:x", "1") == "STORED", "nothing fenced"


def test_two_primaries_replicate_their_halves_to_each_other(start_server, control):
    a, b = start_node(start_server, control), start_node(start_server, control)
    control.publish({"version": 1,
                     "pools": {"main": {"nodes": [a.addr, b.addr], "slots": [
                         {"from": 0, "to": 8191, "node": a.addr, "replica": b.addr},
                         {"from": 8192, "to": 16383, "node": b.addr, "replica": a.addr}]}},
                     "namespaces": {"rep": {"pool": "main", "copies": 2}}})
    wait_until(lambda: caught_up(a) and caught_up(b), timeout=10, message="both streams online")
    keys = [f"rep:m{i}" for i in range(200)]
    low = [k for k in keys if key_slot(k) < 8192]
    high = [k for k in keys if key_slot(k) >= 8192]
    with McRaw(a.host, a.port) as c:
        for k in low:
            assert c.store("set", k, "from-a") == "STORED"
        # a write to a slot this node is replica of (an old router's) is kept but not streamed
        assert c.store("set", high[0], "stray") == "STORED"
    with McRaw(b.host, b.port) as c:
        for k in high[1:]:
            assert c.store("set", k, "from-b") == "STORED"
    wait_until(lambda: caught_up(a) and caught_up(b), timeout=10, message="lag 0 both ways")
    assert all(value_of(b, k) == b"from-a" for k in low)
    assert all(value_of(a, k) == b"from-b" for k in high[1:])
    assert value_of(b, high[0]) is None, "a replica does not stream what it is replica of"
    prim = {p["node"]: p for p in repl(a)["primaries"]}
    assert prim[b.addr]["state"] == "online" and prim[b.addr]["applied"] == repl(b)["offset"]


def test_replica_further_behind_than_the_backlog_resyncs_in_full(start_server, control):
    a = start_node(start_server, control, "--repl-backlog", "256k")
    b = start_node(start_server, control)
    control.publish(doc(1, a, b))
    wait_until(lambda: replica_online(a), timeout=10, message="the replica online")
    full0 = metric(a, "full_resyncs")
    b.proc.send_signal(signal.SIGSTOP)
    try:
        with McRaw(a.host, a.port) as c:
            for i in range(2000):  # 20 MB: past the socket buffers and the 256 KiB backlog
                c.send(f"set rep:far{i} 0 0 10000 noreply\r\n".encode() + b"f" * 10000 + b"\r\n")
            assert c.cmd("mn") == "MN"
    finally:
        b.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: metric(a, "full_resyncs") > full0, timeout=15,
               message="a full resync of the replica that fell behind")
    wait_until(lambda: caught_up(a), timeout=20, message="caught up again")
    with McRaw(b.host, b.port) as c:
        for i in (0, 999, 1999):
            assert c.get(f"rep:far{i}")[0][2] == b"f" * 10000


def test_a_win_is_not_streamed_but_its_fill_is(start_server, control):
    a, b = pair(start_server, control)
    with McRaw(a.host, a.port) as c:
        got = c.meta("mg rep:lease c N30 v")
        assert "W" in got.flags
        assert c.store("set", "rep:marker1", "1") == "STORED"
    wait_until(lambda: value_of(b, "rep:marker1") == b"1", message="the stream passed the win")
    with McRaw(b.host, b.port) as c:
        assert c.get("rep:lease") == [], "the placeholder stays on the primary"
    with McRaw(a.host, a.port) as c:
        assert c.meta(f"ms rep:lease 4 C{got.flags['c']}", b"fill").code == "HD"
        assert c.meta("md rep:lease I").code == "HD"
    wait_until(lambda: caught_up(a), message="synced")
    with McRaw(b.host, b.port) as c:
        r = c.meta("mg rep:lease v c")
        assert r.value == b"fill" and "X" in r.flags and "W" in r.flags, \
            "stale on the replica, and its next reader wins there (no win mark streamed)"
