"""Hostile and careless callers of shoal-control's failover surfaces (issue 15): POST /v1/leases,
POST /v1/reports, GET /v1/failures and a drain (docs/admin-api.md): bad JSON, unknown nodes,
enormous bodies, half-sent requests held open. Each gets a clear error; the control plane stays
up, bounded in memory, and answers well-formed calls meanwhile."""

import json
import socket
import time

import pytest

from controlharness import start_control  # noqa: F401  (a fixture)
from mcraw import rss_bytes, sanitized, wait_until
from test_control_failover import cluster, ranges  # noqa: F401  (a fixture)

NODES = ["127.0.0.1:1", "127.0.0.1:2"]


@pytest.fixture
def ctl(start_control):
    c = start_control()
    status, body = c.post("/v1/pools", {"name": "main", "nodes": NODES})
    assert status == 201, body
    status, body = c.post("/v1/namespaces", {"name": "rep", "pool": "main", "copies": 2,
                                             "memory": 3 << 20})
    assert status == 201, body
    return c


def test_reports_of_made_up_nodes_are_not_kept(ctl):
    """A report is at most 1 MiB, but each of up to 1,024 router ids kept its whole report: 30
    reports of 30,000 made-up names each held ~85 MB. Only what a report says of nodes a pool
    lists is kept now (nothing else was ever counted)."""
    names = {f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}:11211": "up" for i in range(30_000)}
    rss0 = rss_bytes(ctl.proc.pid)
    for r in range(15):
        status, body = ctl.request("POST", "/v1/reports",
                                   json.dumps({"router": f"r{r}", "nodes": {**names, NODES[0]: "down"}}))
        assert status == 200, body
    status, fails = ctl.get("/v1/failures")
    assert status == 200 and len(fails["routers"]) == 15
    def counted():  # fresh reports that list it / say down (older ones went stale)
        down, listed = ctl.get("/v1/failures")[1]["nodes"][NODES[0]]["down_reports"].split("/")
        return down == listed != "0"
    wait_until(counted, message="what the reports say of a listed node counted")
    if not sanitized(ctl.proc.pid):  # ASAN's quarantine keeps freed bodies resident
        grown = rss_bytes(ctl.proc.pid) - rss0
        assert grown < 40 << 20, f"RSS grew {grown >> 20} MiB for reports of made-up nodes"


@pytest.mark.parametrize("path, body, status, rule", [
    ("/v1/leases", "", 400, "json"),
    ("/v1/leases", "{", 400, "json"),
    ("/v1/leases", "[]", 400, "object"),
    ("/v1/leases", '{"node": 5}', 400, "host_port"),
    ("/v1/leases", '{"node": "127.0.0.1:1", "node": "127.0.0.1:2"}', 400, "json"),
    ("/v1/leases", '{"node": "127.0.0.1:1\\u0000"}', 400, "json"),
    ("/v1/leases", '{"node": "9.9.9.9:9"}', 404, "exists"),
    ("/v1/leases", '{"node": "127.0.0.1:1", "x": 1}', 400, "unknown_field"),
    ("/v1/reports", "\x00\xff", 400, "json"),
    ("/v1/reports", '{"router": "", "nodes": {}}', 400, "required"),
    ("/v1/reports", '{"router": "' + "r" * 201 + '", "nodes": {}}', 400, "required"),
    ("/v1/reports", '{"router": "r", "nodes": []}', 400, "object"),
    ("/v1/reports", '{"router": "r", "nodes": {"127.0.0.1:1": "sideways"}}', 400, "up_or_down"),
    ("/v1/pools/main/nodes/127.0.0.1:1/drain", '{"timeout_ms": 5}', 400, "range"),
    ("/v1/pools/main/nodes/127.0.0.1:1/drain", '{"force": 1}', 400, "range"),
    ("/v1/pools/main/nodes/9.9.9.9:9/drain", "{}", 404, "exists"),
    ("/v1/pools/nope/nodes/127.0.0.1:1/drain", "{}", 404, "exists"),
])
def test_malformed_or_unknown_calls_get_a_clear_error(ctl, path, body, status, rule):
    got, reply = ctl.request("POST", path, body)
    assert got == status, reply
    assert isinstance(reply, dict) and reply.get("rule") == rule, reply


def test_a_body_over_1_mib_is_refused_413(ctl):
    status, reply = ctl.request("POST", "/v1/reports", "{" + " " * (1 << 20) + "}")
    assert status == 413, reply


