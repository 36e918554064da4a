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


def launch(*extra, tmp_dir):
    binary = server_binary()
    if not binary.exists():
        hint = ("build it with `make`, set SHOAL_NODE_BIN, or run against the reference with "
                "SHOAL_TEST_SERVER=memcached") if SERVER_KIND == "shoal" else "apt-get install memcached"
        pytest.fail(f"server binary {binary} not found: {hint}")
    for attempt in range(3):  # a port found free may be taken before the server binds it
        port = free_port()
        args = [str(binary), "-p", str(port), "-l", "127.0.0.1", "-U", "0", "-t", "2", "-m", "64"]
        if os.geteuid() == 0:
            args += ["-u", "root"]
        args += list(extra)
        fd, stderr_path = tempfile.mkstemp(prefix="server-", suffix=".stderr", dir=tmp_dir)
        with os.fdopen(fd, "w") as err:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                    start_new_session=True, preexec_fn=_die_with_parent)
        if _wait_ready(proc, port, stderr_path):
            return Server(args, port, proc, stderr_path)
        text = Path(stderr_path).read_text(errors="replace")
        if "in use" not in text.lower() or attempt == 2:
            pytest.fail(f"server exited with status {proc.returncode} before accepting connections: "
                        f"{' '.join(args)}\nstderr:\n{text}")
    raise AssertionError("unreachable")


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
    dead = [s for s in servers if not s.alive()]
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

    def start(*extra):
        s = launch(*extra, tmp_dir=tmp_path)
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

