"""Limits, malformed input and misbehaving clients: the server answers with memcached's errors or
closes the connection, never hangs or dies, and keeps serving everyone else."""

import random
import socket
import threading

import pytest

from mcraw import ConnectionClosed, McRaw, wait_until

ERROR_PREFIXES = ("ERROR", "CLIENT_ERROR", "SERVER_ERROR")


def assert_serving(server):
    c = server.raw()
    assert c.cmd("version").startswith("VERSION "), "a new client should still be served"
    c.close()


def replies_until_closed(raw, timeout=5.0):
    """Half-close our side, then read until the server closes; returns the reply lines. A server
    that neither answers nor closes within `timeout` fails the test (socket.timeout)."""
    try:
        raw.sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    data = raw.read_all_until_closed(timeout=timeout)
    return [l for l in data.decode("latin-1").split("\r\n") if l]


# --- keys -------------------------------------------------------------------------------------------

def test_key_of_250_bytes_is_accepted(raw):
    key = "k" * 250
    assert raw.store("set", key, "v") == "STORED"
    assert raw.get(key) == [(key, 0, b"v", None)]
    assert raw.meta(f"mg {key} v k").flags["k"] == key


@pytest.mark.memcached_only("shoal swallows a refused store's data block (docs/protocol.md)")
def test_key_of_251_bytes_refused_by_set_runs_the_data(raw):
    # memcached 1.6.18 does not swallow the data block of a storage command whose key is too
    # long: the data line "x" that follows is then read as a command and answered with ERROR.
    raw.send(f"set {'k' * 251} 0 0 1\r\n")
    assert raw.read_line() == "CLIENT_ERROR bad command line format"
    raw.send("x\r\n")
    assert raw.read_line() == "ERROR", "the unswallowed data line is parsed as a command"
    assert raw.cmd("mn") == "MN"


@pytest.mark.shoal_only
def test_key_of_251_bytes_refused_by_set_swallows_the_data(raw):
    # as current memcached: the length was readable, so the data block is dropped
    raw.send(f"set {'k' * 251} 0 0 1\r\nx\r\n")
    assert raw.read_line() == "CLIENT_ERROR bad command line format"
    assert raw.cmd("mn") == "MN"


def test_key_of_251_bytes_refused_by_get(raw):
    assert raw.cmd(f"get {'k' * 251}") == "CLIENT_ERROR bad command line format"


def test_multiget_with_one_long_key_fails_whole_command(raw):
    # A too-long key anywhere in a multi-get fails the command: no VALUE for the good keys.
    raw.store("set", "a", "1")
    assert raw.cmd(f"get a {'k' * 251} a") == "CLIENT_ERROR bad command line format"
    assert raw.cmd("mn") == "MN", "nothing else should follow the error"


def test_key_of_251_bytes_refused_by_meta(raw):
    assert raw.cmd(f"mg {'k' * 251} v") == "CLIENT_ERROR bad command line format"
    assert raw.cmd(f"md {'k' * 251}") == "CLIENT_ERROR bad command line format"


# --- item size --------------------------------------------------------------------------------------

ITEM_MAX = 512 * 1024  # -I 512k: memcached needs -I to be a multiple of its 512 KiB slab chunk max


def test_value_within_item_limit_stored(start_server):
    raw = start_server("-I", "512k").raw()
    value = b"x" * 400_000
    assert raw.store("set", "big", value) == "STORED"
    assert raw.get("big")[0][2] == value


def test_value_over_item_limit_refused_and_swallowed(start_server):
    raw = start_server("-I", "512k").raw()
    raw.send(b"set big 0 0 %d\r\n" % (ITEM_MAX + 1) + b"x" * (ITEM_MAX + 1) + b"\r\n")
    assert raw.read_line() == "SERVER_ERROR object too large for cache"
    assert raw.cmd("mn") == "MN", "the oversized data block must be swallowed, not parsed"
    assert raw.get("big") == []


