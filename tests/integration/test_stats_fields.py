"""The stats monitoring tools read: every field the Prometheus memcached exporter parses (see
docs/exporter.md) is in shoal-node's `stats`, `stats settings`, `stats items` and `stats slabs`,
in a form the exporter's parser takes, and the per-class figures move with traffic. Also the
framing of the other `stats` subcommands (each ends as memcached's does) and `stats detail`.

Runs against memcached too (SHOAL_TEST_SERVER=memcached): the exporter was written for it."""

import re

import pytest

from mcraw import wait_until

# Fields the exporter reads, by how it parses them (pkg/exporter/exporter.go, described in
# docs/exporter.md). float: strconv.ParseFloat; timeval: "<sec>.<usec>"; bool: "yes" or "no".
GENERAL_FLOAT = [
    "uptime", "time", "bytes", "limit_maxbytes", "curr_items", "total_items", "bytes_read",
    "bytes_written", "curr_connections", "total_connections", "rejected_connections",
    "conn_yields", "listen_disabled_num", "evictions", "reclaimed", "store_too_large",
    "store_no_memory", "lru_crawler_starts", "direct_reclaims", "crawler_items_checked",
    "crawler_reclaimed", "moves_to_cold", "moves_to_warm", "moves_within_lru", "accepting_conns",
    "cmd_set", "cmd_flush", "cas_badval",
] + [f"{op}_{r}" for op in ("get", "delete", "incr", "decr", "cas", "touch")
     for r in ("hits", "misses")]
GENERAL_TIMEVAL = ["rusage_user", "rusage_system"]
GENERAL_STRING = ["version"]
SLABS_GLOBAL_FLOAT = ["total_malloced"]  # from `stats slabs`, merged into the general map
SETTINGS_FLOAT = ["maxconns", "lru_crawler_sleep", "lru_crawler_tocrawl", "hot_lru_pct",
                  "warm_lru_pct", "hot_max_factor", "warm_max_factor"]
SETTINGS_BOOL = ["lru_crawler", "lru_maintainer_thread"]
ITEMS_FLOAT = [
    "number", "age", "hits_to_hot", "hits_to_warm", "hits_to_cold", "hits_to_temp",
    "crawler_reclaimed", "evicted", "evicted_nonzero", "evicted_time", "evicted_unfetched",
    "expired_unfetched", "outofmemory", "reclaimed", "tailrepairs", "mem_requested",
    "moves_to_cold", "moves_to_warm", "moves_within_lru", "number_hot", "number_warm",
    "number_cold", "age_hot", "age_warm",
]
SLABS_FLOAT = [
    "get_hits", "delete_hits", "incr_hits", "decr_hits", "cas_hits", "touch_hits", "cas_badval",
    "cmd_set", "chunk_size", "chunks_per_page", "total_pages", "total_chunks", "used_chunks",
    "free_chunks", "free_chunks_end",
]


class ExporterParseError(AssertionError):
    pass


def read_block(raw, cmd):
    raw.send(cmd + "\r\n")
    return raw.read_until(b"END\r\n").decode()


def exporter_stats(raw):
    """`stats`, `stats slabs`, `stats items` parsed as the exporter's memcache library does:
    a line is kept when it splits on ' ' into exactly 3 parts starting with STAT; its name
    split on ':' gives a general field (1 part), a slab field (2 parts, the first an integer)
    or an item field (3 parts, the second an integer). A bad integer is an error."""
    general, slabs, items = {}, {}, {}
    for cmd in ("stats", "stats slabs", "stats items"):
        for line in read_block(raw, cmd).split("\r\n"):
            if line.startswith("CLIENT_ERROR"):
                raise ExporterParseError(line)
            parts = line.split(" ")
            if line in ("END", "") or len(parts) != 3 or not parts[0].startswith("STAT"):
                continue
            f = parts[1].split(":")
            try:
                if len(f) == 1:
                    general[f[0]] = parts[2].strip()
                elif len(f) == 2:
                    slabs.setdefault(int(f[0]), {})[f[1]] = parts[2].strip()
                elif len(f) == 3:
                    items.setdefault(int(f[1]), {})[f[2]] = parts[2].strip()
            except ValueError as e:
                raise ExporterParseError(f"{line!r}: {e}")
    return general, slabs, items


