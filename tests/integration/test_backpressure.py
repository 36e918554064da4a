"""Limits of shoal-node's own: request line length, reply queue per connection, and clients that
send without reading. These flags are shoal's (memcached has no equivalent), so the tests are
shoal_only."""

import socket
import time

import pytest

pytestmark = pytest.mark.shoal_only


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def cpu_ticks(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def flood_unread(port, request, seconds):
    """Send `request` repeatedly for `seconds` without reading a byte of the replies."""
    s = socket.create_connection(("127.0.0.1", port))
    s.setblocking(False)
    sent, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            sent += s.send(request)
        except BlockingIOError:
            time.sleep(0.005)
    return s, sent


def test_request_line_over_line_max_is_refused_and_closed(start_server):
    srv = start_server("--line-max", "2048")
    r = srv.raw()
    # no newline: the line can only grow (a get line would be taken in parts instead, see
    # test_long_multiget.py)
    r.send(b"delete " + b"k" * 3000)
    assert r.read_line() == "CLIENT_ERROR line too long"
    assert r.is_closed(), "the connection should close after a line over --line-max"
    assert srv.raw().cmd("version").startswith("VERSION"), "other clients are still served"


def test_line_just_under_line_max_is_parsed(start_server):
    srv = start_server("--line-max", "2048")
    r = srv.raw()
    keys = " ".join(f"k{i:05d}" for i in range(250))  # 1,753 bytes with "get "
    r.send(f"get {keys}\r\n".encode())
    assert r.read_line() == "END"


def test_reply_larger_than_out_max_is_refused_but_connection_survives(start_server):
    srv = start_server("--out-max", "1m", "-I", "2m")
    r = srv.raw()
    assert r.store("set", "big", b"x" * 600_000) == "STORED"
    r.send(b"get big big\r\n")  # 1.2 MB of reply against a 1 MB queue
    assert r.read_line() == "SERVER_ERROR out of memory writing get response"
    r.send(b"get big\r\n")
    assert r.read_line() == "VALUE big 0 600000"
    assert r.read_value(600_000) == b"x" * 600_000
    assert r.read_line() == "END"


def test_client_that_never_reads_does_not_grow_server_memory(start_server):
    srv = start_server("--out-max", "4m")
    assert srv.raw().store("set", "big", b"x" * 500_000) == "STORED"
    before = rss_kb(srv.proc.pid)
    s, sent = flood_unread(srv.port, b"get big big big big\r\n" * 50, 1.5)
    grown = rss_kb(srv.proc.pid) - before
    # Replies asked for: sent/21 gets of 2 MB each; held back: at most out_max plus one reply.
    assert sent > 100_000, "the flood should have been accepted by the kernel buffers"
    assert grown < 16 * 1024, f"server RSS grew {grown} kB for a client that never reads"
    assert srv.raw().cmd("version").startswith("VERSION"), "other clients are still served"
    s.close()


def test_half_closed_unread_client_does_not_spin_the_server(start_server):
    srv = start_server("--out-max", "1m")
    assert srv.raw().store("set", "big", b"x" * 200_000) == "STORED"
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # replies cannot drain into it
    s.connect(("127.0.0.1", srv.port))
    # A few requests whose replies overflow the queue: the server pauses this connection.
    # Few bytes, so the server's receive window stays open and the FIN below reaches it.
    s.sendall(b"get big\r\n" * 8)
    s.shutdown(socket.SHUT_WR)
    pid = srv.proc.pid
    before = cpu_ticks(pid)
    time.sleep(1.0)  # measuring CPU use needs an interval; nothing else is awaited here
    used = cpu_ticks(pid) - before
    assert used < 20, f"server used {used} ticks in 1 s while its only client sat half-closed"
    s.close()
