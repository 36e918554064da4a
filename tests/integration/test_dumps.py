"""Key dumps in memcached's formats: `lru_crawler metadump all|hash|<classes>` and
`stats cachedump <class> <limit>`, their errors, and the tools that read them (memcdump,
memcached-tool display/stats/dump) finishing with the right keys.

Runs against memcached too (SHOAL_TEST_SERVER=memcached) except where marked."""

import re
import socket
import shutil
import subprocess
import threading
import urllib.parse

import pytest

from mcraw import McRaw

META_LINE = re.compile(rb"key=(\S+) exp=(-1|\d+) la=(\d+) cas=(\d+) fetch=(yes|no) cls=(\d+) "
                       rb"size=(\d+)")
ITEM_LINE = re.compile(rb"ITEM (\S+) \[(\d+) b; (\d+) s\]")
MEMCACHED_TOOL = "/usr/share/memcached/scripts/memcached-tool"


def metadump(raw, arg="all"):
    """Lines of a metadump as dicts; asserts memcached's framing (\\n per line, END\\r\\n)."""
    raw.send(f"lru_crawler metadump {arg}\r\n")
    data = raw.read_until(b"END\r\n", timeout=10)
    body = data[:-len(b"END\r\n")]
    out = []
    for line in body.split(b"\n")[:-1] if body else []:
        m = META_LINE.fullmatch(line)
        assert m, f"not a metadump line: {line!r}"
        out.append({"key": urllib.parse.unquote_to_bytes(m.group(1).decode()),
                    "exp": int(m.group(2)), "la": int(m.group(3)), "cas": int(m.group(4)),
                    "fetch": m.group(5) == b"yes", "cls": int(m.group(6)),
                    "size": int(m.group(7)), "raw": m.group(1)})
    return out


def cachedump(raw, cls, limit=0):
    raw.send(f"stats cachedump {cls} {limit}\r\n")
    first = raw.read_line(timeout=10)
    if not first.startswith("ITEM") and first != "END":
        return first
    lines = [] if first == "END" else [first]
    while lines and lines[-1] != "END":
        lines.append(raw.read_line(timeout=10))
    out = []
    for line in lines[:-1] if lines else []:
        m = ITEM_LINE.fullmatch(line.encode())
        assert m, f"not a cachedump line: {line!r}"
        out.append((m.group(1).decode(), int(m.group(2)), int(m.group(3))))
    return out


def test_metadump_lists_every_key_with_memcached_fields(raw):
    assert raw.store("set", "plain", "abc", exptime=0) == "STORED"
    assert raw.store("set", "ns:key", "x", exptime=100) == "STORED"
    raw.get("plain")
    lines = {l["key"]: l for l in metadump(raw)}
    assert set(lines) == {b"plain", b"ns:key"}
    assert lines[b"plain"]["exp"] == -1 and lines[b"plain"]["fetch"]
    assert not lines[b"ns:key"]["fetch"]
    assert lines[b"ns:key"]["raw"] == b"ns%3Akey", "keys are url-encoded as memcached's"
    t = int(raw.stats()["time"])
    assert abs(lines[b"ns:key"]["exp"] - (t + 100)) <= 2, "exp is a unix time"
    assert abs(lines[b"plain"]["la"] - t) <= 2, "la is a unix time"


def test_metadump_encodes_every_byte_outside_unreserved(raw):
    assert raw.store("set", "a%b~c.d_e-f", "1") == "STORED"
    (line,) = metadump(raw)
    assert line["raw"] == b"a%25b~c.d_e-f"


def test_metadump_hash_lists_the_same_keys(raw):
    for i in range(20):
        assert raw.store("set", f"h{i}", "v") == "STORED"
    assert sorted(l["key"] for l in metadump(raw, "hash")) == sorted(
        l["key"] for l in metadump(raw, "all"))


