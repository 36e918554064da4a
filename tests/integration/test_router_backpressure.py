"""shoal-router under a client that does not read its replies: input is paused once --out-max
bytes of replies wait (so the router's memory stays bounded), and once the client reads, every
reply arrives whole and in order. Run with the io_uring batching on and off, since the two send
replies by different paths (one system call for all clients, or one each, with partial sends
finished on EPOLLOUT). Skipped when SHOAL_TEST_SERVER=memcached."""

import os
import socket
import threading

import pytest

from mcraw import McRaw, wait_until, rss_bytes, sanitized

pytestmark = pytest.mark.shoal_only

VALUE = bytes((i * 7 + 13) % 251 for i in range(400_000))
DROPPED = b"SERVER_ERROR shoal-router: reply dropped"
ROUNDS = 100  # 40 MB each way: far beyond --out-max and every socket buffer
# ASAN keeps freed blocks resident in its quarantine, 256 MB by default: under load the router's
# 400 kB buffers filled 75 MB of it here, a figure that says nothing about the router. So the
# router runs with a quarantine of QUARANTINE_MB, and a sanitizer build's bound is the plain
# one plus that and its shadow (1/8). Measured: 3-4 MB grown with no quarantine, 14-16 MB with
# 16 MB, 34-75 MB with the default.
QUARANTINE_MB = 16


def small_quarantine(monkeypatch):
    """Have the processes started from now on (the router) run with ASAN's quarantine at
    QUARANTINE_MB (ignored by a build without ASAN)."""
    opts = os.environ.get("ASAN_OPTIONS", "")
    monkeypatch.setenv("ASAN_OPTIONS", f"{opts}:quarantine_size_mb={QUARANTINE_MB}".lstrip(":"))


def memory_bound(pid, plain_mb):
    """The growth allowed to router `pid`: plain_mb, plus the quarantine and its shadow when
    it runs with ASAN."""
    return (plain_mb << 20) + ((QUARANTINE_MB << 20) * 9 // 8 if sanitized(pid) else 0)


@pytest.mark.parametrize("ring", ["1", "0"])
def test_unread_replies_pause_input_and_arrive_in_order(start_server, start_router, ring,
                                                         monkeypatch):
    node = start_server()
    small_quarantine(monkeypatch)
    router, _, _ = start_router([node], "--io-uring", ring, "--out-max", "8m")
    with McRaw(router.host, router.port) as r:
        assert r.store("set", "big", VALUE) == "STORED"
        assert r.store("set", "small", b"ok") == "STORED"
    before = rss_bytes(router.proc.pid)

    s = socket.create_connection((router.host, router.port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    one = b"set other 0 0 %d\r\n" % len(VALUE) + VALUE + b"\r\nget big\r\nget small\r\n"
    requests = one * ROUNDS
    sent = threading.Event()

    def writer():
        s.sendall(requests)
        sent.set()

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    # The router must stop reading: our requests stay unsent while nothing is read. (A
    # condition that must stay false: the wait is its bound, not a sleep.)
    assert not sent.wait(1.0), "the router read every request although no reply was read"
    grown = rss_bytes(router.proc.pid) - before
    # 4-15 MB here (a set's data block, replies queued, buffers kept for reuse): the bound is
    # 4 x --out-max
    bound = memory_bound(router.proc.pid, 32)
    assert grown < bound, f"router memory grew by {grown} bytes for an unread client"

    # Every reply arrives in order: each one as asked, or, when the requests the router had
    # already read before pausing answer past --out-max, the error that says so (timing).
    parts = [b"STORED\r\n", b"VALUE big 0 %d\r\n" % len(VALUE) + VALUE + b"\r\nEND\r\n",
             b"VALUE small 0 2\r\nok\r\nEND\r\n"]
    s.settimeout(20)
    got, values = b"", 0
    for i in range(ROUNDS * len(parts)):
        want = parts[i % len(parts)]
        while not (got.startswith(want) or (got.startswith(DROPPED) and b"\r\n" in got)):
            assert want.startswith(got[:len(want)]) or DROPPED.startswith(got[:len(DROPPED)]) \
                or got.startswith(DROPPED), f"reply {i} is neither its value nor {DROPPED!r}"
            chunk = s.recv(1 << 20)
            assert chunk, f"connection closed after {i} replies"
            got += chunk
        if got.startswith(want):
            got, values = got[len(want):], values + 1
        else:
            got = got.split(b"\r\n", 1)[1]
    assert got == b""
    assert values > len(parts), "at least the first round answered in full"
    wait_until(sent.is_set, message="the rest of the requests accepted")
    s.close()


def test_replies_to_requests_in_flight_stay_within_out_max(start_server, start_router,
                                                           monkeypatch):
    """Input pauses at a quarter of --out-max, but requests already read still answer: past
    --out-max their replies are replaced by an error, so the router's memory stays bounded
    however many large values a non-reading client has asked for."""
    node = start_server()
    small_quarantine(monkeypatch)
    # (a long timeout: a sanitizer build of the node takes seconds for the 120 MB)
    router, _, _ = start_router([node], "--out-max", "4m", "--timeout-ms", "60000")
    with McRaw(router.host, router.port) as r:
        assert r.store("set", "big", VALUE) == "STORED"
    before = rss_bytes(router.proc.pid)
    gets = 300  # 120 MB of values asked for at once
    s = socket.create_connection((router.host, router.port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.sendall(b"get big\r\n" * gets)

    def dropped():
        with McRaw(router.host, router.port) as st:
            return int(st.stats()["replies_dropped"])

    wait_until(lambda: dropped() >= gets - 40, timeout=60, message="the replies past --out-max dropped")
    grown = rss_bytes(router.proc.pid) - before
    bound = memory_bound(router.proc.pid, 40)
    assert grown < bound, f"router memory grew by {grown} bytes for {gets} unread 400 kB replies"

    value = b"VALUE big 0 %d\r\n" % len(VALUE) + VALUE + b"\r\nEND\r\n"
    error = DROPPED
    s.settimeout(60)
    got, values, errors = b"", 0, 0
    while values + errors < gets:
        if got.startswith(value):
            got, values = got[len(value):], values + 1
        elif got.startswith(error) and b"\r\n" in got:
            got, errors = got.split(b"\r\n", 1)[1], errors + 1
        else:
            chunk = s.recv(1 << 20)
            assert chunk, f"closed after {values} values and {errors} errors"
            got += chunk
            assert value.startswith(got[:len(value)]) or error.startswith(got[:len(error)]) or \
                got.startswith(error), f"unexpected reply bytes {got[:60]!r}"
    assert got == b""
    assert values >= 1 and errors >= gets - 40, (values, errors)
    s.sendall(b"get big\r\n")  # the connection is still in good order
    reply = b""
    while len(reply) < len(value):
        reply += s.recv(1 << 20)
    assert reply == value
    s.close()
