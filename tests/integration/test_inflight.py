"""Values still arriving take no item memory (issue 11, point 5).

shoal-node used to allocate a storage command's item as soon as its line was parsed: 64 clients
that each declared a 1 MB value, sent 1,000 bytes of it and held evicted every item of a 64 MB
cache and made every other set fail until they closed. A value that has not all arrived is now
staged in its connection and becomes an item only once complete; staging for all connections
together is capped by --inflight-max, beyond which a store is refused with memcached's
`SERVER_ERROR out of memory storing object` and its data block swallowed.

Tests that need nothing but the protocol run against memcached too (SHOAL_TEST_SERVER=memcached);
the ones reading shoal's staging gauge, counter or option are shoal_only. The half-sent scenario
is also run against Debian's memcached whatever the server under test, as the reference, and
through shoal-router, which holds a value until it is whole and so never passes the flood on.
The refusals send half a block and wait for the reply, so that block is surely still on its way
(a block that has all reached the socket goes straight into an item, as before)."""

import os
import random
import re
import time

import pytest

from conftest import launch_memcached
from mcraw import accepts, free_port, http, wait_until

OOM = "SERVER_ERROR out of memory storing object"
MB = 1_000_000
HOLDERS = 64
SEEDED = 2000


def nread_conns(raw):
    """How many connections `stats conns` lists as receiving a data block (conn_nread)."""
    return sum(1 for k, v in raw.stats("conns").items() if k.endswith(":state") and v == "conn_nread")


def staged(raw):
    return int(raw.stats()["inflight_bytes"])


def hold_half_sent(server, n, line="set big{i} 0 0 1000000", sent=1000):
    """Open `n` connections that each send a storage line and `sent` bytes of its value, then
    hold; returns them once the server lists every one as receiving its data block."""
    holders = []
    for i in range(n):
        h = server.raw()
        h.send(line.format(i=i).encode() + b"\r\n" + b"h" * sent)
        holders.append(h)
    probe = server.raw()
    wait_until(lambda: nread_conns(probe) >= n, timeout=10,
               message=f"{n} connections receiving a data block")
    probe.close()
    return holders


def seed(raw, n=SEEDED, size=1000):
    """Store n items of `size` bytes, pipelined; returns their value."""
    value = b"s" * size
    raw.send(b"".join(b"set seed%d 0 0 %d noreply\r\n%s\r\n" % (i, size, value) for i in range(n)))
    assert raw.cmd("mn") == "MN"
    return value


def held_items(raw, n=SEEDED):
    raw.send("".join(f"mg seed{i} k\r\n" for i in range(n)) + "mn\r\n")
    hits = 0
    while (line := raw.read_line()) != "MN":
        hits += line.startswith("HD")
    return hits


def check_half_sent_scenario(server, line="set big{i} 0 0 1000000"):
    """The issue's scenario: 2,000 items, then 64 half-sent 1 MB values held open. Every item
    stays readable, other sets succeed, nothing is evicted."""
    raw = server.raw()
    seed(raw)
    holders = hold_half_sent(server, HOLDERS, line)
    assert held_items(raw) == SEEDED, "items stored before the half-sent values must all be kept"
    for i in range(100):
        assert raw.store("set", f"new{i}", b"n" * 500) == "STORED", "other sets must succeed"
    assert raw.stats()["evictions"] == "0"
    for h in holders:
        h.close()


def test_half_sent_values_leave_stored_items_and_sets_alone(server):
    check_half_sent_scenario(server)


def test_half_sent_meta_values_leave_stored_items_and_sets_alone(server):
    check_half_sent_scenario(server, "ms big{i} 1000000 T0")


def test_memcached_keeps_items_under_half_sent_values(tmp_path):
    """The reference the issue quotes: memcached 1.6 keeps all 2,000 items and accepts sets."""
    mc = launch_memcached(tmp_path)
    try:
        check_half_sent_scenario(mc)
    finally:
        mc.stop()


@pytest.mark.shoal_only
def test_half_sent_values_stage_only_what_arrived(server):
    """64 clients that sent 1,000 bytes of a 1 MB value hold 16 KiB each (one chunk), not 1 MB."""
    raw = server.raw()
    holders = hold_half_sent(server, HOLDERS)
    wait_until(lambda: staged(raw) >= HOLDERS * 1000, message="every holder's bytes staged")
    assert staged(raw) == HOLDERS * 16384
    for h in holders:
        h.close()