def test_metadump_of_one_class_lists_only_it(raw):
    assert raw.store("set", "small", "x") == "STORED"
    assert raw.store("set", "large", "x" * 5000) == "STORED"
    by_key = {l["key"]: l["cls"] for l in metadump(raw)}
    assert by_key[b"small"] != by_key[b"large"]
    only = metadump(raw, str(by_key[b"small"]))
    assert [l["key"] for l in only] == [b"small"]
    both = metadump(raw, f"{by_key[b'small']},{by_key[b'large']}")
    assert sorted(l["key"] for l in both) == [b"large", b"small"]


def test_metadump_skips_expired_and_deleted_items(raw):
    assert raw.store("set", "gone", "x", exptime=-1) == "STORED"
    assert raw.store("set", "deleted", "x") == "STORED"
    assert raw.cmd("delete deleted") == "DELETED"
    assert raw.store("set", "kept", "x") == "STORED"
    assert [l["key"] for l in metadump(raw)] == [b"kept"]


def test_metadump_skips_flushed_items(raw):
    assert raw.store("set", "old", "x") == "STORED"
    assert raw.cmd("flush_all") == "OK"
    assert metadump(raw) == []


@pytest.mark.parametrize("arg", ["x", "0", "300", "1,x", "ALL", "all,1"])
def test_metadump_bad_class(raw, arg):
    assert raw.cmd(f"lru_crawler metadump {arg}") == "BADCLASS invalid class id"


@pytest.mark.parametrize("line", ["lru_crawler", "lru_crawler metadump", "lru_crawler nonsense",
                                  "lru_crawler metadump all extra", "lru_crawler crawl",
                                  "lru_crawler tocrawl", "lru_crawler sleep",
                                  "lru_crawler enable x", "lru_crawler mgdump all"])
def test_lru_crawler_malformed_is_error(raw, line):
    assert raw.cmd(line) == "ERROR"


@pytest.mark.parametrize("line,reply", [
    ("lru_crawler crawl all", "OK"), ("lru_crawler crawl 1", "OK"),
    ("lru_crawler crawl 1,x", "BADCLASS invalid class id"),
    ("lru_crawler tocrawl 10", "OK"), ("lru_crawler sleep 10", "OK"),
    ("lru_crawler tocrawl x", "CLIENT_ERROR bad command line format"),
    ("lru_crawler sleep -1", "CLIENT_ERROR bad command line format"),
    ("lru_crawler sleep 2000000", "CLIENT_ERROR sleep must be one second or less"),
    ("lru_crawler enable", "ERROR failed to start lru crawler thread"),
])
def test_lru_crawler_subcommands_answer_as_memcached(raw, line, reply):
    assert raw.cmd(line) == reply


def test_metadump_refused_while_the_crawler_is_disabled(raw):
    assert raw.cmd("lru_crawler disable") == "OK"
    assert raw.stats("settings")["lru_crawler"] == "no"
    assert raw.cmd("lru_crawler metadump all") == "CLIENT_ERROR lru crawler disabled"
    assert raw.cmd("lru_crawler enable") == "OK"
    assert metadump(raw) == []


@pytest.mark.shoal_only  # memcached 1.6.18 drops requests pipelined behind a metadump
def test_requests_pipelined_behind_a_dump_answer_after_its_end(raw):
    for i in range(200):
        assert raw.store("set", f"p{i}", "v") == "STORED"
    raw.send("lru_crawler metadump all\r\nget p7\r\n")
    dump = raw.read_until(b"END\r\n", timeout=10)
    assert dump.count(b"\n") == 201
    assert raw.read_get_reply() == [("p7", 0, b"v", None)]


@pytest.mark.shoal_only  # memcached lists only its COLD LRU: items just stored are missing
def test_cachedump_format_and_limit(raw):
    assert raw.store("set", "c1", "abc") == "STORED"
    assert raw.store("set", "c2", "xyz", exptime=100) == "STORED"
    cls = metadump(raw)[0]["cls"]
    items = {k: (n, exp) for k, n, exp in cachedump(raw, cls)}
    assert items["c1"] == (3, 0)
    assert items["c2"][0] == 3 and items["c2"][1] > 1_000_000_000
    assert len(cachedump(raw, cls, 1)) == 1


