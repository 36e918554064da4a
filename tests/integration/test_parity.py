"""Replies memcached gives byte for byte (issue 10, point 6): meta keys echoed in the form they
were stored in, and malformed request lines of every command. Runs against memcached too
(SHOAL_TEST_SERVER=memcached); the router cases run shoal-router in front of the server."""

import pytest

BADFMT = "CLIENT_ERROR bad command line format"


@pytest.fixture(params=["node", "router"])
def conn(request, server, start_router):
    if request.param == "router":
        router, _, _ = start_router([server])
        c = router.raw()
    else:
        c = server.raw()
    yield c
    c.close()


# --- mg ... b k: the key as stored ------------------------------------------------------------

def test_mg_b_k_of_a_plain_key_echoes_it_plain(conn):
    assert conn.store("set", "foo", "x") == "STORED"
    assert conn.cmd("mg Zm9v b k v") == "VA 1 kfoo"
    assert conn.read_line() == "x"


def test_mg_k_of_a_base64_stored_key_echoes_base64(conn):
    conn.send("ms Zm9v 1 b\r\ny\r\n")
    assert conn.read_line() == "HD"
    assert conn.cmd("mg foo k v") == "VA 1 kZm9v b"
    assert conn.read_line() == "y"
    assert conn.cmd("mg Zm9v b k") == "HD kZm9v b"


def test_mg_b_k_miss_echoes_the_request_form(conn):
    assert conn.cmd("mg bm9uZQ== b k") == "EN kbm9uZQ== b"


def test_md_and_ma_echo_the_request_form(conn):
    assert conn.store("set", "foo", "1") == "STORED"
    assert conn.cmd("ma Zm9v b k") == "HD kZm9v b"
    assert conn.cmd("md Zm9v b k") == "HD kZm9v b"


def test_a_text_set_makes_the_key_plain_again(conn):
    conn.send("ms Zm9v 1 b\r\ny\r\n")
    assert conn.read_line() == "HD"
    assert conn.store("set", "foo", "x") == "STORED"
    assert conn.cmd("mg Zm9v b k") == "HD kfoo"


def test_an_append_makes_the_key_plain(conn):
    conn.send("ms Zm9v 1 b\r\ny\r\n")
    assert conn.read_line() == "HD"
    conn.send("ms Zm9v 1 b MA\r\nw\r\n")
    assert conn.read_line() == "HD"
    assert conn.cmd("mg Zm9v b k") == "HD kfoo"


# --- malformed lines --------------------------------------------------------------------------

# (request, reply lines) as memcached 1.6.18 answers them on a fresh connection
MALFORMED = [
    ("cas k 0 0 1 ", ["ERROR"]),                       # an empty unique: too few tokens
    ("cas k 0 0", ["ERROR"]),
    ("set k 0 0 1 2 3", ["ERROR"]),
    ("verbosity", ["ERROR"]),
    ("verbosity x", [BADFMT]),
    ("verbosity -1", [BADFMT]),
    ("verbosity 99999999999999999999", [BADFMT]),
    ("verbosity 1 2", ["OK"]),
    ("verbosity 1 noreply", []),
    ("verbosity 4294967297", ["OK"]),
    ("flush_all x", ["CLIENT_ERROR invalid exptime argument"]),
    ("flush_all 0 noreply", []),
    ("flush_all noreply 0", ["CLIENT_ERROR invalid exptime argument"]),  # "noreply" as delay
    ("flush_all 0 0 0", ["ERROR"]),
    ("incr", ["ERROR"]),
    ("incr k", ["ERROR"]),
    ("incr k x", ["CLIENT_ERROR invalid numeric delta argument"]),
    ("incr k -1", ["CLIENT_ERROR invalid numeric delta argument"]),
    ("incr k +1", ["NOT_FOUND"]),
    ("incr k 1 2 3", ["ERROR"]),
    ("decr k 18446744073709551616", ["CLIENT_ERROR invalid numeric delta argument"]),
    ("touch k", ["ERROR"]),
    ("touch k x", ["CLIENT_ERROR invalid exptime argument"]),
    ("touch k +5", ["NOT_FOUND"]),
    ("touch k 1 noreply", []),
    ("delete", ["ERROR"]),
    ("delete k 0", ["NOT_FOUND"]),
    ("delete k x noreply", []),
    ("delete k noreply extra", ["CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]"]),
    ("get", ["ERROR"]),
    ("gets", ["ERROR"]),
    ("gat", ["ERROR"]),
    ("gat 10", ["END"]),
    ("gat x k", ["CLIENT_ERROR invalid exptime argument"]),
    ("gat +10 k", ["END"]),
    ("get " + "k" * 251, [BADFMT]),
    ("cache_memlimit x", ["ERROR"]),
    ("cache_memlimit", ["ERROR"]),
    ("cache_memlimit 7", ["MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m"]),
    ("cache_memlimit 1000000001", ["MEMLIMIT_ADJUST_FAILED input value is megabytes not bytes"]),
    ("cache_memlimit 4294967297", ["MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m"]),
    ("cache_memlimit 100 noreply", []),
    ("mn junk more", ["MN"]),
    ("mg", ["ERROR"]),
    ("ms k", [BADFMT]),
    ("ms k x", [BADFMT]),
    ("md", ["ERROR"]),
    ("ma", ["ERROR"]),
    ("ma k D-1", ["CLIENT_ERROR invalid or duplicate flag"]),
    ("mg k Tx", ["CLIENT_ERROR bad token in command line format"]),
    ("mg k T+1", ["EN"]),
    ("mg k F-1", [BADFMT]),
    ("me", [BADFMT]),
    ("foo", ["ERROR"]),
    ("x", ["ERROR"]),
    ("", ["ERROR"]),
    (" ", ["ERROR"]),
    ("stats foo", ["ERROR"]),
    ("extstore", ["ERROR"]),
    ("misbehave", ["ERROR"]),
    ("debugtime 1", ["ERROR"]),
]


