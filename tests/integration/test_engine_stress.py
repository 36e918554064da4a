"""Concurrency stress for shoal-node's item memory (the segmented log): many connections mixing
every storage, read, delete and touch command, text and meta, with values from 10 B to 300 KB and
short TTLs at a tiny -m, while other threads flush, dump keys (`lru_crawler metadump`, `stats
cachedump`), read `stats slabs` and change namespace quotas and eviction policies on the admin
port. Cleaning and eviction move live items under their shard lock all the while, so any read
that sees a half-moved, reused or mis-accounted record shows up: every value is self-checking
(made of units naming their key, their length and a pattern derived from both), so a torn,
wrong-key or wrong-length value fails the test. At the end the node must still answer, its
counters must be sane (curr_items equals what a metadump lists once the short TTLs have passed,
0 <= bytes <= -m) and, on the sanitizer build, its stderr must be clean. shoal only (admin API).

Duration: SHOAL_STRESS_SECONDS, else 20 s (8 s on the sanitizer build, which is ~10x slower)."""

import hashlib
import json
import os
import random
import re
import threading
import time

import pytest

from mcraw import ConnectionClosed, McRaw, accepts, free_port, http, wait_until

pytestmark = pytest.mark.shoal_only

MB = 1 << 20
SAN = "build-san" in os.environ.get("SHOAL_NODE_BIN", "")
SECONDS = float(os.environ.get("SHOAL_STRESS_SECONDS", "8" if SAN else "20"))
CLIENTS = 10
POLICIES = ["lru", "lfu", "s3fifo"]
NAMESPACES = ["qa", "qb", "qc"]
_PAT = {}