@pytest.mark.parametrize("args,reply", [
    ("", "CLIENT_ERROR bad command line"), ("1", "CLIENT_ERROR bad command line"),
    ("x 0", "CLIENT_ERROR bad command line format"),
    ("1 x", "CLIENT_ERROR bad command line format"),
    ("-1 0", "CLIENT_ERROR bad command line format"),
    ("300 0", "CLIENT_ERROR Illegal slab id"),
])
def test_cachedump_bad_arguments(raw, args, reply):
    assert raw.cmd(f"stats cachedump {args}".rstrip()) == reply


def test_cachedump_of_class_zero_or_an_empty_class_is_end(raw):
    assert raw.store("set", "z", "1") == "STORED"
    assert cachedump(raw, 0) == []
    assert cachedump(raw, 63) == []


def test_cachedump_ignores_words_after_the_limit(start_server):
    # memcached's cachedump lists one LRU, from which its maintainer thread moves items
    raw = start_server("-o", "no_lru_maintainer").raw()
    assert raw.store("set", "w", "1") == "STORED"
    cls = metadump(raw)[0]["cls"]
    raw.send(f"stats cachedump {cls} 0 extra\r\n")
    assert raw.read_line() == "ITEM w [1 b; 0 s]"
    assert raw.read_line() == "END"


# -- tools -----------------------------------------------------------------------------------

SIZES = [1, 100, 1000, 5000, 20000, 200000]


def fill_sizes(raw):
    keys = {}
    for n in SIZES:
        k = f"size:{n}"
        assert raw.store("set", k, "v" * n) == "STORED"
        keys[k] = n
    return keys


@pytest.mark.skipif(shutil.which("memcdump") is None, reason="libmemcached-tools not installed")
def test_memcdump_lists_every_key_of_every_size(server, raw):
    keys = fill_sizes(raw)
    out = subprocess.run(["memcdump", f"--servers=127.0.0.1:{server.port}"], capture_output=True,
                         timeout=20, check=True).stdout.decode().split()
    assert sorted(out) == sorted(keys), "each key once, whatever its size class"


def tool(server, *args):
    return subprocess.run(["perl", MEMCACHED_TOOL, f"127.0.0.1:{server.port}", *args],
                          capture_output=True, timeout=20, check=True).stdout


@pytest.mark.skipif(not shutil.os.path.exists(MEMCACHED_TOOL), reason="memcached-tool missing")
def test_memcached_tool_display_lists_the_classes(server, raw):
    fill_sizes(raw)
    rows = [l.split() for l in tool(server, "display").decode().splitlines()[1:]]
    assert sum(int(r[4]) for r in rows) == len(SIZES), rows


@pytest.mark.skipif(not shutil.os.path.exists(MEMCACHED_TOOL), reason="memcached-tool missing")
def test_memcached_tool_stats_prints_the_counters(server, raw):
    raw.store("set", "s", "1")
    out = tool(server, "stats").decode()
    assert re.search(r"^\s+curr_items\s+1\r?$", out, re.M), out


@pytest.mark.skipif(not shutil.os.path.exists(MEMCACHED_TOOL), reason="memcached-tool missing")
def test_memcached_tool_dump_replays_every_item(server, raw):
    keys = fill_sizes(raw)
    out = tool(server, "dump")
    found = {}
    lines = out.split(b"\r\n")
    for i, line in enumerate(lines):
        m = re.fullmatch(rb"add (\S+) (\d+) (\d+) (\d+)", line)
        if m:
            found[m.group(1).decode()] = int(m.group(4))
            assert lines[i + 1] == b"v" * int(m.group(4))
    assert found == keys


# -- large and concurrent ---------------------------------------------------------------------

def test_large_dump_lists_every_key_once(server, raw):
    n = 30000
    batch = b"".join(b"set big:%d 0 0 8 noreply\r\nabcdefgh\r\n" % i for i in range(n))
    raw.send(batch)
    assert raw.cmd("mn") == "MN"
    keys = [l["key"] for l in metadump(raw)]
    assert len(keys) == n and len(set(keys)) == n


