"""Differential test: generated command sequences (memgrammar.py), valid and malformed, run against
Debian's memcached 1.6.18, a shoal-node and a shoal-router in front of a shoal-node of its own;
the replies must match byte for byte once what may differ is normalised (CAS values: each
distinct one becomes its order of appearance; remaining TTLs and last-access times; `stats`
values; `version` strings; `me` details).

Each sequence runs on a fresh connection after `verbosity 0` and `flush_all`; the client then
half-closes its side, so every target answers everything it can and then closes: the replies up
to the close are the answer (a target that closes early, e.g. after `quit` or a line too long,
answers less). A sequence that uses a CAS value syncs first (a quiet meta no-op marker) and fills
in the last CAS that target returned.

A difference is explained by a row of EXPLAINED when dropping that row's commands from the
sequence makes it go away: `deliberate` rows point at the docs/protocol.md section that says why
shoal differs; `pending` rows are differences being fixed on another branch of issue 10 (they
make the test xfail, not fail; remove the row when its fix is merged). Anything else fails the
test with the differences grouped by class, each with a shrunk reproducer.

SHOAL_DIFF_SEED (default 1) and SHOAL_DIFF_COUNT (default 2000) pick the run; any seed works by
hand, e.g. SHOAL_DIFF_SEED=$RANDOM SHOAL_DIFF_COUNT=20000. SHOAL_DIFF_REPORT names a file for
the full report (default: in the test's tmp dir, path printed on failure).
"""

import concurrent.futures
import copy
import os
import re
import socket
import time
from collections import namedtuple
from pathlib import Path

import pytest

import conftest
from memgrammar import CAS_LAST, sequence

pytestmark = pytest.mark.shoal_only  # compares shoal with memcached; meaningless against itself

SEED = int(os.environ.get("SHOAL_DIFF_SEED", "1"))
COUNT = int(os.environ.get("SHOAL_DIFF_COUNT", "2000"))
SEQ_TIMEOUT = 3.0     # a sequence's replies must be complete (the target closed) by then
SYNC_TIMEOUT = 0.5    # a sync marker swallowed by a pending store is answered by a timeout
MAX_EXPLAIN = 100000    # differing sequences examined in depth (explained or shrunk) per target
TAIL = b"mn\r\n" * 8
SYNC_KEY = b"__difftest_sync__"  # never generated: a sync marker's miss echoes k and O

# --- what may differ --------------------------------------------------------------------------

Explained = namedtuple("Explained", "name kind tags ref")
# kind "deliberate": shoal differs on purpose, `ref` is the docs/protocol.md section saying why.
# kind "pending": being fixed on another issue-10 branch (`ref` says which); xfail until merged.
EXPLAINED = [
    Explained("delete with a hold time", "deliberate", {"delete:time"},
              "docs/protocol.md 'Delete hold-off': `delete <key> <seconds>` holds the key off"),
    Explained("meta flags newer than 1.6.18", "deliberate", {"meta:extension"},
              "docs/protocol.md 'Meta commands': E on mg, x on md, S on ms are accepted"),
    Explained("more than 18 meta flags", "deliberate", {"meta:manyflags"},
              "docs/protocol.md 'Deliberate differences from memcached 1.6.18': up to 32 meta "
              "flags"),
    Explained("get with an overlong key drops earlier replies", "deliberate", {"get:longkey"},
              "docs/protocol.md 'Deliberate differences from memcached 1.6.18': memcached also "
              "discards the unsent replies of the commands before it"),
    Explained("long gat lines", "deliberate", {"gat:long"},
              "docs/protocol.md 'Deliberate differences from memcached 1.6.18': `gat`/`gats` "
              "lines may be as long as `get` lines (memcached closes those past 2 KB)"),
    Explained("stats cachedump lists every item", "deliberate", {"stats:cachedump"},
              "docs/protocol.md 'Deliberate differences from memcached 1.6.18': `stats "
              "cachedump` lists every item of the class (memcached 1.6.18 only its COLD LRU)"),
    Explained("binary key of an item N created", "deliberate", {"meta:bvivify"},
              "docs/protocol.md 'Deliberate differences from memcached 1.6.18': an item mg/ma "
              "N creates under b keeps its key base64 in k echoes (memcached echoes it raw)"),
    Explained("over-long opaque refused before the command runs", "deliberate",
              {"meta:longopaque"},
              "docs/protocol.md 'Deliberate differences from memcached 1.6.18': an error means "
              "nothing was done (memcached 1.6.18 runs mg's N/T first)"),
    Explained("refused store's data swallowed", "deliberate", {"store:refused"},
              "docs/protocol.md 'Deliberate differences from memcached 1.6.18': a refused "
              "store's data block is swallowed whenever its length reads"),
    Explained("non-get lines over 2 KiB", "deliberate", {"line:long", "value:long"},
              "docs/protocol.md 'Deliberate differences from memcached 1.6.18': any other line "
              "may be --line-max long (memcached closes past 2 KiB without a reply)"),
]


