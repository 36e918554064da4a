"""Partition tests (issue 15 point 5), in network namespaces the test makes (netnsharness.py):
node n0 alone in namespace A, shoal-control, shoal-router, n1, n2 and the gutter node in B,
joined by one veth pair; nftables in A cuts the link or drops packets at random.

- test_lossy_link_to_one_node_changes_no_topology: 30% packet loss (each direction) on n0's
  link for LOSS_S seconds (default 40, SHOAL_PARTITION_LOSS_S=60 for the issue's full minute):
  control publishes no new topology version (no false promotion, no slot moved) and the router
  keeps answering. Runs today; with replicas and failure detection merged (ctlfo, lease) the
  same assertions are the issue's "no false promotion".
- test_cut_off_primary_...: n0, primary of a copies-2 namespace's slots, loses control and the
  router while a client in A keeps writing to it: no write is accepted once its lease must have
  run out (cut + lease_ms), none after the promotion, and after healing no value deleted during
  the partition is served. Needs the other helpers' parts (skips naming the missing one).

Every test is root-only and skips with the reason otherwise; namespaces, veths, rules and
processes are removed by the fixture's finalizer, also when a test fails.
"""

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import key_slot
from netnsharness import ADDR, McConn, NetPair

REPO = Path(__file__).resolve().parents[2]
LOSS_S = float(os.environ.get("SHOAL_PARTITION_LOSS_S", "40"))
LEASE_MS = 2000
CONTROL = f"{ADDR['B']}:11500"
ROUTER = f"{ADDR['B']}:11211"
ROUTER_ADMIN = f"{ADDR['B']}:11411"
N0 = f"{ADDR['A']}:12000"  # the node on the far side
NODES_B = [f"{ADDR['B']}:12001", f"{ADDR['B']}:12002"]
GUTTER = f"{ADDR['B']}:12009"


def binary(env, name):
    return os.environ.get(env) or str(REPO / "build" / "bin" / name)


def has_flag(bin_path, flag):
    try:
        r = subprocess.run([bin_path, "--help"], capture_output=True, text=True, timeout=10)
    except OSError:
        return False
    return flag in r.stdout + r.stderr


def wait_for(pred, timeout, what, interval=0.05):
    end = time.monotonic() + timeout
    while True:
        try:
            v = pred()
        except OSError:
            v = None
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class Cluster:
    """The processes of one partition test, in their namespaces (fixed ports: the namespaces
    are fresh, nothing else listens in them)."""

    def __init__(self, pair, tmp_path):
        self.pair, self.tmp = pair, tmp_path

    def http(self, method, path, body=None, side="B", addr=CONTROL):
        return self.pair.request(side, addr, method, path, body)

    def topology(self):
        st, doc = self.http("GET", "/v1/topology")
        assert st == 200, doc
        return doc

    def start(self, copies, ns="pt"):
        p, ctl_bin = self.pair, binary("SHOAL_CONTROL_BIN", "shoal-control")
        cargs = [ctl_bin, "-p", "11500", "-l", ADDR["B"], "--data-dir", self.tmp / "ctl"]
        if has_flag(ctl_bin, "--lease-ms"):
            cargs += ["--lease-ms", LEASE_MS]
        p.spawn("B", cargs, "control")
        wait_for(lambda: self.http("GET", "/healthz")[0] == 200, 10, "control")
        node_bin = binary("SHOAL_NODE_BIN", "shoal-node")
        for side, addr, name in [("A", N0, "n0"), ("B", NODES_B[0], "n1"),
                                 ("B", NODES_B[1], "n2"), ("B", GUTTER, "gutter")]:
            host, port = addr.split(":")
            p.spawn(side, [node_bin, "-l", host, "-p", port, "-U", "0", "-t", "1", "-m", "64",
                           "--admin-port", int(port) + 100, "--admin-listen", host, "--control", f"http://{CONTROL}",
                           "--advertise", addr], name)
        for side, addr in [("A", N0), ("B", NODES_B[0]), ("B", NODES_B[1]), ("B", GUTTER)]:
            wait_for(lambda: p.connect(side, addr, 0.5).close() or True, 10, f"node {addr}")
        nodes = [{"node": a, "admin": f"{a.split(':')[0]}:{int(a.split(':')[1]) + 100}",
                  "zone": f"z{i}"} for i, a in enumerate([N0] + NODES_B)]
        st, body = self.http("POST", "/v1/pools", {"name": "main", "nodes": nodes})
        if st not in (200, 201):  # a control without zone labels (before ctlfo)
            for n in nodes:
                n.pop("zone")
            st, body = self.http("POST", "/v1/pools", {"name": "main", "nodes": nodes})
        assert st in (200, 201), body
        st, body = self.http("POST", "/v1/pools", {
            "name": "gutter", "gutter": True,
            "nodes": [{"node": GUTTER, "admin": f"{ADDR['B']}:12109"}]})
        assert st in (200, 201), body
        st, body = self.http("POST", "/v1/namespaces", {"name": ns, "pool": "main",
                                                        "copies": copies})
        assert st in (200, 201), body
        p.spawn("B", [binary("SHOAL_ROUTER_BIN", "shoal-router"), "-l", ADDR["B"], "-p", "11211",
                      "--admin-port", "11411", "--admin-listen", ADDR["B"], "-t", "2", "--control", f"http://{CONTROL}"],
                "router")
        version = self.topology()["version"]
        wait_for(lambda: self.router_metric("shoal_router_topology_version") >= version, 15,
                 "the router to follow control")

    def router_metric(self, name):
        st, text = self.http("GET", "/metrics", addr=ROUTER_ADMIN)
        for line in (text or "").splitlines() if st == 200 else []:
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0.0

    def stable_version(self, quiet_s=1.0, timeout=15):
        """The topology version once it has not changed for quiet_s (nodes registering)."""
        last, since = None, time.monotonic()
        end = since + timeout
        while time.monotonic() < end:
            v = self.topology()["version"]
            if v != last:
                last, since = v, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                return v
            time.sleep(0.1)
        raise AssertionError("the topology version never settled")


