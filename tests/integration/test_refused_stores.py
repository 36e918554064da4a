"""A refused storage command's data block is never read as commands (issue 10, point 1), on
shoal-node and through shoal-router; keys, flags and odd request lines are taken as memcached
takes them.

Each refusal sends its line and a data block that is itself a command (`flush_all`, or a `set` of
a sentinel key) in one write, as a client storing a user-supplied value would, then checks that
the sentinel data survived. Before the fix every one of these ran the data block.

Node tests run against memcached too (SHOAL_TEST_SERVER=memcached): memcached 1.6.18 runs the
data block after most refusals, so those cases are shoal_only (docs/protocol.md lists why)."""

import pytest

from mcraw import McRaw

BADFMT = "CLIENT_ERROR bad command line format"

FLUSH = b"flush_all"                        # 9 bytes: empties the cache if run
SNEAK = b"set sentinel 0 0 6\r\nhacked"     # 26 bytes: overwrites the sentinel if run

# (id, request line with {n} for the data length, expected reply line or None for silence,
#  swallowed by memcached 1.6.18 too)
REFUSALS = [
    ("overlong_key", "set " + "k" * 251 + " 0 0 {n}", BADFMT, False),
    ("overlong_key_noreply", "set " + "k" * 251 + " 0 0 {n} noreply", None, False),
    ("bad_flags", "set k x 0 {n}", BADFMT, False),
    ("negative_flags", "set k -1 0 {n}", BADFMT, False),
    ("flags_over_64_bits", "add k 18446744073709551616 0 {n}", BADFMT, False),
    ("bad_exptime", "replace k 0 1x {n}", BADFMT, False),
    ("bad_exptime_noreply", "append k 0 x {n} noreply", None, False),
    ("prepend_bad_flags", "prepend k 0x1 0 {n}", BADFMT, False),
    ("cas_bad_unique", "cas k 0 0 {n} abc", BADFMT, False),
    ("cas_negative_unique", "cas k 0 0 {n} -1", BADFMT, False),
    ("cas_noreply_as_unique", "cas k 0 0 {n} noreply", None, False),
    ("ms_bad_flags", "ms k {n} Fx", BADFMT, True),
    ("ms_invalid_flag", "ms k {n} !", "CLIENT_ERROR invalid flag", True),
    ("ms_bad_base64_key", "ms a2V5= {n} b", "CLIENT_ERROR error decoding key", True),
    ("ms_quiet_bad_ttl", "ms k {n} q Tx", "CLIENT_ERROR bad token in command line format", True),
    ("ms_overlong_key", "ms " + "k" * 251 + " {n}", BADFMT, False),
]


def refusal_params():
    out = []
    for name, line, reply, mc_too in REFUSALS:
        marks = [] if mc_too else [pytest.mark.shoal_only]
        for what, data in (("flush", FLUSH), ("sneak", SNEAK)):
            out.append(pytest.param(line, reply, data, id=f"{name}-{what}", marks=marks))
    return out


def seed(c, keys):
    for k in keys:
        assert c.store("set", k, "intact") == "STORED"


def attack(c, line, reply, data, keys):
    """Send the refused line, its data block and a get of `keys` in one write; check the reply
    and that every key still holds its value."""
    req = line.format(n=len(data)).encode() + b"\r\n" + data + b"\r\n"
    c.send(req + b"get " + " ".join(keys).encode() + b"\r\n")
    if reply is not None:
        assert c.read_line() == reply
    got = {k: v for k, _, v, _ in c.read_get_reply()}
    assert got == {k: b"intact" for k in keys}, "the data block ran as a command"
    assert c.cmd("mn") == "MN", "nothing is left over on the connection"


@pytest.mark.parametrize("line,reply,data", refusal_params())
def test_refused_store_data_is_swallowed_by_node(raw, line, reply, data):
    seed(raw, ["sentinel", "other"])
    attack(raw, line, reply, data, ["sentinel", "other"])


