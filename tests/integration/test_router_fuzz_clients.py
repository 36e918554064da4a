"""A differential fuzz of shoal-router against its clients: many clients send random and
malformed requests (CRs and control bytes in keys and tokens, quiet mode, noreply, base64 keys,
odd flags and numbers, wrong data blocks, garbage, over-long lines, binary bytes) through a
router in front of one node, and the same requests straight to another node alone. Each batch
must be answered alike by both (but for CAS values and times, which are the nodes' own), and
no client's bytes may cost the node anything: the router marks it down after one failure here
(--down-after 1) and repairs it from a log of two keys (--repair-log 2), so any request counted
as the node's fault shows in `nodes_marked_down`, a logged key or a flush. Meanwhile
well-behaved clients of the same node must be served every time, and keys set before the run
must still be there after it.

Against memcached nodes (SHOAL_TEST_SERVER=memcached) the answers are not compared (the router
parses requests as shoal-node does, which differs from memcached 1.6.18 where docs/protocol.md
says so); the faults are.

The two nodes differ in their clocks (started apart) and CAS counters (the router's node also
serves the canaries and the well-behaved clients), so the generator never lets either decide an
answer: TTLs, delete hold-offs and recache times are none, refused, already past or far longer
than the test, and CAS values compared or set are 0, refused or far above any counter (see
Gen.ttl, hold, recache, cas).

Seeded (SHOAL_FUZZ_SEED, default 12) and bounded in time (SHOAL_FUZZ_SECONDS, default 8); a
failure prints the seed, the client and the batch that differed."""

import base64
import os
import random
import re
import socket
import threading
import time

from conftest import SERVER_KIND, topology
from mcraw import ConnectionClosed, McRaw, accepts, http, wait_until

SEED = int(os.environ.get("SHOAL_FUZZ_SEED", "12"))
SECONDS = float(os.environ.get("SHOAL_FUZZ_SECONDS", "8"))
FUZZERS = 6
GOOD = 2
# the router parses as shoal-node does, which differs from memcached 1.6.18 where
# docs/protocol.md says so: against memcached nodes only the faults are compared
COMPARE = SERVER_KIND != "memcached"
FAULTS = ("nodes_marked_down", "upstream_protocol_errors", "upstream_errors",
          "upstream_timeouts", "upstream_connect_failures", "repair_keys_logged",
          "repair_log_overflows", "repair_flushes", "repair_deletes")


def router_counters(admin):
    status, body = http(admin, "GET", "/metrics")
    assert status == 200, body
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"^shoal_router_(\w+?)(?:_total)? (\d+)$", body, re.M)}


