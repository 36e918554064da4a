"""mcraw.py — a small raw-socket client for the memcache text and meta protocols.

Tests use it where a library would hide what is on the wire: exact reply lines, pipelining,
partial writes, garbage. Every read has a deadline (default 5 s), so a server that stops
answering fails the test with a timeout instead of hanging the suite.
"""

import json
import socket
import time
import urllib.error
import urllib.request

# the tests' one source of ports, re-exported for the modules that import them from here
from ports import free_port, free_port_block  # noqa: F401

DEFAULT_TIMEOUT = 5.0


class ConnectionClosed(Exception):
    """The server closed the connection before the expected bytes arrived."""


class MetaReply:
    """One parsed meta reply: `code` (e.g. "VA", "HD", "EN"), `flags` (letter -> token, "" for
    a flag without a token), `flag_list` (the flags as sent back, in order), `size` (the VA
    length or None), `value` (bytes of a VA data block, else None) and the raw `line`."""

    def __init__(self, line, value=None):
        self.line = line
        parts = line.split(" ")
        self.code = parts[0]
        rest = parts[1:]
        self.size = None
        if self.code == "VA" and rest:
            self.size = int(rest[0])
            rest = rest[1:]
        if self.code in ("CLIENT_ERROR", "SERVER_ERROR", "ERROR"):
            rest = []  # an error's text is not flags
        self.flag_list = [p for p in rest if p]
        self.flags = {p[0]: p[1:] for p in self.flag_list}
        self.value = value

    @property
    def cas(self):
        return int(self.flags["c"])

    def __contains__(self, letter):
        return letter in self.flags

    def __repr__(self):
        return f"MetaReply({self.line!r}, value={self.value!r})"


