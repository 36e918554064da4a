"""The tool matrix: the clients and tools memcached users already run, against Debian's memcached,
one shoal-node, and a shoal-router in front of three shoal-nodes.

Each test runs one scenario of one tool on a fresh target and returns its outcome: a small
structure that keeps what the tool did (values read back, keys listed, counts reported, exit
status, errors printed) and drops what legitimately differs between servers (pids, versions,
uptimes, CAS values, timings). The outcome must pass the test's absolute checks on every target,
memcached included (which proves each check is memcached's behaviour), and on shoal-node and
shoal-router it must equal memcached's outcome for the same scenario. memcached's outcome is
computed once per scenario and reused.

Tools: libmemcached-tools (memcstat, memcdump, memcslap, memcaslap, memccp, memccat, memcrm,
memcexist, memctouch, memcping, memcflush), memcached-tool, python3-memcache, python3-pylibmc
(text protocol), php-memcached and Perl's Cache::Memcached (tools/matrix.php, tools/matrix.pl).
A missing tool skips its tests, except under CI=true, where it fails them.

Every external command runs with a timeout and every client with socket timeouts, and an alarm
bounds each test, so a tool that hangs on a reply fails its test quickly. Through a router, a
memory limit (limit_maxbytes, stats settings maxbytes) is the sum of its nodes' (docs/router.md),
so a scenario reports it as one backend's share: memcached's -m 64 on every target.
"""

import json
import os
import random
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import _register, launch_memcached, topology
from mcraw import McRaw, wait_until

MEMCACHED_TOOL = "/usr/share/memcached/scripts/memcached-tool"
SCRIPTS = Path(__file__).resolve().parent / "tools"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
TEST_DEADLINE = 90  # seconds any one test may take, hangs included
CMD_TIMEOUT = 20  # seconds any one external command may take

# The stats fields libmemcached parses into its memcached_stat_st (memcstat --analyze and
# memcached_stat_get_value read these); a server missing one leaves the client a zero.
LIBMEMCACHED_STATS = ("pid", "uptime", "time", "version", "pointer_size", "rusage_user",
                      "rusage_system", "curr_items", "total_items", "bytes", "curr_connections",
                      "total_connections", "connection_structures", "cmd_get", "cmd_set",
                      "get_hits", "get_misses", "evictions", "bytes_read", "bytes_written",
                      "limit_maxbytes", "threads")


def targets():
    """The three targets as parameters."""
    return [pytest.param(k, id=k) for k in ("memcached", "node", "router")]


def target_cases(values):
    """(kind, value) parameters for every target and value."""
    return [pytest.param(k, v, id=f"{k}-{v}") for k in ("memcached", "node", "router")
            for v in values]


def need(tool):
    """The tool's path; skips the test when it is missing (fails it in CI)."""
    path = tool if os.path.isabs(tool) and os.path.exists(tool) else shutil.which(tool)
    if path is None:
        message = f"{tool} not installed (scripts/deps.sh installs it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return path


def need_module(name):
    try:
        return __import__(name)
    except ImportError:
        message = f"python module {name} not installed (scripts/deps.sh installs it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(autouse=True)
def deadline():
    """Fail a test that runs past TEST_DEADLINE instead of stalling the suite."""
    def expired(signum, frame):
        raise TimeoutError(f"test still running after {TEST_DEADLINE}s: a tool or client hangs")
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(TEST_DEADLINE)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


