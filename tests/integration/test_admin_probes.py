"""The admin port keeps answering health checks and metrics whatever other admin clients do:
hundreds of connections that send part of a request and stop (or trickle it), a flood past
--admin-conn-max, and a node whose data connections have taken descriptor numbers past 1024.
See "Admin HTTP" in docs/operations.md."""

import resource
import socket
import time

import pytest

from mcraw import McRaw, accepts, free_port, http, wait_until

pytestmark = [pytest.mark.shoal_only, pytest.mark.wallclock]

HELD = 200
PROBE_BOUND = 1.0  # seconds a probe may take; they take a few ms


def hold_partial_requests(port, n):
    """n admin connections that each sent a request line and one header, and no end."""
    # the harness waits for the data port; the admin listener may open a moment later
    wait_until(lambda: accepts(port), message=f"the admin port {port} to accept")
    held = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        held.append(s)
    return held


def trickle(held, i):
    """One more header line on each held connection: active, never complete."""
    for s in held:
        try:
            s.sendall(b"X-Slow-%d: 1\r\n" % i)
        except OSError:
            pass


def probe(port, path):
    """GET path: (status, seconds taken)."""
    start = time.monotonic()
    try:
        status, _ = http(port, "GET", path)
    except OSError as e:
        status = repr(e)
    return status, time.monotonic() - start


def assert_probes_answer(admin_port, held, hold_for):
    """Probe /healthz and /metrics for hold_for seconds (past the 2 s header timeout) while the
    held connections trickle header lines; every probe answers 200 within PROBE_BOUND."""
    deadline = time.monotonic() + hold_for
    rounds = 0
    while time.monotonic() < deadline:
        trickle(held, rounds)
        for path in ("/healthz", "/metrics"):
            status, took = probe(admin_port, path)
            assert status == 200 and took < PROBE_BOUND, (
                f"{path} with {len(held)} admin connections holding partial requests: status "
                f"{status} after {took:.2f} s (round {rounds})")
        rounds += 1
        time.sleep(0.25)  # the trickle's pace: a slow client, not a condition to await
    assert rounds >= 4


def close_all(socks):
    for s in socks:
        s.close()


def test_node_probes_answer_while_200_connections_hold_partial_headers(start_server):
    admin = free_port()
    start_server("--admin-port", str(admin))
    held = hold_partial_requests(admin, HELD)
    try:
        assert_probes_answer(admin, held, 3.0)
    finally:
        close_all(held)


def test_router_probes_answer_while_200_connections_hold_partial_headers(start_server,
                                                                         start_router):
    node = start_server()
    _, admin, _ = start_router([node])
    held = hold_partial_requests(admin, HELD)
    try:
        assert_probes_answer(admin, held, 3.0)
    finally:
        close_all(held)


def assert_closed_after_header_timeout(port):
    """A connection to `port` that sends part of a request and stops is closed, unanswered,
    about 1 s later (the caller's --admin-header-timeout 1)."""
    (s,) = hold_partial_requests(port, 1)
    try:
        start = time.monotonic()
        s.settimeout(5)
        try:
            data = s.recv(4096)
        except ConnectionResetError:
            data = b""
        took = time.monotonic() - start
        assert not data.startswith(b"HTTP/1.1 200"), "an incomplete request must not be answered"
        assert 0.5 <= took < 3.0, f"closed after {took:.2f} s; --admin-header-timeout is 1 s"
    finally:
        s.close()


def test_connection_silent_before_its_headers_end_is_closed_after_header_timeout(start_server):
    admin = free_port()
    start_server("--admin-port", str(admin), "--admin-header-timeout", "1")
    assert_closed_after_header_timeout(admin)


def test_probe_past_admin_conn_max_waits_at_most_the_header_timeout(start_server):
    # Past the limit new connections wait in the listen queue until a slot frees; silent ones
    # free theirs after --admin-header-timeout.
    admin = free_port()
    start_server("--admin-port", str(admin), "--admin-conn-max", "50",
                 "--admin-header-timeout", "1")
    held = hold_partial_requests(admin, 100)
    try:
        status, took = probe(admin, "/healthz")
        assert status == 200 and took < 3.0, (
            f"/healthz past --admin-conn-max 50: status {status} after {took:.2f} s")
    finally:
        close_all(held)