class McRaw:
    """A single TCP connection with an input buffer of its own."""

    def __init__(self, host, port, timeout=DEFAULT_TIMEOUT):
        self.host, self.port = host, port
        self.timeout = timeout
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    # -- plumbing ---------------------------------------------------------------------------
    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, data):
        if isinstance(data, str):
            data = data.encode()
        self.sock.sendall(data)

    def _fill(self, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("no reply from server within the deadline")
        self.sock.settimeout(left)
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionClosed(f"server closed the connection; unread buffer {self.buf[:200]!r}")
        self.buf += chunk

    def read_line(self, timeout=None):
        """One reply line, without \\r\\n, decoded as latin-1 (bytes-transparent)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while b"\r\n" not in self.buf:
            self._fill(deadline)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line.decode("latin-1")

    def read_exact(self, n, timeout=None):
        deadline = time.monotonic() + (timeout or self.timeout)
        while len(self.buf) < n:
            self._fill(deadline)
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def read_value(self, n, timeout=None):
        """A data block of n bytes followed by \\r\\n; returns the n bytes."""
        data = self.read_exact(n + 2, timeout)
        assert data[-2:] == b"\r\n", f"data block of {n} bytes not followed by \\r\\n: {data[-10:]!r}"
        return data[:-2]

    def read_until(self, terminator=b"END\r\n", timeout=None):
        """Everything up to and including `terminator` (bytes)."""
        if isinstance(terminator, str):
            terminator = terminator.encode()
        deadline = time.monotonic() + (timeout or self.timeout)
        while terminator not in self.buf:
            self._fill(deadline)
        i = self.buf.index(terminator) + len(terminator)
        data, self.buf = self.buf[:i], self.buf[i:]
        return data

    def read_all_until_closed(self, timeout=None):
        """Read until the server closes the connection; returns what arrived."""
        deadline = time.monotonic() + (timeout or self.timeout)
        try:
            while True:
                self._fill(deadline)
        except ConnectionClosed:
            pass
        except ConnectionResetError:
            pass
        data, self.buf = self.buf, b""
        return data

    def is_closed(self, timeout=1.0):
        """True when the server closes the connection (EOF or reset) within `timeout`; whatever it
        sent before closing is read and discarded."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                self._fill(deadline)
        except (ConnectionClosed, ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    # -- text protocol ----------------------------------------------------------------------
    def cmd(self, line, data=None):
        """Send a request line (and an optional data block) and return the first reply line."""
        self.send(self._frame(line, data))
        return self.read_line()

    @staticmethod
    def _frame(line, data=None):
        if isinstance(line, str):
            line = line.encode()
        out = line + b"\r\n"
        if data is not None:
            if isinstance(data, str):
                data = data.encode()
            out += data + b"\r\n"
        return out

    def store(self, cmd, key, value, flags=0, exptime=0, extra=""):
        """Text storage command; returns the reply line."""
        if isinstance(value, str):
            value = value.encode()
        line = f"{cmd} {key} {flags} {exptime} {len(value)}{(' ' + extra) if extra else ''}"
        return self.cmd(line, value)

    def read_get_reply(self):
        """Parse VALUE blocks up to END: returns a list of (key, flags, value, cas-or-None)."""
        items = []
        while True:
            line = self.read_line()
            if line == "END":
                return items
            parts = line.split(" ")
            assert parts[0] == "VALUE", f"expected VALUE or END, got {line!r}"
            n = int(parts[3])
            cas = int(parts[4]) if len(parts) > 4 else None
            items.append((parts[1], int(parts[2]), self.read_value(n), cas))

    def get(self, *keys, cmd="get"):
        self.send(f"{cmd} {' '.join(keys)}\r\n")
        return self.read_get_reply()

    def stats(self, arg=""):
        """`stats [arg]` as a dict name -> string value."""
        self.send(f"stats {arg}".rstrip() + "\r\n")
        out = {}
        while True:
            line = self.read_line()
            if line == "END":
                return out
            parts = line.split(" ", 2)
            assert parts[0] == "STAT", f"expected STAT line, got {line!r}"
            out[parts[1]] = parts[2] if len(parts) > 2 else ""

    # -- meta protocol ----------------------------------------------------------------------
    def read_meta(self):
        line = self.read_line()
        reply = MetaReply(line)
        if reply.code == "VA":
            reply.value = self.read_value(reply.size)
        return reply

    def meta(self, cmd, data=None):
        """Send one meta command (plus its data block for ms) and parse the reply."""
        self.send(self._frame(cmd, data))
        return self.read_meta()


def wait_until(predicate, timeout=5.0, interval=0.05, message="condition"):
    """Poll `predicate` until it returns a truthy value; fail the test after `timeout` seconds.
    Returns the truthy value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)




def accepts(port):
    """Does something accept TCP connections on 127.0.0.1:port?"""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def http(port, method, path, body=None):
    """One HTTP request to 127.0.0.1:port: (status, body text). A dict or list body is sent as
    JSON; an error status is returned, not raised."""
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def healthz_ok(port):
    """Does the admin listener on 127.0.0.1:port answer GET /healthz with 200?"""
    try:
        return http(port, "GET", "/healthz")[0] == 200
    except OSError:
        return False


def scrape_metrics(port):
    """GET /metrics from 127.0.0.1:port as {series (name with labels): value}."""
    status, text = http(port, "GET", "/metrics")
    assert status == 200, text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def rss_bytes(pid):
    """The resident memory of process `pid`, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def sanitized(pid):
    """Whether process `pid` runs with ASAN (whose quarantine keeps freed memory resident)."""
    with open(f"/proc/{pid}/maps") as f:
        return "libasan" in f.read()


def scrape_while_stopping(proc, admin_port, threads=2, settle=0.2, timeout=20):
    """Send SIGTERM to `proc` while `threads` threads fetch /metrics from admin_port in a loop,
    so that shutdown runs under the admin thread's reads. Returns the exit status."""
    import signal
    import threading
    import time
    done = threading.Event()

    def scrape():
        while not done.is_set():
            try:
                with socket.create_connection(("127.0.0.1", admin_port), timeout=2) as s:
                    s.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
                    while s.recv(65536):
                        pass
            except OSError:
                time.sleep(0.001)

    ts = [threading.Thread(target=scrape, daemon=True) for _ in range(threads)]
    for t in ts:
        t.start()
    time.sleep(settle)  # the scrapers are in full swing
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    finally:
        done.set()
        for t in ts:
            t.join(5)