@pytest.mark.parametrize("line,replies", MALFORMED, ids=[repr(l) for l, _ in MALFORMED])
def test_malformed_line_answered_as_memcached(server, line, replies):
    c = server.raw()
    c.send(line + "\r\nmn\r\n")
    got = []
    while True:
        r = c.read_line()
        if r == "MN":
            break
        got.append(r)
    if line.startswith("mn"):
        assert got == [] and replies == ["MN"]
    else:
        assert got == replies


# --- memcached's tuning commands: accepted and ignored, or memcached's error ------------------

TUNING = [
    ("slabs automove 1", ["OK"]),
    ("slabs automove 0", ["OK"]),
    ("slabs automove 2", ["OK"]),
    ("slabs automove 3", ["ERROR"]),
    ("slabs automove x", [BADFMT]),
    ("slabs automove -1", [BADFMT]),
    ("slabs automove 1 noreply", []),
    ("slabs automove ratio 0.5", ["OK"]),
    ("slabs automove ratio x", ["ERROR"]),
    ("slabs automove ratio", ["ERROR"]),
    ("slabs automove", ["ERROR"]),
    ("slabs", ["ERROR"]),
    ("slabs reassign 1 2 3", ["ERROR"]),
    ("lru_crawler crawl all", ["OK"]),
    ("lru_crawler crawl 1,2", ["OK"]),
    ("lru_crawler crawl 0", ["BADCLASS invalid class id"]),
    ("lru_crawler crawl 64", ["BADCLASS invalid class id"]),
    ("lru_crawler crawl x", ["BADCLASS invalid class id"]),
    ("lru_crawler crawl all 5", ["ERROR"]),
    ("lru_crawler tocrawl x", [BADFMT]),
    ("lru_crawler tocrawl 5", ["OK"]),
    ("lru_crawler sleep x", [BADFMT]),
    ("lru_crawler sleep 2000000", ["CLIENT_ERROR sleep must be one second or less"]),
    ("lru_crawler sleep 100", ["OK"]),
    ("lru_crawler", ["ERROR"]),
    ("lru_crawler foo", ["ERROR"]),
    ("lru_crawler enable", ["ERROR failed to start lru crawler thread"]),  # it already runs
    ("lru tune 10 10 0.1 2", ["OK"]),
    ("lru tune 50 50 1 1", ["ERROR hot and warm pcts must not exceed 80"]),
    ("lru tune 10 10 0 1", ["ERROR hot/warm age factors must be greater than 0"]),
    ("lru tune 10 10 x 1", ["ERROR"]),
    ("lru tune 10 10 0.1", ["ERROR"]),
    ("lru mode flat", ["OK"]),
    ("lru mode segmented noreply", []),
    ("lru mode x", ["ERROR"]),
    ("lru temp_ttl 5 noreply", []),
    ("lru temp_ttl x", ["ERROR"]),
    ("lru", ["ERROR"]),
    ("lru x", ["ERROR"]),
    ("watch noreply", []),
]


@pytest.mark.parametrize("line,replies", TUNING, ids=[repr(l) for l, _ in TUNING])
def test_tuning_command_answered_as_memcached(conn, line, replies):
    conn.send(line + "\r\nmn\r\n")
    got = []
    while (r := conn.read_line()) != "MN":
        got.append(r)
    assert got == replies


@pytest.mark.shoal_only  # memcached streams its log, or reassigns a slab page
@pytest.mark.parametrize("line,reply", [
    ("watch", "CLIENT_ERROR watch commands not allowed"),
    ("watch fetchers", "CLIENT_ERROR watch commands not allowed"),
    ("slabs reassign 1 2", "CLIENT_ERROR slab reassignment disabled"),
    ("slabs reassign x y", "CLIENT_ERROR slab reassignment disabled"),
])
def test_tuning_command_shoal_cannot_honour(conn, line, reply):
    assert conn.cmd(line) == reply
