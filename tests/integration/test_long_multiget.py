"""Multi-gets of any size (issue 10): memcached has no line limit for get, gets, gat and gats, so
shoal-node and shoal-router answer such a line past --line-max in parts as it arrives (every
hit, in order, END when the newline comes) while their memory stays bounded; other lines keep
the limit. Each test runs against a node alone and against a router in front of three nodes (so
the keys split). Skipped when SHOAL_TEST_SERVER=memcached (they use shoal's counters and
--out-max)."""

import socket
import threading
import time

import pytest

from mcraw import McRaw, rss_bytes, sanitized

pytestmark = pytest.mark.shoal_only

NKEYS = 3000


def key(i):
    return f"longget:{i:06d}:abcdefghijklm"  # 28 bytes: 3,000 keys make an 87 KB line


def value(i):
    """Mixed sizes: mostly small, every 250th key 500 KB (3.5 MB across 3,000 keys, at most one
    in a router's part)."""
    size = 500_000 if i % 250 == 7 else (i % 13) * 37
    return (bytes((i + j) % 251 for j in range(251)) * (size // 251 + 1))[:size]


def is_hit(i):
    return i % 3 != 2  # a third are misses


@pytest.fixture(params=["node", "router"])
def target(request, start_server, start_router):
    """The server the client talks to: a shoal-node, or a shoal-router in front of three."""
    if request.param == "node":
        return start_server()
    nodes = [start_server() for _ in range(3)]
    router, _, _ = start_router(nodes)
    return router


def fill(srv, n=NKEYS, hit=is_hit, val=value, keyf=key, flags=lambda i: i):
    """Store the hits among keys 0..n-1, pipelined, and check every reply."""
    with McRaw(srv.host, srv.port, timeout=30) as r:
        batch, count = [], 0
        for i in range(n):
            if not hit(i):
                continue
            v = val(i)
            batch.append(f"set {keyf(i)} {flags(i)} 0 {len(v)}\r\n".encode() + v + b"\r\n")
            count += 1
            if len(batch) == 200:
                r.send(b"".join(batch))
                batch = []
        r.send(b"".join(batch))
        for _ in range(count):
            assert r.read_line() == "STORED"


def send_in_pieces(r, data, piece=1400):
    """Send `data` in many small writes (TCP_NODELAY is on: many segments)."""
    for off in range(0, len(data), piece):
        r.send(data[off:off + piece])


def read_values(r, timeout=30):
    """VALUE blocks up to the first other line: ([(key, flags, value, cas)], that line)."""
    items = []
    while True:
        line = r.read_line(timeout)
        if not line.startswith("VALUE "):
            return items, line
        parts = line.split(" ")
        items.append((parts[1], int(parts[2]), r.read_value(int(parts[3]), timeout),
                      int(parts[4]) if len(parts) > 4 else None))


def expected(keys_idx):
    return [(key(i), i, value(i)) for i in keys_idx if is_hit(i)]


@pytest.mark.parametrize("verb", ["get", "gets", "gat 3600", "gats 3600"])
def test_long_get_line_answers_every_hit_in_order(target, verb):
    """A 3,000-key line (87 KB, past the 64 KB --line-max), sent in 1,400-byte writes: every hit
    with its value, flags and (gets, gats) CAS, in key order, then END."""
    fill(target)
    line = f"{verb} " + " ".join(key(i) for i in range(NKEYS)) + "\r\n"
    assert len(line) > 65536
    with McRaw(target.host, target.port, timeout=30) as r:
        send_in_pieces(r, line.encode())
        items, end = read_values(r)
        assert end == "END"
        assert [(k, f, v) for k, f, v, _ in items] == expected(range(NKEYS))
        with_cas = verb.startswith(("gets", "gats"))
        assert all((cas is not None) == with_cas for *_, cas in items)
        if verb.startswith("gat"):  # the TTL was set on the hits, first and last
            for i in (0, NKEYS - 2):
                reply = r.cmd(f"mg {key(i)} t")
                assert reply.startswith("HD t") and 3590 <= int(reply[4:]) <= 3600, reply


def test_pipelined_commands_after_long_get_answered_in_order(target):
    """A long get, then more requests in the same write: their replies follow its END, in
    order."""
    fill(target)
    line = "get " + " ".join(key(i) for i in range(NKEYS)) + "\r\n"
    with McRaw(target.host, target.port, timeout=30) as r:
        r.send(line + "version\r\n" + f"get {key(0)}\r\n" + line + "set after 0 0 2\r\nok\r\n")
        items, end = read_values(r)
        assert end == "END" and len(items) == len(expected(range(NKEYS)))
        assert r.read_line().startswith("VERSION")
        assert r.read_get_reply() == [(key(0), 0, value(0), None)]
        items, end = read_values(r)
        assert end == "END" and [it[0] for it in items] == [k for k, *_ in expected(range(NKEYS))]
        assert r.read_line() == "STORED"


def test_pymemcache_get_many_of_5000_keys(target):
    fill(target, n=5000)
    c = target.client(timeout=30, connect_timeout=5)
    got = c.get_many([key(i) for i in range(5000)])
    assert got == {key(i): value(i) for i in range(5000) if is_hit(i)}


def test_pylibmc_get_multi_of_3000_keys(target):
    """pylibmc (libmemcached) sends its whole get_multi as one line: it read {} before."""
    pylibmc = pytest.importorskip("pylibmc")
    fill(target, flags=lambda i: 0)  # pylibmc reads flags as its own encoding
    c = pylibmc.Client([f"127.0.0.1:{target.port}"])
    got = c.get_multi([key(i) for i in range(NKEYS)])
    assert {k: bytes(v) for k, v in got.items()} == \
        {key(i): value(i) for i in range(NKEYS) if is_hit(i)}


def test_200000_key_line_in_small_pieces_keeps_memory_bounded(target):
    """A 9 MB line of 200,000 keys, written 4 KB at a time while another thread reads: every hit
    comes back, and the server's resident memory grows by far less than the line."""
    big = 200_000
    k = lambda i: f"huge:{i:07d}:{'q' * 28}"  # 41 bytes + space
    hit = lambda i: i % 1000 == 5
    fill(target, n=big, hit=hit, val=lambda i: b"v%d" % i, keyf=k)
    line = ("get " + " ".join(k(i) for i in range(big)) + "\r\n").encode()
    pid = target.proc.pid
    before = rss_bytes(pid)
    result = {}
    with McRaw(target.host, target.port, timeout=60) as r:
        reader = threading.Thread(target=lambda: result.update(zip(("items", "end"),
                                                                   read_values(r, 60))))
        reader.start()
        send_in_pieces(r, line, 4096)
        reader.join(60)
    assert result["end"] == "END"
    assert [(kk, v) for kk, _, v, _ in result["items"]] == \
        [(k(i), b"v%d" % i) for i in range(big) if hit(i)]
    grown = rss_bytes(pid) - before
    if not sanitized(pid):  # ASAN's quarantine keeps freed buffers resident
        assert grown < len(line) // 4, f"RSS grew {grown} bytes for a {len(line)}-byte line"


def test_non_get_line_over_limit_still_refused_and_closed(target):
    """Only the get family is exempt: any other line past --line-max is refused and closed."""
    with McRaw(target.host, target.port) as r:
        r.send(b"delete " + b"k" * 70_000)
        assert r.read_line() == "CLIENT_ERROR line too long"
        assert r.is_closed(), "the connection closes"
    with McRaw(target.host, target.port) as r:
        r.send(b"set " + b"k " * 40_000 + b"\r\n")
        assert r.read_line() == "CLIENT_ERROR line too long"
        assert r.is_closed()


def test_bad_key_in_long_get_ends_it_with_client_error(target):
    """A key over 250 bytes after 2,000 good ones (sent first, so some are answered): the reply
    ends with CLIENT_ERROR bad command line format in place of END, the rest of the line is
    dropped, and the connection goes on."""
    fill(target)
    head = "get " + " ".join(key(i) for i in range(NKEYS)) + " "
    tail = "x" * 300 + " " + " ".join(key(i) for i in range(100)) + "\r\n"
    with McRaw(target.host, target.port, timeout=30) as r:
        send_in_pieces(r, head.encode())
        r.send(tail + "version\r\n")
        items, end = read_values(r)
        assert end == "CLIENT_ERROR bad command line format"
        assert [it[0] for it in items] == [kk for kk, *_ in expected(range(NKEYS))][:len(items)]
        assert r.read_line().startswith("VERSION"), "the connection goes on"


def test_long_get_token_too_long_for_a_key_is_refused(target):
    """A long get line whose keys never end (no space, no newline): CLIENT_ERROR as soon as the
    token is longer than a key can be, and what follows up to the newline is dropped."""
    with McRaw(target.host, target.port, timeout=30) as r:
        r.send(b"get a " + b"k" * 70_000)
        assert r.read_line() == "CLIENT_ERROR bad command line format"
        r.send(b"k" * 10_000 + b" b c\r\nversion\r\n")
        assert r.read_line().startswith("VERSION")


def test_long_get_of_large_values_to_a_slow_reader(start_server, start_router):
    """Through a router, a long get whose reply (40 MB) is far over the node's and router's
    --out-max (4 MB): a client reading it slowly gets all of it, and neither process holds
    much more than --out-max."""
    nodes = [start_server("--out-max", "4m") for _ in range(3)]
    router, _, _ = start_router(nodes, "--out-max", "4m")
    n = 6000
    big = lambda i: i % 75 == 0  # 80 values of 500 KB
    val = lambda i: (b"%07d" % i) * (500_000 // 7 if big(i) else 3)
    fill(router, n=n, hit=lambda i: True, val=val)
    line = "get " + " ".join(key(i) for i in range(n)) + "\r\n"
    pids = [router.proc.pid] + [s.proc.pid for s in nodes]
    before = [rss_bytes(p) for p in pids]
    with McRaw(router.host, router.port, timeout=60) as r:
        r.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        r.send(line)
        got, peak = 0, [0] * len(pids)
        items = []
        while True:
            l = r.read_line(60)
            if not l.startswith("VALUE "):
                break
            parts = l.split(" ")
            items.append((parts[1], r.read_value(int(parts[3]), 60)))
            if len(items[-1][1]) > 100_000:
                peak = [max(a, rss_bytes(p) - b) for a, p, b in zip(peak, pids, before)]
                time.sleep(0.02)  # a slow reader: the point of the test
        assert l == "END"
    assert items == [(key(i), val(i)) for i in range(n)]
    if not any(sanitized(p) for p in pids):
        assert max(peak) < 16 * 1024 * 1024, f"RSS grew {peak} bytes for a 40 MB reply"
