"""shoal-control's side of issue 15 (FAILOVER.md C1, C4, C5) with the real shoal-control and
stand-ins for everything else: fake nodes (a socket answering `version\\r\\n`, closed to play a
dead node), fake node admins (http.server answering /v1/replication and
/v1/replication/handoff) and fake routers (this test POSTs /v1/reports itself).

Shown: a copies-2 namespace gives every range a replica on another node (another zone when
zones are labelled) and its removal takes them away; a node killed while most reporting
routers say down is promoted over within failure timeout + lease + 1 s, in one version, to its
ranges' replicas; a minority saying down, probes still passing, or a blip shorter than the
timeout promote nothing; a copies-1 pool never moves; a node back becomes replica again; a drain
hands off first, then swaps, and refuses ranges without a replica unless forced."""

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mcraw import wait_until
from ports import free_port
from etcdharness import etcd_cluster  # noqa: F401  (a fixture)

FAILURE_MS = 1000
LEASE_STUB_MS = 2000 + 200  # --lease-ms and its margin: fake nodes never renew, so lapsed then


class FakeNode:
    """A data port answering `version` with `VERSION x`; kill() closes it, revive() reopens it on
    the same port."""

    def __init__(self):
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.sock = None
        self.revive()

    def revive(self):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self.sock = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def _accept(self, s):
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        buf = b""
        with c:
            while self.sock is not None:
                try:
                    d = c.recv(4096)
                except OSError:
                    return
                if not d:
                    return
                buf += d
                while b"\r\n" in buf:
                    line, buf = buf.split(b"\r\n", 1)
                    if line == b"version":
                        c.sendall(b"VERSION 1.6.0-fake\r\n")

    def kill(self):
        s, self.sock = self.sock, None
        if s:
            s.shutdown(socket.SHUT_RDWR)
            s.close()


class FakeAdmin:
    """A node's admin port: GET /v1/replication answers `replication` (a dict, changeable);
    POST /v1/replication/handoff is recorded (with the control version at that moment) and
    answered `handoff_status`; namespace pushes and /metrics get 200 {}."""

    def __init__(self, ctl=None):
        self.ctl = ctl
        self.replication = {"replid": "0", "offset": 0, "replicas": [], "primaries": []}
        self.handoff_status = 200
        self.calls = []  # (method, path, body, control version then)
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _reply(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self):
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"null") if n else None

            def do_GET(self):
                fake.calls.append(("GET", self.path, None, None))
                if self.path == "/v1/replication":
                    return self._reply(200, fake.replication)
                return self._reply(200, {})

            def do_POST(self):
                body = self._body()
                version = fake.ctl.version() if fake.ctl else None
                fake.calls.append(("POST", self.path, body, version))
                if self.path == "/v1/replication/handoff":
                    if fake.handoff_status != 200:
                        return self._reply(fake.handoff_status, {"error": "timeout"})
                    return self._reply(200, {"lag_bytes": 0, "offset": 42})
                return self._reply(404, {})

            def do_PUT(self):
                self._body()
                self._reply(200, {})

            def do_DELETE(self):
                self._reply(200, {})

        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class FakeRouters:
    """Routers reporting every 300 ms (well inside --report-stale-ms) what `views` says:
    {router id: {"host:port": "up"|"down"}}."""

    def __init__(self, ctl, views):
        self.ctl, self.views, self.stop_ = ctl, views, False
        self.lock = threading.Lock()
        self.send()
        self.t = threading.Thread(target=self._loop, daemon=True)
        self.t.start()

    def send(self):
        with self.lock:
            views = {r: dict(v) for r, v in self.views.items()}
        for r, nodes in views.items():
            status, body = self.ctl.post("/v1/reports", {"router": r, "nodes": nodes})
            assert status == 200, body

    def set(self, router, node, state):
        with self.lock:
            self.views[router][node] = state
        self.send()

    def _loop(self):
        while not self.stop_:
            time.sleep(0.3)
            if not self.stop_:
                try:
                    self.send()
                except Exception:  # control stopping at the end of the test
                    return

    def stop(self):
        self.stop_ = True
        self.t.join()