@pytest.mark.parametrize("line,reply,data", refusal_params())
def test_refused_store_data_is_swallowed_by_router(cluster, line, reply, data):
    # keys on every node: a flush_all through the router would reach them all
    keys = ["sentinel"] + [f"other{i}" for i in range(12)]
    assert len({cluster.owner(k) for k in keys}) == 3
    with cluster.raw() as c:
        seed(c, keys)
        attack(c, line, reply, data, keys)
    for node in cluster.nodes:
        with node.raw() as n:
            assert n.cmd("mn") == "MN"
    with cluster.raw() as c:
        assert {k for k, *_ in c.get(*keys)} == set(keys)


def test_too_large_store_data_is_swallowed(server):
    # memcached agrees: a length over the item limit is swallowed whole
    raw = server.raw()
    seed(raw, ["sentinel"])
    block = (FLUSH + b"\r\n") * 200_000  # 2.2 MB of flush_all lines, over the 1 MB default
    raw.send(f"set big 0 0 {len(block)}\r\n".encode() + block + b"\r\nget sentinel\r\n")
    assert raw.read_line(timeout=10) == "SERVER_ERROR object too large for cache"
    assert raw.read_get_reply() == [("sentinel", 0, b"intact", None)]


def test_too_large_store_data_is_swallowed_by_router(cluster):
    with cluster.raw() as c:
        seed(c, ["sentinel"])
        block = (FLUSH + b"\r\n") * 200_000
        c.send(f"ms big {len(block)} T0\r\n".encode() + block + b"\r\nget sentinel\r\n")
        assert c.read_line(timeout=10) == "SERVER_ERROR object too large for cache"
        assert c.read_get_reply() == [("sentinel", 0, b"intact", None)]


# Where the length cannot be read, memcached has nothing to swallow and reads the next line as
# a command; so do we (a client sending such a line has no data block framed by it anyway).
@pytest.mark.parametrize("line,reply", [
    ("set k 0 0 x", BADFMT),
    ("set k 0 0 -1", BADFMT),
    ("set k 0 0 2147483648", BADFMT),          # negative as memcached's 32-bit int
    ("set k 0 0 noreply", None),               # "noreply" as the length: silent
    ("ms k x", BADFMT),
    ("ms k", BADFMT),
    ("set k 0 2", "ERROR"),                    # wrong token counts: ERROR, nothing swallowed
    ("set k 0 0 2 noreply extra", "ERROR"),
    ("cas k 0 0 2", "ERROR"),
])
@pytest.mark.parametrize("via", ["node", "router"])
def test_unreadable_length_leaves_the_next_line_to_run(server, start_router, line, reply, via):
    if via == "router":
        router, _, _ = start_router([server])
        c = router.raw()
    else:
        c = server.raw()
    c.send(line + "\r\nmn\r\n")
    if reply is not None:
        assert c.read_line() == reply
    assert c.read_line() == "MN"


# --- keys and flags as memcached takes them ---------------------------------------------------

CONTROL_KEYS = [b"\x01bad", b"tab\tkey", b"del\x7f", b"high\xff\xfe", b"cr\rin", b"\x1b[31mred"]


@pytest.mark.parametrize("key", CONTROL_KEYS, ids=lambda k: k.hex())
@pytest.mark.parametrize("via", ["node", "router"])
def test_control_bytes_are_key_bytes(server, start_router, key, via):
    if via == "router":
        router, _, _ = start_router([server])
        c = router.raw()
    else:
        c = server.raw()
    c.send(b"set " + key + b" 3 0 9\r\nflush_all\r\n")
    assert c.read_line() == "STORED"
    c.send(b"get " + key + b"\r\n")
    assert c.read_exact(len(b"VALUE ") + len(key) + len(b" 3 9\r\nflush_all\r\nEND\r\n")) == \
        b"VALUE " + key + b" 3 9\r\nflush_all\r\nEND\r\n"
    c.send(b"mg " + key + b" k f v\r\n")
    assert c.read_exact(len(b"VA 9 k") + len(key) + len(b" f3\r\nflush_all\r\n")) == \
        b"VA 9 k" + key + b" f3\r\nflush_all\r\n"
    c.send(b"delete " + key + b"\r\n")
    assert c.read_line() == "DELETED"


