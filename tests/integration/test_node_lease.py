"""shoal-node's slot lease (issue 15 point 2, FAILOVER.md C3, node side): a node following a
control plane renews `POST /v1/leases` every --lease-renew-ms; for the slots it is primary of in
ranges that have a replica it refuses reads and writes (`SERVER_ERROR slot lease expired`) once
the lease (sent time of the last renewal granted + lease_ms) has run out, or while a lease names
a newer topology version than the one in use. Slots of pools without replicas, and everything
before the first document, are never refused.

The control plane is tests/integration/fakecontrol.py: the tests write slot maps with replicas
by hand and play a partition with `silent`."""

import re
import subprocess
import threading
import time

import pytest

from conftest import key_slot, server_binary, start_following_node
from fakecontrol import FakeControl
from mcraw import McRaw, http, wait_until

pytestmark = pytest.mark.shoal_only

FENCED = "SERVER_ERROR slot lease expired"
OTHER = "127.0.0.1:1"  # the other node of the pool: never contacted by these tests
LEASE_MS = 1000


def keys_in(lo, hi, n, prefix="k"):
    out, i = [], 0
    while len(out) < n:
        k = f"{prefix}{i}"
        if lo <= key_slot(k) <= hi:
            out.append(k)
        i += 1
    return out


PRIMARY = keys_in(0, 8191, 8)       # this node is primary, with a replica: fenced
REPLICA = keys_in(8192, 16383, 8)   # this node is the replica: never fenced


def replicated_doc(addr, version):
    return {"version": version, "namespaces": {},
            "pools": {"main": {"nodes": [addr, OTHER], "slots": [
                {"from": 0, "to": 8191, "node": addr, "replica": OTHER},
                {"from": 8192, "to": 16383, "node": OTHER, "replica": addr}]}}}


def plain_doc(addr, version):
    return {"version": version, "namespaces": {},
            "pools": {"main": {"nodes": [addr, OTHER], "slots": [
                {"from": 0, "to": 8191, "node": addr},
                {"from": 8192, "to": 16383, "node": OTHER}]}}}


class Grants:
    """The fake's /v1/leases answer: a lease of LEASE_MS at `version`, recording when each was
    answered (monotonic, the test's clock)."""

    def __init__(self, ctl, version=1, status=200):
        self.version, self.status, self.times = version, status, []
        self.lock = threading.Lock()
        ctl.answer("/v1/leases", self)

    def __call__(self, body):
        with self.lock:
            self.times.append(time.monotonic())
        if self.status != 200:
            return self.status, {"error": "no pool lists it"}
        return 200, {"node": body["node"], "lease_ms": LEASE_MS, "version": self.version}

    def last(self):
        with self.lock:
            return self.times[-1]


def metrics(node):
    status, body = http(node.admin_port, "GET", "/metrics")
    assert status == 200
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^(\w+) (\S+)$", body, re.M)}


def start_node(start_server, ctl, *extra):
    return start_following_node(start_server, ctl.url, "--lease-renew-ms", "100", *extra)


def at_version(node, v):
    wait_until(lambda: metrics(node)["shoal_node_topology_version"] >= v, timeout=5,
               message=f"topology version {v} in use")


def serving(node, ctl, grants, doc):
    """Publish `doc`, wait until it is in use with a valid lease."""
    ctl.publish(doc)
    at_version(node, doc["version"])
    wait_until(lambda: metrics(node)["shoal_node_lease_valid"] == 1, timeout=5,
               message="a valid lease")


def test_granted_lease_serves_replicated_slots_and_renews_as_the_node(start_server):
    ctl = FakeControl()
    grants = Grants(ctl)
    node = start_node(start_server, ctl)
    serving(node, ctl, grants, replicated_doc(node.addr, 1))
    assert ctl.wait_post("/v1/leases") == {"node": node.addr}
    with McRaw(node.host, node.port) as c:
        for k in PRIMARY + REPLICA:
            assert c.store("set", k, "v") == "STORED"
        assert {k for k, _, _, _ in c.get(*PRIMARY)} == set(PRIMARY)
    m = metrics(node)
    assert m["shoal_node_lease_slots"] == 8192
    assert m["shoal_node_lease_fenced"] == 0
    assert 0 < m["shoal_node_lease_remaining_ms"] <= LEASE_MS
    assert m["shoal_node_lease_refusals_total"] == 0
    n = len(ctl.posts("/v1/leases"))
    wait_until(lambda: len(ctl.posts("/v1/leases")) >= n + 3, timeout=3,
               message="renewals keep coming every --lease-renew-ms")