def exporter_settings(raw):
    """`stats settings` as the exporter's library reads it: every line must have 3 or 4
    space-separated parts, else the whole scrape fails."""
    out = {}
    for line in read_block(raw, "stats settings").split("\r\n"):
        if line in ("END", ""):
            continue
        parts = line.split(" ")
        if len(parts) not in (3, 4):
            raise ExporterParseError(f"unexpected stats line format {line!r}")
        out[parts[1]] = parts[2].strip()
    return out


def as_float(m, key):
    assert key in m, f"exporter field {key!r} missing"
    try:
        return float(m[key])
    except ValueError:
        raise ExporterParseError(f"{key}={m[key]!r} does not parse as a float")


def as_timeval(m, key):
    assert key in m, f"exporter field {key!r} missing"
    sec, dot, usec = m[key].partition(".")
    assert dot and "." not in usec, f"{key}={m[key]!r} is not <sec>.<usec>"
    return float(sec) + float(usec) / 1e6


def as_bool(m, key):
    assert m.get(key) in ("yes", "no"), f"{key}={m.get(key)!r} is not yes or no"
    return m[key] == "yes"


def traffic(raw):
    """Enough requests to make one class show every counter."""
    assert raw.store("set", "k1", "v" * 10) == "STORED"
    assert raw.get("k1")[0][2] == b"v" * 10
    assert raw.store("set", "n1", "5") == "STORED"
    assert raw.cmd("incr n1 1") == "6"
    assert raw.cmd("decr n1 1") == "5"
    assert raw.cmd("touch n1 0") == "TOUCHED"
    cas = raw.get("n1", cmd="gets")[0][3]
    assert raw.store("cas", "n1", "7", extra=str(cas)) == "STORED"
    assert raw.store("cas", "n1", "8", extra=str(cas)) == "EXISTS"
    assert raw.cmd("delete k1") == "DELETED"
    assert raw.get("nothere") == []


def test_general_fields_parse_as_the_exporter_reads_them(raw):
    traffic(raw)
    general, _, _ = exporter_stats(raw)
    for key in GENERAL_FLOAT + SLABS_GLOBAL_FLOAT:
        as_float(general, key)
    for key in GENERAL_TIMEVAL:
        as_timeval(general, key)
    assert general["version"], "version must be non-empty (it becomes a label)"
    # memcached's cmd_set includes cas requests; the exporter subtracts them
    assert as_float(general, "cmd_set") >= sum(as_float(general, k)
                                               for k in ("cas_hits", "cas_misses", "cas_badval"))


def test_settings_parse_as_the_exporter_reads_them(raw):
    settings = exporter_settings(raw)
    for key in SETTINGS_FLOAT:
        as_float(settings, key)
    for key in SETTINGS_BOOL:
        as_bool(settings, key)
    assert as_bool(settings, "lru_crawler"), "the exporter reads the crawler series only when yes"


def test_items_and_slabs_carry_every_field_per_class(raw):
    traffic(raw)
    _, slabs, items = exporter_stats(raw)
    assert items, "stats items lists no class although items are stored"
    assert slabs, "stats slabs lists no class although items are stored"
    for cls, fields in items.items():
        for key in ITEMS_FLOAT:
            as_float(fields, key)
    for cls, fields in slabs.items():
        for key in SLABS_FLOAT:
            as_float(fields, key)
    assert set(items) <= set(slabs), "a class with items must own pages"


def test_exporter_would_report_up(raw):
    """The whole scrape parses: the exporter's memcached_up would be 1."""
    traffic(raw)
    exporter_stats(raw)
    exporter_settings(raw)


def slab_figures(raw):
    _, slabs, items = exporter_stats(raw)
    return slabs, items


def test_class_get_hits_grow_after_a_hit(raw):
    assert raw.store("set", "hit:me", "x" * 50) == "STORED"
    slabs, items = slab_figures(raw)
    cls = next(c for c, f in items.items() if int(f["number"]) == 1)
    before = int(slabs[cls]["get_hits"])
    raw.get("hit:me")
    raw.get("hit:me")
    slabs, items = slab_figures(raw)
    assert int(slabs[cls]["get_hits"]) == before + 2
    assert int(items[cls]["hits_to_hot"]) + int(items[cls]["hits_to_warm"]) + \
        int(items[cls]["hits_to_cold"]) >= 2


