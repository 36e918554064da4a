"""Network namespaces for the partition tests (issue 15 point 5): two namespaces made by the
test, A (one node, and a client on its side) and B (control, the router, the other nodes, the
gutter), joined by one veth pair on a private /24; Debian's nftables in A cuts the link
(`cut()`/`heal()`) or drops a share of its packets at random (`loss(30)`). The root namespace
is never touched: the veth is created inside the namespaces (`ip -n`), and the test talks to
processes through sockets opened in a thread that has entered the namespace (setns), which
keep their namespace when used from any thread.

    pair = NetPair(tmp_path)           # skips the test when not root or ip/nft are missing
    pair.spawn("B", [ctl_bin, ...])    # `ip netns exec B ...`
    pair.request("B", "10.201.0.1:11500", "GET", "/v1/topology")
    pair.cut(); pair.heal(); pair.loss(30); pair.close()   # close: kill, remove everything
"""

import ctypes
import http.client
import json
import os
import shutil
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

CLONE_NEWNET = 0x40000000
ADDR = {"A": "10.201.0.2", "B": "10.201.0.1"}
_seq = [0]
_libc = ctypes.CDLL(None, use_errno=True)


def _run(argv, input_text=None):
    return subprocess.run(argv, input=input_text, capture_output=True, text=True, timeout=20)


def _enter(name):
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {name}")
    finally:
        os.close(fd)


