"""A whole failover cluster of real binaries for issue 15's end-to-end tests, and the load and
observation helpers they share.

The fixture `failover_cluster` is a factory: failover_cluster(control_flags=(), router_flags=())
starts, with conftest's and controlharness's starters (so every process is stopped, and checked
for a clean exit, after the test):
  - shoal-control (controlharness.start_control),
  - three shoal-nodes following it (--control, --advertise 127.0.0.1:PORT, --admin-port), pool
    "main", zones z0..z2,
  - a gutter node (pool "gutter"),
  - the namespace NS with copies 2 (`shoal ns create NS --copies 2`),
  - a shoal-router following control (--control, no --config),
and returns a FailoverCluster once the router holds control's version and every replica is
online. Writer and TopologySampler are the load and the observer the tests run beside it.
"""

import json
import os
import random
import signal
import subprocess
import threading
import time

import pytest

from conftest import REPO_ROOT, key_slot, pause_server, restart_server, resume_server
from mcraw import McRaw, free_port, http, scrape_metrics, wait_until

NS = "e2e"
CLI_BIN = REPO_ROOT / os.environ.get("SHOAL_CLI_BIN", "build/bin/shoal")


class FailoverCluster:
    def __init__(self, control, nodes, admins, gutter, router, router_admin):
        self.control, self.nodes, self.admins = control, nodes, admins
        self.gutter, self.router, self.router_admin = gutter, router, router_admin
        self.url = f"http://127.0.0.1:{control.port}"

    # --- addresses and documents ---
    def addr(self, i):
        return f"127.0.0.1:{self.nodes[i].port}"

    def topology(self):
        return self.control.topology()

    def version(self):
        return self.control.version()

    @staticmethod
    def ranges(doc, pool="main"):
        return doc["pools"][pool]["slots"]

    def owner_map(self, doc):
        """{slot range (from, to): (node, replica or None)} of pool main."""
        return {(r["from"], r["to"]): (r["node"], r.get("replica")) for r in self.ranges(doc)}

    def role_of_slot(self, doc, slot):
        """(node, replica) of the range holding slot."""
        for r in self.ranges(doc):
            if r["from"] <= slot <= r["to"]:
                return r["node"], r.get("replica")
        raise AssertionError(f"slot {slot} in no range")

    # --- processes ---
    def kill9(self, i):
        p = self.nodes[i].proc
        self.nodes[i].killed = True  # the fixture's check at the end expects it dead
        p.send_signal(signal.SIGKILL)
        p.wait(5)

    def restart(self, i):
        restart_server(self.nodes[i])
        self.nodes[i].killed = False
        wait_until(lambda: self.admin_ok(i), timeout=10, message="the restarted node's admin port")

    def pause(self, i):
        pause_server(self.nodes[i])

    def resume(self, i):
        resume_server(self.nodes[i])

    # --- figures ---
    def admin_ok(self, i):
        try:
            return http(self.admins[i], "GET", "/healthz")[0] == 200
        except OSError:
            return False

    def replication(self, i):
        status, body = http(self.admins[i], "GET", "/v1/replication")
        assert status == 200, body
        return json.loads(body)

    def failures(self):
        status, body = self.control.get("/v1/failures")
        assert status == 200, body
        return body["nodes"]

    def lease_held(self, i, version):
        m = scrape_metrics(self.admins[i])
        return (m.get("shoal_node_lease_fenced") == 0 and m.get("shoal_node_lease_valid") == 1
                and m.get("shoal_node_lease_version", 0) >= version)

    def router_metrics(self):
        return scrape_metrics(self.router_admin)

    def router_version(self):
        return self.router_metrics().get("shoal_router_topology_version", 0)

    def wait_router_version(self, v, timeout=10):
        wait_until(lambda: self.router_version() >= v, timeout=timeout,
                   message=f"the router to hold topology version {v}")

    def replicas_online(self):
        """Every (primary, replica) pair named by the slot map is online on the primary."""
        doc = self.topology()
        want = {(n, r) for n, r in self.owner_map(doc).values() if r}
        for i in range(len(self.nodes)):
            addr = self.addr(i)
            states = {x["node"]: x["state"] for x in self.replication(i).get("replicas", [])}
            for n, r in want:
                if n == addr and states.get(r) != "online":
                    return False
        return True

    def drain(self, i, timeout=30):
        """`shoal node drain main HOST:PORT`: the CompletedProcess."""
        return subprocess.run([str(CLI_BIN), "node", "drain", "main", self.addr(i), "--control",
                               self.url], capture_output=True, text=True, timeout=timeout)

    def keys_of(self, prefix, n, pred):
        """n keys prefix+str(k) whose slot satisfies pred(slot)."""
        out, k = [], 0
        while len(out) < n:
            key = f"{prefix}{k}"
            if pred(key_slot(key)):
                out.append(key)
            k += 1
        return out