@pytest.fixture
def cluster(start_control):
    """Three fake nodes with fake admins in pool main, a copies-2 namespace, three routers all
    saying up. Yields a dict of the parts."""
    made = {"admins": [], "nodes": [], "routers": None}

    def make(*flags, copies=2, zones=None, n=3):
        ctl = start_control(*flags)
        nodes = [FakeNode() for _ in range(n)]
        admins = [FakeAdmin(ctl) for _ in range(n)]
        made["nodes"], made["admins"] = nodes, admins
        entries = []
        for i in range(n):
            e = {"node": nodes[i].addr, "admin": admins[i].addr}
            if zones:
                e["zone"] = zones[i]
            entries.append(e)
        status, body = ctl.post("/v1/pools", {"name": "main", "nodes": entries})
        assert status == 201, body
        status, body = ctl.post("/v1/namespaces", {"name": "orders", "pool": "main",
                                                   "copies": copies, "memory": 3 << 20})
        assert status == 201, body
        routers = FakeRouters(ctl, {f"r{i}": {nd.addr: "up" for nd in nodes} for i in range(3)})
        made["routers"] = routers
        return ctl, nodes, admins, routers

    yield make
    if made["routers"]:
        made["routers"].stop()
    for a in made["admins"]:
        a.stop()
    for nd in made["nodes"]:
        nd.kill()


def ranges(doc, pool="main"):
    return doc["pools"][pool]["slots"]


def owned(doc, node, pool="main"):
    return [(r["from"], r["to"]) for r in ranges(doc, pool) if r["node"] == node]


def failures(ctl):
    status, body = ctl.get("/v1/failures")
    assert status == 200, body
    return body["nodes"]


def node_state(ctl, addr):
    return failures(ctl).get(addr, {}).get("state")


# ---- C1: replicas in slot maps ------------------------------------------------------------------

def test_copies2_namespace_gives_every_range_a_replica_on_another_node(start_control):
    ctl = start_control()
    nodes = [f"127.0.0.1:{23001 + i}" for i in range(3)]
    assert ctl.post("/v1/pools", {"name": "main", "nodes": nodes})[0] == 201
    assert all("replica" not in r for r in ranges(ctl.topology()))
    v = ctl.version()
    status, body = ctl.post("/v1/namespaces", {"name": "orders", "pool": "main", "copies": 2})
    assert status == 201, body
    doc = ctl.topology()
    assert doc["version"] == v + 1  # one version: the namespace and its pool's replicas
    counts = {n: 0 for n in nodes}
    for r in ranges(doc):
        assert r["replica"] in nodes and r["replica"] != r["node"], r
        counts[r["replica"]] += r["to"] - r["from"] + 1
    assert max(counts.values()) - min(counts.values()) <= 1, counts  # spread evenly
    # the pool's view shows each node's replica share
    status, body = ctl.get("/v1/pools/main")
    assert sum(n["replica_slots"] for n in body["pool"]["nodes"]) == 16384


def test_last_copies2_namespace_leaving_removes_the_replicas(start_control):
    ctl = start_control()
    nodes = [f"127.0.0.1:{23011 + i}" for i in range(2)]
    ctl.post("/v1/pools", {"name": "main", "nodes": nodes})
    ctl.post("/v1/namespaces", {"name": "a", "pool": "main", "copies": 2})
    ctl.post("/v1/namespaces", {"name": "b", "pool": "main", "copies": 2})
    assert ctl.delete("/v1/namespaces/a")[0] == 200
    assert all("replica" in r for r in ranges(ctl.topology()))  # b still has copies 2
    assert ctl.put("/v1/namespaces/b", {"copies": 1})[0] == 200
    assert all("replica" not in r for r in ranges(ctl.topology()))


