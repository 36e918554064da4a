"""shoal-router against one shoal-node: the same pipelined batches of commands, sent through a
router (two sharded pools, a replicated pool and a cold pool warming from an empty one, under
five namespaces) and straight to a single node, must get the same replies but for CAS values
and remaining TTLs. The batches mix what the router's hot path treats specially: multi-gets of
1 to 100 keys (the per-key routes of route_get spill to the heap past 32), gat/gats, base64
(`b`) keys, `k` and `O` echoes, `q`, text `noreply`, values on both sides of the size at which
a sent request's buffer is shrunk to its line (upstream.c FRAG_LINE_KEEP), keys of up to 186
bytes, compares that fail on replicated keys, and topology reloads between batches. Skipped
when SHOAL_TEST_SERVER=memcached."""

import base64
import random
import re
import signal
import time

import pytest

from conftest import RouterCluster
from mcraw import McRaw, free_port

pytestmark = pytest.mark.shoal_only

PREFIXES = ["a:", "b:", "", "r:", "w:"]


def key_name(rnd):
    prefix = rnd.choice(PREFIXES)
    if rnd.random() < 0.05:  # long keys: their base64 form stays within 250 bytes
        return prefix + "L" * rnd.randrange(100, 180) + str(rnd.randrange(5))
    return prefix + f"k{rnd.randrange(40)}"


def value(rnd):
    n = rnd.choice([0, 3, 4090, 5000, 20000]) if rnd.random() < 0.3 else rnd.randrange(40)
    return "".join(rnd.choice("abcdefghij") for _ in range(n))


def b64(key):
    return base64.b64encode(key.encode()).decode()


def command(rnd):
    """One random command with its data block. Deletes never touch the warm-up pool's keys: a
    delete there holds the key off (warm.h), which a single node does not do."""
    k = key_name(rnd)
    r = rnd.random()
    v = value(rnd)
    noreply = " noreply" if rnd.random() < 0.15 else ""
    never = rnd.randrange(10**12, 10**13)  # a CAS no item has
    if r < 0.15:
        cmd = rnd.choice(["set", "add", "replace", "append", "prepend"])
        return f"{cmd} {k} {rnd.randrange(5)} 0 {len(v)}{noreply}\r\n{v}\r\n"
    if r < 0.2:
        return f"cas {k} 1 0 {len(v)} {never}{noreply}\r\n{v}\r\n"
    if r < 0.35:
        n = rnd.choice([1, 2, 32, 33, 64, 65, 100])
        verb = rnd.choice(["get", "gets", "gat 0", "gats 0", "gat 1000", "gats 1000"])
        return verb + " " + " ".join(key_name(rnd) for _ in range(n)) + "\r\n"
    if r < 0.42:
        return f"delete {k.replace('w:', 'a:')}{noreply}\r\n"
    if r < 0.47:
        return f"{rnd.choice(['incr', 'decr'])} {k} {rnd.randrange(10)}{noreply}\r\n"
    if r >= 0.85 and r < 0.92:
        k = k.replace("w:", "a:")  # an md
    use_b = rnd.random() < 0.3
    kk = b64(k) if use_b else k
    flags = ["b"] if use_b else []
    flags += [f for f in "kqsft" if rnd.random() < 0.3]
    if rnd.random() < 0.4:
        flags.append("O" + "".join(rnd.choice("xyz0123") for _ in range(rnd.randrange(31))))
    rnd.shuffle(flags)
    if r < 0.7:
        if rnd.random() < 0.6:
            flags.append("v")
        return f"mg {kk} {' '.join(flags)}".rstrip() + "\r\n"
    if r < 0.85:
        if rnd.random() < 0.2:
            flags.append(f"C{never}")
        return f"ms {kk} {len(v)} {' '.join(flags)}".rstrip() + f"\r\n{v}\r\n"
    if r < 0.92:
        flags = [f for f in flags if f not in ("s", "f", "t")]
        return f"md {kk} {' '.join(flags)}".rstrip() + "\r\n"
    flags = [f for f in flags if f not in ("s", "f")]
    flags += rnd.choice([[], ["N0", "J5"], ["D3"], ["v"], ["MD"]])
    return f"ma {kk} {' '.join(flags)}".rstrip() + "\r\n"


def comparable(stream):
    """The reply lines with CAS values and remaining TTLs blanked."""
    out = []
    for line in stream.split(b"\r\n"):
        if line.startswith(b"VALUE "):
            parts = line.split(b" ")
            if len(parts) == 5:
                parts[4] = b"C"
            line = b" ".join(parts)
        elif line[:2] in (b"VA", b"HD", b"EN", b"NF", b"NS", b"EX"):
            line = b" ".join(b"c" if re.fullmatch(rb"c\d+", t) else b"t" if re.fullmatch(rb"t\d+", t)
                             else t for t in line.split(b" "))
        out.append(line)
    return out


def read_batch(conn):
    """A batch's replies: up to the MN that answers the mn ending it (no value holds "MN")."""
    while not conn.buf.endswith(b"MN\r\n"):
        conn._fill(time.monotonic() + 20)
    out, conn.buf = conn.buf, b""
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_the_router_answers_as_one_node_would(start_server, start_router, seed):
    nodes = [start_server() for _ in range(7)]
    ref = start_server()
    addr = [f"127.0.0.1:{n.port}" for n in nodes]
    unused = f"127.0.0.1:{free_port()}"  # in a pool no key maps to: never connected to

    def doc(version):
        d = {"version": version,
             "pools": {"p1": {"nodes": addr[:2]}, "p2": {"nodes": [addr[2]]},
                       "rep": {"mode": "replicated", "nodes": addr[3:5]},
                       "cold": {"nodes": [addr[5]], "warm_from": "warm"},
                       "warm": {"nodes": [addr[6]]}},
             "namespaces": {"default": {"pool": "p1"}, "a": {"pool": "p1"}, "b": {"pool": "p2"},
                            "r": {"pool": "rep"}, "w": {"pool": "cold"}}}
        if version % 2 == 0:  # a reload that changes the node list but moves no key
            d["pools"]["spare"] = {"nodes": [unused]}
            d["namespaces"]["zz"] = {"pool": "spare"}
        return d

    # one connection per node: requests on several may run on a node out of the client's order
    router, admin, path = start_router(doc(1), "--upstream-conns", "1", "--upstream-window", "4")
    cluster = RouterCluster(nodes, router, path, admin)
    rnd = random.Random(seed)
    version = 1
    with McRaw(router.host, router.port, timeout=20) as r, McRaw(ref.host, ref.port, timeout=20) as d:
        for batch in range(150):
            if batch % 25 == 24:
                version += 1
                cluster.write_topology(doc(version))
                router.proc.send_signal(signal.SIGHUP)
            cmds = [command(rnd) for _ in range(rnd.randrange(1, 40))]
            data = "".join(cmds).encode() + b"mn\r\n"
            r.send(data)
            d.send(data)
            got, want = comparable(read_batch(r)), comparable(read_batch(d))
            if got != want:
                i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                         min(len(got), len(want)))
                pytest.fail(f"batch {batch}, reply line {i}: router {got[i:i + 1]!r}, node "
                            f"{want[i:i + 1]!r}; commands {[c[:120] for c in cmds]!r}")
        stats = r.stats()
    assert int(stats["multiget_split"]) > 0 and int(stats["warm_lookups"]) > 0
    assert int(stats["replicated_cas"]) > 0 and int(stats["window_waits"]) > 0
    assert stats["upstream_protocol_errors"] == "0"
    assert router.alive()
