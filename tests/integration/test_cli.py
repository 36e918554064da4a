"""The shoal CLI (build/bin/shoal, or SHOAL_CLI_BIN): `shoal up` starts a whole local cluster
(shoal-control, three nodes, a gutter node, a router following the control plane) in a temporary
directory on free ports, and every other command is checked against that cluster and its control
plane's API. The fixture always ends with `shoal down` and then kills by pid whatever is left, so
a failing test leaves no process behind."""

from http.server import BaseHTTPRequestHandler, HTTPServer
import json
import os
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
from pymemcache.client.base import Client

from conftest import REPO_ROOT
from mcraw import free_port, http, wait_until

pytestmark = pytest.mark.shoal_only

SHOAL = REPO_ROOT / os.environ.get("SHOAL_CLI_BIN", "build/bin/shoal")
UP_TIMEOUT = 120  # the sanitizer build starts slowly on a shared machine


# `shoal up` keeps the local cluster's admin token under XDG_CONFIG_HOME: one for these tests,
# not the user's
CONFIG_HOME = tempfile.mkdtemp(prefix="shoal-cli-config-")


def run(*args, cwd_dir=None, check=None, timeout=UP_TIMEOUT, env=None):
    """Run shoal with args; (returncode, stdout, stderr). check=0 asserts success."""
    e = dict(os.environ)
    e["XDG_CONFIG_HOME"] = CONFIG_HOME
    e.update(env or {})
    p = subprocess.run([str(SHOAL), *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, env=e, stdin=subprocess.DEVNULL)
    if check is not None:
        assert p.returncode == check, (f"shoal {' '.join(map(str, args))}: exit {p.returncode}\n"
                                       f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p.returncode, p.stdout, p.stderr


def recorded_pids(d):
    """(pid, argv0) of every process DIR/cluster.json records."""
    try:
        rec = json.loads((Path(d) / "cluster.json").read_text())
    except (OSError, ValueError):
        return []
    out = [(p["pid"], p["argv0"]) for p in rec.get("processes", []) if p.get("pid")]
    sup = rec.get("supervisor")
    if sup:
        out.append((sup["pid"], sup["argv0"]))
    return out


def running(pid, argv0):
    """Does pid still run argv0 (not a zombie, not a reused pid)?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X") and cmd == argv0


class Local:
    """A cluster started by `shoal up` in its own directory."""

    def __init__(self, d, port, admin, control_port):
        self.dir, self.port, self.admin, self.control_port = Path(d), port, admin, control_port
        self.control = f"http://127.0.0.1:{control_port}"

    def shoal(self, *args, **kw):
        return run(*args, "--dir", self.dir, **kw)

    def json(self, *args):
        rc, out, err = self.shoal(*args, "--json", check=0)
        return json.loads(out)

    def api(self, method, path, body=None):
        status, text = http(self.control_port, method, path, body)
        return status, (json.loads(text) if text else None)

    def client(self):
        return Client(("127.0.0.1", self.port), connect_timeout=5, timeout=5)

    def up_args(self):
        return ("up", "--dir", self.dir, "--port", self.port, "--admin-port", self.admin,
                "--control-port", self.control_port, "--node-args", "-m 64 -t 2")


def kill_leftovers(d):
    for pid, argv0 in recorded_pids(d):
        if running(pid, argv0):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def local(tmp_path):
    c = Local(tmp_path / "cluster", free_port(), free_port(), free_port())
    try:
        rc, out, err = run(*c.up_args())
        assert rc == 0, f"shoal up failed ({rc}):\n{out}\n{err}"
        c.up_output = out
        yield c
    finally:
        run("down", "--dir", c.dir, "--timeout", "20")
        kill_leftovers(c.dir)
    # the daemons are not the test's children: their sanitizer reports are in their logs
    for log in sorted((c.dir / "logs").glob("*.log")):
        text = log.read_text(errors="replace")
        assert "Sanitizer" not in text and "runtime error:" not in text, f"{log}:\n{text[-3000:]}"


def test_up_prints_what_runs_where_and_serves_through_the_router(local):
    for name in ("control", "node1", "node2", "node3", "gutter", "router"):
        assert any(line.strip().startswith(name + " ") for line in local.up_output.splitlines()), \
            f"the table lists {name}:\n{local.up_output}"
    assert local.control in local.up_output, "the control plane's URL is printed"
    line = next((l for l in local.up_output.splitlines() if "dashboard" in l), "")
    assert f"{local.control}/ " in line + " ", f"the dashboard's URL is printed:\n{local.up_output}"
    status, page = http(local.control_port, "GET", "/")
    assert status == 200 and "<html" in page.lower(), "the printed dashboard URL serves the page"
    assert f"127.0.0.1:{local.port}" in local.up_output
    c = local.client()
    for i in range(50):
        assert c.set(f"user:{i}", f"v{i}") is True
    assert c.get_many([f"user:{i}" for i in range(50)]) == {f"user:{i}": f"v{i}".encode()
                                                             for i in range(50)}


def test_status_json_matches_the_cluster(local):
    c = local.client()
    for i in range(60):
        c.set(f"k{i}", "x")
        c.get(f"k{i}")
    st = local.json("status")
    _, topo = local.api("GET", "/v1/topology")
    assert st["version"] == topo["version"]
    nodes = st["nodes"]
    assert len(nodes) == 4 and all(n["healthy"] for n in nodes), nodes
    main = [n for n in nodes if n["pool"] == "main"]
    assert sorted(n["node"] for n in main) == sorted(topo["pools"]["main"]["nodes"])
    assert sum(n["slots"] for n in main) == 16384
    assert sum(n["items"] for n in main) >= 60, "every key set through the router is counted"
    assert all(n["get_hits"] >= 1 for n in main) and st["healthy"] is True
    assert [r["topology_version"] for r in st["routers"]] == [topo["version"]]


def test_status_table_names_every_node_and_the_version(local):
    rc, out, err = local.shoal("status", check=0)
    _, topo = local.api("GET", "/v1/topology")
    assert f"topology version {topo['version']}" in out
    for addr in topo["pools"]["main"]["nodes"] + topo["pools"]["gutter"]["nodes"]:
        line = next((l for l in out.splitlines() if addr in l), None)
        assert line and " ok " in line, f"{addr} listed healthy:\n{out}"


def test_ns_create_show_update_delete_round_trip(local):
    local.shoal("ns", "create", "feed", "--memory", "64m", "--default-ttl", "60", "--max-ttl",
                "600", "--eviction", "lfu", "--team", "web", "--copies", "2", check=0)
    status, got = local.api("GET", "/v1/namespaces/feed")
    assert status == 200
    ns = got["namespace"]
    assert (ns["memory"], ns["default_ttl"], ns["max_ttl"], ns["eviction"], ns["team"],
            ns["copies"], ns["pool"]) == (64 << 20, 60, 600, "lfu", "web", 2, "main")
    assert "feed" in local.json("ns", "list")["namespaces"]
    assert local.json("ns", "show", "feed")["namespace"] == ns
    rc, out, _ = local.shoal("ns", "show", "feed", check=0)
    assert "64M" in out and "lfu" in out

    local.shoal("ns", "update", "feed", "--memory", "33554432", "--eviction", "s3fifo", check=0)
    ns2 = local.api("GET", "/v1/namespaces/feed")[1]["namespace"]
    assert (ns2["memory"], ns2["eviction"], ns2["max_ttl"]) == (32 << 20, "s3fifo", 600)

    local.shoal("ns", "update", "feed", "--memory", "1g", check=0)
    assert local.api("GET", "/v1/namespaces/feed")[1]["namespace"]["memory"] == 1 << 30

    local.shoal("ns", "delete", "feed", check=0)
    assert local.api("GET", "/v1/namespaces/feed")[0] == 404


def test_a_refusal_is_printed_readably_and_fails(local):
    before = local.api("GET", "/v1/topology")[1]["version"]
    rc, out, err = local.shoal("ns", "create", "bad", "--default-ttl", "600", "--max-ttl", "60")
    assert rc == 1
    assert "longer than max_ttl" in err and "field: default_ttl" in err, err
    assert local.api("GET", "/v1/namespaces/bad")[0] == 404
    assert local.api("GET", "/v1/topology")[1]["version"] == before


def test_a_bad_size_is_refused_before_any_request(local):
    rc, out, err = local.shoal("ns", "create", "x", "--memory", "12q")
    assert rc == 2 and "--memory 12q is not a size" in err
    assert local.api("GET", "/v1/namespaces/x")[0] == 404


def test_an_unreachable_control_plane_says_what_to_do(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    rc, out, err = run("ns", "list", "--control", url, "--dir", tmp_path)
    assert rc == 1
    assert f"cannot reach the control plane at {url}" in err and "shoal up" in err, err


def test_node_add_and_remove_change_pool_show(local):
    extra = f"127.0.0.1:{free_port()}"
    rc, out, _ = local.shoal("node", "add", "main", extra, check=0)
    assert "adding" in out and "added" in out
    pool = local.json("pool", "show", "main")["pool"]
    slots = {n["node"]: n["slots"] for n in pool["nodes"]}
    assert len(slots) == 4 and slots[extra] == 16384 // 4
    rc, out, _ = local.shoal("status")
    assert rc == 1, "a node that is down makes status fail"
    assert any(extra in l and "DOWN" in l for l in out.splitlines()), out
    local.shoal("node", "remove", "main", extra, check=0)
    pool = local.json("pool", "show", "main")["pool"]
    assert extra not in [n["node"] for n in pool["nodes"]] and len(pool["nodes"]) == 3


def test_top_shows_ops_per_second_under_load(local):
    local.shoal("ns", "create", "hot", check=0)
    stop = threading.Event()

    def load():
        c = local.client()
        i = 0
        while not stop.is_set():
            c.set(f"hot:{i % 100}", "v")
            c.get(f"hot:{i % 100}")
            i += 1

    t = threading.Thread(target=load, daemon=True)
    t.start()
    try:
        # the node learns of "hot" by a push: until then its keys count under default
        wait_until(lambda: local.api("GET", "/v1/namespaces/hot")[1]["nodes"] and all(
            n["in_place"] for n in local.api("GET", "/v1/namespaces/hot")[1]["nodes"].values()),
            timeout=10, message="hot's settings on every node")
        rc, out, err = local.shoal("top", "--iterations", "2", "--json", check=0)
    finally:
        stop.set()
        t.join()
    frames = [json.loads(line) for line in out.splitlines()]
    assert len(frames) == 2
    assert frames[-1]["namespaces"]["hot"]["ops_per_sec"] > 0, frames[-1]
    assert frames[-1]["namespaces"]["hot"]["hit_ratio"] > 0.5


def test_second_up_is_refused(local):
    rc, out, err = run(*local.up_args())
    assert rc == 1 and "already running" in err, err
    assert local.client().set("still", "up") is True


def test_down_stops_every_process(local):
    pids = recorded_pids(local.dir)
    assert len(pids) == 6 and all(running(p, a) for p, a in pids)
    rc, out, _ = local.shoal("down", check=0)
    for name in ("router", "gutter", "node1", "node2", "node3", "control"):
        assert f"stopped {name}" in out, out
    assert not any(running(p, a) for p, a in pids), "no process is left"
    rc, out, _ = local.shoal("down", check=0)
    assert "nothing to stop" in out


def test_up_again_after_down_keeps_namespaces_and_node_ports(local):
    local.shoal("ns", "create", "kept", "--memory", "16m", check=0)
    nodes = local.api("GET", "/v1/pools/main")[1]["pool"]["nodes"]
    local.shoal("down", check=0)
    rc, out, err = run(*local.up_args())
    assert rc == 0, err
    ns = local.api("GET", "/v1/namespaces/kept")[1]
    assert ns["namespace"]["memory"] == 16 << 20
    assert local.api("GET", "/v1/pools/main")[1]["pool"]["nodes"] == nodes
    assert local.json("status")["healthy"] is True


def test_foreground_up_is_stopped_by_down(tmp_path):
    c = Local(tmp_path / "fg", free_port(), free_port(), free_port())
    log = open(tmp_path / "fg.log", "w+")
    # started by a relative path, as scripts/run.sh does
    proc = subprocess.Popen([os.path.relpath(SHOAL, REPO_ROOT), *map(str, c.up_args()),
                             "--foreground"], cwd=REPO_ROOT, stdout=log,
                            env=dict(os.environ, XDG_CONFIG_HOME=CONFIG_HOME),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: "cluster is up" in (tmp_path / "fg.log").read_text()
                   or proc.poll() is not None, timeout=UP_TIMEOUT, message="shoal up --foreground")
        assert proc.poll() is None, (tmp_path / "fg.log").read_text()
        pids = recorded_pids(c.dir)
        assert len(pids) == 7, "six processes and the foreground shoal itself"
        rc, out, _ = c.shoal("down", check=0)
        assert "stopped the foreground `shoal up`" in out, out
        assert proc.wait(timeout=60) == 0, "stopped by a signal, not by a death"
        assert not any(running(p, a) for p, a in pids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_leftovers(c.dir)
        log.close()


def test_a_node_that_cannot_start_fails_up_and_leaves_nothing(tmp_path):
    c = Local(tmp_path / "bad", free_port(), free_port(), free_port())
    try:
        args = list(c.up_args())
        args[args.index("--node-args") + 1] = "--no-such-flag"
        rc, out, err = run(*args)
        assert rc == 1 and "node1 exited at start" in err, err
        assert "stopped control" in out
        assert not any(running(p, a) for p, a in recorded_pids(c.dir))
    finally:
        kill_leftovers(c.dir)


def test_shoal_token_is_sent_as_a_bearer_token(tmp_path):
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            body = b'{"version": 1, "namespaces": {}}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        run("ns", "list", "--control", url, "--dir", tmp_path, env={"SHOAL_TOKEN": "s3cret"},
            check=0)
        env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "no-config"))
        env.pop("SHOAL_TOKEN", None)
        subprocess.run([str(SHOAL), "ns", "list", "--control", url, "--dir", str(tmp_path)],
                       env=env, capture_output=True, timeout=30, check=True)
    finally:
        srv.shutdown()
        srv.server_close()
    assert seen == ["Bearer s3cret", None]


def test_help_lists_commands_and_flags(tmp_path):
    rc, out, _ = run("--help", check=0)
    for cmd in ("up", "down", "ns create", "pool show", "node add", "status", "top"):
        assert cmd in out
    rc, out, _ = run("ns", "create", "--help", check=0)
    assert "--memory SIZE" in out and "--eviction" in out and "--control URL" in out
    rc, out, err = run("ns", "create")
    assert rc == 2 and "missing arguments" in err
