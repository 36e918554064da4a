"""shoal-router when a node dies under load: a request whose node refuses the connection, resets
it or times out is retried once on the gutter pool before its client is answered (the paper's
§3.3, mcrouter's failover routes), so killing a node with SIGKILL under a steady pipelined load
of gets and sets costs the clients no errors at all; and a node marked down by one worker thread
is marked down for every worker. Skipped when SHOAL_TEST_SERVER=memcached."""

import re
import socket
import threading

import pytest

from conftest import default_owner, key_slot, restart_server, topology
from mcraw import McRaw, http, wait_until

pytestmark = pytest.mark.shoal_only

DEPTH = 16  # requests each load client pipelines before it reads their replies


class Loader(threading.Thread):
    """One client connection pipelining DEPTH gets and sets of its own keys at a time and
    checking every reply against its request: a set is STORED; a get misses or returns a value
    this client wrote for that very key (a reply out of order, or another client's, would name
    another key or carry another value). Anything else is an error."""

    def __init__(self, host, port, cid, nkeys, stop):
        super().__init__(daemon=True)
        self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rf = self.sock.makefile("rb")
        self.keys = [f"c{cid}k{i}" for i in range(nkeys)]
        self.stop = stop
        self.done = 0
        self.errors = []
        self.seq = 0
        self.i = cid

    def run(self):
        try:
            while not self.stop.is_set():
                self.batch()
        except Exception as e:  # a lost connection or a timeout is an error too
            self.errors.append(repr(e))

    def batch(self):
        sent = []
        out = []
        for _ in range(DEPTH):
            self.i += 7
            key = self.keys[self.i % len(self.keys)]
            if self.i % 3 == 0:
                self.seq += 1
                value = f"{key}={self.seq}".encode()
                out.append(b"set %s 0 60 %d\r\n%s\r\n" % (key.encode(), len(value), value))
                sent.append(("set", key))
            else:
                out.append(f"get {key}\r\n".encode())
                sent.append(("get", key))
        self.sock.sendall(b"".join(out))
        for verb, key in sent:
            line = self.rf.readline().rstrip(b"\r\n").decode(errors="replace")
            if verb == "set":
                if line != "STORED":
                    self.errors.append(f"set {key}: {line}")
                continue
            if line.startswith("VALUE "):
                parts = line.split()
                data = self.rf.read(int(parts[3]) + 2)[:-2].decode(errors="replace")
                end = self.rf.readline().rstrip(b"\r\n").decode(errors="replace")
                if parts[1] != key or not data.startswith(key + "=") or end != "END":
                    self.errors.append(f"get {key}: {line} {data!r} {end}")
                elif int(data.split("=")[1]) > self.seq:
                    self.errors.append(f"get {key}: a value never written: {data!r}")
            elif line != "END":
                self.errors.append(f"get {key}: {line}")
        self.done += len(sent)


def metric(admin, name):
    status, body = http(admin, "GET", "/metrics")
    assert status == 200, body
    m = re.search(rf"^{re.escape(name)} (\d+)$", body, re.M)
    return int(m[1]) if m else 0


def node_stat(server, name):
    with McRaw(server.host, server.port) as c:
        return int(c.stats()[name])


def test_kill_under_pipelined_load_costs_clients_no_errors(start_server, start_router):
    nodes = [start_server() for _ in range(3)]
    gutter = start_server()
    doc = topology(nodes)
    doc["pools"]["gutter"] = {"nodes": [f"127.0.0.1:{gutter.port}"]}
    doc["gutter_pool"] = "gutter"
    router, admin, _ = start_router(doc, "-t", "2", "--timeout-ms", "1000", "--probe-ms", "100",
                                    "--retry-ms", "100")
    victim = nodes[1]
    vaddr = f"127.0.0.1:{victim.port}"
    stop = threading.Event()
    loaders = [Loader(router.host, router.port, cid, 300, stop) for cid in range(4)]
    victim_keys = [k for ld in loaders for k in ld.keys if default_owner(key_slot(k), 3) == 1]
    assert victim_keys

    def total():
        return sum(ld.done for ld in loaders)

    def errors():
        return [e for ld in loaders for e in ld.errors]

    def running(cond):  # a condition of the load, failing at once if a loader has stopped
        def check():
            assert all(ld.is_alive() for ld in loaders), f"a loader stopped: {errors()[-3:]}"
            return cond()
        return check

    for ld in loaders:
        ld.start()
    try:
        wait_until(running(lambda: total() >= 4000), timeout=10, message="the load running")
        victim.proc.kill()
        victim.proc.wait()
        at_kill = total()
        # marked down in every worker, the victim's keys served and filled by the gutter
        wait_until(lambda: f'shoal_router_node_down{{node="{vaddr}"}} 2' in
                   http(admin, "GET", "/metrics")[1], timeout=10,
                   message="the dead node marked down by both workers")
        sets0, hits0 = node_stat(gutter, "cmd_set"), node_stat(gutter, "get_hits")
        wait_until(running(lambda: total() >= at_kill + 4000 and node_stat(gutter, "cmd_set") > sets0
                   and node_stat(gutter, "get_hits") > hits0), timeout=10,
                   message="the dead node's keys filled and read in the gutter")
        restart_server(victim)
        # back in use: the load reads and writes its keys on it again
        wait_until(lambda: node_stat(victim, "get_hits") > 0 and node_stat(victim, "cmd_set") > 0,
                   timeout=10, message="the restarted node back in use")
        at_back = total()
        wait_until(running(lambda: total() >= at_back + 2000), timeout=10, message="more load")
    finally:
        stop.set()
        for ld in loaders:
            ld.join(timeout=15)
    errs = errors()
    assert errs == [], f"{len(errs)} of {total()} requests failed, e.g. {errs[:5]}"
    assert metric(admin, "shoal_router_gutter_retries_total") > 0
    assert total() > 10000