@pytest.fixture
def part(request, tmp_path):
    pair = NetPair(tmp_path)
    request.addfinalizer(pair.close)
    cl = Cluster(pair, tmp_path)
    yield cl
    print(pair.logs())  # shown by pytest only when the test failed


def ranges_of(doc, pool="main"):
    return [r for r in doc["pools"][pool].get("slots", []) if isinstance(r, dict)]


def primary_of(ranges, slot):
    for r in ranges:
        if r["from"] <= slot <= r["to"]:
            return r
    return None


def test_lossy_link_to_one_node_changes_no_topology(part):
    """30% loss each way on n0's link: no new topology version (nothing promoted, no slot
    moved) for LOSS_S seconds, and the router keeps answering nearly every request."""
    part.start(copies=2, ns="pl")
    pair = part.pair
    v0 = part.stable_version()
    doc0 = part.topology()
    keys = [f"pl:k{i}" for i in range(600)]
    assert any(primary_of(ranges_of(doc0), key_slot(k))["node"] == N0 for k in keys), \
        "no test key is on the lossy node"
    mc = McConn(pair, "B", ROUTER)
    for k in keys:
        assert mc.cmd(f"set {k} 0 0 1\r\nv\r\n") == "STORED"

    far = [k for k in keys if primary_of(ranges_of(doc0), key_slot(k))["node"] == N0]
    near = [k for k in keys if k not in far]
    stop, versions = threading.Event(), []
    counts = {"far": {"ok": 0, "err": 0, "errs": []}, "near": {"ok": 0, "err": 0, "errs": []}}

    def load(which, ks):
        """get, and set on a miss, in a loop over keys of n0 ("far") or of n1/n2 ("near"):
        one client each, so the lossy link's slow answers do not hold up the others."""
        c, n = McConn(pair, "B", ROUTER), counts[which]
        i = 0
        while not stop.is_set():
            k = ks[i % len(ks)]
            i += 1
            try:
                v, err = c.get(k)
                if err is None and v is None:
                    err = None if c.cmd(f"set {k} 0 0 1\r\nv\r\n") == "STORED" else "set failed"
            except OSError as e:  # timeout: the router did not answer within 3 s
                err = f"{type(e).__name__}"
                c.close()
                c = McConn(pair, "B", ROUTER)
            if err:
                n["err"] += 1
                n["errs"].append(err)
            else:
                n["ok"] += 1
            time.sleep(0.002)

    def watch():
        while not stop.is_set():
            try:
                versions.append(part.topology()["version"])
            except (OSError, AssertionError):
                pass
            stop.wait(0.25)

    threads = [threading.Thread(target=load, args=("far", far)),
               threading.Thread(target=load, args=("near", near)),
               threading.Thread(target=watch)]
    for t in threads:
        t.start()
    pair.loss(30)
    try:
        time.sleep(LOSS_S)
    finally:
        pair.no_loss()
        stop.set()
        for t in threads:
            t.join(10)
    doc1 = part.topology()
    assert set(versions) == {v0}, f"the topology changed under packet loss: versions {versions}"
    assert ranges_of(doc1) == ranges_of(doc0), "slots moved under packet loss"
    print("requests", counts, {m: part.router_metric(m) for m in (
        "shoal_router_nodes_marked_down_total", "shoal_router_gutter_requests_total",
        "shoal_router_upstream_timeouts_total", "shoal_router_gutter_retries_total")})
    for which, n in counts.items():
        total = n["ok"] + n["err"]
        assert n["err"] <= 0.05 * total, \
            f"{which}: {n['err']} of {total} requests failed through the router: {n['errs'][:10]}"
    # the other nodes' keys are served at full speed, n0's slowly (TCP retransmissions) but
    # still served
    assert counts["near"]["ok"] >= 50 * LOSS_S, counts["near"]
    assert counts["far"]["ok"] >= 1 * LOSS_S, counts["far"]