def test_dump_beside_concurrent_writes_stays_well_formed(server, raw):
    for i in range(5000):
        raw.send(f"set w:{i} 0 0 4 noreply\r\nabcd\r\n")
    assert raw.cmd("mn") == "MN"
    stop = threading.Event()

    def writer():
        w = McRaw(server.host, server.port)
        i = 0
        while not stop.is_set():
            w.send(f"set w:{i % 8000} 0 0 {i % 50} noreply\r\n{'z' * (i % 50)}\r\n"
                   f"delete w:{(i * 7) % 8000} noreply\r\n")
            i += 1
        assert w.cmd("mn") == "MN"
        w.close()

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(5):
            lines = metadump(raw)  # asserts every line's format and the END
            assert all(l["key"].startswith(b"w:") for l in lines)
    finally:
        stop.set()
        t.join()


# -- namespaces (shoal) -----------------------------------------------------------------------

@pytest.fixture
def ns_node(start_server, tmp_path):
    path = tmp_path / "ns.json"
    path.write_text('{"team": {"memory": 0, "default_ttl": 300}}')
    return start_server("--namespaces", str(path))


@pytest.mark.shoal_only
def test_dumps_show_a_namespace_key_as_the_client_stored_it(ns_node):
    raw = ns_node.raw()
    assert raw.store("set", "team:k", "v") == "STORED"
    assert raw.store("set", "other", "v") == "STORED"
    lines = {l["key"]: l for l in metadump(raw)}
    assert set(lines) == {b"team:k", b"other"}
    assert lines[b"team:k"]["exp"] > 0, "the namespace's default_ttl applied"
    assert sorted(k for k, _, _ in cachedump(raw, lines[b"team:k"]["cls"])) == ["other", "team:k"]


@pytest.mark.shoal_only
def test_detail_counts_a_namespace_under_its_name(ns_node):
    raw = ns_node.raw()
    assert raw.cmd("stats detail on") == "OK"
    assert raw.store("set", "team:k", "v") == "STORED"
    raw.get("team:k")
    raw.send("stats detail dump\r\n")
    assert raw.read_until(b"END\r\n") == b"PREFIX team get 1 hit 1 set 1 del 0\r\nEND\r\n"


@pytest.mark.shoal_only  # memcached builds this reply whole; shoal sends it in slices
def test_detail_dump_to_clients_that_do_not_read_keeps_memory_bounded(server):
    """`stats detail dump` of 60,000 long prefixes is about 13 MB; 30 clients that ask for it
    and never read must not make the node hold 30 copies: it goes out in slices, each queued
    only once the last one was read (a review probe took a node to 722 MB this way)."""
    from mcraw import rss_bytes, sanitized
    if sanitized(server.proc.pid):
        pytest.skip("ASAN's quarantine keeps freed memory resident")
    r = server.raw()
    assert r.cmd("stats detail on") == "OK"
    pad = "x" * 180
    for start in range(0, 60000, 5000):
        r.send("".join(f"delete p{i:06d}{pad}:k noreply\r\n" for i in range(start, start + 5000)))
        assert r.cmd("mn") == "MN"
    before = rss_bytes(server.proc.pid)
    stalled = []
    for _ in range(30):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
        s.connect((server.host, server.port))
        s.sendall(b"stats detail dump\r\nversion\r\n")
        stalled.append(s)
    # every stalled client's request has been taken up once the node answers on each of them
    # the first slice; then give the workers a moment to queue whatever they would
    for s in stalled:
        s.settimeout(5)
        assert s.recv(64).startswith(b"PREFIX ")
    assert r.cmd("version").startswith("VERSION"), "the node still answers"
    grown = rss_bytes(server.proc.pid) - before
    assert grown < 64 * 1024 * 1024, f"node grew {grown >> 20} MiB for 30 unread detail dumps"
    for s in stalled:
        s.close()
    lines = []
    r.send("stats detail dump\r\n")
    while (line := r.read_line()) != "END":
        lines.append(line)
    assert len(lines) == 60000 and all(l.endswith(" get 0 hit 0 set 0 del 1") for l in lines)