class Gen:
    """Random requests of one client, on keys of its own (so both nodes see each key's requests
    in the same order whatever the other clients do)."""

    ODD = [b"", b"", b"", b"\r", b"\r\r", b"\x01", b"\x7f", b"\xff", b"\t", b"\xc3\xa9", b"\x00"]
    FLAGS = b"vkOqsftchlbNRTEICHMDJFuxQ"

    def __init__(self, rng, cid):
        self.r, self.cid = rng, cid

    def key(self):
        r = self.r
        k = b"z%d%s" % (self.cid, r.choice([b"a", b"b", b"c", b"d"]))
        if r.random() < 0.03:
            k += b"x" * r.choice([240, 250, 260])  # about the 250-byte limit
        return k + r.choice(self.ODD)

    def num(self):
        r = self.r
        return r.choice([b"0", b"1", b"5", b"-1", b"1000", b"99999999999999999999", b"x", b"",
                         b"1\r", b"0x10", b"+3", b"1000000000"])

    def ttl(self):
        """A TTL that is no race: never, already expired, or far off (a TTL of a second or
        two could run out between the two sides' requests)."""
        return self.r.choice([b"0", b"-1", b"1000", b"1000000000", b"99999999999999999999",
                              b"x", b"", b"1000\r", b"+1000"])

    def cas(self):
        """A CAS value to compare with (cas, C) or to set (E) that no node hands out: each node
        numbers its own writes, and the router's also numbers the canaries' and the well-behaved
        clients', so `cas k 0 0 1 3` could match on the node alone only. Values set with E are
        the same on both sides and may be matched."""
        return self.r.choice([b"0", b"-1", b"x", b"", b"1000000000000", b"1000000000000\r",
                              b"+1000000000000", b"99999999999999999999", b"0x10", b"2000000000000"])

    def hold(self):
        """A delete hold-off time that is no race: none, refused, or longer than the test. Each
        node times a hold on its own clock, so a hold of a second or two could end on one side
        and not the other, and an add or an N placeholder would then differ."""
        return self.r.choice([b"0", b"-1", b"1000", b"99999999999999999999", b"x", b"", b"1000\r",
                              b"+1000", b"1000 x"])

    def recache(self):
        """An R (recache) time that is no race against the TTLs above: an item set with T1000
        has 1000 or 999 seconds left depending on where each node's clock tick falls."""
        return self.r.choice([b"", b"1", b"-1", b"0", b"99999", b"x", b"\r", b"7\r", b"a" * 40])

    def data(self, n):
        return bytes(self.r.choice(b"abcdefgh0123456789") for _ in range(n))

    def token(self):
        return self.r.choice([b"", b"1", b"-1", b"1000", b"x", b"\r", b"7\r", b"abc\r", b"\x01",
                              b"S", b"E", b"a" * 31, b"a" * 40])

    def meta(self):
        r = self.r
        cmd = r.choice([b"mg", b"mg", b"ms", b"md", b"ma", b"me", b"mn"])
        key = self.key()
        if r.random() < 0.15:
            key = base64.b64encode(key.rstrip(b"\x00") or b"k") + r.choice([b"", b"\r", b"="])
        parts = [cmd, key]
        n = None
        if cmd == b"ms":
            n = r.choice([0, 1, 3, 8])
            parts.append(r.choice([str(n).encode()] * 6 + [b"x", b"-1", b""]))
        for _ in range(r.randint(0, 6)):
            f = bytes([r.choice(self.FLAGS)])
            pick = {b"T": self.ttl, b"N": self.ttl, b"H": self.hold, b"R": self.recache,
                    b"C": self.cas, b"E": self.cas}
            tok = pick.get(f, self.token)() if r.random() < 0.6 else b""
            parts.append(f + tok)
        line = b" ".join(parts)
        if r.random() < 0.1:
            line += b" "
        out = line + b"\r\n"
        if n is not None:
            out += self.data(n) + (b"\r\n" if r.random() < 0.9 else b"xy")
        return out

    def storage(self):
        r = self.r
        cmd = r.choice([b"set", b"add", b"replace", b"append", b"prepend", b"cas"])
        n = r.choice([0, 1, 4, 10])
        parts = [cmd, self.key(), r.choice([b"0", b"5", b"-1", b"x", b"4294967296"]),
                 r.choice([b"0", b"-1", b"1000", b"1000000000", b"x"]),
                 r.choice([str(n).encode()] * 8 + [b"-1", b"x"])]
        if cmd == b"cas":
            parts.append(self.cas())
        if r.random() < 0.2:
            parts.append(b"noreply")
        if r.random() < 0.05:
            parts.append(b"junk")
        term = r.choice([b"\r\n"] * 8 + [b"xy", b"\n\r"])
        return b" ".join(parts) + b"\r\n" + self.data(n) + term

    def get(self):
        r = self.r
        cmd = r.choice([b"get", b"gets", b"gat", b"gats"])
        keys = [self.key() for _ in range(r.randint(0, 4))]
        if cmd in (b"gat", b"gats"):
            keys.insert(0, r.choice([b"0", b"-1", b"1000", b"x"]))
        return b" ".join([cmd] + keys) + r.choice([b"\r\n", b"\r\n", b" \r\n", b"\r\r\n"])

    def other(self):
        r = self.r
        cmd = r.choice([b"delete", b"incr", b"decr", b"touch"])
        parts = [cmd, self.key()]
        if cmd == b"touch":
            parts.append(self.ttl())
        elif cmd == b"delete":
            if r.random() < 0.3:
                parts.append(self.hold())
        else:
            parts.append(self.num())
        if r.random() < 0.2:
            parts.append(b"noreply")
        return b" ".join(parts) + b"\r\n"

    def garbage(self):
        r = self.r
        return bytes(r.choice(b"\x00\x01\x1b\r\t abcz09\xff\x7f:") for _ in range(r.randint(0, 40))) \
            + b"\r\n"

    def request(self):
        """One request; (bytes, True when both sides close the connection after it)."""
        r = self.r
        x = r.random()
        if x < 0.01 and not COMPARE:  # memcached closes on neither, mid-connection
            x = 0.01
        if x < 0.005:
            # binary protocol (at a line's start: after an empty line): ERROR and a close
            return b"\r\n\x80\x00\x00\x00junk\r\n", True
        if x < 0.01:
            return b"\r\nmg " + b"y" * (70 * 1024) + b"\r\n", True  # over --line-max: a close
        if x < 0.015:  # a get line over --line-max: answered in parts
            return b"get " + b" ".join(self.key() for _ in range(7000)) + b"\r\n", False
        if x < 0.45:
            return self.meta(), False
        if x < 0.65:
            return self.storage(), False
        if x < 0.8:
            return self.get(), False
        if x < 0.93:
            return self.other(), False
        return self.garbage(), False


# CAS values, TTLs and access times are each node's own
NORMALISE = [
    (re.compile(rb"(?<= )c\d+"), b"c#"),
    (re.compile(rb"(?<= )t-?\d+"), b"t#"),
    (re.compile(rb"(?<= )l\d+"), b"l#"),
    (re.compile(rb"(cas|la|exp)=-?\d+"), rb"\1=#"),
    (re.compile(rb"(?m)^(VALUE [^ ]+ \d+ \d+) \d+\r$"), rb"\1 #\r"),
]


def normalise(b):
    for rx, to in NORMALISE:
        b = rx.sub(to, b)
    return b