def test_finishing_a_held_value_stores_it(server):
    raw = server.raw()
    value = random.Random(1).randbytes(MB)
    h = server.raw()
    h.send(f"set k 5 0 {MB}\r\n".encode() + value[:1000])
    wait_until(lambda: nread_conns(raw) >= 1, message="the value being received")
    h.send(value[1000:] + b"\r\n")
    assert h.read_line(timeout=10) == "STORED"
    assert raw.get("k") == [("k", 5, value, None)]


def test_slow_sender_of_a_large_value_within_the_cap_is_stored(start_server):
    """Pieces of odd sizes, each sent on its own, cross the staging chunks' boundaries both
    through the input buffer and by reads straight into a chunk; every byte must land."""
    server = start_server() if os.environ.get("SHOAL_TEST_SERVER") == "memcached" else \
        start_server("--inflight-max", "2m")
    raw = server.raw()
    value = random.Random(2).randbytes(MB)
    h = server.raw()
    h.send(f"set slow 0 0 {MB}\r\n".encode())
    rng = random.Random(3)
    pos = 0
    while pos < MB:
        n = rng.choice((1, 100, 4093, 16384, 30011, 70001))
        h.send(value[pos:pos + n])
        pos += n
        if rng.random() < 0.2:  # a slow sender: the server often finds one piece alone
            time.sleep(0.002)
    h.send(b"\r\n")
    assert h.read_line(timeout=10) == "STORED"
    assert raw.get("slow") == [("slow", 0, value, None)]


def test_bad_terminator_after_a_staged_value_is_refused(server):
    raw = server.raw()
    h = server.raw()
    h.send(f"set k 0 0 {MB}\r\n".encode() + b"v" * 1000)
    wait_until(lambda: nread_conns(raw) >= 1, message="the value being received")
    h.send(b"v" * (MB - 1000) + b"XY")
    assert h.read_line(timeout=10) == "CLIENT_ERROR bad data chunk"
    assert raw.get("k") == []


# -- the cap: --inflight-max ------------------------------------------------------------------

def fill_cap(server):
    """Hold a value that stages 507,904 bytes (chunks of 16..256 KiB) and wait for it. At
    --inflight-max 1m this leaves room for less than another 512 KiB. (The refusal tests run
    with --inflight-stall-ms 0: the held value, stalled, would otherwise give its room.)"""
    h = server.raw()
    h.send(f"set held 0 0 {MB}\r\n".encode() + b"h" * 500_000)
    raw = server.raw()
    wait_until(lambda: staged(raw) >= 500_000, message="the held value staged")
    return h


def send_over_cap(c, line, block):
    """Send `line` and the first 600,000 bytes of `block` (a data block still on its way, so it
    is staged) and return the reply that comes before the rest is sent; then send the rest."""
    c.send(line.encode() + b"\r\n" + block[:600_000])
    reply = c.read_line(timeout=10)
    c.send(block[600_000:])
    return reply