def explains(row, cmd):
    return bool(row.tags & cmd.tags)


# --- servers ------------------------------------------------------------------------------------

@pytest.fixture
def targets(start_server, start_router, tmp_path):
    mc = conftest.launch_memcached(tmp_path)
    node = start_server()
    router_node = start_server()
    router, _, _ = start_router([router_node])
    yield {"memcached": mc, "shoal-node": node, "shoal-router": router}
    mc.proc.kill()
    mc.proc.wait()


# --- running a sequence -----------------------------------------------------------------------

def _recv_until(sock, buf, pred, deadline):
    """Receive into buf until pred(buf), EOF/reset (returns "closed") or the deadline
    ("timeout"); returns None when pred held."""
    while not pred(buf):
        left = deadline - time.monotonic()
        if left <= 0:
            return "timeout"
        sock.settimeout(left)
        try:
            chunk = sock.recv(1 << 20)
        except socket.timeout:
            return "timeout"
        except (ConnectionResetError, BrokenPipeError):
            return "closed"
        if not chunk:
            return "closed"
        buf += chunk
    return None


def _send(sock, data):
    try:
        sock.sendall(data)
        return True
    except (BrokenPipeError, ConnectionResetError):
        return False


def run_sequence(port, cmds, is_memcached):
    """Run cmds on a fresh connection; returns (raw reply bytes, end) where end is "closed" or
    "timeout"."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=SEQ_TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        deadline = time.monotonic() + SEQ_TIMEOUT
        pre = bytearray()
        sock.sendall(b"verbosity 0\r\nflush_all\r\n")
        end = _recv_until(sock, pre, lambda b: len(b) >= 8, deadline)
        assert end is None and bytes(pre) == b"OK\r\nOK\r\n", \
            f"port {port}: verbosity 0 + flush_all before a sequence answered {bytes(pre)!r} ({end})"
        buf = bytearray()
        pending = b""
        nsync = 0
        alive = True
        for c in cmds:
            data = c.for_target(is_memcached)
            if CAS_LAST in data:
                if alive:
                    nsync += 1
                    marker = b"EN k%s O%d\r\n" % (SYNC_KEY, nsync)
                    alive = _send(sock, pending + b"mg %s k O%d\r\n" % (SYNC_KEY, nsync))
                    pending = b""
                    end = _recv_until(sock, buf, lambda b: marker in b,
                                      time.monotonic() + SYNC_TIMEOUT)
                    if end == "closed":
                        alive = False
                data = data.replace(CAS_LAST, last_cas(bytes(buf)))
            if c.split is None:
                pending += data
            else:
                if alive:
                    alive = _send(sock, pending + data[:c.split])
                    time.sleep(0.001)  # let the first piece arrive on its own
                pending = data[c.split:]
        if alive:
            # the tail completes a data block left short by a malformed length (memcached sends
            # no reply while it waits for one, not even those it owes), and shows where the
            # targets' framing ended up
            _send(sock, pending + TAIL)
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        end = _recv_until(sock, buf, lambda b: False, deadline)
        return bytes(buf), end
    finally:
        sock.close()


# --- parsing and normalising replies ----------------------------------------------------------

def parse_replies(raw):
    """Split a reply stream into items: a line (bytes, without CRLF) or (line, data block)
    for VALUE and VA; a trailing fragment without CRLF becomes ("<partial>", bytes)."""
    items, i = [], 0
    while i < len(raw):
        j = raw.find(b"\r\n", i)
        if j < 0:
            items.append(("<partial>", raw[i:]))
            break
        line = raw[i:j]
        i = j + 2
        parts = line.split(b" ")
        n = None
        try:
            if parts[0] == b"VALUE" and len(parts) >= 4:
                n = int(parts[3])
            elif parts[0] == b"VA" and len(parts) >= 2:
                n = int(parts[1])
        except ValueError:
            n = None
        if n is not None and n >= 0:
            items.append((line, raw[i:i + n + 2]))
            i += n + 2
        else:
            items.append(line)
    return items


CAS_RE = re.compile(rb"^c(\d+)$")
META_CODES = {b"HD", b"VA", b"EN", b"NF", b"NS", b"EX", b"OK"}


def last_cas(raw):
    """The last CAS value in a reply stream (VALUE ... <cas> or a meta c<cas>), else b"0"."""
    found = b"0"
    for it in parse_replies(raw):
        line = it[0] if isinstance(it, tuple) else it
        if not isinstance(line, bytes):
            continue
        parts = line.split(b" ")
        if parts[0] == b"VALUE" and len(parts) == 5 and parts[4].isdigit():
            found = parts[4]
        elif parts[0] in META_CODES:
            for p in parts[1:]:
                m = CAS_RE.match(p)
                if m:
                    found = m.group(1)
    return found


def normalise(raw, end):
    """The comparable form of one target's replies: a list of items with CAS values numbered by
    first appearance, times and stats values blanked."""
    cas_ids = {}

    def cas(v):
        return b"#%d" % cas_ids.setdefault(v, len(cas_ids) + 1)

    out = []
    for it in parse_replies(raw):
        line, data = (it if isinstance(it, tuple) else (it, None))
        if isinstance(line, bytes):
            parts = line.split(b" ")
            code = parts[0]
            if code == b"VALUE" and len(parts) == 5:
                parts[4] = cas(parts[4])
            elif code in META_CODES:
                for k in range(1, len(parts)):
                    p = parts[k]
                    if k == 1 and code == b"VA":
                        continue
                    if CAS_RE.match(p):
                        parts[k] = b"c" + cas(p[1:])
                    elif p[:1] == b"t" and p[1:].isdigit():
                        parts[k] = b"t+"   # remaining TTL: a second may pass
                    elif p[:1] == b"l" and p[1:].isdigit():
                        parts[k] = b"l*"   # seconds since last access
            elif code == b"ME" and len(parts) >= 2:
                parts = parts[:2] + [b"*"]  # exp/la/cas/fetch/cls/size: a debug dump
            elif code == b"STAT":
                continue  # which stats there are and their values: only the framing counts
            elif code == b"VERSION":
                parts = [b"VERSION*"]
            line = b" ".join(parts)
        out.append(line if data is None else (line, data))
    out.append(("<end>", end))
    return out


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i, x, y
    n = min(len(a), len(b))
    return n, (a[n] if n < len(a) else None), (b[n] if n < len(b) else None)


# --- the harness ----------------------------------------------------------------------------

class Harness:
    def __init__(self, targets):
        self.targets = targets
        self.pool = concurrent.futures.ThreadPoolExecutor(len(targets))
        self.runs = 0

    def run(self, cmds, names):
        """Normalised replies of the named targets to cmds."""
        self.runs += 1
        futs = {n: self.pool.submit(run_sequence, self.targets[n].port, cmds, n == "memcached")
                for n in names}
        return {n: normalise(*f.result()) for n, f in futs.items()}

    def differs(self, cmds, target):
        got = self.run(cmds, ["memcached", target])
        return got["memcached"] != got[target]

    def shrink(self, cmds, target, budget=60):
        """Drop commands (and splits) while the difference stays."""
        cur = list(cmds)
        changed = True
        while changed and budget > 0:
            changed = False
            for i in reversed(range(len(cur))):
                if len(cur) == 1 or budget <= 0:
                    break
                cand = cur[:i] + cur[i + 1:]
                budget -= 1
                if self.differs(cand, target):
                    cur, changed = cand, True
        for i, c in enumerate(cur):
            if c.split is not None and budget > 0:
                plain = copy.copy(c)
                plain.split = None
                cand = cur[:i] + [plain] + cur[i + 1:]
                budget -= 1
                if self.differs(cand, target):
                    cur = cand
        return cur

    def explain(self, cmds, target):
        """(rows, None) when rows of EXPLAINED account for the difference (dropping their
        commands makes it go away), else (None, shrunk reproducer of what is left once every
        explained command is dropped)."""
        rows = [r for r in EXPLAINED if any(explains(r, c) for c in cmds)]
        for r in rows:
            rest = [c for c in cmds if not explains(r, c)]
            # twice: a row must not take the blame for a difference that came and went
            if not rest or (not self.differs(rest, target) and not self.differs(rest, target)):
                return [r], None
        def without(rs):
            return [c for c in cmds if not any(explains(r, c) for r in rs)]
        rest = without(rows)
        if rows and (not rest or not self.differs(rest, target)):
            # several rows together: keep only those whose commands must go
            needed = list(rows)
            for r in rows:
                trial = [x for x in needed if x is not r]
                rest = without(trial)
                if trial and rest and not self.differs(rest, target):
                    needed = trial
            return needed, None
        if not self.differs(rest, target):
            return [Explained("not reproducible", "flaky", set(),
                              "ran again, the same sequence showed no difference")], None
        return None, self.shrink(rest, target)


def class_key(target, cmds, replies):
    mc, got = replies["memcached"], replies[target]
    _, a, b = first_difference(mc, got)

    def shape(x):
        return re.sub(rb"\d+", b"N", x if isinstance(x, bytes) else repr(x).encode())[:80]
    return (target, shape(a), shape(b))


def describe(target, cmds, replies):
    lines = [f"  reproducer ({len(cmds)} command(s), sent to {target} and memcached):"]
    for c in cmds:
        lines.append(f"    {c!r}")
    for n in ("memcached", "shoal-node", "shoal-router"):
        if n in replies:
            lines.append(f"    {n:13s} -> {replies[n]!r}"[:1500])
    return "\n".join(lines)


def test_replies_match_memcached(targets, tmp_path):
    h = Harness(targets)
    started = time.monotonic()
    explained = {}      # (target, row name) -> count
    explained_rows = {}
    examples = {}       # (target, row name) -> (shortest sequence it explained, replies)
    classes = {}        # class key -> [count, cmds, replies]
    examined = {t: 0 for t in ("shoal-node", "shoal-router")}
    differing = 0
    for i in range(COUNT):
        cmds = sequence(SEED, i)
        got = h.run(cmds, list(targets))
        for t in ("shoal-node", "shoal-router"):
            if got[t] == got["memcached"]:
                continue
            differing += 1
            if examined[t] >= MAX_EXPLAIN:
                continue
            examined[t] += 1
            rows, small = h.explain(cmds, t)
            if rows is not None:
                for row in rows:
                    explained[(t, row.name)] = explained.get((t, row.name), 0) + 1
                    explained_rows[row.name] = row
                    if (t, row.name) not in examples or len(cmds) < len(examples[(t, row.name)][0]):
                        examples[(t, row.name)] = (cmds, got)
                continue
            replies = h.run(small, list(targets))
            key = class_key(t, small, replies)
            if key in classes:
                classes[key][0] += 1
                if len(small) < len(classes[key][1]):
                    classes[key][1:] = [small, replies]
            else:
                classes[key] = [1, small, replies]
        for name, s in targets.items():
            assert s.alive(), f"{name} died running sequence {i} of seed {SEED}: {cmds!r}"
    took = time.monotonic() - started

    report = [f"differential run: seed {SEED}, {COUNT} sequences, {h.runs} runs in {took:.1f} s; "
              f"{differing} target-sequences differed"]
    for (t, name), n in sorted(explained.items()):
        r = explained_rows[name]
        report.append(f"explained {t}: {n} x {name} [{r.kind}] -> {r.ref}")
    for (t, name), (cmds, got) in sorted(examples.items()):
        report.append(f"\nEXAMPLE of '{name}' on {t}:\n" + describe(t, cmds, got))
    fails = [(k, v) for k, v in classes.items()]
    fails.sort(key=lambda kv: -kv[1][0])
    for k, (n, cmds, replies) in fails:
        report.append(f"\nCLASS {k[0]} x{n}: memcached {k[1]!r}, {k[0]} {k[2]!r}\n"
                      + describe(k[0], cmds, replies))
    text = "\n".join(report)
    path = Path(os.environ.get("SHOAL_DIFF_REPORT", tmp_path / "differential-report.txt"))
    path.write_text(text)
    print(text)
    flaky = [k for k in explained if explained_rows[k[1]].kind == "flaky"]
    assert not fails and not flaky, f"{len(fails)} unexplained difference class(es); report in {path}\n" + text[:20000]
    pending = sorted({name for (_, name) in explained if explained_rows[name].kind == "pending"})
    if pending:
        pytest.xfail("differences being fixed on other issue-10 branches: " + "; ".join(
            f"{n} ({explained_rows[n].ref})" for n in pending))