def pattern(key: bytes, n: int) -> bytes:
    """n bytes derived from key and n."""
    seed = (key, n % 251)
    p = _PAT.get(seed)
    if p is None:
        p = hashlib.sha256(b"%s/%d" % seed).hexdigest().encode() * 8  # 512 bytes
        _PAT[seed] = p
    return (p * (n // len(p) + 1))[:n]


def unit(key: bytes, n: int) -> bytes:
    """A self-checking unit of exactly n bytes (n >= len(key) + 12) for key."""
    head = b"<%s|%08d|" % (key, n)
    return head + pattern(key, n - len(head) - 1) + b">"


def min_unit(key: bytes) -> int:
    return len(key) + 12


def check_value(key: bytes, data: bytes, flags=None):
    """Raise AssertionError unless data is a concatenation of key's units (or, for the counter
    family, a decimal number) and flags (if given) are key's."""
    if key.split(b":")[-1].startswith(b"n"):
        assert data.rstrip(b" ").isdigit(), f"{key!r}: counter value {data[:80]!r}"
        return
    if flags is not None:
        assert flags == key_flags(key), f"{key!r}: flags {flags} are not the key's"
    p = 0
    assert data, f"{key!r}: empty value"
    while p < len(data):
        head = b"<%s|" % key
        assert data[p:p + len(head)] == head, \
            f"{key!r}: value at {p}/{len(data)} does not start with its key: {data[p:p + 60]!r}"
        n = int(data[p + len(head):p + len(head) + 8])
        assert p + n <= len(data), f"{key!r}: unit of {n} at {p} overruns {len(data)}"
        assert data[p:p + n] == unit(key, n), \
            f"{key!r}: unit of {n} bytes at {p}/{len(data)} is corrupt"
        p += n


def key_flags(key: bytes) -> int:
    return int.from_bytes(hashlib.md5(key).digest()[:2], "little")


def value_size(rng):
    r = rng.random()
    if r < 0.55:
        return rng.randint(10, 400)
    if r < 0.85:
        return rng.randint(400, 8000)
    if r < 0.97:
        return rng.randint(8000, 60000)
    return rng.randint(60000, 300000)


class Client:
    """One connection doing random commands; validates every reply."""

    def __init__(self, port, seed, stats, deadline):
        self.c = McRaw("127.0.0.1", port, timeout=20)
        self.rng = random.Random(seed)
        self.stats, self.deadline = stats, deadline
        self.oom = []

    def key(self):
        rng = self.rng
        fam = rng.choice([b"k", b"k", b"k", b"a", b"n"])
        ns = rng.choice([b"", b"", b"qa:", b"qb:", b"qc:"])
        return ns + fam + b"%d" % rng.randint(0, 400)

    def value(self, key):
        n = max(value_size(self.rng), min_unit(key))
        return unit(key, n)

    def ttl(self):
        return self.rng.choice([0, 0, 1, 2, 3])

    def count(self, what):
        self.stats[what] = self.stats.get(what, 0) + 1

    def expect(self, line, allowed, cmd):
        ok = line in allowed or line.startswith("SERVER_ERROR out of memory") or \
            line == "SERVER_ERROR object too large for cache"
        assert ok, f"{cmd!r}: unexpected reply {line!r}"
        if line.startswith("SERVER_ERROR"):
            self.count("server_error")
            self.oom.append(cmd[:60])

    def read_values(self, cmd):
        got = 0
        while True:
            line = self.c.read_line()
            if line == "END":
                return got
            parts = line.split(" ")
            assert parts[0] == "VALUE", f"{cmd!r}: unexpected {line!r}"
            key, flags, n = parts[1].encode("latin-1"), int(parts[2]), int(parts[3])
            data = self.c.read_value(n)
            check_value(key, data, flags)
            got += 1

    def op(self):
        rng, c = self.rng, self.c
        key = self.key()
        base = key.split(b":")[-1]
        counter = base.startswith(b"n")
        kind = rng.random()
        if counter:
            self.counter_op(key, kind)
            return
        if kind < 0.22:
            cmd = rng.choice([b"set", b"set", b"add", b"replace"])
            v = self.value(key)
            line = b"%s %s %d %d %d\r\n" % (cmd, key, key_flags(key), self.ttl(), len(v))
            c.send(line + v + b"\r\n")
            self.expect(c.read_line(), ("STORED", "NOT_STORED"), line)
            self.count("store")
        elif kind < 0.30 and base.startswith(b"a"):
            cmd = rng.choice([b"append", b"prepend"])
            v = unit(key, max(min_unit(key), rng.randint(10, 3000)))
            line = b"%s %s 0 0 %d\r\n" % (cmd, key, len(v))
            c.send(line + v + b"\r\n")
            self.expect(c.read_line(), ("STORED", "NOT_STORED"), line)
            self.count("append")
        elif kind < 0.36:
            c.send(b"gets %s\r\n" % key)
            line = c.read_line()
            if line == "END":
                return
            parts = line.split(" ")
            assert parts[0] == "VALUE", line
            data = c.read_value(int(parts[3]))
            check_value(key, data, int(parts[2]))
            assert c.read_line() == "END"
            v = self.value(key)
            cl = b"cas %s %d %d %d %s\r\n" % (key, key_flags(key), self.ttl(), len(v),
                                              parts[4].encode())
            c.send(cl + v + b"\r\n")
            self.expect(c.read_line(), ("STORED", "EXISTS", "NOT_FOUND"), cl)
            self.count("cas")
        elif kind < 0.60:
            keys = [key] + [self.key() for _ in range(rng.randint(0, 6))]
            keys = [k for k in keys if not k.split(b":")[-1].startswith(b"n")]
            cmd = rng.choice([b"get", b"gets", b"gat 5", b"gats 3"])
            line = b"%s %s\r\n" % (cmd, b" ".join(keys))
            c.send(line)
            self.stats["hits"] = self.stats.get("hits", 0) + self.read_values(line)
            self.count("get")
        elif kind < 0.72:
            c.send(b"mg %s v f c t k\r\n" % key)
            line = c.read_line()
            if line.startswith("VA "):
                parts = line.split(" ")
                data = c.read_value(int(parts[1]))
                fl = [p for p in parts[2:] if p.startswith("f")]
                kf = [p for p in parts[2:] if p.startswith("k")]
                assert kf == ["k" + key.decode()], f"mg {key!r}: {line}"
                check_value(key, data, int(fl[0][1:]))
                self.count("hits")
            else:
                assert line in ("EN", "EN k" + key.decode()), f"mg {key!r}: {line!r}"
            self.count("mg")
        elif kind < 0.82:
            v = self.value(key)
            mode = rng.choice([b"", b" MS", b" ME", b" MR"])
            line = b"ms %s %d T%d F%d%s\r\n" % (key, len(v), self.ttl(), key_flags(key), mode)
            c.send(line + v + b"\r\n")
            self.expect(c.read_line(), ("HD", "NS", "NF"), line)
            self.count("ms")
        elif kind < 0.88:
            if rng.random() < 0.5:
                c.send(b"delete %s\r\n" % key)
                self.expect(c.read_line(), ("DELETED", "NOT_FOUND"), key)
            else:
                c.send(b"md %s\r\n" % key)
                self.expect(c.read_line(), ("HD", "NF"), key)
            self.count("delete")
        elif kind < 0.94:
            c.send(b"touch %s %d\r\n" % (key, self.ttl()))
            self.expect(c.read_line(), ("TOUCHED", "NOT_FOUND"), key)
            self.count("touch")
        else:
            # a pipelined burst of sets and gets on one key: the reply order is fixed
            n = rng.randint(2, 6)
            out, want = [], []
            for _ in range(n):
                v = self.value(key)
                out.append(b"set %s %d 0 %d\r\n%s\r\nget %s\r\n" % (key, key_flags(key), len(v),
                                                                      v, key))
            c.send(b"".join(out))
            for _ in range(n):
                self.expect(c.read_line(), ("STORED",), b"burst set")
                self.read_values(b"burst get")
            self.count("burst")

    def counter_op(self, key, kind):
        c = self.c
        if kind < 0.3:
            v = b"%d" % self.rng.randint(0, 10 ** 12)
            c.send(b"set %s 0 %d %d\r\n%s\r\n" % (key, self.ttl(), len(v), v))
            self.expect(c.read_line(), ("STORED",), key)
        elif kind < 0.7:
            cmd = self.rng.choice([b"incr", b"decr"])
            c.send(b"%s %s %d\r\n" % (cmd, key, self.rng.randint(1, 10 ** 6)))
            line = c.read_line()
            assert line.isdigit() or line == "NOT_FOUND" or line.startswith("SERVER_ERROR out"), \
                f"{cmd!r} {key!r}: {line!r}"
        else:
            c.send(b"get %s\r\n" % key)
            self.read_values(b"get counter")
        self.count("counter")

    def run(self):
        while time.monotonic() < self.deadline:
            self.op()


def reader_loop(port, deadline, stats):
    """Dumps and stats while everything moves."""
    c = McRaw("127.0.0.1", port, timeout=30)
    rng = random.Random(7)
    while time.monotonic() < deadline:
        r = rng.random()
        if r < 0.3:
            c.send(b"lru_crawler metadump all\r\n")
            data = c.read_until(b"END\r\n")
            for line in data[:-5].split(b"\n"):  # lines end in a bare \n, END in \r\n
                assert not line or line.startswith(b"key="), f"metadump line {line[:100]!r}"
            stats["metadumps"] = stats.get("metadumps", 0) + 1
        elif r < 0.6:
            c.send(b"stats cachedump %d 50\r\n" % rng.randint(1, 40))
            data = c.read_until(b"END\r\n")
            for line in data.split(b"\r\n")[:-2]:
                assert line.startswith(b"ITEM "), f"cachedump line {line[:100]!r}"
        elif r < 0.8:
            c.send(b"stats slabs\r\n")
            c.read_until(b"END\r\n")
        else:
            c.send(b"stats items\r\n")
            c.read_until(b"END\r\n")


def flusher_loop(port, deadline):
    c = McRaw("127.0.0.1", port, timeout=20)
    rng = random.Random(11)
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(1.0, 3.0))
        c.send(b"flush_all\r\n" if rng.random() < 0.7 else b"flush_all 1\r\n")
        assert c.read_line() == "OK"


def admin_loop(admin, memory, deadline):
    rng = random.Random(13)
    seg = max(64 * 1024, 1 << ((memory // 64).bit_length() - 1))
    seg = min(seg, MB)
    while time.monotonic() < deadline:
        name = rng.choice(NAMESPACES)
        quota = rng.choice([0, seg, 2 * seg, 4 * seg, memory // 8, memory // 4])
        st, body = http(admin, "PUT", f"/v1/namespaces/{name}",
                        {"memory": quota, "eviction": rng.choice(POLICIES)})
        assert st in (200, 201), body
        time.sleep(rng.uniform(0.05, 0.4))


def read_stats(c, arg=b""):
    c.send(b"stats %s\r\n" % arg if arg else b"stats\r\n")
    data = c.read_until(b"END\r\n").decode("latin-1")
    return {m.group(1): m.group(2) for m in re.finditer(r"STAT (\S+) (\S+)", data)}


def metadump_keys(c):
    c.send(b"lru_crawler metadump all\r\n")
    data = c.read_until(b"END\r\n")
    return [ln for ln in data[:-5].split(b"\n") if ln]


@pytest.mark.parametrize("memory_mb", [8, 16])
def test_engine_survives_concurrent_mixed_load_with_moves(start_server, memory_mb):
    admin = free_port()
    node = start_server("-m", str(memory_mb), "-t", "4", "--admin-port", str(admin))
    wait_until(lambda: accepts(admin), timeout=5, message="the admin port to accept connections")
    for i, name in enumerate(NAMESPACES):
        st, body = http(admin, "PUT", f"/v1/namespaces/{name}",
                        {"memory": memory_mb * MB // 4, "eviction": POLICIES[i]})
        assert st in (200, 201), body

    deadline = time.monotonic() + SECONDS
    errors, stats = [], {}

    def guard(fn, *args):
        def run():
            try:
                fn(*args)
            except BaseException as e:  # report every thread's failure, not only the first
                errors.append(f"{fn.__qualname__}: {type(e).__name__}: {e}")
        return threading.Thread(target=run, daemon=True)

    clients = [Client(node.port, seed, stats, deadline) for seed in range(CLIENTS)]
    threads = [guard(cl.run) for cl in clients]
    off = os.environ.get("SHOAL_STRESS_OFF", "")  # for bisecting a failure: "flush,admin,dump"
    if "dump" not in off:
        threads.append(guard(reader_loop, node.port, deadline, stats))
    if "flush" not in off:
        threads.append(guard(flusher_loop, node.port, deadline))
    if "admin" not in off:
        threads.append(guard(admin_loop, admin, memory_mb * MB, deadline))
    for t in threads:
        t.start()
    for t in threads:
        t.join(SECONDS + 120)
    assert not any(t.is_alive() for t in threads), "a client thread hung (node stuck?)"
    assert not errors, "\n".join(errors[:10])
    assert node.alive(), node.stderr_text()

    c = McRaw("127.0.0.1", node.port, timeout=30)
    # An immediate flush also cancels a delayed one the flusher may have left pending; then a
    # known set of long-lived items of mixed sizes goes in, into memory the load left behind.
    # Counts leaked by the load survive the flush (only what is reaped is uncounted).
    c.send(b"flush_all\r\n")
    assert c.read_line() == "OK"
    # Room for the final set in every namespace: no quota. With a quota lowered here (say
    # SHOAL_STRESS_END_QUOTA=2097152) a namespace holding far less than it sometimes loses
    # some of the final items (an open finding of the stress, see the hammer report).
    end_quota = int(os.environ.get("SHOAL_STRESS_END_QUOTA", "0"))
    for name in NAMESPACES:
        st_, body = http(admin, "PUT", f"/v1/namespaces/{name}",
                         {"memory": end_quota, "eviction": "lru"})
        assert st_ in (200, 201), body
    rng = random.Random(5)
    end = {}
    for i in range(200):
        key = rng.choice([b"", b"qa:", b"qb:", b"qc:"]) + b"end%d" % i
        v = unit(key, max(min_unit(key), value_size(rng) // 4))
        c.send(b"set %s %d 0 %d\r\n%s\r\n" % (key, key_flags(key), len(v), v))
        if c.read_line() == "STORED":
            end[key] = v
    assert len(end) == 200, f"only {len(end)} of 200 final stores accepted"

    st = read_stats(c)
    assert 0 <= int(st["bytes"]) <= memory_mb * MB, st["bytes"]
    # Short TTLs are at most 5 s (gat): once they have passed and the sweeper has been round,
    # what the counters say is held is what a dump lists.
    last = {}

    def consistent():
        s = read_stats(c)
        keys = metadump_keys(c)
        last.update(items=int(s["curr_items"]), dumped=len(keys), bytes=int(s["bytes"]))
        return last["items"] == last["dumped"]

    try:
        wait_until(consistent, timeout=15, interval=0.5, message="")
    except AssertionError:
        c.send(b"stats items\r\n")
        items = c.read_until(b"END\r\n")
        pytest.fail(f"curr_items {last['items']} never equalled the metadump's "
                    f"{last['dumped']} keys; {items.decode()[:3000]}")
    held = 0
    for key, v in end.items():  # ~0.5 MB in all, a small share of each namespace: all held
        c.send(b"get %s\r\n" % key)
        line = c.read_line()
        if line != "END":
            assert line == "VALUE %s %d %d" % (key.decode(), key_flags(key), len(v)), line
            assert c.read_value(len(v)) == v and c.read_line() == "END", key
            held += 1
    if held != len(end):
        missing = {}
        for key in end:
            c.send(b"get %s\r\n" % key)
            if c.read_until(b"END\r\n") == b"END\r\n":
                ns = key.split(b":")[0].decode() if b":" in key else "default"
                missing[ns] = missing.get(ns, 0) + 1
        figures = {n: json.loads(http(admin, "GET", f"/v1/namespaces/{n}")[1])["stats"]
                   for n in NAMESPACES + ["default"]}
        pytest.fail(f"{held} of {len(end)} final items held; missing per namespace {missing}; "
                    f"{figures}; {last}")
    assert held == last["items"], (held, last)
    assert 0 <= last["bytes"] <= memory_mb * MB, last
    for name in NAMESPACES:
        s, body = http(admin, "GET", f"/v1/namespaces/{name}")
        assert s == 200, body
        ns = json.loads(body)["stats"]
        assert 0 <= ns["items"] <= last["items"] and 0 <= ns["bytes"] <= memory_mb * MB, ns
    slabs = read_stats(c, b"slabs")
    assert int(slabs.get("total_malloced", 0)) <= memory_mb * MB, slabs.get("total_malloced")
    text = node.stderr_text()
    for bad in ("runtime error", "AddressSanitizer", "LeakSanitizer", "freed twice", "store_replace:",
                "error", "assert"):
        assert bad not in text, text[-4000:]
    print(f"\n-m {memory_mb}: {stats}, final {last}")
    if os.environ.get("SHOAL_STRESS_OOM"):
        for cl in clients:
            for cmd in cl.oom:
                print("OOM", cmd)
    assert stats.get("store", 0) > 0, stats
    # A store that fits is refused only in rare races (every victim pinned or busy, a run with no
    # contiguous room): before the one-segment-quota fix, 1% of stores failed here.
    stores = sum(stats.get(k, 0) for k in ("store", "append", "cas", "ms", "burst"))
    assert stats.get("server_error", 0) <= stores * 0.003, stats