def test_class_counters_follow_their_commands(raw):
    assert raw.store("set", "c", "10") == "STORED"
    slabs, items = slab_figures(raw)
    cls = next(iter(items))
    assert int(slabs[cls]["cmd_set"]) == 1
    assert raw.cmd("incr c 1") == "11"
    assert raw.cmd("decr c 2") == "9"
    assert raw.cmd("touch c 0") == "TOUCHED"
    cas = raw.get("c", cmd="gets")[0][3]
    assert raw.store("cas", "c", "12", extra=str(cas)) == "STORED"
    assert raw.store("cas", "c", "13", extra=str(cas)) == "EXISTS"
    slabs, _ = slab_figures(raw)
    f = slabs[cls]
    assert (int(f["incr_hits"]), int(f["decr_hits"]), int(f["touch_hits"])) == (1, 1, 1)
    assert (int(f["cas_hits"]), int(f["cas_badval"])) == (1, 1)
    assert raw.cmd("delete c") == "DELETED"
    slabs, _ = slab_figures(raw)
    assert int(slabs[cls]["delete_hits"]) == 1


def test_mem_requested_counts_the_items_bytes(raw):
    assert raw.store("set", "m1", "x" * 100) == "STORED"
    _, items = slab_figures(raw)
    cls = next(iter(items))
    one = int(items[cls]["mem_requested"])
    assert one >= 100 + 2, "mem_requested covers at least key and value"
    assert raw.store("set", "m2", "y" * 100) == "STORED"
    _, items = slab_figures(raw)
    assert int(items[cls]["mem_requested"]) == 2 * one
    assert int(items[cls]["number"]) == 2
    assert raw.cmd("delete m1") == "DELETED"
    _, items = slab_figures(raw)
    assert int(items[cls]["mem_requested"]) == one


def test_stats_reset_clears_class_counters(raw):
    assert raw.store("set", "r", "1") == "STORED"
    raw.get("r")
    assert raw.cmd("stats reset") == "RESET"
    slabs, _ = slab_figures(raw)
    assert all(int(f["get_hits"]) == 0 and int(f["cmd_set"]) == 0 for f in slabs.values())


# -- framing: every reply a client waits for ends ------------------------------------------

@pytest.mark.parametrize("sub", ["sizes", "conns", "extstore", "items extra", "slabs x",
                                 "settings x", "sizes x", "conns x", "extstore x"])
def test_stats_subcommand_ends_with_end(raw, sub):
    raw.send(f"stats {sub}\r\n")
    block = raw.read_until(b"END\r\n", timeout=3).decode()
    assert all(l.startswith("STAT ") for l in block.split("\r\n")[:-2]), block


def test_stats_sizes_says_disabled(raw):
    assert raw.stats("sizes") == {"sizes_status": "disabled"}


@pytest.mark.parametrize("sub", ["nonsense", "ITEMS", "items\tx", "a b c d e f g h i j"])
def test_unknown_stats_subcommand_is_error(raw, sub):
    assert raw.cmd(f"stats {sub}") == "ERROR"


def test_stats_reset_with_argument_resets(raw):
    assert raw.cmd("stats reset x") == "RESET"


# -- stats detail ----------------------------------------------------------------------------

def detail_dump(raw):
    raw.send("stats detail dump\r\n")
    block = raw.read_until(b"END\r\n").decode().split("\r\n")[:-2]
    out = {}
    for line in block:
        m = re.fullmatch(r"PREFIX (\S*) get (\d+) hit (\d+) set (\d+) del (\d+)", line)
        assert m, f"not memcached's PREFIX line: {line!r}"
        out[m.group(1)] = tuple(int(x) for x in m.group(2, 3, 4, 5))
    return out


def test_detail_is_off_until_turned_on(raw):
    assert raw.store("set", "p:a", "1") == "STORED"
    raw.get("p:a")
    assert detail_dump(raw) == {}
    assert raw.stats("settings")["detail_enabled"] == "no"