def test_500_half_sent_requests_held_open_do_not_stop_renewals(ctl):
    # from another address than the renewal's: past --admin-conn-per-ip (256) control closes
    # the flooder's new connections at once, which a send may see as a reset
    socks = []
    try:
        for _ in range(500):
            s = socket.socket()
            s.settimeout(5)
            socks.append(s)
            s.bind(("127.0.0.2", 0))
            try:
                s.connect((ctl.host, ctl.port))
                s.sendall(b"POST /v1/leases HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"no")
            except ConnectionError:
                pass
        status, body = ctl.post("/v1/leases", {"node": NODES[0]})
        assert status == 200, body
        status, body = ctl.get("/v1/failures")
        assert status == 200, body
    finally:
        for s in socks:
            s.close()
    assert ctl.alive()


def test_a_drain_timeout_the_nodes_would_refuse_is_refused_400(cluster):  # noqa: F811
    """A node takes a handoff timeout_ms of at most 60000 (400 above): a drain accepted up to
    600000 then failed every handoff. It is refused before any handoff now."""
    ctl, nodes, admins, routers = cluster()
    status, body = ctl.post(f"/v1/pools/main/nodes/{nodes[0].addr}/drain", {"timeout_ms": 60001})
    assert status == 400 and body["rule"] == "range", body
    assert [c for c in admins[0].calls if c[1] == "/v1/replication/handoff"] == []
    status, body = ctl.post(f"/v1/pools/main/nodes/{nodes[0].addr}/drain", {"timeout_ms": 60000})
    assert status == 200, body


@pytest.mark.parametrize("victim", [0, 1, 2])
def test_a_drain_leaves_the_drained_node_replica_of_every_slot_it_handed_off(cluster, victim):  # noqa: F811
    """docs/admin-api.md: every range handed off gets the replica as node and the drained node
    as replica, in one version. The replica plan was then recomputed for the pool, which gave
    the drained node's excess of replica slots (it kept those it had) to others: for the middle
    node most of its range got another replica. Routers took that for a promotion (the old node
    is not the new replica) and replayed recent deletes over later writes, and the new replica
    had to sync in full. Checked for every slot, not only each range's first."""
    ctl, nodes, admins, routers = cluster()
    node = nodes[victim].addr
    before = ctl.topology()
    mine = [r for r in ranges(before) if r["node"] == node]
    status, body = ctl.post(f"/v1/pools/main/nodes/{node}/drain", {})
    assert status == 200, body
    own = {s: (r["node"], r.get("replica")) for r in ranges(ctl.topology())
           for s in range(r["from"], r["to"] + 1)}
    for r in mine:
        wrong = [s for s in range(r["from"], r["to"] + 1) if own[s] != (r["replica"], node)]
        assert wrong == [], f"{len(wrong)} slots of {r['from']}-{r['to']} not (new node, drained node)"


def test_half_sent_requests_past_admin_conn_max_do_not_lapse_a_nodes_lease(start_control,
                                                                           start_server):
    """More half-sent requests than --admin-conn-max held open on control's port (no token
    needed to open one) while a node renews on its kept-alive connection: they wait in the
    listen queue or are closed at their timeouts, and the node's lease never lapses. (They come
    from the node's own address here, as on loopback every client does: from another one,
    --admin-conn-per-ip closes those past 256 at once; test_admin_probes.py.)"""
    import urllib.request

    from mcraw import free_port
    ctl = start_control("--admin-conn-max", "64", "--poll-max", "16")
    admin = free_port()
    node = start_server("--admin-port", str(admin), "--control", f"http://127.0.0.1:{ctl.port}",
                        "--lease-renew-ms", "100")
    addr = f"127.0.0.1:{node.port}"
    status, body = ctl.post("/v1/pools", {"name": "main", "nodes": [{"node": addr}]})
    assert status == 201, body

    def lease_valid():
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5) as r:
            return any(line == "shoal_node_lease_valid 1"
                       for line in r.read().decode().splitlines())
    wait_until(lease_valid, timeout=5, message="the node's first lease")

    def closed(s):
        s.setblocking(False)
        try:
            gone = s.recv(4096) == b""
        except BlockingIOError:
            gone = False
        except OSError:
            gone = True
        if gone:
            s.close()
        return gone
    held, lapsed = [], []
    try:
        deadline = time.monotonic() + 6  # past the 2 s lease, and the 2 s header timeout twice
        while time.monotonic() < deadline:
            held = [s for s in held if not closed(s)]
            while len(held) < 200:  # keep well past the limit: reopen what control closed
                s = socket.socket()
                s.settimeout(0.2)
                try:
                    s.connect(("127.0.0.1", ctl.port))
                    s.sendall(b"POST /v1/leases HTTP/1.1\r\nHost: x\r\nContent-Length: 99\r\n\r\n{")
                except OSError:  # the listen queue is full: enough are waiting
                    s.close()
                    break
                held.append(s)
            if not lease_valid():
                lapsed.append(round(time.monotonic() - deadline + 6, 2))
            time.sleep(0.1)  # a sampling interval, not a wait for a condition
    finally:
        for s in held:
            s.close()
    assert lapsed == [], f"the node's lease lapsed at {lapsed} s into the flood"
