"""shoal-router's topology: an invalid document at start stops the router with a message naming the
field; SIGHUP and PUT /v1/topology swap in a newer document while requests flow, with none failed;
an invalid or older document on reload is refused and the running one kept. Skipped when
SHOAL_TEST_SERVER=memcached."""

import json
import signal
import subprocess
import threading
import time

import pytest

from conftest import ROUTER_BIN, topology
from mcraw import McRaw, http, wait_until

pytestmark = pytest.mark.shoal_only


def run_router(tmp_path, doc):
    path = tmp_path / "bad.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return subprocess.run([str(ROUTER_BIN), "-p", "0", "--config", str(path)],
                          capture_output=True, text=True, timeout=10)


@pytest.mark.parametrize("doc,field", [
    ("{not json", "not valid JSON"),
    ({"pools": {"main": {"nodes": ["127.0.0.1:1"]}}, "namespaces": {"default": {"pool": "main"}}},
     "version"),
    ({"version": 1, "pools": {"main": {"nodes": ["localhost"]}},
      "namespaces": {"default": {"pool": "main"}}}, "pools.main.nodes[0]"),
    ({"version": 1, "pools": {"main": {"nodes": ["127.0.0.1:1"]}},
      "namespaces": {"default": {"pool": "other"}}}, "namespaces.default.pool"),
    ({"version": 1, "pools": {"main": {"nodes": ["127.0.0.1:1"]}}, "gutter_pool": "g",
      "namespaces": {"default": {"pool": "main"}}}, "gutter_pool"),
])
def test_invalid_topology_at_start_names_the_field(tmp_path, doc, field):
    res = run_router(tmp_path, doc)
    assert res.returncode == 2, res.stderr
    assert field in res.stderr and "bad.json" in res.stderr, res.stderr


def test_missing_config_is_refused(tmp_path):
    res = subprocess.run([str(ROUTER_BIN), "-p", "0"], capture_output=True, text=True, timeout=10)
    assert res.returncode == 2 and "--config" in res.stderr


def test_help_lists_router_flags():
    res = subprocess.run([str(ROUTER_BIN), "--help"], capture_output=True, text=True, timeout=10)
    assert res.returncode == 0
    for flag in ("-p", "-l", "-t", "-c", "--admin-port", "--timeout-ms", "--config"):
        assert flag in res.stdout, f"--help mentions {flag}"


def test_sighup_applies_a_newer_topology(cluster):
    r = cluster.raw()
    two = cluster.nodes[:2]
    cluster.reload(topology(two, version=2))
    keys = [f"after:{i}" for i in range(60)]
    for k in keys:
        assert r.store("set", k, "v") == "STORED"
    for k in keys:
        owner = cluster.owner(k, two)
        assert McRaw(owner.host, owner.port).meta(f"mg {k} v").code == "VA", \
            f"{k} is routed by the two-node map of version 2"
    assert not any(McRaw(n.host, n.port).meta(f"mg {k}").code == "HD"
                   for n in cluster.nodes[2:] for k in keys), "the removed node gets nothing"


def test_invalid_reload_keeps_the_running_topology(cluster):
    r = cluster.raw()
    cluster.write_topology('{"version": 5, "pools": ')
    cluster.router.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "reload failed" in cluster.router.stderr_text(), message="the refusal logged")
    assert "keeping version 1" in cluster.router.stderr_text()
    assert cluster.version() == 1
    assert r.store("set", "still", "ok") == "STORED"
    assert r.get("still") == [("still", 0, b"ok", None)]


def test_older_version_is_refused(cluster):
    cluster.reload(topology(cluster.nodes, version=3))
    cluster.write_topology(topology(cluster.nodes[:1], version=2))
    cluster.router.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "not newer" in cluster.router.stderr_text(), message="the refusal logged")
    assert cluster.version() == 3


def test_admin_put_topology(cluster):
    doc = topology(cluster.nodes, version=7)
    doc["gutter_ttl"] = 5
    doc["namespaces"]["catalog"] = {"pool": "main", "default_ttl": 600, "max_ttl": 3600,
                                    "max_value_bytes": 1000, "ops_per_sec": 50}
    status, body = http(cluster.admin_port, "PUT", "/v1/topology", doc)
    assert status == 200 and json.loads(body) == doc
    status, body = http(cluster.admin_port, "GET", "/v1/topology")
    assert status == 200 and json.loads(body) == doc, "GET gives back every field as loaded"
    bad = topology(cluster.nodes, version=8)
    bad["namespaces"]["default"]["pool"] = "nope"
    status, body = http(cluster.admin_port, "PUT", "/v1/topology", bad)
    assert status == 400 and "namespaces.default.pool" in body
    status, body = http(cluster.admin_port, "PUT", "/v1/topology", topology(cluster.nodes, version=6))
    assert status == 409
    assert cluster.version() == 7


def test_reload_under_load_fails_no_request(cluster):
    """Clients hammer the router with sets and multi-gets while the topology changes between two
    and three nodes; every request must get a well-formed, non-error reply."""
    stop = threading.Event()
    errors, counts = [], []

    def load(t):
        n = 0
        try:
            c = cluster.raw()
            while not stop.is_set():
                k = f"load{t}:{n % 200}"
                reply = c.store("set", k, str(n))
                if reply != "STORED":
                    errors.append(f"set {k}: {reply}")
                got = c.get(k, f"load{t}:{(n * 7) % 200}", f"other{n % 50}")
                for item in got:
                    if not item[0].startswith(("load", "other")):
                        errors.append(f"bad item {item}")
                m = c.meta(f"mg {k} v")
                if m.code not in ("VA", "EN"):
                    errors.append(f"mg {k}: {m.line}")
                n += 1
        except Exception as e:
            errors.append(repr(e))
        counts.append(n)

    threads = [threading.Thread(target=load, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    try:
        version = 1
        for i in range(10):
            time.sleep(0.1)
            version += 1
            nodes = cluster.nodes[:2] if i % 2 == 0 else cluster.nodes
            cluster.reload(topology(nodes, version=version))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == [], errors[:10]
    assert sum(counts) > 200, f"the load ran: {counts}"
    assert cluster.version() == 11
