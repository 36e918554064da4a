"""shoal-control answers lease renewals on their own, never behind a change (docs/operations.md,
Leases): a change whose state save etcd holds for seconds (played by a gateway in front of a
real etcd member that stalls the save) leaves every renewal and GET /v1/leases answered within
RENEW_BOUND_S, so no node's lease runs out and nothing is fenced although nothing failed. And
the rule that makes promotion safe still holds with renewals off the change path: while a
promotion over a node is being stored its renewals are refused, and the first one granted after
names the promotion's version (or a later one), so the node fences until it has that document.
Reads do not wait for the save either: they show the version before the change until it is
stored."""

import http.client
import json
import threading
import time
import urllib.request
import uuid

import pytest

from etcdharness import etcd_member, stalling_gateway  # noqa: F401  (fixtures)
from mcraw import free_port, wait_until
from test_control_failover import FakeAdmin, FakeNode, FakeRouters

pytestmark = pytest.mark.shoal_only

STALL_S = 3.0         # how long etcd holds the save: past lease + margin (1 s + 150 ms)
RENEW_BOUND_S = 0.2   # what a renewal may take meanwhile
LEASE_MS = 1000


def etcd_control(start_control, gw, prefix, *extra):
    """A lone shoal-control on etcd through `gw`, leader, with room for slow saves: each etcd
    request may take 10 s, and its own etcd lease outlives a stalled save."""
    ctl = start_control("--etcd", gw.url, "--etcd-prefix", prefix, "--etcd-timeout-ms", "10000",
                        "--etcd-lease-ttl", "20", "--lease-ms", str(LEASE_MS), *extra)
    wait_until(lambda: ctl.metrics()["shoal_control_leader"] == 1, timeout=10,
               message="control to become the leader")
    return ctl


class Renewer:
    """Renews `node` on one kept-alive connection (as a node does), timing each answer."""

    def __init__(self, port, node):
        self.node = node
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def renew(self):
        t0 = time.monotonic()
        self.conn.request("POST", "/v1/leases", body=json.dumps({"node": self.node}),
                          headers={"Content-Type": "application/json"})
        r = self.conn.getresponse()
        body = json.loads(r.read() or b"null")
        return r.status, body, time.monotonic() - t0

    def list(self):
        t0 = time.monotonic()
        self.conn.request("GET", "/v1/leases")
        r = self.conn.getresponse()
        body = json.loads(r.read() or b"null")
        return r.status, body, time.monotonic() - t0

    def close(self):
        self.conn.close()


