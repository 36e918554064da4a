"""pylibmc scenarios for test_tool_matrix.py, run in a child process: libmemcached asserts (and
aborts) on some replies it does not expect, which must fail one test, not end the test run.

Usage: matrix_pylibmc.py HOST:PORT CASE   prints the case's outcome as one JSON document.
"""

import json
import re
import socket
import sys

import pylibmc

TIMEOUTS = {"connect_timeout": 2000, "receive_timeout": 3_000_000, "send_timeout": 3_000_000,
            "_poll_timeout": 3000}


def client(addr, **behaviors):
    return pylibmc.Client([addr], binary=False, behaviors={**TIMEOUTS, **behaviors})


def raw_get(addr, key):
    """The value memcached holds for key (bytes), read with a plain text get, or None."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=3) as s:
        s.sendall(b"get " + key + b"\r\n")
        buf = b""
        while not (buf.endswith(b"END\r\n") or (b"\r\n" in buf and not buf.startswith(b"VALUE "))):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    if not buf.startswith(b"VALUE "):
        return None if buf == b"END\r\n" else buf.decode("latin-1").strip()
    head, rest = buf.split(b"\r\n", 1)
    return rest[:int(head.split(b" ")[3])].decode("latin-1")


def multi3000(addr):
    c = client(addr)
    # 3,000 keys of 30 bytes: a get line of ~93 KB
    values = {f"tool_matrix_pylibmc_key_{i:06d}": f"value-{i}" * (1 + i % 7) for i in range(3000)}
    failed = c.set_multi(values)
    got = c.get_multi(list(values) + ["absent"])
    return {"failed": sorted(failed), "got": len(got), "same": got == values}


def control_key(addr):
    """pylibmc passes a key with a control byte as it is (verify_keys is off). memcached stores
    it; the value, which looks like a command, must stay data. (pylibmc's own get of such a key
    returns b'' even from memcached, so it is read back with a plain get.)"""
    c = client(addr)
    c.set("other", "kept")
    try:
        stored = c.set("ctl\x01key", "flush_all")
    except pylibmc.Error as e:
        stored = f"{type(e).__name__}: {re.sub(r'[(]0x[0-9a-f]+[)] |,  host.*', '', str(e))}"
    return {"stored": stored, "value": raw_get(addr, b"ctl\x01key"), "other": raw_get(addr, b"other")}


def behaviors(addr):
    """Behaviours set at creation read back as set, and requests still work under them: hashing
    and distribution, Nagle off, cas, noreply. (buffer_requests is left out: pylibmc
    raises on libmemcached's MEMCACHED_BUFFERED answer to a buffered set, against any server.)"""
    wanted = {"tcp_nodelay": 1, "ketama": 1, "hash": "md5", "distribution": "consistent",
              "cas": 1, "no_block": 1, "verify_keys": 1, "retry_timeout": 1}
    c = client(addr, **wanted)
    o = {"readback": {k: c.behaviors[k] for k in wanted}}
    c.set("b1", "one")
    value, cas = c.gets("b1")
    o["cas"] = [value, c.cas("b1", "two", cas), c.cas("b1", "three", cas), c.get("b1")]
    noreply = client(addr, _noreply=1)
    noreply.set("b3", "quiet")
    o["noreply"] = [noreply.get("b3"), c.get("b3")]
    return o


def operations(addr):
    c = client(addr)
    o = {"add": [c.add("k", "1"), c.add("k", "2")], "replace": [c.replace("k", "3"),
                                                                 c.replace("absent", "x")]}
    o["incr"] = [c.incr("k", 10), c.decr("k", 100)]
    try:
        c.incr("absent")
        o["incr_absent"] = "no error"
    except pylibmc.NotFound:
        o["incr_absent"] = "NotFound"
    c.set("s", "mid")
    o["append"] = [c.append("s", ">"), c.prepend("s", "<"), c.get("s")]
    o["touch"] = [c.touch("s", 100), c.touch("absent", 100)]
    o["delete"] = [c.delete("s"), c.delete("s"), c.get("s")]
    c.set_multi({"m1": "a", "m2": "b"})
    o["delete_multi"] = [c.delete_multi(["m1", "m2", "m3"]), c.get_multi(["m1", "m2"])]
    stats = c.get_stats()  # libmemcached's parsed fields: a missing one reads as 0
    o["stats"] = [len(stats)] + [stats[0][1].get(k).decode() for k in ("curr_items", "get_hits", "cmd_set")]
    return o


if __name__ == "__main__":
    addr, case = sys.argv[1], sys.argv[2]
    print(json.dumps(globals()[case](addr)))
