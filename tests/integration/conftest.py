"""Integration-test harness: starts a real cache server per test and hands tests a way to talk to it.

The server under test is chosen by SHOAL_TEST_SERVER:
  shoal      (default) build/bin/shoal-node, or the path in SHOAL_NODE_BIN (relative to the repo root)
  memcached  /usr/bin/memcached (or SHOAL_MEMCACHED_BIN), the reference every test must agree with

Both are started with memcached's flags: -p PORT -l 127.0.0.1 -U 0 -t 2 -m 64 (+ -u root when
running as root), plus whatever a test asks for. Each server gets a free loopback port, is waited
for by polling connect() with a deadline, and is stopped after the test; its stderr goes to a temp
file that is attached to the report of a failed test.

Fixtures:
  server           a fresh server with the default flags, per test
  start_server     factory: start_server("-m", "2") -> Server with extra flags (stopped after the test)
  mc / raw         a pymemcache Client / an McRaw connection to `server`
"""

import ctypes
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from pymemcache.client.base import Client

from mcraw import McRaw, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVER_KIND = os.environ.get("SHOAL_TEST_SERVER", "shoal")
READY_TIMEOUT = 10.0
STOP_TIMEOUT = 5.0


def server_binary():
    if SERVER_KIND == "memcached":
        return Path(os.environ.get("SHOAL_MEMCACHED_BIN", "/usr/bin/memcached"))
    if SERVER_KIND == "shoal":
        rel = os.environ.get("SHOAL_NODE_BIN", "build/bin/shoal-node")
        path = Path(rel)
        return path if path.is_absolute() else REPO_ROOT / path
    raise pytest.UsageError(f"SHOAL_TEST_SERVER must be 'shoal' or 'memcached', not {SERVER_KIND!r}")


class Server:
    """One running server process on 127.0.0.1:port."""

    def __init__(self, args, port, proc, stderr_path):
        self.args, self.port, self.proc, self.stderr_path = args, port, proc, stderr_path
        self.host = "127.0.0.1"
        self._conns = []

    def raw(self, timeout=5.0):
        c = McRaw(self.host, self.port, timeout=timeout)
        self._conns.append(c)
        return c

    def client(self, **kw):
        kw.setdefault("connect_timeout", 5)
        kw.setdefault("timeout", 5)
        kw.setdefault("default_noreply", False)
        c = Client((self.host, self.port), **kw)
        self._conns.append(c)
        return c

    def alive(self):
        return self.proc.poll() is None

    def stderr_text(self):
        try:
            return Path(self.stderr_path).read_text(errors="replace")
        except OSError:
            return ""

    def stop(self):
        """Stop the process. Returns a problem description for shoal-node when it did not exit
        cleanly (status 0 within STOP_TIMEOUT of SIGTERM, which also surfaces sanitizer reports
        printed at exit), else None."""
        for c in self._conns:
            try:
                c.close()
            except Exception:
                pass
        if self.proc.poll() is not None:
            return None
        if SERVER_KIND == "memcached":
            # memcached takes ~1 s to exit on SIGTERM/SIGINT once it has served a connection,
            # which would dominate the suite's time; the reference is simply killed.
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT)
            return None
        self.proc.terminate()
        try:
            status = self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT)
            return f"did not exit within {STOP_TIMEOUT}s of SIGTERM"
        return None if status == 0 else f"exited with status {status} after SIGTERM"


