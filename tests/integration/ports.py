"""The one place integration tests get TCP ports from: free_port() and free_port_block().

Why not "bind port 0, read it, close it": two such calls may return the same port (a router got
`-p P --admin-port P`), and the kernel's ephemeral range is also where every client socket's
local port comes from, so a port found free there may be some connection's source port by the
time a server binds it. So ports here come:
  - from outside the ephemeral range (/proc/sys/net/ipv4/ip_local_port_range): by default
    20000-31999, or the range in SHOAL_TEST_PORTS ("LO-HI"), clipped below the ephemeral range;
  - from this process's own slice of that range: a pytest-xdist worker (PYTEST_XDIST_WORKER=gwN,
    PYTEST_XDIST_WORKER_COUNT) takes slice N of the workers', so workers never race each other;
  - never twice in one process, so two calls never collide, and a test that stops a server and
    starts another cannot get the first one's port back;
  - checked free by binding them (without SO_REUSEADDR, so a port with connections in TIME_WAIT
    is skipped too), which guards against other processes on the machine, whose picks start
    elsewhere in the slice (the offset depends on the process id).
A test needing "a port nothing listens on" uses free_port() too: nothing will, for the run.
"""

import os
import socket
import threading

DEFAULT_RANGE = (20000, 31999)

_lock = threading.Lock()
_state = {}


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _slice():
    """(lo, hi) inclusive: this process's ports."""
    lo, hi = DEFAULT_RANGE
    spec = os.environ.get("SHOAL_TEST_PORTS")
    if spec:
        lo, hi = (int(x) for x in spec.split("-", 1))
    hi = min(hi, _ephemeral_low() - 1)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw"):
        n = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
        i = int(worker[2:]) % n
        size = (hi - lo + 1) // n
        lo, hi = lo + i * size, lo + (i + 1) * size - 1
    if hi - lo < 100:
        raise RuntimeError(f"test port range {lo}-{hi} too small (SHOAL_TEST_PORTS, "
                           "ip_local_port_range)")
    return lo, hi


def _bindable(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_block(offsets):
    """A base port B such that every B+o (o in offsets, each >= 0) is free and has not been
    handed out before in this process; all of them are then taken. free_port() is
    free_port_block((0,))."""
    span = max(offsets) + 1
    with _lock:
        if "slice" not in _state:
            lo, hi = _slice()
            _state.update(slice=(lo, hi), next=lo + (os.getpid() * 7919) % (hi - lo + 1),
                          used=set())
        lo, hi = _state["slice"]
        used = _state["used"]
        size = hi - lo + 1
        for _ in range(size):
            base = _state["next"]
            _state["next"] = lo + (base - lo + 1) % size
            ports = [base + o for o in offsets]
            if base + span - 1 > hi or any(p in used for p in ports):
                continue
            if all(_bindable(p) for p in ports):
                used.update(ports)
                return base
        raise RuntimeError(f"no free test port left in {lo}-{hi} ({len(used)} handed out)")


def free_port():
    """A TCP port on 127.0.0.1, free now, outside the ephemeral range, and never returned
    before in this process."""
    return free_port_block((0,))