def test_detail_counts_gets_hits_sets_and_deletes_per_prefix(raw):
    assert raw.cmd("stats detail on") == "OK"
    assert raw.stats("settings")["detail_enabled"] == "yes"
    assert raw.store("set", "ns:k1", "hi") == "STORED"
    raw.get("ns:k1", "ns:zz", "plain")
    assert raw.store("set", "a:b:c", "x") == "STORED"
    assert raw.cmd("delete ns:k1") == "DELETED"
    assert raw.cmd("delete ns:k1") == "NOT_FOUND"
    assert detail_dump(raw) == {"ns": (2, 1, 1, 2), "a": (0, 0, 1, 0)}


def test_detail_off_stops_counting_and_keeps_figures(raw):
    assert raw.cmd("stats detail on") == "OK"
    raw.get("q:1")
    assert raw.cmd("stats detail off") == "OK"
    raw.get("q:1")
    assert detail_dump(raw) == {"q": (1, 0, 0, 0)}


def test_detail_counts_an_empty_prefix(raw):
    assert raw.cmd("stats detail on") == "OK"
    raw.get(":x")
    assert detail_dump(raw) == {"": (1, 0, 0, 0)}


def test_stats_reset_forgets_prefixes(raw):
    assert raw.cmd("stats detail on") == "OK"
    raw.get("r:1")
    assert raw.cmd("stats reset") == "RESET"
    assert detail_dump(raw) == {}


@pytest.mark.parametrize("arg", ["", "x", "dumpx"])
def test_detail_usage_error(raw, arg):
    assert raw.cmd(f"stats detail {arg}".rstrip()) == "CLIENT_ERROR usage: stats detail on|off|dump"


def test_detail_looks_at_the_first_word_only(raw):
    assert raw.cmd("stats detail on off") == "OK"
    raw.get("w:1")
    assert detail_dump(raw) == {"w": (1, 0, 0, 0)}


# -- stats conns: every connection, as memcached lists them --------------------------------

def conns_by_fd(raw):
    """`stats conns` as {fd: {field: value}}."""
    out = {}
    for name, value in raw.stats("conns").items():
        fd, _, field = name.partition(":")
        out.setdefault(int(fd), {})[field] = value
    return out


def sock_addr(sock):
    host, port = sock.getsockname()[:2]
    return f"tcp:{host}:{port}"


def test_stats_conns_lists_the_listener_and_every_connection(server, raw):
    idle = server.raw()
    assert idle.cmd("version").startswith("VERSION")
    receiving = server.raw()
    receiving.send("set half 0 0 10\r\nabc")  # its data block is still arriving
    listen = f"tcp:{server.host}:{server.port}"

    def listed():
        conns = conns_by_fd(raw)
        by_addr = {f.get("addr"): f for f in conns.values()}
        return conns if sock_addr(receiving.sock) in by_addr and by_addr[
            sock_addr(receiving.sock)].get("state") == "conn_nread" else None
    conns = wait_until(listed, timeout=5, message="the receiving connection listed as conn_nread")
    listeners = [f for f in conns.values() if f.get("state") == "conn_listening"]
    assert [f["addr"] for f in listeners] == [listen] and "listen_addr" not in listeners[0]
    by_addr = {f["addr"]: f for f in conns.values() if f.get("state") != "conn_listening"}
    for c in (raw, idle, receiving):
        f = by_addr[sock_addr(c.sock)]
        assert f["listen_addr"] == listen and int(f["secs_since_last_cmd"]) >= 0, f
    assert by_addr[sock_addr(raw.sock)]["state"] == "conn_parse_cmd", "the asking connection"
    assert by_addr[sock_addr(idle.sock)]["state"] in ("conn_read", "conn_waiting", "conn_new_cmd")
    assert list(conns) == sorted(conns), "in fd order, as memcached"


def test_stats_conns_forgets_a_closed_connection(server, raw):
    other = server.raw()
    assert other.cmd("version").startswith("VERSION")
    addr = sock_addr(other.sock)
    assert addr in {f.get("addr") for f in conns_by_fd(raw).values()}
    other.close()
    wait_until(lambda: addr not in {f.get("addr") for f in conns_by_fd(raw).values()}, timeout=5,
               message="the closed connection gone from stats conns")