def test_oversized_set_removes_the_old_value(start_server):
    # memcached unlinks the existing item when a *set* is refused as too large, so a reader never
    # sees the value the writer meant to replace. add/append keep the old value.
    raw = start_server("-I", "512k").raw()
    raw.store("set", "big", "old")
    raw.send(b"set big 0 0 600000\r\n" + b"x" * 600_000 + b"\r\n")
    assert raw.read_line() == "SERVER_ERROR object too large for cache"
    assert raw.get("big") == [], "a refused oversized set must remove the old value"
    raw.store("set", "big", "old")
    raw.send(b"append big 0 0 600000\r\n" + b"x" * 600_000 + b"\r\n")
    assert raw.read_line() == "SERVER_ERROR object too large for cache"
    assert raw.get("big")[0][2] == b"old", "a refused oversized append keeps the old value"


def test_oversized_meta_set_refused(start_server):
    raw = start_server("-I", "512k").raw()
    raw.meta("ms big 3", b"old")
    reply = raw.meta("ms big 600000", b"x" * 600_000)
    assert reply.line == "SERVER_ERROR object too large for cache"
    assert raw.meta("mn").code == "MN"
    assert raw.meta("mg big v").code == "EN", "ms (set mode) too large removes the old value too"


def test_oversized_set_noreply_is_silent(start_server):
    # Surprising: with noreply even the SERVER_ERROR is suppressed.
    raw = start_server("-I", "512k").raw()
    raw.send(b"set big 0 0 600000 noreply\r\n" + b"x" * 600_000 + b"\r\nmn\r\n")
    assert raw.read_line() == "MN"


def test_default_item_limit_is_one_megabyte(raw):
    raw.send(b"set big 0 0 %d\r\n" % (1024 * 1024 + 1) + b"x" * (1024 * 1024 + 1) + b"\r\n")
    assert raw.read_line() == "SERVER_ERROR object too large for cache"
    assert raw.cmd("mn") == "MN"


# --- malformed commands -----------------------------------------------------------------------------

def test_bad_data_chunk(raw):
    # The server reads exactly <bytes>+2 bytes; when they do not end in \r\n the store is refused.
    # What follows those bytes ("fgh\r\n" here) is read as the next command, hence ERROR.
    raw.send("set bd 0 0 3\r\nabcdefgh\r\n")
    assert raw.read_line() == "CLIENT_ERROR bad data chunk"
    assert raw.read_line() == "ERROR"
    assert raw.get("bd") == [], "the malformed value must not be stored"


def test_bad_data_chunk_meta_set(raw):
    raw.send("ms bd 2\r\nzzz\r\n")
    assert raw.read_line() == "CLIENT_ERROR bad data chunk"
    assert raw.read_line() == "ERROR"
    assert raw.meta("mn").code == "MN"


def test_unknown_command(raw):
    assert raw.cmd("bogus") == "ERROR"
    assert raw.cmd("bogus with args") == "ERROR"


def test_commands_are_case_sensitive(raw):
    assert raw.cmd("GET a") == "ERROR"


def test_empty_line(raw):
    assert raw.cmd("") == "ERROR"


def test_bare_newline_terminator_accepted(raw):
    raw.send("get nothing\n")
    assert raw.read_line() == "END", "a request line ending in \\n alone is accepted"


@pytest.mark.parametrize("line", [
    "set k 0 0 -1",        # negative length
    "set k 0 0 abc",       # bad length
])
def test_malformed_storage_line(raw, line):
    assert raw.cmd(line) == "CLIENT_ERROR bad command line format"
    raw.send("mn\r\n")
    # With no length memcached has set up nothing to swallow; our "mn" is the next command.
    assert raw.read_line() == "MN"


@pytest.mark.shoal_only
@pytest.mark.parametrize("line", [
    "set k 0 abc 1",       # bad exptime
    "set k -1 0 1",        # negative flags
])
def test_malformed_storage_line_with_a_length_swallows_the_data(raw, line):
    raw.send(line + "\r\nx\r\n")
    assert raw.read_line() == "CLIENT_ERROR bad command line format"
    assert raw.cmd("mn") == "MN", "the data block was dropped, not run"