def node_metric(admin_port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


def test_renewals_are_answered_at_once_while_a_change_waits_on_a_slow_etcd_save(
        etcd_member, stalling_gateway, start_control, start_server):  # noqa: F811
    prefix = f"/shoal-test-{uuid.uuid4().hex[:8]}/"
    gw = stalling_gateway(etcd_member.members[0][1], prefix + "state")
    ctl = etcd_control(start_control, gw, prefix)
    admin = free_port()
    node = start_server("--admin-port", str(admin), "--control",
                        f"http://127.0.0.1:{ctl.port}", "--lease-renew-ms", "100")
    addr = f"127.0.0.1:{node.port}"
    status, body = ctl.post("/v1/pools", {"name": "main", "nodes": [{"node": addr}]})
    assert status == 201, body
    wait_until(lambda: node_metric(admin, "shoal_node_lease_valid") == 1, timeout=5,
               message="the node's first lease")
    gw.stall_s = STALL_S
    done = {}
    change = threading.Thread(target=lambda: done.update(r=ctl.post(
        "/v1/namespaces", {"name": "orders", "pool": "main", "memory": 1 << 20})))
    change.start()
    wait_until(lambda: gw.stalled >= 1, message="the change's save held by etcd")
    r = Renewer(ctl.port, addr)
    slow, rounds, invalid = [], 0, []
    try:
        while gw.released == 0:
            status, body, took = r.renew()
            assert status == 200, body
            if took >= RENEW_BOUND_S:
                slow.append(("POST", round(took, 3)))
            status, body, took = r.list()
            assert status == 200 and body["nodes"][addr]["lapsed"] is False, body
            if took >= RENEW_BOUND_S:
                slow.append(("GET", round(took, 3)))
            if node_metric(admin, "shoal_node_lease_valid") != 1:
                invalid.append(rounds)
            rounds += 1
            time.sleep(0.05)  # a renewal interval, not a wait for a condition
    finally:
        r.close()
    change.join(15)
    assert done["r"][0] == 201, done  # the change itself went through, slowly
    assert slow == [], f"renewals held up behind the change: {slow}"
    assert invalid == [], f"the node's lease ran out during the change (rounds {invalid})"
    assert rounds >= 5, rounds  # renewals were tried through the whole stall
    assert node_metric(admin, "shoal_node_lease_fenced") == 0


def test_reads_show_the_version_before_a_change_until_its_slow_save_is_done(
        etcd_member, stalling_gateway, start_control):  # noqa: F811
    prefix = f"/shoal-test-{uuid.uuid4().hex[:8]}/"
    gw = stalling_gateway(etcd_member.members[0][1], prefix + "state")
    ctl = etcd_control(start_control, gw, prefix)
    status, body = ctl.post("/v1/pools", {"name": "main", "nodes": [{"node": "127.0.0.1:7"}]})
    assert status == 201, body
    v0 = ctl.version()
    gw.stall_s = STALL_S
    done = {}
    change = threading.Thread(target=lambda: done.update(r=ctl.post(
        "/v1/namespaces", {"name": "orders", "pool": "main", "memory": 1 << 20})))
    change.start()
    wait_until(lambda: gw.stalled >= 1, message="the change's save held by etcd")
    for path in ("/v1/topology", "/v1/namespaces", "/v1/pools/main", "/metrics"):
        t0 = time.monotonic()
        status, body = ctl.get(path)
        took = time.monotonic() - t0
        assert status == 200, (path, body)
        assert took < RENEW_BOUND_S, f"GET {path} waited {took:.2f} s behind the save"
    assert ctl.version() == v0  # not stored yet: not served
    status, body = ctl.get("/v1/namespaces")
    assert "orders" not in body["namespaces"], body
    assert gw.released == 0, "the save was done before the reads were tried"
    change.join(15)
    assert done["r"][0] == 201, done
    assert ctl.version() == v0 + 1


def test_a_promotion_being_stored_refuses_the_nodes_renewals_and_the_next_names_its_version(
        etcd_member, stalling_gateway, start_control):  # noqa: F811
    prefix = f"/shoal-test-{uuid.uuid4().hex[:8]}/"
    gw = stalling_gateway(etcd_member.members[0][1], prefix + "state")
    nodes, admins, routers = [], [], None
    try:
        ctl = etcd_control(start_control, gw, prefix, "--probe-ms", "100",
                           "--failure-timeout-ms", "300")
        nodes = [FakeNode() for _ in range(3)]
        admins = [FakeAdmin() for _ in range(3)]
        status, body = ctl.post("/v1/pools", {"name": "main", "nodes": [
            {"node": n.addr, "admin": a.addr} for n, a in zip(nodes, admins)]})
        assert status == 201, body
        status, body = ctl.post("/v1/namespaces", {"name": "orders", "pool": "main",
                                                   "copies": 2, "memory": 3 << 20})
        assert status == 201, body
        routers = FakeRouters(ctl, {f"r{i}": {n.addr: "up" for n in nodes} for i in range(3)})
        dead, live = nodes[1], nodes[0]
        v0 = ctl.version()
        gw.stall_s = STALL_S
        dead.kill()
        routers.set("r0", dead.addr, "down")
        routers.set("r1", dead.addr, "down")
        # dead for the failure timeout, lapsed a lease + margin after start: then the
        # promotion is being stored (held by etcd)
        wait_until(lambda: gw.stalled >= 1, timeout=10, message="the promotion's save held")
        r, other = Renewer(ctl.port, dead.addr), Renewer(ctl.port, live.addr)
        try:
            status, body, took = r.renew()
            assert status == 409 and body["rule"] == "promoting", body
            assert took < RENEW_BOUND_S, took
            assert ctl.metrics()["shoal_control_lease_refusals_total"] == 1
            status, body, took = other.renew()  # other nodes renew as ever, at once
            assert status == 200 and body["version"] == v0, body
            assert took < RENEW_BOUND_S, took
            assert gw.released == 0, "the promotion was stored before the renewals were tried"
            doc = wait_until(lambda: (d := ctl.topology())["version"] > v0 and d, timeout=15,
                             message="the promotion published")
            assert not [x for x in doc["pools"]["main"]["slots"] if x["node"] == dead.addr]
            r.close()  # idle past --admin-header-timeout meanwhile: a new connection
            r = Renewer(ctl.port, dead.addr)
            status, body, _ = r.renew()
            assert status == 200, body
            assert body["version"] >= doc["version"], (body, doc["version"])
        finally:
            r.close()
            other.close()
    finally:
        if routers:
            routers.stop()
        for a in admins:
            a.stop()
        for n in nodes:
            n.kill()
