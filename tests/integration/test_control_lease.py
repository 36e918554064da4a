"""shoal-control's slot leases (issue 15 point 2, FAILOVER.md C3, control side): `POST /v1/leases`
{"node": "host:port"} grants a node a pool lists a lease of --lease-ms at the current topology
version; `GET /v1/leases` shows each node's age and whether its lease has lapsed (last grant +
L + L/20 + 100 ms), which is what promotion waits for. A process that starts counts every node
as renewed at that moment. Renewals need an admin token under --auth-file."""

import http.client
import json
import subprocess
import time

import pytest

from controlharness import CONTROL_BIN
from etcdharness import etcd_cluster  # noqa: F401  (a fixture)
from mcraw import free_port, wait_until

pytestmark = pytest.mark.shoal_only

NODE = "127.0.0.1:7101"
ADMIN = "admin-token-0123456789abcdef"
SHOP = "shop-token-0123456789abcdef"


def call(port, method, path, body=None, token=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = json.dumps(body) if isinstance(body, (dict, list)) else body
    try:
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        text = r.read().decode()
    finally:
        conn.close()
    try:
        return r.status, json.loads(text) if text else None
    except ValueError:
        return r.status, text


def with_pool(ctl, *nodes):
    status, body = ctl.post("/v1/pools", {"name": "main", "nodes": [{"node": n} for n in nodes]})
    assert status == 201, body


def leases(ctl):
    status, body = ctl.get("/v1/leases")
    assert status == 200, body
    return body


def test_renewal_is_granted_with_lease_length_and_current_version(start_control):
    ctl = start_control("--lease-ms", "1500")
    with_pool(ctl, NODE)
    status, body = ctl.post("/v1/leases", {"node": NODE})
    assert status == 200, body
    assert body == {"node": NODE, "lease_ms": 1500, "version": ctl.version()}
    assert ctl.metrics()["shoal_control_lease_grants_total"] == 1
    got = leases(ctl)
    assert got["lease_ms"] == 1500 and got["margin_ms"] == 1500 // 20 + 100 and got["leader"]
    assert got["nodes"][NODE]["lapsed"] is False and got["nodes"][NODE]["age_ms"] < 1500


def test_node_no_pool_lists_gets_404(start_control):
    ctl = start_control()
    with_pool(ctl, NODE)
    status, body = ctl.post("/v1/leases", {"node": "127.0.0.1:7999"})
    assert status == 404 and body["field"] == "node", body
    assert ctl.metrics()["shoal_control_lease_grants_total"] == 0


@pytest.mark.parametrize("body,field", [
    ("not json", "body"),
    ([NODE], "body"),
    ({}, "node"),
    ({"node": 7}, "node"),
    ({"node": "no-port"}, "node"),
    ({"node": NODE, "ttl": 5}, "ttl"),
])
def test_bad_renewal_is_400_naming_the_field(start_control, body, field):
    ctl = start_control()
    with_pool(ctl, NODE)
    status, reply = ctl.post("/v1/leases", body)
    assert status == 400 and reply["field"] == field, reply


def test_lease_lapses_after_lease_plus_margin_without_renewals(start_control):
    ctl = start_control("--lease-ms", "500")
    with_pool(ctl, NODE)
    sent = time.monotonic()
    assert ctl.post("/v1/leases", {"node": NODE})[0] == 200
    assert leases(ctl)["nodes"][NODE]["lapsed"] is False
    wait_until(lambda: leases(ctl)["nodes"][NODE]["lapsed"], timeout=5, interval=0.01,
               message="the lease lapsed")
    seen = time.monotonic()
    assert seen - sent >= (500 + 125) / 1000, \
        f"lapsed {seen - sent:.3f} s after the renewal was sent, before L + margin (0.625 s)"
    assert seen - sent < 1.5, f"still not lapsed {seen - sent:.3f} s after the renewal"


def test_renewals_keep_the_lease_from_lapsing(start_control):
    ctl = start_control("--lease-ms", "300")
    with_pool(ctl, NODE)
    end = time.monotonic() + 1.2
    while time.monotonic() < end:
        assert ctl.post("/v1/leases", {"node": NODE})[0] == 200
        assert leases(ctl)["nodes"][NODE]["lapsed"] is False
        time.sleep(0.05)


def test_a_started_process_counts_every_node_as_renewed_at_start(start_control):
    """The lease table is memory only: right after a (re)start a node never granted by this
    process must not count as lapsed before a full lease has passed, since it may hold a lease
    the previous process granted."""
    ctl = start_control("--lease-ms", "600")
    with_pool(ctl, NODE)
    ctl.stop()
    ctl2 = start_control("--lease-ms", "600", data_dir=ctl.data_dir)
    started = time.monotonic()
    got = leases(ctl2)["nodes"][NODE]
    if time.monotonic() - started < 0.5:
        assert got["lapsed"] is False, got
    wait_until(lambda: leases(ctl2)["nodes"][NODE]["lapsed"], timeout=5,
               message="lapsed a lease after the start")


def test_renewal_needs_an_admin_token_under_auth_file(start_control, tmp_path):
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"tokens": [{"token": ADMIN, "role": "admin"},
                                           {"token": SHOP, "team": "shop"}]}))
    auth.chmod(0o600)
    ctl = start_control("--auth-file", str(auth))
    assert call(ctl.port, "POST", "/v1/pools", {"name": "main", "nodes": [{"node": NODE}]},
                token=ADMIN)[0] == 201
    assert call(ctl.port, "POST", "/v1/leases", {"node": NODE})[0] == 401
    assert call(ctl.port, "POST", "/v1/leases", {"node": NODE}, token=SHOP)[0] == 403, \
        "a team token could keep a dead primary's lease alive and hold off its failover"
    assert call(ctl.port, "POST", "/v1/leases", {"node": NODE}, token=ADMIN)[0] == 200
    assert call(ctl.port, "GET", "/v1/leases")[0] == 200, "reading stays open"