_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def _die_with_parent():
    """In the child before exec: have the kernel SIGKILL the server if pytest itself dies (killed
    by a timeout, say), so no server outlives the run."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _wait_ready(proc, port, stderr_path):
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.02)
    proc.kill()
    proc.wait()
    pytest.fail(f"server did not accept connections on port {port} within {READY_TIMEOUT}s; "
                f"stderr:\n{Path(stderr_path).read_text(errors='replace')}")


def _wait_admin(proc, extra):
    """With --admin-port P among a node's flags, wait until P accepts too (or the process is
    gone): the data port listens a moment before it, and a test that asks the admin API at once
    was refused on a loaded machine."""
    extra = [str(a) for a in extra]
    if "--admin-port" in extra[:-1] and extra[extra.index("--admin-port") + 1] != "0":
        from mcraw import accepts, wait_until
        admin = int(extra[extra.index("--admin-port") + 1])
        wait_until(lambda: accepts(admin) or proc.poll() is not None, timeout=READY_TIMEOUT,
                   message=f"the admin port {admin}")


def _spawn(binary, extra, tmp_dir, name, port=None):
    """Start `binary` with memcached's flags on a free port (or `port`, for a server whose flags
    name its own address, e.g. --advertise) and wait for it. Retries when the port was taken
    meanwhile; fails the test with the server's stderr otherwise."""
    for attempt in range(3):  # a port found free may be taken before the server binds it
        port = port if port is not None and attempt == 0 else free_port()
        args = [str(binary), "-p", str(port), "-l", "127.0.0.1", "-U", "0", "-t", "2", "-m", "64"]
        if os.geteuid() == 0:
            args += ["-u", "root"]
        args += list(extra)
        fd, stderr_path = tempfile.mkstemp(prefix=f"{name}-", suffix=".stderr", dir=tmp_dir)
        with os.fdopen(fd, "w") as err:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                    start_new_session=True, preexec_fn=_die_with_parent)
        if _wait_ready(proc, port, stderr_path):
            _wait_admin(proc, extra)
            return Server(args, port, proc, stderr_path)
        text = Path(stderr_path).read_text(errors="replace")
        if "in use" not in text.lower() or attempt == 2:
            pytest.fail(f"server exited with status {proc.returncode} before accepting connections: "
                        f"{' '.join(args)}\nstderr:\n{text}")
    raise AssertionError("unreachable")


def launch(*extra, tmp_dir, port=None):
    binary = server_binary()
    if not binary.exists():
        hint = ("build it with `make`, set SHOAL_NODE_BIN, or run against the reference with "
                "SHOAL_TEST_SERVER=memcached") if SERVER_KIND == "shoal" else "apt-get install memcached"
        pytest.fail(f"server binary {binary} not found: {hint}")
    return _spawn(binary, extra, tmp_dir, "server", port)


def launch_memcached(tmp_dir, *extra):
    """Debian's memcached on a free port, whatever SHOAL_TEST_SERVER says: the reference."""
    binary = os.environ.get("SHOAL_MEMCACHED_BIN", "/usr/bin/memcached")
    if not os.path.exists(binary):
        message = f"{binary} not found: apt-get install memcached (scripts/deps.sh)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    return _spawn(binary, extra, tmp_dir, "memcached")


def _register(node, server):
    if not hasattr(node, "_servers"):
        node._servers = []
    node._servers.append(server)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for s in getattr(item, "_servers", []):
            rep.sections.append((f"server stderr ({' '.join(s.args)})", s.stderr_text() or "(empty)"))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "shoal_only: behaviour memcached 1.6.18 lacks but shoal-node must implement "
                   "(skipped when SHOAL_TEST_SERVER=memcached)")
    config.addinivalue_line(
        "markers", "memcached_only(reason): memcached 1.6.18 behaviour that shoal-node deliberately "
                   "does not copy, as listed in docs/protocol.md (skipped for shoal)")
    config.addinivalue_line(
        "markers", "wallclock: asserts a bound on wall-clock time that CPU contention can break; "
                   "scripts/test.sh runs these alone, after the two suites it runs at once")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SERVER_KIND == "memcached" and "shoal_only" in item.keywords:
            item.add_marker(pytest.mark.skip(
                reason="shoal-only behaviour; memcached 1.6.18 does not have it"))
        mark = item.get_closest_marker("memcached_only")
        if SERVER_KIND != "memcached" and mark is not None:
            why = mark.args[0] if mark.args else mark.kwargs.get("reason", "")
            item.add_marker(pytest.mark.skip(reason=f"deliberate difference from memcached: {why}"))


def _check_survived(servers):
    dead = [s for s in servers if not s.alive() and not getattr(s, "killed", False)]
    problems = [(s, s.stop()) for s in servers]
    for s in dead:
        pytest.fail(f"server died during the test with status {s.proc.returncode}: "
                    f"{' '.join(s.args)}\nstderr:\n{s.stderr_text()}")
    for s, problem in problems:
        if problem:
            pytest.fail(f"server {problem}: {' '.join(s.args)}\nstderr:\n{s.stderr_text()}")