class Target:
    """Where a scenario runs: `addr` for the tools, `backends` the servers holding the data (the
    target itself, or a router's nodes), whose stats a scenario may sum."""

    def __init__(self, kind, server, backends):
        self.kind, self.server, self.backends = kind, server, backends
        self.host, self.port = server.host, server.port
        self.addr = f"{server.host}:{server.port}"

    def raw(self):
        return McRaw(self.host, self.port, timeout=10)

    def per_backend_maxbytes(self, value):
        """A reported memory limit as one backend's share: a router reports the sum of its
        nodes' limits (docs/router.md), so with equal nodes each has sum / len(backends). A
        value that is not that sum is returned unchanged, to fail the check."""
        if value is None or not str(value).isdigit():
            return value
        total = self.backend_stat("limit_maxbytes")
        n = len(self.backends)
        return type(value)(int(value) // n) if int(value) == total and total % n == 0 else value

    def backend_stat(self, name):
        """`name` from `stats`, summed over the backends."""
        total = 0
        for b in self.backends:
            with McRaw(b.host, b.port, timeout=10) as c:
                total += int(c.stats()[name])
        return total


@pytest.fixture
def make_target(request, tmp_path, start_server, start_router):
    """Factory: make_target(kind) -> a fresh Target of that kind."""
    references = []

    def make(kind):
        if kind == "memcached":
            s = launch_memcached(tmp_path)
            _register(request.node, s)
            references.append(s)
            return Target(kind, s, [s])
        if kind == "node":
            s = start_server()
            return Target(kind, s, [s])
        nodes = [start_server() for _ in range(3)]
        router, _, _ = start_router(topology(nodes))
        return Target(kind, router, nodes)

    yield make
    for s in references:  # memcached is slow to exit on SIGTERM; the reference is killed
        s.proc.kill()
        s.proc.wait(5)


_REFERENCE = {}


def check_matrix(kind, make_target, scenario, check, **kw):
    """Run `scenario(target, **kw)` on a fresh target of `kind`, apply `check` to its outcome,
    and on shoal compare it with memcached's outcome for the same scenario."""
    outcome = scenario(make_target(kind), **kw)
    key = (scenario.__name__, json.dumps(kw, sort_keys=True, default=str))
    if kind == "memcached":
        _REFERENCE[key] = outcome
    check(outcome)
    if kind != "memcached":
        if key not in _REFERENCE:
            ref = scenario(make_target("memcached"), **kw)
            check(ref)
            _REFERENCE[key] = ref
        assert outcome == _REFERENCE[key], f"{kind} differs from memcached"
    return outcome


def run(args, cwd=None, timeout=CMD_TIMEOUT, input=None):
    """Run a command with a timeout: (exit status or 'timeout', stdout bytes, stderr text)."""
    try:
        p = subprocess.run(args, cwd=cwd, capture_output=True, timeout=timeout, input=input,
                           stdin=None if input is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        return "timeout", e.stdout or b"", (e.stderr or b"").decode(errors="replace")
    return p.returncode, p.stdout, p.stderr.decode(errors="replace")


def seed_items(target, items):
    """Store {key: (flags, value bytes)} with plain text sets."""
    with target.raw() as c:
        for k, (flags, v) in items.items():
            assert c.store("set", k, v, flags=flags) == "STORED", k


def sample_items(n=30):
    rnd = random.Random(n)
    return {f"item_{i}": (i % 5, bytes(rnd.choice(b"abcdefgh") for _ in range(10 + i * 97)))
            for i in range(n)}


# --- libmemcached-tools ---------------------------------------------------------------------------

def memcstat_fields(target):
    seed_items(target, sample_items(3))
    rc, out, err = run([need("memcstat"), f"--servers={target.addr}"])
    text = out.decode(errors="replace")
    fields = dict(re.findall(r"^\t(\w+): (.*)$", text, re.M))
    return {"rc": rc, "server_line": f"Server: {target.host} ({target.port})" in text,
            "missing": sorted(set(LIBMEMCACHED_STATS) - set(fields)),
            "curr_items": fields.get("curr_items"), "cmd_set": fields.get("cmd_set")}


@pytest.mark.parametrize("kind", targets())
def test_memcstat_lists_the_fields_libmemcached_parses(kind, make_target):
    def check(o):
        assert o["rc"] == 0 and o["server_line"], o
        assert o["missing"] == [], o
        assert o["curr_items"] == "3" and o["cmd_set"] == "3", o
    check_matrix(kind, make_target, memcstat_fields, check)


def memcstat_analyze(target):
    seed_items(target, sample_items(4))
    with target.raw() as c:  # 4 hits and 4 misses: a 50% hit ratio
        for i in range(4):
            assert len(c.get(f"item_{i}", f"absent_{i}")) == 1
    rc, out, err = run([need("memcstat"), "--analyze", f"--servers={target.addr},{target.addr}"])
    text = out.decode(errors="replace")
    size = re.search(r"Average Item Size \(incl/overhead\)\s*: (\d+) bytes", text)
    return {"rc": rc, "servers": re.findall(r"Number of Servers Analyzed\s*: (\d+)", text),
            "hit_ratio": re.findall(r"Pool-wide Hit Ratio\s*: (\S+)", text),
            "item_size_known": bool(size and int(size.group(1)) > 0),
            "longest_uptime": bool(re.search(r"Node with longest uptime\s*: " + re.escape(target.addr),
                                             text))}


@pytest.mark.parametrize("kind", targets())
def test_memcstat_analyze_reports_the_hit_ratio(kind, make_target):
    def check(o):
        assert o == {"rc": 0, "servers": ["2"], "hit_ratio": ["50%"], "item_size_known": True,
                     "longest_uptime": True}, o
    check_matrix(kind, make_target, memcstat_analyze, check)


def memcdump_keys(target):
    """The keys memcdump lists once it lists every stored one (memcached's `stats cachedump` shows
    a fresh item only once its LRU maintainer has moved it; hence the wait), or after 5 s."""
    items = sample_items(25)
    seed_items(target, items)
    tool = need("memcdump")
    listed = {}

    def complete():
        rc, out, err = run([tool, f"--servers={target.addr}"], timeout=10)
        listed.update(rc=rc, keys=sorted(set(out.decode(errors="replace").split())), err=err)
        return rc == 0 and set(items) <= set(listed["keys"])
    try:
        wait_until(complete, timeout=5, interval=0.2, message="memcdump listing every key")
    except AssertionError:
        pass
    return {"rc": listed["rc"], "keys": listed["keys"]}


@pytest.mark.parametrize("kind", targets())
def test_memcdump_lists_the_keys_stored(kind, make_target):
    def check(o):
        assert o == {"rc": 0, "keys": sorted(sample_items(25))}, o
    check_matrix(kind, make_target, memcdump_keys, check)


def memcslap_run(target, test, n, concurrency=2):
    """memcslap --test=<test>: its exit status, the lines where it reports a failure, and the
    get hits the backends counted during the run."""
    tool = need("memcslap")
    before = target.backend_stat("get_hits")
    rc, out, err = run([tool, f"--servers={target.addr}", f"--test={test}",
                        f"--execute-number={n}", f"--concurrency={concurrency}"])
    text = out.decode(errors="replace") + err
    return {"rc": rc, "failures": [l for l in text.splitlines() if "fail" in l.lower()],
            "reported": bool(re.search(rf"Time to {test}\s+\d+ keys by\s+{concurrency} threads",
                                       text)),
            "hits": target.backend_stat("get_hits") - before}


@pytest.mark.parametrize("kind", targets())
def test_memcslap_mget_gets_every_key(kind, make_target):
    def check(o):  # each of the 2 threads gets all 3,000 keys in one multi-get
        assert o == {"rc": 0, "failures": [], "reported": True, "hits": 6000}, o
    check_matrix(kind, make_target, memcslap_run, check, test="mget", n=3000)


@pytest.mark.parametrize("test,hits", [("get", 200), ("set", 0)])
@pytest.mark.parametrize("kind", targets())
def test_memcslap_get_and_set_run_clean(kind, make_target, test, hits):
    def check(o):
        assert o == {"rc": 0, "failures": [], "reported": True, "hits": hits}, o
    check_matrix(kind, make_target, memcslap_run, check, test=test, n=100)


def memcaslap_run(target, extra):
    """A bounded memcaslap run (400 operations, 2 connections): what it reports."""
    tool = need("memcaslap")
    rc, out, err = run([tool, "-s", target.addr, "-x", "400", "-T", "1", "-c", "2", "-X", "100",
                        *extra])
    text = out.decode(errors="replace") + err
    figures = dict(re.findall(r"^(\w+): (\d+)$", text, re.M))
    ops = re.search(r"Ops: (\d+)", text)
    return {"rc": rc, "error_lines": sorted({l for l in text.splitlines() if "ERROR" in l}),
            "ops": int(ops.group(1)) if ops else None,
            "get_misses": figures.get("get_misses"), "verify_failed": figures.get("verify_failed")}


@pytest.mark.parametrize("kind", targets())
def test_memcaslap_bounded_run_completes_without_errors(kind, make_target):
    def check(o):
        assert o == {"rc": 0, "error_lines": [], "ops": 400, "get_misses": "0",
                     "verify_failed": None}, o
    check_matrix(kind, make_target, memcaslap_run, check, extra=[])


@pytest.mark.parametrize("kind", targets())
def test_memcaslap_verifies_values_and_multigets(kind, make_target):
    def check(o):  # -v 1: every get checks the value; -d 10: gets of 10 keys at once
        assert o == {"rc": 0, "error_lines": [], "ops": 400, "get_misses": "0",
                     "verify_failed": "0"}, o
    check_matrix(kind, make_target, memcaslap_run, check, extra=["-v", "1", "-d", "10"])


def file_tools(target, tmp_path):
    """memccp three files up, memccat them back, memcexist/memctouch/memcrm/memcflush."""
    rnd = random.Random(7)
    files = {"blob.bin": bytes(rnd.randrange(256) for _ in range(3000)),
             "big.bin": bytes(rnd.randrange(256) for _ in range(200_000)),
             "note.txt": b"hello\n"}
    work = tmp_path / f"files-{target.kind}-{target.port}"
    work.mkdir()
    for name, data in files.items():
        (work / name).write_bytes(data)
    s = f"--servers={target.addr}"
    o = {"cp": run([need("memccp"), s, *files], cwd=work)[0]}
    o["cat"] = {}
    for name, data in files.items():  # memccat prints each value followed by a newline
        rc, out, _ = run([need("memccat"), s, name])
        o["cat"][name] = (rc, out == data + b"\n")
    o["ping"] = run([need("memcping"), s])[0]
    o["exist"] = [run([need("memcexist"), s, k])[0] for k in ("note.txt", "absent")]
    o["touch"] = [run([need("memctouch"), s, "--expire=600", k])[0] for k in ("note.txt", "absent")]
    o["rm"] = run([need("memcrm"), s, "note.txt"])[0]
    o["cat_removed"] = run([need("memccat"), s, "note.txt"])[0] != 0
    o["blob_kept"] = run([need("memccat"), s, "blob.bin"])[1] == files["blob.bin"] + b"\n"
    o["flush"] = run([need("memcflush"), s])[0]
    o["cat_flushed"] = run([need("memccat"), s, "blob.bin"])[0] != 0
    return o


@pytest.mark.parametrize("kind", targets())
def test_memccp_memccat_memcrm_round_trip_files(kind, make_target, tmp_path):
    def check(o):
        assert o == {"cp": 0, "cat": {n: (0, True) for n in ("blob.bin", "big.bin", "note.txt")},
                     "ping": 0, "exist": [0, 1], "touch": [0, 1], "rm": 0, "cat_removed": True,
                     "blob_kept": True, "flush": 0, "cat_flushed": True}, o
    check_matrix(kind, make_target, file_tools, check, tmp_path=tmp_path)


# --- memcached-tool -------------------------------------------------------------------------------

def memcached_tool(target, mode, *extra):
    return run(["perl", need(MEMCACHED_TOOL), target.addr, mode, *extra], timeout=5)


def tool_display(target):
    items = sample_items(30)
    seed_items(target, items)
    rc, out, err = memcached_tool(target, "display")
    lines = out.decode(errors="replace").splitlines()
    rows = [l.split() for l in lines[1:] if re.match(r"^\s*\d+\s", l)]
    return {"rc": rc, "header": lines[0].split() if lines else [],
            "count": sum(int(r[4]) for r in rows if len(r) >= 9), "rows_parse": all(len(r) >= 9 for r in rows)}


@pytest.mark.parametrize("kind", targets())
def test_memcached_tool_display_counts_every_item(kind, make_target):
    def check(o):
        assert o == {"rc": 0, "header": ["#", "Item_Size", "Max_age", "Pages", "Count", "Full?",
                                         "Evicted", "Evict_Time", "OOM"],
                     "count": 30, "rows_parse": True}, o
    check_matrix(kind, make_target, tool_display, check)


def tool_stats(target):
    seed_items(target, sample_items(5))
    with target.raw() as c:
        c.get("item_1", "item_2", "absent")
    rc, out, err = memcached_tool(target, "stats")
    lines = out.decode(errors="replace").splitlines()
    fields = dict(l.split() for l in lines[1:] if len(l.split()) == 2)
    return {"rc": rc, "title": bool(lines) and lines[0].startswith(f"#{target.addr}"),
            "missing": sorted(set(LIBMEMCACHED_STATS) - set(fields)),
            "figures": [fields.get(k) for k in ("curr_items", "get_hits", "get_misses", "cmd_set")]}


@pytest.mark.parametrize("kind", targets())
def test_memcached_tool_stats_lists_the_counters(kind, make_target):
    def check(o):
        assert o == {"rc": 0, "title": True, "missing": [], "figures": ["5", "2", "1", "5"]}, o
    check_matrix(kind, make_target, tool_stats, check)


def tool_settings(target):
    rc, out, err = memcached_tool(target, "settings")
    lines = out.decode(errors="replace").splitlines()
    fields = dict(l.split(None, 1) for l in lines[1:] if l.strip())
    figures = {k: fields.get(k) for k in ("maxbytes", "item_size_max", "cas_enabled")}
    figures["maxbytes"] = target.per_backend_maxbytes(figures["maxbytes"])
    return {"rc": rc, "title": bool(lines) and lines[0].startswith(f"#{target.addr}"),
            "figures": figures}


@pytest.mark.parametrize("kind", targets())
def test_memcached_tool_settings_lists_the_limits(kind, make_target):
    def check(o):
        assert o == {"rc": 0, "title": True, "figures": {"maxbytes": str(64 << 20),
                     "item_size_max": str(1 << 20), "cas_enabled": "yes"}}, o
    check_matrix(kind, make_target, tool_settings, check)


def tool_dump(target):
    items = sample_items(20)
    seed_items(target, items)
    rc, out, err = memcached_tool(target, "dump")
    got, data = {}, out
    while data:  # "add <key> <flags> <exptime> <len>\r\n<value>\r\n" per item
        m = re.match(rb"add (\S+) (\d+) (\d+) (\d+)\r\n", data)
        if not m:
            break
        n = int(m.group(4))
        value = data[m.end():m.end() + n]
        got[m.group(1).decode()] = (int(m.group(2)), int(m.group(3)), value)
        data = data[m.end() + n + 2:]
    return {"rc": rc, "items": got == {k: (f, 0, v) for k, (f, v) in items.items()},
            "count": len(got), "rest": data[:200]}


@pytest.mark.parametrize("kind", targets())
def test_memcached_tool_dump_prints_every_item(kind, make_target):
    def check(o):
        assert o == {"rc": 0, "items": True, "count": 20, "rest": b""}, o
    check_matrix(kind, make_target, tool_dump, check)


def tool_keys(target):
    items = sample_items(20)
    seed_items(target, items)
    rc, out, err = memcached_tool(target, "keys")
    keys = re.findall(r"^key=(\S+) exp=-1 la=\d+ cas=\d+ fetch=no cls=\d+ size=\d+$",
                      out.decode(errors="replace"), re.M)
    return {"rc": rc, "keys": sorted(keys)}


@pytest.mark.parametrize("kind", targets())
def test_memcached_tool_keys_lists_every_key(kind, make_target):
    def check(o):
        assert o == {"rc": 0, "keys": sorted(sample_items(20))}, o
    check_matrix(kind, make_target, tool_keys, check)


# --- python3-memcache -----------------------------------------------------------------------------

MIXED_SIZES = (1, 100, 1023, 1024, 4096, 65_535, 65_536, 100_000, 300_000, 500_000)


def pymemcache_client(target, timeout=5):
    memcache = need_module("memcache")
    return memcache.Client([target.addr], socket_timeout=timeout, dead_retry=0, cache_cas=True)


def pm_multi(target):
    c = pymemcache_client(target)
    rnd = random.Random(3)
    values = {f"mixed_{n}": bytes(rnd.randrange(256) for _ in range(n)) for n in MIXED_SIZES}
    values["text"] = "unicode text ünïcödé"
    values["number"] = 12345
    values["structure"] = {"a": [1, 2, 3]}
    failed = c.set_multi(values)
    got = c.get_multi(list(values) + ["absent_1", "absent_2"])
    o = {"failed": sorted(failed), "same": got == values, "keys": sorted(got),
         "single": [c.get(k) == v for k, v in values.items()]}
    c.disconnect_all()
    return o


@pytest.mark.parametrize("kind", targets())
def test_python_memcache_set_multi_get_multi_mixed_sizes(kind, make_target):
    def check(o):
        assert o["failed"] == [] and o["same"] and all(o["single"]), o
        assert o["keys"] == sorted([f"mixed_{n}" for n in MIXED_SIZES] + ["text", "number",
                                                                          "structure"]), o
    check_matrix(kind, make_target, pm_multi, check)


def pm_arith_cas(target):
    c = pymemcache_client(target)
    o = {"set": c.set("n", 10), "incr": c.incr("n", 5), "decr": c.decr("n", 20),
         "incr_absent": c.incr("absent"), "decr_absent": c.decr("absent"),
         "big": (c.set("big", str(2**64 - 1)), c.incr("big", 1))}
    o["get_n"] = c.get("n")
    c.set("c", "one")
    o["gets"] = c.gets("c")
    o["cas"] = c.cas("c", "two")
    c2 = pymemcache_client(target)
    o["gets2"] = c2.gets("c")
    o["stale_cas"] = (c.set("c", "three"), c2.cas("c", "four"))
    o["final"] = c.get("c")
    o["add"] = (c.add("c", "x"), c.add("fresh", "y"))
    o["replace"] = (c.replace("absent", "x"), c.replace("fresh", "z"))
    o["append"] = (c.append("fresh", "!"), c.prepend("fresh", "<"), c.get("fresh"))
    o["touch"] = c.touch("fresh", 100)
    o["delete"] = (c.delete("fresh"), c.get("fresh"), c.delete("fresh"))
    c.disconnect_all()
    c2.disconnect_all()
    return o


@pytest.mark.parametrize("kind", targets())
def test_python_memcache_incr_decr_and_cas_via_gets(kind, make_target):
    def check(o):
        assert o["incr"] == 15 and o["decr"] == 0 and o["get_n"] == 0, o
        assert o["incr_absent"] is None and o["decr_absent"] is None, o
        assert o["big"] == (True, 0), o  # wraps at 2^64
        assert o["gets"] == "one" and o["cas"] is True and o["gets2"] == "two", o
        assert o["stale_cas"] == (True, False) and o["final"] == "three", o
        assert o["append"] == (True, True, "<z!") and o["touch"], o
    check_matrix(kind, make_target, pm_arith_cas, check)


def pm_stats(target):
    c = pymemcache_client(target)
    c.set("s1", "v")
    c.get("s1")
    stats = c.get_stats()
    o = {"servers": len(stats)}
    if stats:
        name, fields = stats[0]
        o["name"] = name.split(" ")[0] == target.addr
        o["missing"] = sorted(set(LIBMEMCACHED_STATS) - set(fields))
    c.disconnect_all()
    return o


@pytest.mark.parametrize("kind", targets())
def test_python_memcache_get_stats(kind, make_target):
    def check(o):
        assert o == {"servers": 1, "name": True, "missing": []}, o
    check_matrix(kind, make_target, pm_stats, check)


def pm_stats_arg(target, arg):
    """get_stats(arg), which sends `stats <arg>`, after storing one 100-byte value: whether the
    server answered, and the part of the answer every server must agree on. (get_slabs and
    get_slab_stats fail on str/bytes in python3-memcache 1.59, against any server.)"""
    c = pymemcache_client(target, timeout=2)
    c.set("s1", "x" * 100)
    stats = c.get_stats(arg)
    c.disconnect_all()
    if len(stats) != 1:
        return {"answered": False}
    f = stats[0][1]
    view = {"items": lambda: sum(int(v) for k, v in f.items() if re.fullmatch(r"items:\d+:number", k)),
            "slabs": lambda: sorted({k.split(":")[-1] for k in f} & {"chunk_size", "used_chunks",
                                                                    "total_pages", "active_slabs"}),
            "sizes": lambda: sorted(f),
            "conns": lambda: any(k.endswith(":state") for k in f),
            "settings": lambda: [target.per_backend_maxbytes(f.get("maxbytes")),
                                 f.get("item_size_max"), f.get("cas_enabled")]}
    return {"answered": True, "view": view[arg]()}


STATS_ARG_VIEWS = {"items": 1, "slabs": ["active_slabs", "chunk_size", "total_pages", "used_chunks"],
                   "sizes": ["sizes_status"], "conns": True,
                   "settings": [str(64 << 20), str(1 << 20), "yes"]}


@pytest.mark.parametrize("kind,arg", target_cases(list(STATS_ARG_VIEWS)))
def test_python_memcache_get_stats_with_argument(kind, make_target, arg):
    def check(o):
        assert o == {"answered": True, "view": STATS_ARG_VIEWS[arg]}, o
    check_matrix(kind, make_target, pm_stats_arg, check, arg=arg)


# --- python3-pylibmc (text protocol), in a child process: see tools/matrix_pylibmc.py --------------

def pylibmc_case(target, case):
    need_module("pylibmc")
    rc, out, err = run(["/usr/bin/python3", str(SCRIPTS / "matrix_pylibmc.py"), target.addr, case])
    if rc != 0:
        return {"rc": rc, "error": (err.strip().splitlines() or [""])[-1]}
    return json.loads(out)


@pytest.mark.parametrize("kind", targets())
def test_pylibmc_get_multi_of_3000_keys(kind, make_target):
    def check(o):
        assert o == {"failed": [], "got": 3000, "same": True}, o
    check_matrix(kind, make_target, pylibmc_case, check, case="multi3000")


@pytest.mark.parametrize("kind", targets())
def test_pylibmc_key_with_control_byte_is_stored_as_data(kind, make_target):
    def check(o):
        assert o == {"stored": True, "value": "flush_all", "other": "kept"}, o
    check_matrix(kind, make_target, pylibmc_case, check, case="control_key")


@pytest.mark.parametrize("kind", targets())
def test_pylibmc_behaviors_read_back_and_requests_work_under_them(kind, make_target):
    def check(o):
        assert o["readback"] == {"tcp_nodelay": 1, "ketama": 1, "hash": "md5",
                                 "distribution": "consistent", "cas": 1, "no_block": 1,
                                 "verify_keys": 1, "retry_timeout": 1}, o
        assert o["cas"] == ["one", True, False, "two"] and o["noreply"] == ["quiet", "quiet"], o
    check_matrix(kind, make_target, pylibmc_case, check, case="behaviors")


@pytest.mark.parametrize("kind", targets())
def test_pylibmc_storage_arithmetic_and_stats(kind, make_target):
    def check(o):
        assert o == {"add": [True, False], "replace": [True, False], "incr": [13, 0],
                     "incr_absent": "NotFound", "append": [True, True, "<mid>"],
                     "touch": [True, False], "delete": [True, False, None],
                     "delete_multi": [False, {}], "stats": [1, "1", "1", "9"]}, o
    check_matrix(kind, make_target, pylibmc_case, check, case="operations")


# --- php-memcached: tools/matrix.php --------------------------------------------------------------

def need_php_extension(php, name):
    rc, out, err = run([php, "-m"])
    if name not in out.decode(errors="replace").split():
        message = f"php extension {name} not loaded (scripts/deps.sh installs php-{name})"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


def php_case(target, case):
    php = need("php")
    need_php_extension(php, "memcached")
    rc, out, err = run([php, "-d", "display_errors=stderr", str(SCRIPTS / "matrix.php"),
                        target.host, str(target.port), case])
    if rc != 0:
        return {"rc": rc, "error": err.strip()[-300:]}
    return json.loads(out)


@pytest.mark.parametrize("kind", targets())
def test_php_memcached_set_get_getmulti_delete(kind, make_target):
    def check(o):
        assert o == {"set": [True, 0], "set_int": [True, 0], "set_array": [True, 0],
                     "get": ["alpha", 42, {"x": [1, 2]}], "miss": [False, True],
                     "setMulti": [True, 0], "getMulti": [["php_m1", "php_m2", "php_a"], 200000, 0],
                     "delete": [True, False, True, False]}, o
    check_matrix(kind, make_target, php_case, check, case="basic")


@pytest.mark.parametrize("kind", targets())
def test_php_memcached_cas(kind, make_target):
    def check(o):
        assert o == {"extended": ["one", True], "cas": [True, 0], "stale": [False, True],
                     "absent": [False, True], "final": "two"}, o
    check_matrix(kind, make_target, php_case, check, case="cas")


@pytest.mark.parametrize("kind", targets())
def test_php_memcached_increment_append_touch(kind, make_target):
    def check(o):  # a decr keeps the value's length, as memcached pads it with spaces
        assert o == {"inc": [15, 0, "0 "], "absent": [False, True],
                     "append": [True, True, "10 7"], "touch": [True, False, True, "y"]}, o
    check_matrix(kind, make_target, php_case, check, case="increment")


@pytest.mark.parametrize("kind", targets())
def test_php_memcached_get_all_keys(kind, make_target):
    def check(o):
        assert o == {"keys": sorted(f"php_key_{i}" for i in range(20)), "code": 0}, o
    check_matrix(kind, make_target, php_case, check, case="getAllKeys")


def php_stats(target):
    """getStats(), limit_maxbytes as one backend's share (a router sums its nodes')."""
    o = php_case(target, "getStats")
    if isinstance(o.get("figures"), list) and len(o["figures"]) == 5:
        o["figures"][4] = target.per_backend_maxbytes(o["figures"][4])
    return o


@pytest.mark.parametrize("kind", targets())
def test_php_memcached_get_stats(kind, make_target):
    def check(o):
        assert o == {"servers": 1, "named": True, "figures": [1, 1, 1, 1, 64 << 20],
                     "version": 1}, o
    check_matrix(kind, make_target, php_stats, check)


# --- Perl Cache::Memcached: tools/matrix.pl -------------------------------------------------------

def perl_case(target, case):
    perl = need("perl")
    if run([perl, "-MCache::Memcached", "-e", "1"])[0] != 0:
        message = "Cache::Memcached not installed (scripts/deps.sh installs libcache-memcached-perl)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    rc, out, err = run([perl, str(SCRIPTS / "matrix.pl"), target.addr, case])
    if rc != 0:
        return {"rc": rc, "error": err.strip()[-300:]}
    return json.loads(out)


@pytest.mark.parametrize("kind", targets())
def test_perl_cache_memcached_set_get(kind, make_target):
    def check(o):
        assert o == {"set": [True, True, True], "get": ["alpha", 300000, {"list": [1, 2]}, None],
                     "add": [False, False, True, "beta"], "delete": [True, False, None]}, o
    check_matrix(kind, make_target, perl_case, check, case="set_get")


@pytest.mark.parametrize("kind", targets())
def test_perl_cache_memcached_get_multi(kind, make_target):
    def check(o):
        assert o == {"count": 200, "same": True}, o
    check_matrix(kind, make_target, perl_case, check, case="get_multi")


@pytest.mark.parametrize("kind", targets())
def test_perl_cache_memcached_incr_decr(kind, make_target):
    def check(o):
        assert o == {"arith": ["11", "20", "0", "0 ", None]}, o
    check_matrix(kind, make_target, perl_case, check, case="incr_decr")


def perl_stats(target):
    """stats(['misc']), limit_maxbytes as one backend's share (a router sums its nodes')."""
    o = perl_case(target, "stats")
    if isinstance(o.get("misc"), list) and len(o["misc"]) == 4:
        o["misc"][3] = target.per_backend_maxbytes(o["misc"][3])
    return o


@pytest.mark.parametrize("kind", targets())
def test_perl_cache_memcached_stats(kind, make_target):
    def check(o):
        assert o == {"misc": ["1", "1", "1", str(64 << 20)], "total": [1, 1]}, o
    check_matrix(kind, make_target, perl_stats, check)


@pytest.mark.parametrize("kind", targets())
def test_perl_cache_memcached_default_stats_keep_the_connection(kind, make_target):
    def check(o):  # `stats malloc` answers ERROR: no wait, and the connection stays usable
        assert o == {"types": ["misc"], "misc_pid": True, "after": "v"}, o
    check_matrix(kind, make_target, perl_case, check, case="stats_default")