def test_replicas_go_to_another_zone_and_zones_stay_out_of_the_document(start_control):
    ctl = start_control()
    zones = ["a", "a", "b", "b"]
    nodes = [{"node": f"127.0.0.1:{23021 + i}", "zone": zones[i]} for i in range(4)]
    assert ctl.post("/v1/pools", {"name": "main", "nodes": nodes})[0] == 201
    ctl.post("/v1/namespaces", {"name": "orders", "pool": "main", "copies": 2})
    zone = {n["node"]: n["zone"] for n in nodes}
    doc = ctl.topology()
    for r in ranges(doc):
        assert zone[r["replica"]] != zone[r["node"]], r
    assert "zone" not in json.dumps(doc)
    status, body = ctl.get("/v1/pools/main")
    assert [n["zone"] for n in body["pool"]["nodes"]] == zones
    # a node added later keeps its zone too
    status, body = ctl.post("/v1/pools/main/nodes", {"node": "127.0.0.1:23029", "zone": "c"})
    assert status == 200, body
    zone["127.0.0.1:23029"] = "c"
    for r in ranges(ctl.topology()):
        assert zone[r["replica"]] != zone[r["node"]], r


def test_a_bad_zone_is_refused(start_control):
    ctl = start_control()
    status, body = ctl.post("/v1/pools", {"name": "main",
                                          "nodes": [{"node": "127.0.0.1:23031", "zone": "a b"}]})
    assert status == 400 and body["rule"] == "name" and body["field"] == "nodes[0].zone", body


def test_copies2_share_is_twice_memory_over_nodes(start_control):
    ctl = start_control()
    ctl.post("/v1/pools", {"name": "main", "nodes": ["127.0.0.1:23041", "127.0.0.1:23042"]})
    status, body = ctl.post("/v1/namespaces", {"name": "r", "pool": "main", "copies": 2,
                                               "memory": 1 << 30})
    assert body["share"] == (1 << 30)  # 2 x memory / 2 nodes: a primary half and a replica half
    status, body = ctl.post("/v1/namespaces", {"name": "s", "pool": "main", "memory": 1 << 30})
    assert body["share"] == (1 << 29)


# ---- C4: reports ---------------------------------------------------------------------------------

def test_reports_are_checked(start_control):
    ctl = start_control()
    assert ctl.post("/v1/reports", {"router": "r1", "nodes": {"127.0.0.1:1": "up"}}) == (200, {})
    status, body = ctl.post("/v1/reports", {"router": "r1", "nodes": {"127.0.0.1:1": "maybe"}})
    assert status == 400 and body["rule"] == "up_or_down"
    status, body = ctl.post("/v1/reports", {"nodes": {}})
    assert status == 400 and body["field"] == "router"
    assert ctl.metrics()["shoal_control_reports_total"] == 1


# ---- C4 + C5: promotion --------------------------------------------------------------------------