@pytest.fixture
def failover_cluster(start_control, start_server, start_router):
    def make(control_flags=(), router_flags=(), node_flags=()):
        ctl = start_control(*control_flags)
        url = f"http://127.0.0.1:{ctl.port}"
        nodes, admins = [], []
        for i in range(4):
            port, admin = free_port(), free_port()
            nodes.append(start_server("--control", url, "--advertise", f"127.0.0.1:{port}",
                                      "--admin-port", str(admin), *node_flags, port=port))
            admins.append(admin)
        entries = [{"node": f"127.0.0.1:{nodes[i].port}", "admin": f"127.0.0.1:{admins[i]}",
                    "zone": f"z{i}"} for i in range(3)]
        status, body = ctl.post("/v1/pools", {"name": "main", "nodes": entries})
        assert status == 201, body
        status, body = ctl.post("/v1/pools", {"name": "gutter", "gutter": True, "nodes": [
            {"node": f"127.0.0.1:{nodes[3].port}", "admin": f"127.0.0.1:{admins[3]}"}]})
        assert status == 201, body
        r = subprocess.run([str(CLI_BIN), "ns", "create", NS, "--pool", "main", "--copies", "2",
                            "--control", url], capture_output=True, text=True, timeout=20)
        assert r.returncode == 0, r.stdout + r.stderr
        router, radmin, _ = start_router(None, "--control", url, *router_flags)
        c = FailoverCluster(ctl, nodes[:3], admins[:3], nodes[3], router, radmin)
        doc = c.topology()
        assert all(r.get("replica") for r in c.ranges(doc)), doc
        c.wait_router_version(doc["version"])
        wait_until(c.replicas_online, timeout=15, interval=0.1,
                   message="every replica online on its primary")
        # until a node's first lease it fences the slots it is primary of (writes then get
        # SERVER_ERROR slot lease expired): the load starts once none does
        wait_until(lambda: all(c.lease_held(i, doc["version"]) for i in range(3)), timeout=10,
                   message="every node holding a lease for the document")
        return c

    return make


def value_of(key, seq, size):
    head = f"{key}|{seq}|".encode()
    return head + b"v" * max(0, size - len(head))


def seq_of(value):
    """The sequence number written into a value by value_of."""
    return int(value.split(b"|", 2)[1])


def mixed_size(rng):
    """100 B .. 200 KB, mostly small."""
    x = rng.random()
    if x < 0.7:
        return rng.randint(100, 2000)
    if x < 0.9:
        return rng.randint(2000, 50_000)
    return rng.randint(50_000, 200_000)


class Writer(threading.Thread):
    """Sets (mixed sizes) and deletes through the router on its own keys, one at a time, as fast
    as it goes. Per key it keeps every acknowledged operation as (time acked, seq or None for a
    delete) and the last one; any reply other than STORED / DELETED / NOT_FOUND (or none) is an
    error, kept with its time, and makes that key's state unknown from then on."""

    def __init__(self, port, keys, seed, delete_share=0.15, size=None):
        super().__init__(daemon=True)
        self.size = size or mixed_size
        self.port, self.keys, self.delete_share = port, list(keys), delete_share
        self.rng = random.Random(seed)
        self.history = {k: [] for k in self.keys}  # key -> [(t_acked, seq or None)]
        self.errors = []  # (time, key, what, value size or None for a delete)
        self.unknown = set()
        self.ops = 0
        self.stop_ev = threading.Event()
        self.keys_lock = threading.Lock()

    def use_keys(self, keys):
        """From the next operation on, write these keys instead."""
        with self.keys_lock:
            self.keys = list(keys)
            for k in keys:
                self.history.setdefault(k, [])

    def run(self):
        seq = 0
        conn = McRaw("127.0.0.1", self.port, timeout=5)
        try:
            while not self.stop_ev.is_set():
                with self.keys_lock:
                    key = self.rng.choice(self.keys)
                seq += 1
                size = None if self.rng.random() < self.delete_share else self.size(self.rng)
                try:
                    if size is None:
                        reply = conn.cmd(f"delete {key}")
                        ok, s = reply in ("DELETED", "NOT_FOUND"), None
                    else:
                        reply = conn.store("set", key, value_of(key, seq, size))
                        ok, s = reply == "STORED", seq
                except Exception as e:  # no reply: the state of the key is unknown
                    reply, ok = f"no reply: {e!r}", False
                    conn.close()
                    conn = McRaw("127.0.0.1", self.port, timeout=5)
                now = time.monotonic()
                if ok:
                    self.history[key].append((now, s))
                else:
                    self.errors.append((now, key, reply, size))
                    self.unknown.add(key)
                self.ops += 1
        finally:
            conn.close()

    def finish(self):
        self.stop_ev.set()
        self.join(30)
        assert not self.is_alive(), "the writer did not stop"

    def last(self, key, before=None):
        """(t, seq or None) of the last acknowledged operation on key (before `before`), or
        None when there was none."""
        h = [e for e in self.history.get(key, []) if before is None or e[0] < before]
        return h[-1] if h else None


def router_get(conn, key):
    """The value the router serves for key, or None."""
    items = conn.get(key)
    return items[0][2] if items else None


class TopologySampler(threading.Thread):
    """Control's topology every `interval` s: [(monotonic time, version, document)] of every
    version seen, so a test can tell when a change was first published."""

    def __init__(self, control, interval=0.02):
        super().__init__(daemon=True)
        self.control, self.interval = control, interval
        self.seen, self.stop_ev, self.errors = [], threading.Event(), 0

    def run(self):
        last = None
        while not self.stop_ev.is_set():
            try:
                doc = self.control.topology()
            except (OSError, AssertionError):
                self.errors += 1
                doc = None
            if doc and doc["version"] != last:
                last = doc["version"]
                self.seen.append((time.monotonic(), last, doc))
            self.stop_ev.wait(self.interval)

    def finish(self):
        self.stop_ev.set()
        self.join(5)

    def first(self, pred, after=0.0):
        """(time, version, doc) of the first version seen at or after `after` satisfying pred."""
        return next(((t, v, d) for t, v, d in self.seen if t >= after and pred(d)), None)