@pytest.fixture
def start_server(request, tmp_path):
    started = []

    def start(*extra, port=None):
        s = launch(*extra, tmp_dir=tmp_path, port=port)
        started.append(s)
        _register(request.node, s)
        return s

    yield start
    _check_survived(started)


@pytest.fixture
def server(start_server):
    return start_server()


@pytest.fixture
def mc(server):
    return server.client()


@pytest.fixture
def raw(server):
    return server.raw()



# --- shoal-router with real shoal-nodes -----------------------------------------------------------

ROUTER_BIN = REPO_ROOT / os.environ.get("SHOAL_ROUTER_BIN", "build/bin/shoal-router")
NODE_BIN = REPO_ROOT / os.environ.get("SHOAL_NODE_BIN", "build/bin/shoal-node")


def crc16_xmodem(data: bytes) -> int:
    """CRC16-XMODEM (poly 0x1021, init 0): the slot hash of design.md."""
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc


def key_slot(key) -> int:
    """Slot of a key: CRC16 of its first non-empty {hash tag}, else of the whole key, mod 16384."""
    if isinstance(key, str):
        key = key.encode()
    i = key.find(b"{")
    if i >= 0:
        j = key.find(b"}", i + 1)
        if j > i + 1:
            key = key[i + 1:j]
    return crc16_xmodem(key) % 16384


def start_following_node(start_server, control_url, *extra):
    """A node with an admin port that follows the control plane at `control_url` (retrying
    every 200 ms at most), returned once its admin port accepts (start_server waits for it).
    Sets .admin_port and .addr ("127.0.0.1:PORT", how pools name it)."""
    admin = free_port()
    node = start_server("--admin-port", str(admin), "--control", control_url,
                        "--control-backoff-max-ms", "200", *extra)
    node.admin_port = admin
    node.addr = f"127.0.0.1:{node.port}"
    return node


def default_owner(slot, n):
    """Index of the node of n that owns slot under the default map."""
    return next(i for i in range(n) if i * 16384 // n <= slot < (i + 1) * 16384 // n)


def topology(nodes, version=1, **extra):
    """The minimal topology document: one pool "main" of `nodes` (Servers or "host:port")."""
    addrs = [n if isinstance(n, str) else f"127.0.0.1:{n.port}" for n in nodes]
    doc = {"version": version, "pools": {"main": {"nodes": addrs}},
           "namespaces": {"default": {"pool": "main"}}}
    doc.update(extra)
    return doc


class RouterCluster:
    """Nodes plus one shoal-router in front of them, with its topology file and admin port."""

    def __init__(self, nodes, router, topo_path, admin_port):
        self.nodes, self.router, self.topo_path, self.admin_port = nodes, router, topo_path, admin_port

    def raw(self, timeout=5.0):
        return self.router.raw(timeout)

    def client(self, **kw):
        return self.router.client(**kw)

    def owner(self, key, nodes=None):
        """The node (Server) that owns `key` under the default map of `nodes` (default: all)."""
        nodes = nodes or self.nodes
        return nodes[default_owner(key_slot(key), len(nodes))]

    def write_topology(self, doc):
        tmp = Path(str(self.topo_path) + ".tmp")
        tmp.write_text(doc if isinstance(doc, str) else json.dumps(doc))
        os.replace(tmp, self.topo_path)

    def version(self):
        from mcraw import http
        status, body = http(self.admin_port, "GET", "/v1/topology")
        assert status == 200, body
        return json.loads(body)["version"]

    def reload(self, doc, expect_version=None):
        """Write `doc`, send SIGHUP and wait until the router reports its version (or, for a
        document it should refuse, `expect_version`)."""
        from mcraw import wait_until
        self.write_topology(doc)
        want = expect_version if expect_version is not None else doc["version"]
        self.router.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: self.version() == want, message=f"topology version {want}")


def restart_server(server):
    """Start a killed server again with its arguments and port (the same Server object, so the
    fixture that started it still stops it); its output goes on in the same stderr file."""
    from mcraw import accepts, wait_until
    with open(server.stderr_path, "a") as err:
        server.proc = subprocess.Popen(server.args, stdin=subprocess.DEVNULL, stdout=err,
                                       stderr=err, start_new_session=True,
                                       preexec_fn=_die_with_parent)
    wait_until(lambda: accepts(server.port), message=f"the server listening again on {server.port}")