def test_majority_down_and_failing_probes_promote_to_the_replica_in_one_version(cluster):
    ctl, nodes, admins, routers = cluster("--probe-ms", "100")
    dead = nodes[1]
    before = ctl.topology()
    v0 = before["version"]
    victims = [r for r in ranges(before) if r["node"] == dead.addr]
    assert victims and all("replica" in r for r in victims)
    for i, a in enumerate(admins):  # what each says it applied of the dead node's stream
        a.replication = {"replid": "1", "offset": 0, "replicas": [],
                         "primaries": [{"node": dead.addr, "replid": "9", "applied": 100 * i,
                                        "state": "online"}]}
    t0 = time.monotonic()
    dead.kill()
    routers.set("r0", dead.addr, "down")
    routers.set("r1", dead.addr, "down")  # 2 of 3
    doc = wait_until(lambda: (d := ctl.topology())["version"] > v0 and d,
                     timeout=(FAILURE_MS + LEASE_STUB_MS) / 1000 + 1 + 1,
                     interval=0.05, message="a promotion")
    took = time.monotonic() - t0
    assert took <= (FAILURE_MS + LEASE_STUB_MS) / 1000 + 1, took
    assert doc["version"] == v0 + 1  # one version
    assert owned(doc, dead.addr) == []
    own = {s: r["node"] for r in ranges(doc) for s in range(r["from"], r["to"] + 1)}
    for r in victims:  # every range went to its replica
        for s in (r["from"], r["to"]):
            assert own[s] == r["replica"], (r, own[s])
    for r in ranges(doc):  # and nobody names the dead node as replica
        assert r.get("replica") != dead.addr and r.get("replica") != r["node"]
    # the replica was asked what it applied before it was promoted
    promoted_to = {r["replica"] for r in victims}
    for i, nd in enumerate(nodes):
        if nd.addr in promoted_to:
            assert ("GET", "/v1/replication", None, None) in admins[i].calls
    m = ctl.metrics()
    assert m["shoal_control_promotions_total"] == 1
    assert m["shoal_control_nodes_dead"] == 1
    assert 0 < m["shoal_control_promotion_seconds"] < 5
    assert "promoted " in ctl.stderr_text() and f"of {dead.addr} to" in ctl.stderr_text()
    st = failures(ctl)[dead.addr]
    assert st["state"] == "dead" and st["probe"] == "failing" and st["down_reports"] == "2/3"
    assert st["promoted"] is True


def test_a_minority_saying_down_promotes_nothing(cluster):
    ctl, nodes, admins, routers = cluster()
    v0 = ctl.version()
    nodes[0].kill()
    routers.set("r0", nodes[0].addr, "down")  # 1 of 3
    wait_until(lambda: failures(ctl).get(nodes[0].addr, {}).get("probe") == "failing",
               message="control's probe failing")
    time.sleep((FAILURE_MS + LEASE_STUB_MS) / 1000 + 0.5)  # nothing to await: nothing happens
    assert ctl.version() == v0
    assert node_state(ctl, nodes[0].addr) == "up"
    assert failures(ctl)[nodes[0].addr]["down_reports"] == "1/3"


def test_passing_probes_keep_a_node_reported_down_alive(cluster):
    ctl, nodes, admins, routers = cluster()
    v0 = ctl.version()
    for r in ("r0", "r1", "r2"):
        routers.set(r, nodes[2].addr, "down")  # every router says down; control reaches it
    wait_until(lambda: failures(ctl).get(nodes[2].addr, {}).get("down_reports") == "3/3",
               message="the reports counted")
    time.sleep((FAILURE_MS + LEASE_STUB_MS) / 1000 + 0.5)
    assert ctl.version() == v0
    assert failures(ctl)[nodes[2].addr]["probe"] == "ok"
    assert node_state(ctl, nodes[2].addr) == "up"


def test_a_blip_shorter_than_the_failure_timeout_changes_nothing(cluster):
    ctl, nodes, admins, routers = cluster("--failure-timeout-ms", "2000")
    v0 = ctl.version()
    nodes[0].kill()
    for r in ("r0", "r1"):
        routers.set(r, nodes[0].addr, "down")
    wait_until(lambda: node_state(ctl, nodes[0].addr) == "suspect", message="suspect")
    nodes[0].revive()  # back well before 2 s of suspicion
    for r in ("r0", "r1"):
        routers.set(r, nodes[0].addr, "up")
    wait_until(lambda: node_state(ctl, nodes[0].addr) == "up", message="up again")
    time.sleep(2.5)  # past when it would have been dead and promoted
    assert ctl.version() == v0
    assert ctl.metrics()["shoal_control_promotions_total"] == 0