def test_node_probes_answer_with_over_1024_data_connections_open(start_server):
    # Each data connection is a descriptor: past 1024 of them, a select()-based admin listener
    # refused every admin connection (its descriptor is past FD_SETSIZE).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2600
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below {need}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    data = []
    try:
        admin = free_port()
        server = start_server("-c", "2000", "--admin-port", str(admin))
        wait_until(lambda: accepts(admin), message=f"the admin port {admin} to accept")
        data = [socket.create_connection((server.host, server.port)) for _ in range(1100)]
        with McRaw(server.host, server.port) as c:
            wait_until(lambda: int(c.stats()["curr_connections"]) > 1100,
                       message="the node to hold the 1100 data connections")
        for path in ("/healthz", "/metrics"):
            status, took = probe(admin, path)
            assert status == 200 and took < PROBE_BOUND, (
                f"{path} with 1100 data connections open: status {status} after {took:.2f} s")
    finally:
        close_all(data)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))



# shoal-control serves its admin API on a pool of threads (docs/operations.md, Leases): the
# limits keep their meaning there, over all threads together.

def test_control_probes_answer_while_200_connections_hold_partial_headers(start_control):
    ctl = start_control()
    held = hold_partial_requests(ctl.port, HELD)
    try:
        assert_probes_answer(ctl.port, held, 3.0)
    finally:
        close_all(held)


def test_control_connection_silent_before_its_headers_end_is_closed_after_header_timeout(
        start_control):
    ctl = start_control("--admin-header-timeout", "1")
    assert_closed_after_header_timeout(ctl.port)


def test_control_admin_conn_max_counts_over_all_its_threads(start_control):
    # 8 silent connections fill --admin-conn-max 8 across control's listener threads: a probe
    # waits in the listen queue until a header timeout frees a slot (per thread it would be 32)
    ctl = start_control("--admin-conn-max", "8", "--poll-max", "4", "--admin-header-timeout", "2")
    held = hold_partial_requests(ctl.port, 8)
    try:
        status, took = probe(ctl.port, "/healthz")
        assert status == 200, status
        assert 1.0 <= took < 5.0, f"/healthz past --admin-conn-max 8 answered after {took:.2f} s"
    finally:
        close_all(held)


def closed_by_peer(s):
    """Has the other end closed s (without blocking)?"""
    s.setblocking(False)
    try:
        return s.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_one_address_past_admin_conn_per_ip_leaves_the_others_room(start_control):
    # 40 half-sent requests from 127.0.0.2 against --admin-conn-max 32: without a per-address
    # bound they take every slot until their header timeout (10 s), and a node renewing its
    # lease on a new connection from elsewhere waits that long; with --admin-conn-per-ip 8
    # control closes all but 8 of them at once and answers the others as if idle
    ctl = start_control("--admin-conn-max", "32", "--poll-max", "8", "--admin-conn-per-ip", "8",
                        "--admin-header-timeout", "10")
    wait_until(lambda: accepts(ctl.port), message="control's port to accept")
    flood = []
    try:
        for _ in range(40):
            s = socket.socket()
            s.settimeout(5)
            s.bind(("127.0.0.2", 0))
            s.connect(("127.0.0.1", ctl.port))
            s.sendall(b"POST /v1/leases HTTP/1.1\r\nHost: x\r\nContent-Length: 99\r\n\r\n{")
            flood.append(s)
        wait_until(lambda: sum(map(closed_by_peer, flood)) >= 32, timeout=5,
                   message="control to close the flooding address's connections past 8")
        for path in ("/healthz", "/metrics", "/v1/topology"):
            status, took = probe(ctl.port, path)
            assert status == 200 and took < PROBE_BOUND, (
                f"{path} from 127.0.0.1 beside 8 half-sent requests from 127.0.0.2: status "
                f"{status} after {took:.2f} s")
        assert sum(map(closed_by_peer, flood)) == 32  # the 8 it kept are still open
    finally:
        close_all(flood)