def test_silent_control_fences_writes_and_reads_at_lease_end_and_never_after(start_server):
    ctl = FakeControl()
    grants = Grants(ctl)
    node = start_node(start_server, ctl)
    serving(node, ctl, grants, replicated_doc(node.addr, 1))
    key = PRIMARY[0]
    accepted, refused_at = [], None
    with McRaw(node.host, node.port) as c:
        assert c.store("set", key, "0") == "STORED"
        ctl.silent = True  # a partition: renewals get no answer from now on
        cut = time.monotonic()
        i = 0
        while time.monotonic() < cut + LEASE_MS / 1000 + 2:
            i += 1
            sent = time.monotonic()
            r = c.store("set", key, str(i))
            if r == "STORED":
                accepted.append(sent)
                assert refused_at is None, "a write was accepted after the fence went up"
            else:
                assert r == FENCED, r
                if refused_at is None:
                    refused_at = time.monotonic()
            time.sleep(0.002)
        last_grant = grants.last()
        assert refused_at is not None, "writes still accepted 2 s after the lease's end"
        assert refused_at <= last_grant + (LEASE_MS + 300) / 1000, \
            f"fenced {refused_at - last_grant:.3f} s after the last renewal answered"
        assert accepted and accepted[-1] < last_grant + LEASE_MS / 1000, \
            f"a write sent {accepted[-1] - last_grant:.3f} s after the last renewal was accepted"
        c.send(b"get " + key.encode() + b"\r\n")
        assert c.read_line() == FENCED, "reads of a fenced slot are refused too"
        c.get(*REPLICA)  # VALUEs and END, no error: slots it is replica of are not fenced
        assert c.store("set", REPLICA[0], "x") == "STORED", "slots it is replica of are not fenced"
    m = metrics(node)
    assert m["shoal_node_lease_valid"] == 0 and m["shoal_node_lease_fenced"] == 1
    assert m["shoal_node_lease_refusals_total"] >= 2
    ctl.silent = False
    wait_until(lambda: metrics(node)["shoal_node_lease_fenced"] == 0, timeout=5,
               message="fencing ends once a renewal is granted again")
    with McRaw(node.host, node.port) as c:
        assert c.store("set", key, "back") == "STORED"
    text = node.stderr_text()
    assert "lease: fencing 8192 slots" in text and "lease: fencing ends" in text, text


def test_every_key_command_answers_the_error_in_a_fenced_slot(start_server):
    ctl = FakeControl()
    Grants(ctl, status=404)  # never granted: fenced from the first document
    node = start_node(start_server, ctl)
    ctl.publish(replicated_doc(node.addr, 1))
    at_version(node, 1)
    k, r = PRIMARY[1], REPLICA[1]
    with McRaw(node.host, node.port) as c:
        lines = [f"get {k}", f"gets {k}", f"gat 10 {k}", f"gats 10 {k}", f"incr {k} 1",
                 f"decr {k} 1", f"touch {k} 10", f"delete {k}", f"mg {k} v", f"md {k}",
                 f"ma {k}", f"me {k}"]
        for line in lines:
            c.send(line.encode() + b"\r\n")
            assert c.read_line() == FENCED, line
        for cmd in ("set", "add", "replace", "append", "prepend"):
            c.send(f"{cmd} {k} 0 0 1\r\nx\r\n".encode())
            assert c.read_line() == FENCED, cmd
        c.send(f"cas {k} 0 0 1 5\r\nx\r\n".encode())
        assert c.read_line() == FENCED, "cas"
        c.send(f"ms {k} 1\r\nx\r\n".encode())
        assert c.read_line() == FENCED, "ms"
        # a multi-key get with one fenced key: the whole request is refused, no VALUE
        assert c.store("set", r, "v") == "STORED"
        c.send(f"get {r} {k}\r\n".encode())
        assert c.read_line() == FENCED
        c.send(b"mn\r\n")
        assert c.read_line() == "MN", "nothing else was sent for the refused get"
        # noreply silences the refusal as it does memcached's errors
        c.send(f"set {k} 0 0 1 noreply\r\nx\r\nmn\r\n".encode())
        assert c.read_line() == "MN"
        assert {x for x, _, _, _ in c.get(r)} == {r}, "the replica's slots serve"
    assert metrics(node)["shoal_node_lease_refusals_total"] >= 20