@pytest.mark.shoal_only
@pytest.mark.parametrize("io_uring", ["1", "0"])
def test_value_over_the_cap_is_refused_and_swallowed(start_server, io_uring):
    server = start_server("--inflight-max", "1m", "--inflight-stall-ms", "0", "--io-uring", io_uring)
    held = fill_cap(server)
    c = server.raw()
    # a block of commands, then a store: the block must not be read as commands
    block = b"set x 0 0 1\r\nX\r\n" * (MB // 16) + b"\r\nset after 0 0 2\r\nok\r\n"
    assert send_over_cap(c, f"set over 0 0 {MB}", block) == OOM
    assert c.read_line(timeout=10) == "STORED", "the connection must stay in step"
    raw = server.raw()
    assert raw.get("over", "x") == []
    assert raw.get("after") == [("after", 0, b"ok", None)]
    st = raw.stats()
    assert st["store_inflight_refused"] == "1" and st["evictions"] == "0"
    held.close()


@pytest.mark.shoal_only
def test_refused_staged_set_removes_the_old_value(start_server):
    """As when memcached has no memory for a set: a stale value must not survive it."""
    server = start_server("--inflight-max", "1m", "--inflight-stall-ms", "0")
    raw = server.raw()
    assert raw.store("set", "k", "old") == "STORED"
    held = fill_cap(server)
    c = server.raw()
    assert send_over_cap(c, f"set k 0 0 {MB}", b"n" * MB + b"\r\n") == OOM
    assert raw.get("k") == []
    held.close()


@pytest.mark.shoal_only
def test_refused_staged_ms_answers_the_error(start_server):
    server = start_server("--inflight-max", "1m", "--inflight-stall-ms", "0")
    held = fill_cap(server)
    c = server.raw()
    assert send_over_cap(c, f"ms m {MB} T0", b"m" * MB + b"\r\nmn\r\n") == OOM
    assert c.read_line(timeout=10) == "MN"
    held.close()


@pytest.mark.shoal_only
def test_held_value_is_stored_once_finished_after_a_refusal(start_server):
    server = start_server("--inflight-max", "1m", "--inflight-stall-ms", "0")
    held = fill_cap(server)
    c = server.raw()
    assert send_over_cap(c, f"set over 0 0 {MB}", b"o" * MB + b"\r\n") == OOM
    held.send(b"h" * (MB - 500_000) + b"\r\n")
    assert held.read_line(timeout=10) == "STORED"
    raw = server.raw()
    assert raw.get("held") == [("held", 0, b"h" * MB, None)]
    assert staged(raw) == 0


@pytest.mark.shoal_only
def test_closing_mid_value_frees_its_staging(server):
    raw = server.raw()
    holders = hold_half_sent(server, 8, sent=100_000)
    wait_until(lambda: staged(raw) >= 8 * 100_000, message="every holder's bytes staged")
    for h in holders:
        h.close()
    wait_until(lambda: staged(raw) == 0, message="inflight_bytes back to 0 after the closes")


@pytest.mark.shoal_only
@pytest.mark.parametrize("memory, expected", [("8", 1 << 20), ("64", 8 << 20), ("1024", 128 << 20)])
def test_inflight_max_defaults_to_an_eighth_of_memory_at_least_the_item_limit(
        start_server, memory, expected):
    server = start_server("-m", memory)
    assert int(server.raw().stats("settings")["inflight_max"]) == expected


@pytest.mark.shoal_only
def test_staging_gauge_and_refusals_in_metrics(start_server):
    port = free_port()
    server = start_server("--inflight-max", "1m", "--inflight-stall-ms", "0", "--admin-port", str(port))
    wait_until(lambda: accepts(port), message="the admin port")
    held = fill_cap(server)
    c = server.raw()
    assert send_over_cap(c, f"set over 0 0 {MB}", b"o" * MB + b"\r\n") == OOM
    status, body = http(port, "GET", "/metrics")
    assert status == 200
    values = dict(re.findall(r"^(shoal_node_\w+) (\S+)$", body, re.M))
    assert values["shoal_node_inflight_bytes"] == "507904"
    assert values["shoal_node_store_inflight_refused_total"] == "1"
    assert "# TYPE shoal_node_inflight_bytes gauge" in body
    held.close()


# -- stalled values give their room: --inflight-stall-ms -----------------------------------------

STALL_MS = 50


def stalled(holder):
    """Let `holder`'s staged value go without a byte past --inflight-stall-ms (STALL_MS): what
    is awaited is time itself, nothing the server reports."""
    time.sleep(STALL_MS * 4 / 1000)
    return holder


@pytest.mark.shoal_only
@pytest.mark.parametrize("io_uring", ["1", "0"])
def test_a_stalled_value_gives_its_room_to_one_that_arrives(start_server, io_uring):
    """A value arriving in parts while a stalled one holds the cap is stored, not refused: the
    stalled client is closed for it (one worker, so both are on the same one: the worker that
    needs the room closes its own stalled stagers at once)."""
    server = start_server("--inflight-max", "1m", "--inflight-stall-ms", str(STALL_MS),
                          "-t", "1", "--io-uring", io_uring)
    held = stalled(fill_cap(server))
    c = server.raw()
    value = random.Random(4).randbytes(MB)
    c.send(f"set new 0 0 {MB}\r\n".encode() + value[:600_000])
    raw = server.raw()
    wait_until(lambda: staged(raw) > 507_904, message="the new value staged past the held one")
    c.send(value[600_000:] + b"\r\n")
    assert c.read_line(timeout=10) == "STORED"
    assert held.is_closed(timeout=5), "the stalled client must be closed for the room"
    assert raw.get("new") == [("new", 0, value, None)]
    st = raw.stats()
    assert st["conns_closed_inflight"] == "1" and st["store_inflight_refused"] == "0"
    assert staged(raw) == 0
    assert "its value has sent no byte for" in server.stderr_text()


@pytest.mark.shoal_only
def test_stalled_values_over_seven_eighths_of_the_cap_are_closed_on_every_worker(start_server):
    """Two stalled values that stage 1,015,808 bytes of a 1m cap (over 7/8 of it): whatever
    worker each is on, one is closed (the sweep brings staging back under 7/8), the other is
    left and can finish its value."""
    server = start_server("--inflight-max", "1m", "--inflight-stall-ms", str(STALL_MS))
    raw = server.raw()
    holders = []
    for i in range(2):
        h = server.raw()
        h.send(f"set held{i} 0 0 {MB}\r\n".encode() + b"h" * 500_000)
        holders.append(h)
    wait_until(lambda: raw.stats()["conns_closed_inflight"] == "1", timeout=10,
               message="one stalled value closed")
    assert staged(raw) == 507_904
    left = [h for h in holders if not h.is_closed(timeout=0.5)]
    assert len(left) == 1, "exactly one of the two must be closed"
    left[0].send(b"h" * (MB - 500_000) + b"\r\n")
    assert left[0].read_line(timeout=10) == "STORED"
    assert raw.stats()["conns_closed_inflight"] == "1"


@pytest.mark.shoal_only
def test_a_value_stalled_less_than_the_stall_time_keeps_its_room(start_server):
    """Only a value that sent nothing for --inflight-stall-ms gives its room: the held one here
    is never quiet that long, so the newcomer is refused as before."""
    server = start_server("--inflight-max", "1m", "--inflight-stall-ms", "60000", "-t", "1")
    held = fill_cap(server)
    c = server.raw()
    assert send_over_cap(c, f"set over 0 0 {MB}", b"o" * MB + b"\r\n") == OOM
    held.send(b"h" * (MB - 500_000) + b"\r\n")
    assert held.read_line(timeout=10) == "STORED"
    assert server.raw().stats()["conns_closed_inflight"] == "0"


@pytest.mark.shoal_only
@pytest.mark.parametrize("io_uring", ["1", "0"])
def test_a_staged_value_whose_rest_has_arrived_needs_no_room(start_server, io_uring):
    """A value staged in part finds no room for its next chunk, but the rest of it has all
    arrived: it goes into its item, not refused (no stalled value is closed for it here:
    --inflight-stall-ms 0). The cap is set so that it fits the first two chunks of a 60,000
    byte value (49,152 bytes) and a held 1 MB value staged whole (1,000,000), and not the
    10,848 bytes of the last chunk."""
    server = start_server("--inflight-max", "1050000", "--inflight-stall-ms", "0",
                          "--io-uring", io_uring)
    raw = server.raw()
    value = random.Random(6).randbytes(60_000)
    c = server.raw()
    c.send(b"set whole 3 0 60000\r\n" + value[:40_000])
    wait_until(lambda: staged(raw) == 49_152, message="the first two chunks staged")
    held = server.raw()
    held.send(f"set held 0 0 {MB}\r\n".encode() + b"h" * 600_000)
    wait_until(lambda: staged(raw) == 1_049_152, message="the held value staged whole")
    c.send(value[40_000:] + b"\r\n")  # one send: all of it is queued on the socket at once
    assert c.read_line(timeout=10) == "STORED"
    assert raw.get("whole") == [("whole", 3, value, None)]
    st = raw.stats()
    assert st["store_inflight_direct"] == "1" and st["store_inflight_refused"] == "0"
    assert staged(raw) == 1_000_000, "its staged chunks are freed once it moved"
    held.close()


def test_half_sent_values_through_the_router_leave_stored_items_alone(start_server, start_router):
    """shoal-router holds a value until it is whole (its own limits), so the flood does not
    reach the node; the cache behind it keeps its items and takes sets."""
    node = start_server()
    router, _, _ = start_router([node])
    r = router.raw()
    seed(r)
    before = int(r.stats()["router_bytes_read"])
    holders = []
    for i in range(HOLDERS):
        h = router.raw()
        h.send(f"set big{i} 0 0 {MB}\r\n".encode() + b"h" * 1000)
        holders.append(h)
    wait_until(lambda: int(r.stats()["router_bytes_read"]) >= before + HOLDERS * 1000,
               message="the router to read every holder's bytes")
    assert held_items(r) == SEEDED
    assert r.store("set", "new", b"n" * 500) == "STORED"
    assert node.raw().stats()["evictions"] == "0"
    for h in holders:
        h.close()
