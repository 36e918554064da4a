"""Behaviour shoal-node must have that memcached 1.6.18 lacks: newer meta flags (E, md x), shoal's own
limits (--line-max, --out-max, exact -c) and the admin HTTP listener. Options and replies are the
ones docs/operations.md, docs/protocol.md and docs/admin-api.md describe. Skipped when
SHOAL_TEST_SERVER=memcached."""

import re
import socket
import threading

import pytest

from mcraw import ConnectionClosed, McRaw, accepts, free_port, http, wait_until

pytestmark = pytest.mark.shoal_only


# --- E: explicit new CAS ----------------------------------------------------------------------------

def test_ms_E_sets_cas(raw):
    r = raw.meta("ms k 1 E12345 c", b"x")
    assert r.line == "HD c12345", "ms E<token> stores the item with that CAS"
    assert raw.meta("mg k c").line == "HD c12345"
    assert raw.get("k", cmd="gets")[0][3] == 12345


def test_ms_E_takes_a_48_bit_cas_and_refuses_a_larger_one(raw):
    """Items keep 48-bit CAS values (2 header bytes fewer an item, docs/protocol.md): the largest
    round-trips, one more is a bad token and stores nothing."""
    top = (1 << 48) - 1
    assert raw.meta(f"ms k 1 E{top} c", b"x").line == f"HD c{top}"
    assert raw.get("k", cmd="gets")[0][3] == top
    assert raw.meta(f"ms j 1 E{top + 1}", b"x").line.startswith("CLIENT_ERROR bad token")
    assert raw.meta("mg j").line == "EN", "nothing stored under a refused token"
    assert raw.meta("mg k c").line == f"HD c{top}"


def test_ms_E_then_cas_compare_uses_it(raw):
    raw.meta("ms k 1 E777", b"x")
    assert raw.meta("ms k 1 C777", b"y").line == "HD"


def test_ms_E_not_applied_when_not_stored(raw):
    raw.meta("ms k 1 E100", b"x")
    assert raw.meta("ms k 1 ME E200", b"y").line == "NS"
    assert raw.meta("mg k c").cas == 100, "a refused add must not change the CAS"


def test_md_I_E_sets_cas(raw):
    raw.meta("ms k 1", b"x")
    assert raw.meta("md k I E555").line == "HD"
    r = raw.meta("mg k c v")
    assert r.cas == 555 and "X" in r.flags


def test_ma_E_sets_cas(raw):
    raw.meta("ms n 1", b"1")
    r = raw.meta("ma n E888 c v")
    assert (r.cas, r.value) == (888, b"2")
    assert raw.meta("mg n c").cas == 888


def test_mg_N_E_sets_placeholder_cas(raw):
    r = raw.meta("mg k v c N30 E999")
    assert "W" in r.flags and r.cas == 999, f"the vivified placeholder takes the E CAS: {r.line}"
    assert raw.meta("ms k 1 C999", b"x").line == "HD", "the lease fill compares against it"


def test_mg_E_on_hit_without_change_keeps_cas(raw):
    cas = raw.meta("ms k 1 c", b"x").cas
    assert raw.meta("mg k c E42").cas == cas, "a plain read modifies nothing, so E is not applied"


def test_E_bad_token(raw):
    raw.send("ms k 1 Eabc\r\nx\r\nmn\r\n")
    assert raw.read_line() == "CLIENT_ERROR bad token in command line format"
    assert raw.read_line() == "MN"


# --- md x: drop the value, keep the item ------------------------------------------------------------

def test_md_x_empties_value_but_keeps_item(raw):
    raw.meta("ms k 5 T100", b"hello")
    assert raw.meta("md k x").line == "HD"
    r = raw.meta("mg k v t")
    assert r.code == "VA" and r.size == 0 and r.value == b"", f"a hit with an empty value: {r.line}"
    assert 98 <= int(r.flags["t"]) <= 100, "the item keeps its TTL"


def test_md_x_on_missing_key(raw):
    assert raw.meta("md nope x").line == "NF"


def test_md_x_changes_cas(raw):
    cas = raw.meta("ms k 1 c", b"x").cas
    raw.meta("md k x")
    assert raw.meta("mg k c").cas != cas


def test_md_x_with_cas_compare(raw):
    cas = raw.meta("ms k 1 c", b"x").cas
    assert raw.meta(f"md k x C{cas + 1}").line == "EX"
    assert raw.meta("mg k v").value == b"x"


# --- -c: exact connection limit ---------------------------------------------------------------------