def test_a_copies1_pool_never_moves_a_dead_nodes_ranges(cluster):
    ctl, nodes, admins, routers = cluster(copies=1)
    v0 = ctl.version()
    doc = ctl.topology()
    assert all("replica" not in r for r in ranges(doc))
    nodes[1].kill()
    for r in ("r0", "r1", "r2"):
        routers.set(r, nodes[1].addr, "down")
    time.sleep((FAILURE_MS + LEASE_STUB_MS) / 1000 + 0.5)
    assert ctl.version() == v0
    assert ctl.topology() == doc
    assert failures(ctl).get(nodes[1].addr) is None  # not watched: nothing to promote to


def test_a_node_back_after_promotion_becomes_a_replica_again(cluster):
    ctl, nodes, admins, routers = cluster()
    dead = nodes[0]
    v0 = ctl.version()
    dead.kill()
    for r in ("r0", "r1", "r2"):
        routers.set(r, dead.addr, "down")
    wait_until(lambda: ctl.version() > v0, timeout=6, message="the promotion")
    v1 = ctl.version()
    assert not any(r.get("replica") == dead.addr for r in ranges(ctl.topology()))
    dead.revive()
    for r in ("r0", "r1", "r2"):
        routers.set(r, dead.addr, "up")
    doc = wait_until(lambda: (d := ctl.topology())["version"] > v1 and d, timeout=5,
                     message="the return")
    assert doc["version"] == v1 + 1
    assert owned(doc, dead.addr) == []  # owns nothing: it resyncs before it is ever primary
    mine = sum(r["to"] - r["from"] + 1 for r in ranges(doc) if r.get("replica") == dead.addr)
    assert mine >= 16384 // 3 - 1, mine  # its even share as replica
    assert node_state(ctl, dead.addr) == "up"
    assert ctl.metrics()["shoal_control_returns_total"] == 1


# ---- C5: drain -----------------------------------------------------------------------------------

def test_drain_hands_off_first_then_swaps_node_and_replica(cluster):
    ctl, nodes, admins, routers = cluster()
    node = nodes[0]
    before = ctl.topology()
    v0 = before["version"]
    mine = [r for r in ranges(before) if r["node"] == node.addr]
    status, body = ctl.post(f"/v1/pools/main/nodes/{node.addr}/drain", {})
    assert status == 200, body
    handoffs = [c for c in admins[0].calls if c[1] == "/v1/replication/handoff"]
    # one handoff per replica, each naming it and its ranges, made before the version changed
    assert sorted(h[2]["to"] for h in handoffs) == sorted({r["replica"] for r in mine})
    for h in handoffs:
        assert h[3] == v0
        want = [[r["from"], r["to"]] for r in mine if r["replica"] == h[2]["to"]]
        assert h[2]["slots"] == want
    doc = ctl.topology()
    assert doc["version"] == v0 + 1 == body["version"]
    assert owned(doc, node.addr) == []
    own = {s: (r["node"], r.get("replica")) for r in ranges(doc) for s in range(r["from"], r["to"] + 1)}
    for r in mine:
        assert own[r["from"]] == (r["replica"], node.addr)
    assert sorted((m["from"], m["to"], m["new_node"]) for m in body["moved"]) == \
        sorted((r["from"], r["to"], r["replica"]) for r in mine)
    assert body["failed"] == [] and body["kept"] == []


def test_drain_refuses_ranges_without_a_replica_unless_forced(cluster):
    ctl, nodes, admins, routers = cluster(copies=1)
    v0 = ctl.version()
    status, body = ctl.post(f"/v1/pools/main/nodes/{nodes[1].addr}/drain", {})
    assert status == 409 and body["rule"] == "replica", body
    assert body["ranges"] == [[r["from"], r["to"]] for r in ranges(ctl.topology())
                              if r["node"] == nodes[1].addr]
    assert ctl.version() == v0
    status, body = ctl.post(f"/v1/pools/main/nodes/{nodes[1].addr}/drain", {"force": True})
    assert status == 200, body
    assert body["moved"] == [] and len(body["kept"]) >= 1
    assert ctl.version() == v0
    assert not [c for c in admins[1].calls if c[1] == "/v1/replication/handoff"]