def test_cut_off_primary_accepts_no_write_after_its_lease_and_serves_no_deleted_value(part):
    missing = [why for ok, why in [
        (has_flag(binary("SHOAL_CONTROL_BIN", "shoal-control"), "--lease-ms"),
         "control's leases (helper lease, FAILOVER.md C3: --lease-ms, POST /v1/leases)"),
        (has_flag(binary("SHOAL_NODE_BIN", "shoal-node"), "--lease-renew-ms"),
         "the node's lease renewal and fencing (helper lease, C3)"),
        (has_flag(binary("SHOAL_ROUTER_BIN", "shoal-router"), "--replay-window-s"),
         "the router's recent-deletes replay on promotion (helper rfail, C6)"),
    ] if not ok]
    if missing:
        pytest.skip("needs " + "; ".join(missing))
    part.start(copies=2, ns="pt")
    pair = part.pair
    part.stable_version()
    doc0 = part.topology()
    if not any("replica" in r for r in ranges_of(doc0)):
        pytest.skip("needs replicas in the slot map for copies 2 (helper ctlfo, C1) and "
                    "replication (helper repl, C2)")
    victim_keys = [k for k in (f"pt:k{i}" for i in range(3000))
                   if primary_of(ranges_of(doc0), key_slot(k))["node"] == N0][:200]
    assert len(victim_keys) >= 100
    mc = McConn(pair, "B", ROUTER)
    for k in victim_keys:
        assert mc.cmd(f"set {k} 0 0 3\r\nold\r\n") == "STORED"
    # on the replicas too before the cut (asynchronous replication: ask the replica itself)
    for k in victim_keys[-5:]:
        rep = primary_of(ranges_of(doc0), key_slot(k))["replica"]
        rc = McConn(pair, "B", rep)
        wait_for(lambda: rc.get(k)[0] == "old", 5, f"{k} on its replica {rep}")
        rc.close()
    assert part.router_metric("shoal_router_nodes_marked_down_total") == 0

    # a client in A writes to n0 directly, as fast as it gets answers
    stop, writes = threading.Event(), []  # (sent, answered, reply)

    def writer():
        c = McConn(pair, "A", N0)
        i = 0
        while not stop.is_set():
            k = victim_keys[i % 50]
            i += 1
            t0 = time.monotonic()
            try:
                r = c.cmd(f"set {k} 0 0 7\r\nA-write\r\n")
            except OSError as e:
                r = type(e).__name__
                c.close()
                c = McConn(pair, "A", N0)
            writes.append((t0, time.monotonic(), r))
            time.sleep(0.005)

    wt = threading.Thread(target=writer)
    wt.start()
    try:
        wait_for(lambda: any(r == "STORED" for _, _, r in writes), 5, "the A-side client's writes")
        pair.cut()
        t_cut = time.monotonic()  # the cut holds from here: no renewal succeeds after it
        # deletes through the router during the partition (B side): half the keys
        deleted = victim_keys[50:150]
        for k in deleted:
            r = mc.cmd(f"delete {k}\r\n")
            assert r in ("DELETED", "NOT_FOUND"), f"delete {k} during the partition: {r}"

        def promoted():
            doc = part.topology()
            if all(r["node"] != N0 for r in ranges_of(doc)):
                return time.monotonic(), doc
            return None

        t_promo, doc1 = wait_for(promoted, 15, "the promotion of n0's replicas", 0.05)
        time.sleep(1.0)  # the A-side client keeps trying past the promotion
    finally:
        stop.set()
        wt.join(10)

    lease_end = t_cut + LEASE_MS / 1000
    late = [(round(s - t_cut, 3), r) for s, a, r in writes if s >= lease_end and r == "STORED"]
    assert not late, f"n0 accepted writes sent after its lease must have ended: {late[:5]}"
    refused = {r for s, a, r in writes if s >= lease_end}
    print(f"A-side writes: {len(writes)}; after the cut accepted until "
          f"{max([a - t_cut for s, a, r in writes if r == 'STORED'] or [0]):.3f} s; promoted "
          f"at {t_promo - t_cut:.3f} s; answers after the lease: {refused}")
    assert refused == {"SERVER_ERROR slot lease expired"}, refused
    assert t_promo >= lease_end - 0.05, \
        f"promoted {t_promo - t_cut:.3f} s after the cut, before n0's lease ran out"
    both = [round(a - t_cut, 3) for s, a, r in writes if r == "STORED" and a >= t_promo]
    assert not both, f"n0 accepted writes after its replica was promoted: {both[:5]}"

    pair.heal()
    # n0 comes back owning nothing (C5); the router and its clients must never see a deleted
    # value again, whatever n0 still holds
    end = time.monotonic() + 5
    served = set()
    rc = McConn(pair, "B", ROUTER)
    while time.monotonic() < end:
        for k in deleted:
            v, err = rc.get(k)
            if v is not None:
                served.add((k, v))
        time.sleep(0.2)
    assert not served, f"values deleted during the partition served after healing: {sorted(served)[:5]}"
    assert all(r["node"] != N0 for r in ranges_of(part.topology())), \
        "n0 is primary again right after healing (it must resync as a replica first)"
