"""connburst.py — a burst of TCP connects timed one by one, shared by test_conn_setup.py and
scripts/connect-storm.py (which imports it from here)."""

import selectors
import socket
import time


def connect_burst(port, n, in_flight, keep=True, fail_on_error=True):
    """Open n connections to 127.0.0.1:port, at most in_flight connecting at once; hold them all
    (keep) or close each once connected. A connect completes once the kernel has the handshake:
    about 1 s means its SYN was dropped by a full listen queue and retransmitted.
    Returns (seconds each connect took to complete, the sockets held, how many failed); with
    fail_on_error a failed connect raises instead. Raises when no connect completes for 10 s."""
    sel = selectors.DefaultSelector()
    took, held, started, failed = [], [], 0, 0
    try:
        while len(took) < n:
            while started < n and started - len(took) < in_flight:
                s = socket.socket()
                s.setblocking(False)
                try:
                    s.connect(("127.0.0.1", port))
                except BlockingIOError:
                    pass
                sel.register(s, selectors.EVENT_WRITE, time.monotonic())
                started += 1
            ready = sel.select(timeout=10)
            if not ready:
                raise RuntimeError(f"no connect completed within 10 s ({len(took)} of {n} done)")
            for key, _ in ready:
                took.append(time.monotonic() - key.data)
                sel.unregister(key.fileobj)
                err = key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err and fail_on_error:
                    key.fileobj.close()
                    raise RuntimeError(f"connect {len(took)} of {n} failed: errno {err}")
                failed += err != 0
                if keep:
                    held.append(key.fileobj)
                else:
                    key.fileobj.close()
    except BaseException:
        for key in list(sel.get_map().values()):
            key.fileobj.close()
        for s in held:
            s.close()
        raise
    finally:
        sel.close()
    return took, held, failed