def test_a_failed_handoff_keeps_the_range_and_says_so(cluster):
    ctl, nodes, admins, routers = cluster()
    admins[0].handoff_status = 504
    v0 = ctl.version()
    status, body = ctl.post(f"/v1/pools/main/nodes/{nodes[0].addr}/drain", {})
    assert status == 502, body
    assert body["moved"] == [] and body["failed"] and body["failed"][0]["status"] == 504
    assert ctl.version() == v0


def test_cli_node_drain_prints_the_ranges_moved(cluster):
    import subprocess
    from pathlib import Path
    ctl, nodes, admins, routers = cluster()
    mine = [r for r in ranges(ctl.topology()) if r["node"] == nodes[2].addr]
    cli = Path(__file__).resolve().parents[2] / "build/bin/shoal"
    p = subprocess.run([str(cli), "node", "drain", "main", nodes[2].addr, "--control",
                        f"http://127.0.0.1:{ctl.port}"], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 0, p.stderr
    for r in mine:
        assert f"{r['from']}-{r['to']}" in p.stdout and r["replica"] in p.stdout, p.stdout
    assert "drained: " in p.stdout and "moved" in p.stdout
    assert owned(ctl.topology(), nodes[2].addr) == []
    # again: nothing left to move
    p = subprocess.run([str(cli), "node", "drain", "main", nodes[2].addr, "--control",
                        f"http://127.0.0.1:{ctl.port}"], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 0 and "drained: 0 slots" in p.stdout, (p.stdout, p.stderr)


def test_a_dead_node_can_be_replaced_and_the_state_reloads(cluster, start_control):
    ctl, nodes, admins, routers = cluster()
    dead = nodes[1]
    v0 = ctl.version()
    dead.kill()
    for r in ("r0", "r1", "r2"):
        routers.set(r, dead.addr, "down")
    wait_until(lambda: ctl.version() > v0, timeout=6, message="the promotion")
    # the promoted map is not even: it stays valid across a restart
    routers.stop()
    ctl.kill9()
    ctl = start_control(data_dir=ctl.data_dir)
    assert owned(ctl.topology(), dead.addr) == []
    # replace: remove the dead node (nothing moves: it owns nothing), add a new one
    status, body = ctl.delete(f"/v1/pools/main/nodes/{dead.addr}")
    assert status == 200 and body["moved"] == 0, body
    status, body = ctl.post("/v1/pools/main/nodes", {"node": "127.0.0.1:23099"})
    assert status == 200 and body["moved"] == 16384 // 3, body
    doc = ctl.topology()
    for r in ranges(doc):
        assert r["replica"] != r["node"] and dead.addr not in (r["node"], r["replica"])
    assert sum(r["to"] - r["from"] + 1 for r in ranges(doc) if r["replica"] == "127.0.0.1:23099") > 0


def test_a_standby_forwards_reports_to_the_leader(etcd_cluster, start_control):
    import uuid
    prefix = f"/shoal-test-{uuid.uuid4().hex[:8]}/"
    ctls = [start_control("--etcd", etcd_cluster.urls, "--etcd-prefix", prefix) for _ in range(2)]

    def leader():
        ls = [c for c in ctls if c.metrics().get("shoal_control_leader") == 1]
        return ls[0] if len(ls) == 1 else None

    lead = wait_until(leader, timeout=10, message="one leader")
    standby = [c for c in ctls if c is not lead][0]
    status, body = standby.post("/v1/reports", {"router": "r9", "nodes": {"127.0.0.1:1": "down"}})
    assert status == 200, body
    assert lead.metrics()["shoal_control_reports_total"] == 1
    assert standby.metrics()["shoal_control_reports_total"] == 0
    assert "r9" in lead.get("/v1/failures")[1]["routers"]
    assert standby.get("/v1/failures")[1]["routers"] == {}