def test_storage_line_with_too_few_arguments(raw):
    assert raw.cmd("set k 0 0") == "ERROR"


def test_storage_line_with_too_many_arguments(raw):
    assert raw.cmd("set k 0 0 1 noreply extra") == "ERROR"


def test_client_flags_are_taken_modulo_2_pow_32(raw):
    # Surprising: memcached 1.6.18 accepts a flags field above 2^32-1 and keeps its low 32 bits.
    assert raw.store("set", "f", "x", flags=2**32 - 1) == "STORED"
    assert raw.get("f")[0][1] == 2**32 - 1
    assert raw.store("set", "f", "x", flags=2**32 + 1) == "STORED"
    assert raw.get("f")[0][1] == 1, "flags 4294967297 are stored as 1"


# --- long lines -------------------------------------------------------------------------------------

def test_very_long_line_without_newline(server):
    # memcached closes a connection whose pending line grows past its limit with no newline
    # (and it does not start with "get "/"gets "). Accept an error reply or a close, never a hang.
    raw = server.raw()
    try:
        raw.send(b"x" * 1_000_000)
    except (BrokenPipeError, ConnectionResetError):
        pass
    lines = replies_until_closed(raw)
    assert all(l.startswith(ERROR_PREFIXES) for l in lines), f"only errors are acceptable: {lines[:3]}"
    assert_serving(server)