def test_node_following_control_renews_its_lease(start_control, start_server):
    ctl = start_control("--lease-ms", "1000")
    admin = free_port()
    node = start_server("--admin-port", str(admin), "--control", f"http://127.0.0.1:{ctl.port}",
                        "--lease-renew-ms", "100")
    addr = f"127.0.0.1:{node.port}"
    with_pool(ctl, addr)
    wait_until(lambda: ctl.metrics()["shoal_control_lease_grants_total"] >= 3, timeout=5,
               message="renewals from the node")
    got = leases(ctl)["nodes"][addr]
    assert got["lapsed"] is False and got["age_ms"] < 500, got
    assert f'shoal_control_lease_age_seconds{{node="{addr}"}}' in ctl.metrics()


def test_help_lists_lease_ms():
    out = subprocess.run([str(CONTROL_BIN), "--help"], capture_output=True, text=True).stdout
    assert "--lease-ms" in out


def test_etcd_group_only_the_leader_grants_and_a_new_leader_waits_a_full_lease(
        etcd_cluster, start_control, start_server):  # noqa: F811
    import uuid
    prefix = f"/shoal-test-{uuid.uuid4().hex[:8]}/"
    ctls = [start_control("--etcd", etcd_cluster.urls, "--etcd-prefix", prefix, "--lease-ms", "800")
            for _ in range(2)]
    leader = wait_until(lambda: (lambda ls: ls[0] if len(ls) == 1 else None)(
        [c for c in ctls if c.metrics()["shoal_control_leader"] == 1]), timeout=10,
        message="one leader")
    standby = ctls[1] if leader is ctls[0] else ctls[0]
    admin = free_port()
    node = start_server("--admin-port", str(admin), "--control",
                        f"http://127.0.0.1:{standby.port},http://127.0.0.1:{leader.port}",
                        "--lease-renew-ms", "100")
    addr = f"127.0.0.1:{node.port}"
    with_pool(leader, addr)
    wait_until(lambda: addr in json.dumps(standby.topology()), message="the standby synced")
    status, body = standby.post("/v1/leases", {"node": addr})
    assert status == 503 and body["rule"] == "leader", body
    assert body["leader"] == f"http://127.0.0.1:{leader.port}", body
    # the node is sent away by the standby and renews with the leader
    wait_until(lambda: leader.metrics()["shoal_control_lease_grants_total"] >= 3, timeout=5,
               message="the node renewing with the leader")
    assert standby.metrics()["shoal_control_lease_grants_total"] == 0
    # the leader dies: the standby takes over and counts the node as renewed at that moment
    leader.kill9()
    wait_until(lambda: standby.metrics()["shoal_control_leader"] == 1, timeout=10,
               message="the standby takes over")
    took_over = time.monotonic()
    got = leases(standby)["nodes"][addr]
    if time.monotonic() - took_over < 0.6:
        assert got["lapsed"] is False, got
    wait_until(lambda: standby.metrics()["shoal_control_lease_grants_total"] >= 3, timeout=5,
               message="the node renewing with the new leader")
    assert leases(standby)["nodes"][addr]["lapsed"] is False
