"""Log lines are one line of printable text each, however hostile the bytes they quote: a
client's key, a node's reply or an admin request's body may hold control bytes, CR, LF or
bytes past 0x7f, and each is logged as \\xNN in a line of at most LOG_LINE_MAX (1024) bytes
after its timestamp, name and level. (log_clean itself: tests/unit/test_common.c.)"""

import re
from pathlib import Path

import pytest

from fakenode import FakeNode
from mcraw import McRaw, accepts, http, wait_until

pytestmark = pytest.mark.shoal_only

LOG_LINE_MAX = 1024
LINE_HEAD = re.compile(rb"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ shoal-router (error|warn|notice|info|debug): ")


class GarbledNode(FakeNode):
    """Answers every request with a value for another key whose name holds control bytes and
    0xff: a reply that does not match its request, which the router logs with the request."""

    def answer(self, line, rest):
        return b"VALUE other\x01\xff\x1b[31m 0 1\r\nx\r\nEND\r\n", rest


def log_bytes(server):
    return Path(server.stderr_path).read_bytes()


def assert_clean_lines(log):
    """Every line starts as the logger writes it (no forged line), holds only printable ASCII,
    and its message is within LOG_LINE_MAX."""
    for line in log.split(b"\n")[:-1]:
        head = LINE_HEAD.match(line)
        assert head, f"a log line not written by the logger (forged by a CR/LF?): {line!r}"
        bad = [b for b in line if not 0x20 <= b < 0x7f]
        assert not bad, f"raw bytes {bytes(bad)!r} in log line {line!r}"
        assert len(line) - head.end() <= LOG_LINE_MAX, f"a log line of {len(line)} bytes"


def test_router_logs_client_and_node_bytes_escaped(start_router):
    node = GarbledNode()
    try:
        # -v: a reply for another key fails its request alone and is logged at info (the
        # node's fault or the client's is told by an mn afterwards; docs/router.md)
        router, _, _ = start_router([node.addr], "-v")
        with McRaw(router.host, router.port) as c:
            c.send(b"get k\x01\xff\x1b[2J\rz\r\n")
            assert c.read_line().startswith("SERVER_ERROR"), "a mismatched reply fails the get"
        wait_until(lambda: b"answered" in log_bytes(router),
                   message="the router to log the mismatched reply")
        log = log_bytes(router)
        assert_clean_lines(log)
        line = next(l for l in log.split(b"\n") if b"answered" in l)
        assert b"k\\x01\\xff\\x1b[2J" in line, f"the client's key, escaped: {line!r}"
        assert b"other\\x01\\xff\\x1b[31m" in line, f"the node's reply, escaped: {line!r}"
    finally:
        node.close()


def test_router_logs_cr_lf_of_an_admin_request_escaped(start_server, start_router):
    node = start_server()
    router, admin, _ = start_router([node])
    bad = {"version": 2, "pools": {"main": {"nodes": ["\x01\r\n2026-01-01T00:00:00Z shoal-router "
                                                      "notice: forged\u00ff" + "x" * 3000]}},
           "namespaces": {"default": {"pool": "main"}}}
    wait_until(lambda: accepts(admin), message="the admin port to accept")
    status, _ = http(admin, "PUT", "/v1/topology", bad)
    assert status == 400
    wait_until(lambda: b"refused" in log_bytes(router), message="the router to log the refusal")
    log = log_bytes(router)
    assert_clean_lines(log)
    line = next(l for l in log.split(b"\n") if b"refused" in l)
    assert b"\\x01\\x0d\\x0a2026-01-01T00:00:00Z shoal-router notice: forged\\xc3\\xbf" in line, \
        f"the address's CR/LF and UTF-8 bytes, escaped in the same line: {line!r}"