def test_lease_naming_a_newer_version_fences_until_that_document_is_in_use(start_server):
    ctl = FakeControl()
    grants = Grants(ctl)
    node = start_node(start_server, ctl)
    serving(node, ctl, grants, replicated_doc(node.addr, 1))
    k = PRIMARY[2]
    with McRaw(node.host, node.port) as c:
        assert c.store("set", k, "v") == "STORED"
        grants.version = 2  # control moved on (a promotion, say) and this node has not seen it
        wait_until(lambda: c.store("set", k, "v") == FENCED, timeout=3,
                   message="writes refused while the document in use is older than the lease")
        assert metrics(node)["shoal_node_lease_valid"] == 1, "the lease itself is valid"
        c.send(f"mg {k} v\r\n".encode())
        assert c.read_line() == FENCED
        ctl.publish(replicated_doc(node.addr, 2))
        at_version(node, 2)
        assert c.store("set", k, "v2") == "STORED"
    assert "is newer than version 1 in use" in node.stderr_text()


def test_renewal_back_after_a_partition_with_a_newer_version_stays_fenced_until_it_arrives(
        start_server):
    ctl = FakeControl()
    grants = Grants(ctl)
    node = start_node(start_server, ctl)
    serving(node, ctl, grants, replicated_doc(node.addr, 1))
    k = PRIMARY[3]
    with McRaw(node.host, node.port) as c:
        ctl.silent = True
        wait_until(lambda: c.store("set", k, "v") == FENCED, timeout=3,
                   message="fenced once the lease ran out")
        grants.version = 5  # meanwhile control promoted the replica (version 5)
        n = len(grants.times)
        ctl.silent = False
        wait_until(lambda: len(grants.times) > n + 2 and metrics(node)["shoal_node_lease_valid"],
                   timeout=5, message="renewals granted again")
        assert c.store("set", k, "v") == FENCED, "a valid lease of a version not seen yet"
        assert c.cmd(f"get {k}") == FENCED
        ctl.publish(replicated_doc(node.addr, 5))
        at_version(node, 5)
        assert c.store("set", k, "v") == "STORED"


def test_pool_without_replicas_is_never_fenced(start_server):
    ctl = FakeControl()
    Grants(ctl, status=404)  # no lease at all
    node = start_node(start_server, ctl)
    ctl.publish(plain_doc(node.addr, 1))
    at_version(node, 1)
    time.sleep(0.3)  # renewals have been refused several times by now (every 100 ms)
    assert len(ctl.posts("/v1/leases")) >= 2
    with McRaw(node.host, node.port) as c:
        for k in PRIMARY:
            assert c.store("set", k, "v") == "STORED"
        assert {x for x, _, _, _ in c.get(*PRIMARY)} == set(PRIMARY)
    m = metrics(node)
    assert m["shoal_node_lease_slots"] == 0 and m["shoal_node_lease_refusals_total"] == 0


def test_nothing_is_fenced_before_the_first_document(start_server):
    ctl = FakeControl()
    ctl.silent = True
    node = start_node(start_server, ctl)
    with McRaw(node.host, node.port) as c:
        for k in PRIMARY:
            assert c.store("set", k, "v") == "STORED"
    assert metrics(node)["shoal_node_lease_valid"] == 0
    ctl.silent = False


def test_node_without_control_never_fences(server):
    with McRaw(server.host, server.port) as c:
        assert c.store("set", PRIMARY[0], "v") == "STORED"


def test_renewals_carry_the_token_file(start_server, tmp_path):
    ctl = FakeControl()
    Grants(ctl)
    tok = tmp_path / "token"
    tok.write_text("node-token-0123456789abcdef\n")
    start_node(start_server, ctl, "--token-file", str(tok))
    ctl.wait_post("/v1/leases")
    assert "Bearer node-token-0123456789abcdef" in ctl.auths


def test_help_lists_the_lease_option():
    out = subprocess.run([str(server_binary()), "--help"], capture_output=True, text=True).stdout
    assert "--lease-renew-ms" in out
