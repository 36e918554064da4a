"""Memory bounded in total, not only per connection (issue 12, point 3).

Many clients that each stay within their own limits (--out-max, --line-max, --item-max) can
still add up to gigabytes: a hundred clients that pipeline gets of a 100 KB value and never read
the replies, or two thousand slowloris connections each holding most of a 1 MB value and never
sending the rest. shoal-node and shoal-router keep every connection's buffers within one budget
(--buffers-max): past half of it a connection stops taking requests while its replies wait, and
past it the connections holding the most are closed, with a logged reason; a partial request
that sees no byte for --partial-timeout-ms is closed; and memory freed goes back to the system.
Each test measures the process's RSS from /proc while the attack runs (failing as soon as it
passes its bound, so today's code stops early), and a well-behaved client keeps being served
with a bounded latency throughout. shoal_only: these are shoal's own limits."""

import resource
import select
import socket
import threading
import time

import pytest

from mcraw import McRaw, wait_until, rss_bytes, sanitized

pytestmark = pytest.mark.shoal_only

MIB = 1 << 20
BIG = bytes((i * 7 + 13) % 251 for i in range(100_000))


@pytest.fixture(autouse=True)
def many_fds():
    """Room for 2,000 attacking sockets here and as many in the server: servers started by the
    test inherit the raised limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 12_000 if hard == resource.RLIM_INFINITY else min(hard, 12_000)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def fd_room(n):
    """How many attacking connections fit: n, or fewer when the fd limit is low (each needs a
    socket here and one in the server, plus the server's own)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(100, min(n, (soft - 200) // 2))


class Prober:
    """A well-behaved client: a set and a get of a small key, again and again, on its own
    connection, recording each round trip's latency, until stopped."""

    def __init__(self, host, port):
        self.conn = McRaw(host, port, timeout=10)
        self.latencies, self.failures = [], []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        i = 0
        while not self._stop.is_set():
            i += 1
            t0 = time.monotonic()
            try:
                got = self.conn.cmd(f"set probe 0 0 {len(str(i))}", str(i))
                if got != "STORED":
                    self.failures.append(f"set answered {got!r}")
                items = self.conn.get("probe")
                if [v for _, _, v, _ in items] != [str(i).encode()]:
                    self.failures.append(f"get answered {items!r}")
            except Exception as e:  # noqa: BLE001 - any failure of the well-behaved client counts
                self.failures.append(repr(e))
                return
            self.latencies.append(time.monotonic() - t0)
            time.sleep(0.01)

    def stop(self):
        self._stop.set()
        self._thread.join(20)
        self.conn.close()

    def check(self, bound):
        """The well-behaved client was answered every time, at least a few times, and never
        waited longer than `bound` seconds for a round trip."""
        assert not self.failures, f"the well-behaved client failed: {self.failures[:3]}"
        assert len(self.latencies) >= 5, \
            f"the well-behaved client got only {len(self.latencies)} answers during the attack"
        worst = max(self.latencies)
        assert worst < bound, f"the well-behaved client waited {worst:.3f}s for one round trip"


class RssWatch:
    """Samples a process's RSS in the background; fails the test, through check(), when it ever
    passed `bound` bytes, and stops the attack at once through `over` (so a process that grows
    without bound is not left eating the machine)."""

    def __init__(self, pid, bound):
        self.pid, self.bound, self.peak = pid, bound, 0
        self.over = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                rss = rss_bytes(self.pid)
            except (FileNotFoundError, ProcessLookupError, AssertionError):
                return
            self.peak = max(self.peak, rss)
            if rss > self.bound:
                self.over.set()
            time.sleep(0.01)

    def stop(self):
        self._stop.set()
        self._thread.join(5)

    def check(self, what):
        print(f"{what}: peak RSS {self.peak / MIB:.0f} MiB")
        assert self.peak <= self.bound, \
            f"{what}: RSS reached {self.peak / MIB:.0f} MiB, over the bound of {self.bound / MIB:.0f} MiB"


def never_readers(port, n, request, count, watch):
    """n connections that each send `request` `count` times and never read a byte (a small
    receive buffer, so the replies back up into the server at once)."""
    socks = []
    payload = request * count
    for _ in range(n):
        if watch.over.is_set():
            break
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        s.setblocking(False)
        try:
            s.send(payload)  # what the kernel takes; the rest is never needed
        except (BlockingIOError, ConnectionError):
            pass
        socks.append(s)
    return socks


def slowloris(port, n, declared, partial, watch, deadline_s=30):
    """n connections that each send a storage command of `declared` bytes and then only
    `partial` of them, and stay open. Sends until every one has sent its part or was closed
    by the server (or the watch saw the bound passed). Returns (sockets, how many were closed
    under them)."""
    body = memoryview(b"x" * partial)
    conns = []
    for i in range(n):
        if watch.over.is_set():
            break
        s = socket.socket()
        s.connect(("127.0.0.1", port))
        s.setblocking(False)
        conns.append([s, memoryview(b"set slow%d 0 0 %d\r\n" % (i, declared)), body])
    poll = select.poll()
    by_fd = {c[0].fileno(): c for c in conns}
    for fd in by_fd:
        poll.register(fd, select.POLLOUT)
    closed, end = 0, time.monotonic() + deadline_s
    while by_fd and time.monotonic() < end and not watch.over.is_set():
        for fd, ev in poll.poll(100):
            c = by_fd.get(fd)
            if c is None:
                continue
            done = False
            try:
                if ev & (select.POLLERR | select.POLLHUP):
                    raise ConnectionResetError
                buf = c[1] if len(c[1]) else c[2]
                sent = c[0].send(buf[:262144])
                if len(c[1]):
                    c[1] = c[1][sent:]
                else:
                    c[2] = c[2][sent:]
                done = not len(c[1]) and not len(c[2])
            except BlockingIOError:
                continue
            except (ConnectionError, OSError):
                closed += 1
                done = True
            if done:
                poll.unregister(fd)
                del by_fd[fd]
    return [c[0] for c in conns], closed


def close_all(socks):
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


def stat(host, port, name):
    with McRaw(host, port) as c:
        return int(c.stats().get(name, "0"))


def quiet(host, port, name, still=0.5, slack=256 * 1024, timeout=20.0):
    """Wait until counter `name` grows by less than `slack` in `still` seconds: the attack has
    done what it can (every connection paused or closed; the prober alone moves it)."""
    last = [stat(host, port, name), time.monotonic()]

    def settled():
        now, t = stat(host, port, name), time.monotonic()
        if now - last[0] >= slack:
            last[0], last[1] = now, t
        return t - last[1] >= still

    wait_until(settled, timeout=timeout, interval=0.1, message=f"{name} to settle")


def latency_bound(pid):
    return 6.0 if sanitized(pid) else 2.0


# -- shoal-node ---------------------------------------------------------------------------------

def test_node_rss_stays_bounded_with_100_clients_that_never_read(start_server):
    node = start_server()  # -m 64
    with McRaw(node.host, node.port) as c:
        assert c.store("set", "big", BIG) == "STORED"
    bound = (64 + 128) * MIB * (3 if sanitized(node.proc.pid) else 1)
    watch = RssWatch(node.proc.pid, bound)
    prober = Prober(node.host, node.port)
    socks = never_readers(node.port, 100, b"get big\r\n", 2000, watch)
    try:
        if not watch.over.is_set():
            quiet(node.host, node.port, "bytes_written")
    finally:
        watch.stop()
        prober.stop()
        close_all(socks)
    watch.check("shoal-node with 100 clients that never read")
    prober.check(latency_bound(node.proc.pid))


def test_node_rss_stays_bounded_with_2000_slowloris_connections(start_server):
    node = start_server("-c", "8192")
    n = fd_room(2000)
    bound = (64 + 128) * MIB * (3 if sanitized(node.proc.pid) else 1)
    watch = RssWatch(node.proc.pid, bound)
    prober = Prober(node.host, node.port)
    try:
        socks, _ = slowloris(node.port, n, 1_000_000, 900_000, watch)
    finally:
        watch.stop()
        prober.stop()
    close_all(socks)
    watch.check(f"shoal-node with {n} slowloris connections")
    prober.check(latency_bound(node.proc.pid))


# -- shoal-router -------------------------------------------------------------------------------

def test_router_rss_stays_bounded_with_100_clients_that_never_read(start_server, start_router):
    node = start_server()
    router, _, _ = start_router([node])
    with McRaw(router.host, router.port) as c:
        assert c.store("set", "big", BIG) == "STORED"
    bound = 256 * MIB * (3 if sanitized(router.proc.pid) else 1)
    watch = RssWatch(router.proc.pid, bound)
    prober = Prober(router.host, router.port)
    socks = never_readers(router.port, 100, b"get big\r\n", 2000, watch)
    try:
        if not watch.over.is_set():
            quiet(router.host, router.port, "bytes_written")
    finally:
        watch.stop()
        prober.stop()
        close_all(socks)
    watch.check("shoal-router with 100 clients that never read")
    prober.check(latency_bound(router.proc.pid))


def test_router_rss_stays_bounded_with_2000_slowloris_connections(start_server, start_router):
    node = start_server()
    router, _, _ = start_router([node])
    n = fd_room(2000)
    bound = 256 * MIB * (3 if sanitized(router.proc.pid) else 1)
    watch = RssWatch(router.proc.pid, bound)
    prober = Prober(router.host, router.port)
    try:
        socks, _ = slowloris(router.port, n, 1_000_000, 900_000, watch)
    finally:
        watch.stop()
        prober.stop()
    close_all(socks)
    watch.check(f"shoal-router with {n} slowloris connections")
    prober.check(latency_bound(router.proc.pid))