def pause_server(server):
    """SIGSTOP the server and wait until every thread of it is stopped (the signal is delivered
    asynchronously: a thread may still answer a request meanwhile). It keeps its data, as a
    stalled or partitioned node would (a restarted one would be empty)."""
    from mcraw import wait_until
    os.kill(server.proc.pid, signal.SIGSTOP)

    def stopped():
        tasks = f"/proc/{server.proc.pid}/task"
        for t in os.listdir(tasks):
            with open(f"{tasks}/{t}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "T":
                    return False
        return True
    wait_until(stopped, interval=0.001, message="the server stopped")


def resume_server(server):
    os.kill(server.proc.pid, signal.SIGCONT)


def held_value(server, key):
    """The value `server` itself holds for key (bytes), or None."""
    with McRaw(server.host, server.port) as c:
        got = c.meta(f"mg {key} v")
        return got.value if got.code == "VA" else None


def launch_router(topo_path, *extra, tmp_dir):
    """topo_path None: no --config (a router following --control among `extra`)."""
    if not ROUTER_BIN.exists():
        pytest.fail(f"router binary {ROUTER_BIN} not found: build it with `make`")
    for attempt in range(3):
        port, admin = free_port(), free_port()
        args = [str(ROUTER_BIN), "-p", str(port), "-l", "127.0.0.1", "-t", "2",
                "--admin-port", str(admin),
                *(["--config", str(topo_path)] if topo_path is not None else []), *extra]
        fd, stderr_path = tempfile.mkstemp(prefix="router-", suffix=".stderr", dir=tmp_dir)
        with os.fdopen(fd, "w") as err:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                    start_new_session=True, preexec_fn=_die_with_parent)
        if _wait_ready(proc, port, stderr_path):
            from mcraw import accepts, wait_until
            # the data port listens a moment before the admin port does
            wait_until(lambda: accepts(admin) or proc.poll() is not None, message="the admin port")
            return Server(args, port, proc, stderr_path), admin
        text = Path(stderr_path).read_text(errors="replace")
        if "in use" not in text.lower() or attempt == 2:
            pytest.fail(f"router exited with status {proc.returncode}: {' '.join(args)}\n{text}")
    raise AssertionError("unreachable")


@pytest.fixture
def start_router(request, tmp_path):
    """Factory: start_router(doc_or_nodes, *flags) -> (Server, admin_port, topology path); doc
    None: no topology file (a router following --control among the flags; path None)."""
    started = []

    def start(doc, *extra):
        if isinstance(doc, list):
            doc = topology(doc)
        path = None
        if doc is not None:
            path = tmp_path / f"topology-{len(started)}.json"
            path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
        r, admin = launch_router(path, *extra, tmp_dir=tmp_path)
        started.append(r)
        _register(request.node, r)
        return r, admin, path

    yield start
    _check_survived(started)


@pytest.fixture
def cluster(start_server, start_router):
    """Three shoal-nodes and a shoal-router whose topology lists them in order."""
    nodes = [start_server() for _ in range(3)]
    router, admin, path = start_router(nodes)
    return RouterCluster(nodes, router, path, admin)


@pytest.fixture
def gcluster(start_server, start_router):
    """Three shoal-nodes, a gutter pool of one more (gutter_ttl 7), and a one-worker router quick
    to mark a node down (300 ms timeout, 50 ms retry) and to probe it back (100 ms)."""
    nodes = [start_server() for _ in range(3)]
    gutter = start_server()
    doc = topology(nodes)
    doc["pools"]["gutter"] = {"nodes": [f"127.0.0.1:{gutter.port}"]}
    doc["gutter_pool"] = "gutter"
    doc["gutter_ttl"] = 7
    router, admin, path = start_router(doc, "-t", "1", "--timeout-ms", "300", "--probe-ms", "100",
                                       "--retry-ms", "50")
    c = RouterCluster(nodes, router, path, admin)
    c.gutter = gutter
    return c


# --- shoal-control (tests/integration/controlharness.py) ------------------------------------------
from controlharness import start_control  # noqa: E402,F401  (a fixture)
