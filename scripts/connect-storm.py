#!/usr/bin/env python3
"""connect-storm.py — time a burst of TCP connects to a cache server (docs/operations.md,
"Connection set-up").

Opens N connections to 127.0.0.1:PORT with at most IN_FLIGHT connecting at once and prints the
total time and the spread of connect() completion times, and the kernel's listen-queue
overflow counters (nstat) over the run. A connect completes once the kernel has the handshake;
one that takes about 1 s had its SYN dropped by a full listen queue and retransmitted.

  scripts/connect-storm.py PORT [N [IN_FLIGHT [keep|close]]]

keep (default) holds every connection until the end, as clients that stay connected do (and so
can go past the server's -c); close closes each as soon as it is connected."""

import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from connburst import connect_burst  # noqa: E402 - found through the path set just above


def nstat():
    """TcpExt listen-queue counters since the last call (nstat keeps its own history)."""
    try:
        out = subprocess.run(["nstat"], capture_output=True, text=True).stdout
    except OSError:
        return {}
    want = ("TcpExtListenOverflows", "TcpExtListenDrops", "TcpExtTCPSynRetrans")
    return {f.split()[0]: int(f.split()[1]) for f in out.splitlines()
            if f.split() and f.split()[0] in want}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    port = int(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    in_flight = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    keep = (sys.argv[4] if len(sys.argv) > 4 else "keep") == "keep"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    nstat()
    t0 = time.monotonic()
    took, held, failed = connect_burst(port, n, in_flight, keep=keep, fail_on_error=False)
    total = time.monotonic() - t0
    counters = nstat()
    took.sort()
    print(f"port {port}: {n} connects, {in_flight} in flight, {'held' if keep else 'closed'}: "
          f"{total:.3f} s; p50 {took[n // 2] * 1000:.2f} ms, p99 {took[int(n * 0.99)] * 1000:.2f} ms, "
          f"slowest {took[-1] * 1000:.1f} ms, {sum(t >= 0.5 for t in took)} at 0.5 s or more, "
          f"{failed} failed")
    print("  " + ", ".join(f"{k} {v}" for k, v in counters.items()) if counters
          else "  no listen overflows (nstat)")
    for s in held:
        s.close()


if __name__ == "__main__":
    main()