def test_conn_limit_exact(start_server):
    server = start_server("-c", "10")
    first = McRaw(server.host, server.port, timeout=3)
    # The harness's readiness probe may still hold a slot for a moment: wait for it to go.
    wait_until(lambda: first.stats()["curr_connections"] == "1", timeout=5,
               message="curr_connections to count only this one client")
    clients = [first] + [McRaw(server.host, server.port, timeout=3) for _ in range(9)]
    for i, c in enumerate(clients):
        assert c.cmd("version").startswith("VERSION "), f"client {i + 1} of 10 should be served"
    extra = McRaw(server.host, server.port, timeout=3)
    try:
        assert extra.read_line() == "ERROR Too many open connections"
    except (ConnectionClosed, ConnectionResetError):
        pytest.fail("the 11th client should be told ERROR Too many open connections before close")
    assert extra.is_closed(timeout=3)
    clients[0].close()

    def served():
        try:
            c = McRaw(server.host, server.port, timeout=3)
            ok = c.cmd("version").startswith("VERSION ")
            c.close()
            return ok
        except (ConnectionClosed, OSError):
            return False
    wait_until(served, timeout=5, message="a slot to free up after a client leaves")


# --- --line-max -------------------------------------------------------------------------------------

def test_complete_line_over_line_max_closes_connection(start_server):
    # test_backpressure.py covers a line that never ends; this is one that ends past the limit.
    server = start_server("--line-max", "1024")
    raw = server.raw()
    raw.send(b"delete " + b"k" * 2000 + b"\r\n")  # not a get line: those go in parts
    assert raw.read_line() == "CLIENT_ERROR line too long"
    assert raw.is_closed(timeout=3), "the connection closes after a too-long line"
    ok = server.raw()
    assert ok.cmd("get " + " ".join(f"k{i}" for i in range(100))) == "END", \
        "a line under the limit is served"


# --- --out-max --------------------------------------------------------------------------------------

def test_mg_reply_over_out_max_refused(start_server):
    server = start_server("--out-max", "65536")
    raw = server.raw()
    raw.meta("ms big 100000", b"x" * 100_000)
    assert raw.meta("mg big v").line == "SERVER_ERROR out of memory writing get response"


def test_slow_reader_is_throttled_not_dropped(start_server):
    # Over out_max/4 queued, the node stops reading; the client still gets every reply once it
    # reads (backpressure, not loss).
    server = start_server("--out-max", "65536")
    raw = server.raw()
    raw.store("set", "v", b"y" * 1000)
    n = 2000
    sender = threading.Thread(target=lambda: raw.sock.sendall(b"get v\r\n" * n), daemon=True)
    sender.start()
    one = b"VALUE v 0 1000\r\n" + b"y" * 1000 + b"\r\nEND\r\n"
    assert raw.read_exact(len(one) * n, timeout=10) == one * n
    sender.join(5)


# --- admin HTTP -------------------------------------------------------------------------------------

def http_get(port, path):
    return http(port, "GET", path)


@pytest.fixture
def admin_server(start_server):
    port = free_port()
    server = start_server("--admin-port", str(port))
    wait_until(lambda: accepts(port), timeout=5, message="the admin port to accept connections")
    server.admin_port = port
    return server




def test_admin_healthz(admin_server):
    status, body = http_get(admin_server.admin_port, "/healthz")
    assert status == 200 and body.strip() == "ok"


def test_admin_metrics_prometheus(admin_server):
    raw = admin_server.raw()
    raw.store("set", "a", "1")
    raw.get("a", "nope")
    status, body = http_get(admin_server.admin_port, "/metrics")
    assert status == 200
    values = dict(re.findall(r"^(shoal_node_\w+) (\S+)$", body, re.M))
    assert values.get("shoal_node_curr_items") == "1", "metrics must mirror stats: one item"
    assert values.get("shoal_node_get_hits_total") == "1"
    assert values.get("shoal_node_get_misses_total") == "1"
    assert "# TYPE shoal_node_get_hits_total counter" in body


def test_admin_metrics_count_leases(admin_server):
    raw = admin_server.raw()
    raw.meta("mg k v N30")
    raw.meta("mg k v N30")
    _, body = http_get(admin_server.admin_port, "/metrics")
    values = dict(re.findall(r"^(shoal_node_\w+) (\S+)$", body, re.M))
    assert (values.get("shoal_node_lease_wins_total"), values.get("shoal_node_lease_waits_total")) \
        == ("1", "1")


def test_admin_unknown_path_404(admin_server):
    status, body = http_get(admin_server.admin_port, "/nope")
    assert status == 404
    assert "/healthz" in body and "/metrics" in body, "the 404 names the paths that exist"


def test_admin_port_is_not_the_data_port(admin_server):
    raw = McRaw("127.0.0.1", admin_server.admin_port, timeout=3)
    raw.send("version\r\n\r\n")
    try:
        data = raw.read_all_until_closed(timeout=3)
    except socket.timeout:
        data = raw.buf
    assert not data.startswith(b"VERSION"), "the admin port must not speak memcache"