def skip_reason():
    """Why partition tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "partition tests need root (ip netns, veth, nftables)"
    if not shutil.which("ip"):
        return "iproute2's `ip` is missing"
    if not shutil.which("nft"):
        return "nftables is missing (scripts/deps.sh installs the Debian package nftables)"
    return None


class NetPair:
    def __init__(self, tmp_path):
        why = skip_reason()
        if why:
            pytest.skip(why)
        _seq[0] += 1
        tag = f"{os.getpid() % 100000:05d}{_seq[0] % 100:02d}"
        self.tmp = Path(tmp_path)
        self.ns = {"A": f"shoalpartA{tag}", "B": f"shoalpartB{tag}"}
        self.veth = {"A": f"spa{tag}", "B": f"spb{tag}"}  # at most 15 characters
        self.procs, self.pools, self.closed = [], {}, False
        made = []
        try:
            for side in "AB":
                r = _run(["ip", "netns", "add", self.ns[side]])
                if r.returncode:
                    pytest.skip(f"cannot make a network namespace: {r.stderr.strip()}")
                made.append(side)
            self._ip("A", "link", "add", self.veth["A"], "type", "veth", "peer", "name",
                     self.veth["B"], "netns", self.ns["B"])
            for side in "AB":
                self._ip(side, "addr", "add", ADDR[side] + "/24", "dev", self.veth[side])
                self._ip(side, "link", "set", self.veth[side], "up")
                self._ip(side, "link", "set", "lo", "up")
            r = self.nft("A", "add table inet shoalprobe\ndelete table inet shoalprobe\n")
            if r.returncode:
                pytest.skip(f"nftables does not work in a namespace here: {r.stderr.strip()}")
        except BaseException:
            for side in made:
                _run(["ip", "netns", "del", self.ns[side]])
            raise
        for side in "AB":
            self.pools[side] = ThreadPoolExecutor(1, initializer=_enter,
                                                  initargs=(self.ns[side],))

    def _ip(self, side, *args):
        r = _run(["ip", "-n", self.ns[side], *args])
        if r.returncode:
            raise RuntimeError(f"ip -n {self.ns[side]} {' '.join(args)}: {r.stderr.strip()}")

    def nft(self, side, ruleset):
        return _run(["ip", "netns", "exec", self.ns[side], "nft", "-f", "-"], ruleset)

    # ---- faults, all on A's side of the link ----
    def cut(self):
        """Drop every packet between A and B (both directions); A's own loopback still works."""
        r = self.nft("A", f"""table inet shoalcut {{
  chain in {{ type filter hook input priority 0; policy accept;
    iifname "{self.veth['A']}" drop
  }}
  chain out {{ type filter hook output priority 0; policy accept;
    oifname "{self.veth['A']}" drop
  }}
}}
""")
        assert r.returncode == 0, r.stderr

    def heal(self):
        r = self.nft("A", "delete table inet shoalcut\n")
        assert r.returncode == 0, r.stderr

    def loss(self, pct):
        """Drop pct% of the packets crossing the link, at random, in each direction."""
        r = self.nft("A", f"""table inet shoalloss {{
  chain in {{ type filter hook input priority 0; policy accept;
    iifname "{self.veth['A']}" numgen random mod 100 < {pct} drop
  }}
  chain out {{ type filter hook output priority 0; policy accept;
    oifname "{self.veth['A']}" numgen random mod 100 < {pct} drop
  }}
}}
""")
        assert r.returncode == 0, r.stderr

    def no_loss(self):
        self.nft("A", "delete table inet shoalloss\n")

    # ---- processes and sockets ----
    def spawn(self, side, argv, name):
        log = open(self.tmp / f"{name}.log", "w")
        p = subprocess.Popen(["ip", "netns", "exec", self.ns[side], *map(str, argv)],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             start_new_session=True)
        p.name, p.log = name, self.tmp / f"{name}.log"
        self.procs.append(p)
        return p

    def logs(self):
        out = []
        for p in self.procs:
            try:
                tail = p.log.read_text(errors="replace").splitlines()[-15:]
            except OSError:
                tail = []
            out.append(f"--- {p.name} (exit {p.poll()})\n" + "\n".join(tail))
        return "\n".join(out)

    def call(self, side, fn, *args):
        return self.pools[side].submit(fn, *args).result()

    def connect(self, side, addr, timeout=2.0):
        host, port = addr.rsplit(":", 1)
        return self.call(side, socket.create_connection, (host, int(port)), timeout)

    def request(self, side, addr, method, path, body=None, timeout=5.0):
        """(status, parsed JSON or text) of an HTTP request made from inside `side`."""
        pair = self

        class Conn(http.client.HTTPConnection):
            def connect(self):
                self.sock = pair.connect(side, f"{self.host}:{self.port}", self.timeout)

        host, port = addr.rsplit(":", 1)
        c = Conn(host, int(port), timeout=timeout)
        try:
            data = json.dumps(body) if body is not None else None
            c.request(method, path, body=data,
                      headers={"Content-Type": "application/json"} if data else {})
            r = c.getresponse()
            text = r.read().decode()
        finally:
            c.close()
        try:
            return r.status, (json.loads(text) if text else None)
        except ValueError:
            return r.status, text

    def close(self):
        if self.closed:
            return
        self.closed = True
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for pool in self.pools.values():
            pool.shutdown(wait=False)
        for side in "AB":
            # anything still inside (a stray child) goes with the namespace's processes
            r = _run(["ip", "netns", "pids", self.ns[side]])
            for pid in r.stdout.split():
                try:
                    os.kill(int(pid), 9)
                except (OSError, ValueError):
                    pass
            _run(["ip", "netns", "del", self.ns[side]])


class McConn:
    """A memcached text-protocol client on a socket opened inside a namespace."""

    def __init__(self, pair, side, addr, timeout=3.0):
        self.sock = pair.connect(side, addr, timeout)
        self.sock.settimeout(timeout)
        self.buf = b""

    def _line(self):
        while b"\r\n" not in self.buf:
            d = self.sock.recv(65536)
            if not d:
                raise ConnectionError("closed")
            self.buf += d
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line.decode(errors="replace")

    def cmd(self, text):
        """One storage/delete command: its reply line."""
        self.sock.sendall(text.encode())
        return self._line()

    def get(self, key):
        """(value or None, None) or (None, error line)."""
        self.sock.sendall(f"get {key}\r\n".encode())
        line = self._line()
        if line == "END":
            return None, None
        if not line.startswith("VALUE "):
            return None, line
        n = int(line.split()[3])
        while len(self.buf) < n + 2:
            d = self.sock.recv(65536)
            if not d:
                raise ConnectionError("closed")
            self.buf += d
        val, self.buf = self.buf[:n].decode(errors="replace"), self.buf[n + 2:]
        end = self._line()
        return val, (None if end == "END" else end)

    def close(self):
        self.sock.close()

