"""A real 3-member etcd cluster on loopback for the tests of shoal-control --etcd: each member
gets free client and peer ports and its own data directory under the test's temporary
directory, and is stopped after the test. Skips the test when /usr/bin/etcd (Debian's
etcd-server, installed by scripts/deps.sh) is absent.

    def test_x(etcd_cluster):
        etcd_cluster.urls           # "http://127.0.0.1:P1,http://127.0.0.1:P2,..."
        etcd_cluster.kill9(0)       # one member gone
        etcd_cluster.delete(key)    # through the v3 JSON gateway

    def test_y(etcd_member, stalling_gateway, start_control):  # one member: no quorum needed
        gw = stalling_gateway(etcd_member.members[0][1], prefix + "state")
        gw.stall_s = 3              # state saves now take 3 s more (a slow etcd)
"""

import base64
import http.client
import http.server
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from mcraw import free_port, wait_until

ETCD_BIN = os.environ.get("SHOAL_ETCD_BIN", "/usr/bin/etcd")


def b64(s):
    return base64.b64encode(s.encode()).decode()


class EtcdCluster:
    def __init__(self, tmp_path, size=3):
        self.members = []  # (name, client_url, peer_url, data_dir)
        for i in range(size):
            self.members.append((f"m{i}", f"http://127.0.0.1:{free_port()}",
                                 f"http://127.0.0.1:{free_port()}", tmp_path / f"etcd-m{i}"))
        initial = ",".join(f"{n}={p}" for n, _, p, _ in self.members)
        token = f"shoal-test-{os.getpid()}-{self.members[0][2]}"
        self.procs, self.logs = [], []
        for name, client, peer, data in self.members:
            log = open(tmp_path / f"etcd-{name}.log", "w")
            self.logs.append(log)
            from conftest import _die_with_parent
            self.procs.append(subprocess.Popen(
                [ETCD_BIN, "--name", name, "--data-dir", str(data),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", initial, "--initial-cluster-state", "new",
                 "--initial-cluster-token", token],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                preexec_fn=_die_with_parent))
        wait_until(self.healthy, timeout=30, interval=0.1, message="the etcd cluster to be up")

    @property
    def urls(self):
        return ",".join(c for _, c, _, _ in self.members)

    def call(self, path, body, member=None):
        """POST to the JSON gateway of `member` (the first live one by default)."""
        order = [member] if member is not None else range(len(self.members))
        last = None
        for i in order:
            if self.procs[i].poll() is not None:
                continue
            req = urllib.request.Request(self.members[i][1] + path, data=json.dumps(body).encode(),
                                         method="POST")
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    return json.loads(r.read())
            except OSError as e:
                last = e
        raise AssertionError(f"no etcd member answered {path}: {last}")

    def healthy(self):
        try:
            return all(self.call("/v3/kv/range", {"key": b64("health")}, member=i)
                       for i in range(len(self.members)))
        except AssertionError:
            return False

    def get(self, key):
        """The value of `key` (str) or None."""
        kvs = self.call("/v3/kv/range", {"key": b64(key)}).get("kvs", [])
        return base64.b64decode(kvs[0]["value"]).decode() if kvs else None

    def delete(self, key):
        return self.call("/v3/kv/deleterange", {"key": b64(key)})

    def kill9(self, i):
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait(5)

    def stop(self):
        # Killed, not terminated: the data is thrown away, and members terminated together take
        # 5-7 s to exit (each tries to hand leadership to another that is leaving too).
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait(5)
        for log in self.logs:
            log.close()
        for _, _, _, data in self.members:
            shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def etcd_cluster(tmp_path):
    if not Path(ETCD_BIN).exists():
        pytest.skip(f"{ETCD_BIN} not found: install Debian's etcd-server (scripts/deps.sh) to run "
                    "the shoal-control --etcd tests")
    c = EtcdCluster(tmp_path)
    yield c
    c.stop()


@pytest.fixture
def etcd_member(tmp_path):
    """A one-member etcd: quicker to start than etcd_cluster."""
    if not Path(ETCD_BIN).exists():
        pytest.skip(f"{ETCD_BIN} not found: install Debian's etcd-server (scripts/deps.sh) to run "
                    "the shoal-control --etcd tests")
    c = EtcdCluster(tmp_path, size=1)
    yield c
    c.stop()


class StallingGateway:
    """A pass-through HTTP proxy in front of one etcd member's JSON gateway that can play a slow
    etcd for shoal-control's state saves: while `stall_s` > 0, every transaction that puts
    `state_key` (a change being stored) is held that long before it goes on to etcd. Other
    requests (the election, lease keep-alives, reads) pass at once. `stalled` counts the
    saves held so far; `released` those answered since."""

    def __init__(self, upstream, state_key):
        self.upstream = urllib.parse.urlsplit(upstream)
        self.state_key = b64(state_key).encode()
        self.stall_s = 0.0
        self.stalled = self.released = 0
        self.lock = threading.Lock()
        gw = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as etcd's gateway does

            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                held = (gw.stall_s > 0 and self.path == "/v3/kv/txn"
                        and b"request_put" in body and gw.state_key in body)
                if held:
                    with gw.lock:
                        gw.stalled += 1
                    time.sleep(gw.stall_s)  # the slow etcd being played, not a wait
                conn = http.client.HTTPConnection(gw.upstream.hostname, gw.upstream.port,
                                                  timeout=30)
                try:
                    conn.request("POST", self.path, body=body,
                                 headers={"Content-Type": "application/json"})
                    r = conn.getresponse()
                    status, data = r.status, r.read()
                finally:
                    conn.close()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                if held:
                    with gw.lock:
                        gw.released += 1

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stalling_gateway():
    """Factory: stalling_gateway(upstream_url, state_key) -> StallingGateway. Each is stopped
    after the test, after every shoal-control the test started (ask for this fixture before
    start_control): a control stopping leaves etcd its lease back through it, and finds it
    gone otherwise (retrying for 3 x --etcd-timeout-ms)."""
    made = []

    def make(upstream, state_key):
        gw = StallingGateway(upstream, state_key)
        made.append(gw)
        return gw

    yield make
    for gw in made:
        gw.stall_s = 0
        gw.stop()
