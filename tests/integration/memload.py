"""memload.py — bulk pipelined loads, with a model of what must be live, for the memory rules.

test_memory_rules.py drives servers with hundreds of megabytes of stores of many sizes and then
checks every item it believes live. mcraw's buffer is fine for single replies but grows by
concatenation; here replies are read through a buffered file object, values are slices of one
random pool (so a value is checked byte for byte without keeping a copy), and the client's own
account of live bytes is kept next to the server's `bytes`.
"""

import math
import random
import socket
from collections import OrderedDict

VALUE_MAX = 1_000_000  # below the default item limit (-I 1m) of both memcached and shoal-node


def log_uniform(rng, lo, hi):
    """A size in [lo, hi], uniform in log space: as many 10-100 B values as 100-1000 B ones."""
    return min(hi, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))


class Pool:
    """Value bytes: value (off, n) is pool[off:off+n] of one seeded random block."""

    def __init__(self, seed, size=2 * VALUE_MAX + 1):
        self.data = random.Random(seed).randbytes(size)
        self.view = memoryview(self.data)
        self.span = size - VALUE_MAX

    def pick(self, rng, n):
        return (rng.randrange(self.span), n)

    def value(self, ref):
        off, n = ref
        return self.view[off:off + n]


class Bulk:
    """One TCP connection for pipelined text-protocol requests with one-line replies (set,
    delete) and for multi-key gets. Every read waits at most `timeout` seconds."""

    def __init__(self, host, port, timeout=30.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rf = self.sock.makefile("rb", buffering=1 << 20)

    def close(self):
        self.rf.close()
        self.sock.close()

    def line(self):
        got = self.rf.readline()
        if not got.endswith(b"\r\n"):
            raise ConnectionError(f"connection closed mid-reply: {got[:200]!r}")
        return got[:-2].decode("latin-1")

    def run(self, frames):
        """Send the request frames (bytes-like) in one write and return one reply line each.
        Only for requests whose replies are one short line (the server never blocks on them)."""
        self.sock.sendall(b"".join(frames))
        return [self.line() for _ in frames]

    def get_many(self, keys):
        """`get` of keys (str), 100 a line, each line's reply read before the next line is sent
        (callers keep a line's values to a few megabytes): {key: value bytes}."""
        out = {}
        for i in range(0, len(keys), 100):
            self.sock.sendall(("get " + " ".join(keys[i:i + 100]) + "\r\n").encode())
            while True:
                head = self.line()
                if head == "END":
                    break
                parts = head.split(" ")
                if parts[0] != "VALUE":
                    raise AssertionError(f"expected VALUE or END, got {head!r}")
                n = int(parts[3])
                data = self.rf.read(n + 2)
                if len(data) != n + 2 or data[-2:] != b"\r\n":
                    raise AssertionError(f"bad data block for {parts[1]}")
                out[parts[1]] = data[:-2]
        return out

    def stats(self, arg=""):
        self.sock.sendall((f"stats {arg}".rstrip() + "\r\n").encode())
        out = {}
        while True:
            got = self.line()
            if got == "END":
                return out
            parts = got.split(" ", 2)
            out[parts[1]] = parts[2] if len(parts) > 2 else ""


def batches(keys, size_of, max_bytes=4 << 20, max_keys=100):
    """Split keys into lists of at most max_keys whose values add up to at most max_bytes (or
    one key): one `get` line each, so no reply is larger than a few megabytes."""
    out, cur, total = [], [], 0
    for k in keys:
        n = size_of(k)
        if cur and (len(cur) >= max_keys or total + n > max_bytes):
            out.append(cur)
            cur, total = [], 0
        cur.append(k)
        total += n
    if cur:
        out.append(cur)
    return out


def set_frame(key, value, flags=0):
    return b"set %s %d 0 %d\r\n%s\r\n" % (key.encode(), flags, len(value), value)


def item_overhead(bulk, bytes_of, key="memload:probe"):
    """Bytes the server counts per item beyond its key and value: store a probe item, read how
    much `bytes_of(stats)` grew, delete it again."""
    before = bytes_of(bulk)
    value = b"p" * 1000
    assert bulk.run([set_frame(key, value)]) == ["STORED"]
    grew = bytes_of(bulk) - before
    assert bulk.run([f"delete {key}\r\n".encode()]) == ["DELETED"]
    return max(0, grew - len(key) - len(value))


class LiveSet:
    """The client's model: key -> value ref, oldest first, with the bytes the server should
    count for them (key + value + the per-item overhead measured at the start)."""

    def __init__(self, overhead):
        self.items = OrderedDict()
        self.overhead = overhead
        self.bytes = 0
        self.keys = []  # every key ever stored, for random picks (dead ones are skipped)

    def cost(self, key, n):
        return len(key) + n + self.overhead

    def put(self, key, ref):
        old = self.items.pop(key, None)
        if old is None:
            self.keys.append(key)
        else:
            self.bytes -= self.cost(key, old[1])
        self.items[key] = ref
        self.bytes += self.cost(key, ref[1])

    def drop(self, key):
        ref = self.items.pop(key)
        self.bytes -= self.cost(key, ref[1])

    def oldest(self):
        return next(iter(self.items))

    def random_live(self, rng):
        for _ in range(20):
            k = self.keys[rng.randrange(len(self.keys))]
            if k in self.items:
                return k
        return None


class Churn:
    """Stores, overwrites and deletes that keep the modelled live bytes at or below `high_water`
    at every instant, counting an overwrite's old and new value both (a server may hold both
    while the new one is stored). Oldest items are deleted first to make room, so a phase that
    writes its capacity's worth replaces the whole live set with its own sizes."""

    def __init__(self, bulk, pool, live, rng, high_water, prefix, batch_bytes=4 << 20):
        self.bulk, self.pool, self.live, self.rng = bulk, pool, live, rng
        self.high_water, self.prefix, self.batch_bytes = high_water, prefix, batch_bytes
        self.written = 0       # value bytes stored
        self.requests = 0
        self.next_key = 0
        self.lost = []         # (key, reply) of deletes that found nothing, sets not STORED
        self.frames, self.expect, self.pending = [], [], 0

    def _queue(self, frame, key, want):
        self.frames.append(frame)
        self.expect.append((key, want))
        self.pending += len(frame)
        if self.pending >= self.batch_bytes or len(self.frames) >= 2000:
            self.flush()

    def flush(self):
        if not self.frames:
            return
        replies = self.bulk.run(self.frames)
        self.requests += len(self.frames)
        for (key, want), got in zip(self.expect, replies):
            if got != want:
                self.lost.append((key, got))
        self.frames, self.expect, self.pending = [], [], 0

    def _delete(self, key):
        self.live.drop(key)
        self._queue(f"delete {key}\r\n".encode(), key, "DELETED")

    def _set(self, key, n):
        need = self.live.cost(key, n)
        while self.live.bytes + need > self.high_water and self.live.items:
            victim = self.live.oldest()
            self._delete(victim)
        ref = self.pool.pick(self.rng, n)
        self.live.put(key, ref)
        self.written += n
        self._queue(set_frame(key, self.pool.value(ref)), key, "STORED")

    def step(self, lo, hi, p_overwrite=0.25, p_delete=0.10):
        """One random operation with a value size log-uniform in [lo, hi]."""
        roll = self.rng.random()
        if roll < p_delete and self.live.items:
            key = self.live.random_live(self.rng)
            if key is not None:
                self._delete(key)
                return
        key = None
        if roll < p_delete + p_overwrite and self.live.items:
            key = self.live.random_live(self.rng)
        if key is None:
            key = f"{self.prefix}{self.next_key}"
            self.next_key += 1
        self._set(key, log_uniform(self.rng, lo, hi))

    def phase(self, lo, hi, write_bytes):
        """Random operations until `write_bytes` more value bytes have been stored."""
        goal = self.written + write_bytes
        while self.written < goal:
            self.step(lo, hi)
        self.flush()

    def verify(self):
        """Read every modelled key: returns (missing keys, keys with a wrong value)."""
        keys = list(self.live.items)
        missing, wrong = [], []
        for chunk in batches(keys, lambda k: self.live.items[k][1]):
            got = self.bulk.get_many(chunk)
            for k in chunk:
                if k not in got:
                    missing.append(k)
                elif got[k] != self.pool.value(self.live.items[k]):
                    wrong.append(k)
        return missing, wrong