class Side:
    """A fuzzing client's connection to one side (router or node alone)."""

    def __init__(self, port):
        self.port = port
        self.c = None

    def exchange(self, data, sentinel, closes):
        """Send data then the sentinel request; what came back up to the sentinel's reply, or
        up to the close (then reconnect)."""
        if self.c is None:
            self.c = McRaw("127.0.0.1", self.port, timeout=5)
        self.c.send(data + (b"" if closes else sentinel[0]))
        if closes:
            got = self.c.read_all_until_closed(timeout=5)
            self.c.close()
            self.c = None
            return got + b"<closed>"
        try:
            return self.c.read_until(sentinel[1], timeout=5)
        except (ConnectionClosed, ConnectionResetError):  # as it was meant to (line too long)
            got, self.c.buf = self.c.buf, b""
            self.c.close()
            self.c = None
            return got + b"<closed>"


def fuzz_client(cid, router, alone, deadline, diffs, counts):
    """One fuzzing client; a failure of the test's own code is a difference too (a thread's
    exception would otherwise only stop that client and leave the test passing)."""
    try:
        fuzz_one(cid, router, alone, deadline, diffs, counts)
    except Exception as e:  # noqa: BLE001 - reported as the test's failure
        diffs.append((cid, counts[cid], b"", f"fuzz client crashed: {e!r}"))


def fuzz_one(cid, router, alone, deadline, diffs, counts):
    rng = random.Random(SEED * 1000 + cid)
    gen = Gen(rng, cid)
    sides = [Side(router.port), Side(alone.port)]
    n = 0
    while time.monotonic() < deadline and len(diffs) < 5:
        batch, closes = [], False
        for _ in range(rng.randint(1, 6)):
            req, c = gen.request()
            batch.append(req)
            if c:
                closes = True
                break
        data = b"".join(batch)
        n += 1
        # on a line of its own even after a data block's odd end (its \r\n, an empty line, is
        # answered ERROR by both sides)
        sentinel = (b"\r\nmg _s O%dx%d\r\n" % (n, cid), b"EN O%dx%d\r\n" % (n, cid))
        try:
            got = [s.exchange(data, sentinel, closes) for s in sides]
        except (socket.timeout, OSError) as e:
            diffs.append((cid, n, data, f"no answer: {e!r}"))
            return
        if COMPARE and normalise(got[0]) != normalise(got[1]):
            diffs.append((cid, n, data, got))
        counts[cid] += len(batch)
    for s in sides:
        if s.c:
            s.c.close()


def good_client(i, router, stop, served, errors):
    with McRaw(router.host, router.port, timeout=5) as c:
        n = 0
        while not stop.is_set():
            key, val = f"good{i}:{n % 50}", f"v{n}"
            n += 1
            if c.store("set", key, val) != "STORED":
                errors.append((key, "set"))
                continue
            c.send(f"get {key}\r\n".encode())
            got = c.read_get_reply()
            if got != [(key, 0, val.encode(), None)]:
                errors.append((key, got))
            served[i] += 1


def test_random_and_malformed_clients_never_count_against_the_node(start_server, start_router):
    behind, alone = start_server(), start_server()
    router, admin, _ = start_router(topology([behind]), "--down-after", "1", "--repair-log", "2",
                                    "--probe-ms", "50")
    wait_until(lambda: accepts(admin), message="the router's admin port")
    with McRaw(router.host, router.port) as c:
        for i in range(20):
            assert c.store("set", f"canary:{i}", f"kept{i}") == "STORED"
    before = router_counters(admin)
    deadline = time.monotonic() + SECONDS
    diffs, counts = [], [0] * FUZZERS
    stop, served, errors = threading.Event(), [0] * GOOD, []
    fuzzers = [threading.Thread(target=fuzz_client, args=(i, router, alone, deadline, diffs, counts))
               for i in range(FUZZERS)]
    goods = [threading.Thread(target=good_client, args=(i, router, stop, served, errors))
             for i in range(GOOD)]
    for t in fuzzers + goods:
        t.start()
    for t in fuzzers:
        t.join(SECONDS + 30)
    stop.set()
    for t in goods:
        t.join(10)
    after = router_counters(admin)
    caused = after.get("client_caused_reply_errors", 0) - before.get("client_caused_reply_errors", 0)
    report = (f"seed {SEED}: {sum(counts)} fuzz requests, {sum(served)} well-behaved set+get "
              f"pairs, client_caused_reply_errors {caused}")
    print(report)
    assert not diffs, f"{report}\nrouter and node alone answered differently: " + "\n".join(
        f"client {c} batch {n}: sent {d!r}\n  got {g!r}" for c, n, d, g in diffs[:3])
    moved = {k: (before[k], after[k]) for k in FAULTS if after[k] != before[k]}
    assert not moved, f"{report}\nclients' requests counted against the node: {moved}"
    assert not errors, f"{report}\nwell-behaved clients failed {len(errors)} times: {errors[:5]}"
    assert min(served) > 20, f"{report}\nwell-behaved clients were starved: {served}"
    with McRaw(router.host, router.port) as c:
        for i in range(20):
            assert c.get(f"canary:{i}") == [(f"canary:{i}", 0, f"kept{i}".encode(), None)]