def test_very_long_line_with_newline(server):
    raw = server.raw()
    try:
        raw.send(b"x" * 100_000 + b"\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    lines = replies_until_closed(raw)
    assert all(l.startswith(ERROR_PREFIXES) for l in lines), f"only errors are acceptable: {lines[:3]}"
    assert_serving(server)


def test_long_multiget_line_is_served(raw):
    # A multi-get may be longer than any fixed line buffer: 2000 keys, ~12 kB.
    raw.store("set", "k1999", "last")
    keys = [f"k{i}" for i in range(2000)]
    got = raw.get(*keys)
    assert [(k, v) for k, _, v, _ in got] == [("k1999", b"last")]


# --- misbehaving clients ----------------------------------------------------------------------------

def test_client_vanishing_mid_value(server):
    c = server.raw()
    c.send(b"set k 0 0 100\r\n" + b"0123456789")
    c.close()
    other = server.raw()
    assert other.cmd("version").startswith("VERSION ")
    assert other.get("k") == [], "a value whose client vanished mid-block must not be stored"
    assert other.store("set", "k2", "fine") == "STORED"


def test_client_vanishing_mid_line(server):
    c = server.raw()
    c.send(b"get some_ke")
    c.close()
    assert_serving(server)


def test_client_closing_with_unread_replies(server):
    c = server.raw()
    c.store("set", "big", b"x" * 500_000)
    c.send(b"get big\r\n" * 50)  # ~25 MB of replies, never read
    c.close()
    assert_serving(server)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_binary_garbage(server, seed):
    rnd = random.Random(seed)
    garbage = bytes(rnd.randrange(256) for _ in range(8192))
    # A first byte of 0x80 would make memcached switch to its binary protocol; this is about
    # garbage on the text protocol.
    garbage = b"\x00" + garbage.replace(b"\x80", b"\x7f")
    raw = server.raw()
    try:
        raw.send(garbage)
    except (BrokenPipeError, ConnectionResetError):
        pass
    lines = replies_until_closed(raw)
    assert all(l.startswith(ERROR_PREFIXES) for l in lines), \
        f"garbage may only be answered with errors, got {[l for l in lines if not l.startswith(ERROR_PREFIXES)][:3]}"
    assert_serving(server)


def test_garbage_lines_answered_with_error_and_connection_usable(raw):
    raw.send(b"\x00\x01\x02 garbage\x00\r\n\xff\xfe\r\n")
    assert raw.read_line() == "ERROR"
    assert raw.read_line() == "ERROR"
    assert raw.cmd("mn") == "MN"


# --- pipelining -------------------------------------------------------------------------------------

def test_pipelined_mixed_commands_in_one_write(raw):
    requests, expected = [], []
    for i in range(20):
        requests.append(f"set p{i} {i} 0 {len(str(i))}\r\n{i}\r\n")
        expected.append("STORED\r\n")
        requests.append(f"get p{i} nope\r\n")
        expected.append(f"VALUE p{i} {i} {len(str(i))}\r\n{i}\r\nEND\r\n")
        requests.append(f"incr p{i} 5\r\n")
        expected.append(f"{i + 5}\r\n")
        requests.append(f"mg p{i} v f\r\n")
        expected.append(f"VA {len(str(i + 5))} f{i}\r\n{i + 5}\r\n")
        requests.append(f"delete p{i}\r\n" if i % 2 else "mn\r\n")
        expected.append("DELETED\r\n" if i % 2 else "MN\r\n")
    assert len(requests) == 100
    raw.send("".join(requests))
    want = "".join(expected).encode()
    got = raw.read_exact(len(want))
    assert got == want, "pipelined replies must come back complete and in request order"
    assert raw.cmd("mn") == "MN", "nothing extra may follow"


def test_pipelined_large_batch_of_gets(raw):
    raw.store("set", "v", "value")
    raw.send("get v\r\n" * 2000 + "mn\r\n")
    want = b"VALUE v 0 5\r\nvalue\r\nEND\r\n" * 2000 + b"MN\r\n"
    assert raw.read_exact(len(want), timeout=10) == want


def test_client_that_writes_far_more_than_it_reads_gets_every_reply(raw):
    # 5000 gets of a 1 kB value (~5 MB of replies) sent while reading: the server may stop
    # reading while its replies back up, but must deliver every reply, in order.
    raw.store("set", "v", b"y" * 1000)
    n = 5000
    sender = threading.Thread(target=lambda: raw.sock.sendall(b"get v\r\n" * n), daemon=True)
    sender.start()
    one = b"VALUE v 0 1000\r\n" + b"y" * 1000 + b"\r\nEND\r\n"
    got = raw.read_exact(len(one) * n, timeout=20)
    sender.join(5)
    assert got == one * n


def test_request_split_across_writes(raw):
    for chunk in (b"se", b"t sp 0 0 5\r", b"\nhel", b"lo\r", b"\n"):
        raw.send(chunk)
    assert raw.read_line() == "STORED"
    assert raw.get("sp")[0][2] == b"hello"


# --- connection limit -------------------------------------------------------------------------------

def test_max_connections_refuses_excess_and_recovers(start_server):
    # memcached reserves some descriptors of -c for itself (with -c 32 it serves only ~16 clients,
    # and `-c 10 -t 2` does not even start). An excess client is accepted, sent
    # "ERROR Too many open connections" and closed. Assert only the shape: never more than -c
    # clients served, excess clients told so and closed, and service resumes once clients leave.
    server = start_server("-c", "32")
    clients, served, refused = [], 0, 0
    for _ in range(40):
        c = McRaw(server.host, server.port, timeout=3)
        clients.append(c)
        try:
            line = c.cmd("version")
        except (ConnectionClosed, ConnectionResetError):
            refused += 1
            continue
        if line.startswith("VERSION "):
            served += 1
        else:
            assert line == "ERROR Too many open connections", f"unexpected reply {line!r}"
            assert c.is_closed(timeout=3), "a refused client should be disconnected"
            refused += 1
    assert 1 <= served <= 32, f"served {served} clients with -c 32"
    assert refused >= 8, "40 clients with -c 32 must see some refused"
    for c in clients:
        c.close()

    def recovered():
        try:
            c = McRaw(server.host, server.port, timeout=3)
            ok = c.cmd("version").startswith("VERSION ")
            c.close()
            return ok
        except (ConnectionClosed, OSError):
            return False
    wait_until(recovered, timeout=5, message="the server to accept clients again")