@pytest.mark.parametrize("via", ["node", "router"])
def test_nul_ends_the_request_line(server, start_router, via):
    if via == "router":
        router, _, _ = start_router([server])
        c = router.raw()
    else:
        c = server.raw()
    assert c.store("set", "a", "x") == "STORED"
    c.send(b"get a\x00b\r\n")
    assert c.read_get_reply() == [("a", 0, b"x", None)]
    c.send(b"set a\x00b 0 0 1\r\nx\r\n")  # "set a": too few tokens, then "x"
    assert c.read_line() == "ERROR"
    assert c.read_line() == "ERROR"


@pytest.mark.parametrize("flags,stored", [
    ("4294967296", 0), ("4294967297", 1), ("18446744073709551615", 4294967295),
    ("9223372036854775808", 0), ("+5", 5), ("-18446744073709551615", 1), ("5\tjunk", 5),
])
def test_client_flags_read_as_memcached_reads_them(raw, flags, stored):
    raw.send(f"set f {flags} 0 1\r\nx\r\n")
    assert raw.read_line() == "STORED"
    assert raw.get("f") == [("f", stored, b"x", None)]
    raw.send(f"ms m 1 F{flags.split()[0]}\r\nx\r\n")
    assert raw.read_line() == "HD"
    assert raw.meta("mg m f").flags["f"] == str(stored)


@pytest.mark.parametrize("line", ["set f -1 0 1", "set f 18446744073709551616 0 1"])
@pytest.mark.shoal_only  # memcached runs the data block "x" (ERROR) after these
def test_client_flags_memcached_refuses_are_refused(raw, line):
    raw.send(line + "\r\nx\r\n")
    assert raw.read_line() == BADFMT
    assert raw.cmd("mn") == "MN"


def test_length_keeps_its_low_32_bits(raw):
    raw.send("set v 0 0 4294967297\r\nx\r\n")  # memcached reads 1
    assert raw.read_line() == "STORED"
    assert raw.get("v") == [("v", 0, b"x", None)]


# --- HTTP and binary requests -----------------------------------------------------------------

HTTP_LINES = [b"GET / HTTP/1.0\r\n\r\n", b"PUT /x HTTP/1.1\r\nHost: a\r\n\r\n",
              b"POST /api HTTP/1.1\r\n", b"HEAD / HTTP/1.0\r\n", b"OPTIONS * HTTP/1.1\r\n"]


@pytest.mark.parametrize("req", HTTP_LINES, ids=lambda r: r.split()[0].decode())
def test_http_request_closes_node_connection_silently(server, req):
    c = server.raw()
    c.send(req)
    assert c.read_all_until_closed(timeout=5) == b""


@pytest.mark.parametrize("req", HTTP_LINES, ids=lambda r: r.split()[0].decode())
def test_http_request_closes_router_connection_silently(cluster, req):
    c = cluster.raw()
    c.send(req)
    assert c.read_all_until_closed(timeout=5) == b""


def test_http_lookalike_memcached_answers_error(raw):
    # only an unknown command outside memcached's first-letter dispatch closes
    for line in ["dog / HTTP/1.0", "gxx / HTTP/1.0", "GET / HTTP/1.0 x", "G HTTP/1.0"]:
        assert raw.cmd(line) == "ERROR", line


GET_FOO_BINARY = bytes([0x80, 0x00, 0x00, 0x03, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0,
                        0, 0, 0, 0, 0, 0, 0, 0]) + b"foo"


@pytest.mark.shoal_only  # memcached negotiates the binary protocol instead
def test_binary_request_gets_error_and_close_from_node(raw):
    raw.send(GET_FOO_BINARY)  # no newline anywhere: must not wait for one
    assert raw.read_all_until_closed(timeout=5) == b"ERROR\r\n"


def test_binary_request_gets_error_and_close_from_router(cluster):
    c = cluster.raw()
    c.send(GET_FOO_BINARY)
    assert c.read_all_until_closed(timeout=5) == b"ERROR\r\n"


@pytest.mark.shoal_only
def test_binary_request_after_text_requests_gets_their_replies_first(raw):
    raw.send(b"mn\r\n" + GET_FOO_BINARY)
    assert raw.read_all_until_closed(timeout=5) == b"MN\r\nERROR\r\n"


def test_binary_byte_inside_a_line_is_a_key_byte(raw):
    raw.send(b"get \x80\r\n")
    assert raw.read_line() == "END"
